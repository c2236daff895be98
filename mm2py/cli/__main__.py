"""`python -m mm2py.cli ...`, as the tests and benchmarks run the command line."""

import sys

from mm2py.cli import main

# Guarded: a task process (multiprocessing spawn) imports this module again.
if __name__ == "__main__":
    sys.exit(main())
