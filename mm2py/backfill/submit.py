"""`mm2py backfill` for spark-submit: the same options, Spark's master from spark-submit.

    PYSPARK_DRIVER_PYTHON=.venv/bin/python spark-submit --master yarn \\
        mm2py/backfill/submit.py mm2.properties --source A --target B

mm2py must be importable by the driver's Python; the executors get theirs with the
job, as with `mm2py backfill --master ...` (see mm2py.backfill.environment).
"""

from __future__ import annotations

import sys

from mm2py.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
