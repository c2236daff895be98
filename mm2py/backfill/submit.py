"""`mm2py backfill` for spark-submit: the same options, Spark's master from spark-submit.

    spark-submit --master yarn --py-files mm2py.zip mm2py/backfill/submit.py \\
        mm2.properties --source A --target B

mm2py and confluent-kafka must be importable on the driver and the executors.
"""

from __future__ import annotations

import sys

from mm2py.cli import main

if __name__ == "__main__":
    sys.exit(main(["backfill", *sys.argv[1:]]))
