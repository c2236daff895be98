"""`python -m mm2py.cli ...`, as the tests and benchmarks run the command line."""

import sys

from mm2py.cli import main

sys.exit(main())
