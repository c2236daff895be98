"""`mm2py backfill`: bulk-copy a flow's history with Spark, then hand over to `mm2py run`."""

from __future__ import annotations

import argparse
import sys

from mm2py.cli.arguments import Subparsers, add_pair_arguments, positive, topics_pattern
from mm2py.errors import EXIT_OK, Interrupted, UsageError


def run(args: argparse.Namespace) -> int:
    from mm2py.backfill.job import BackfillOptions, format_summary, run_backfill
    from mm2py.backfill.plan import TimeBoundError, parse_time_bound
    from mm2py.config import load_config
    from mm2py.tools.translate import check_aliases

    config = load_config(args.config)
    check_aliases(config, args.source, args.target)
    topics = topics_pattern(args.topics)
    try:
        start, end = parse_time_bound(args.from_, "earliest"), parse_time_bound(args.until, "now")
    except TimeBoundError as err:
        raise UsageError(f"--from/--until: {err}") from None
    options = BackfillOptions(
        args.source,
        args.target,
        topics,
        start,
        end,
        master=args.master,
        python_env=args.python_env,
        range_records=args.range_records,
        parallelism=args.parallelism,
    )
    tty = sys.stderr.isatty()

    def show(line: str) -> None:
        # On a terminal one line is rewritten in place; in a log, one line per update.
        sys.stderr.write(f"\r\033[K{line}" if tty else f"{line}\n")
        sys.stderr.flush()

    try:
        summary = run_backfill(config, options, show)
    except KeyboardInterrupt:
        raise Interrupted(
            "interrupted; run it again to continue from the last commit of each partition"
        ) from None
    finally:
        if tty:  # end the progress line: the summary or an error starts on a line of its own
            sys.stderr.write("\n")
    sys.stdout.write(format_summary(summary))
    return EXIT_OK


def add_parser(sub: Subparsers) -> None:
    from mm2py.backfill.plan import DEFAULT_RANGE_RECORDS

    p = sub.add_parser(
        "backfill",
        help="bulk-copy a flow's history with Spark, then hand over to `mm2py run`",
        description=(
            "Copy the records of the flow's topics (offsets fixed when it starts) to their "
            "remote topics with a PySpark job: same partition, key, value, headers and "
            "timestamp, aborted transactions left out. Writes offset syncs and the progress "
            "`mm2py run` (or MM2) continues from. Run again after an interruption: completed "
            "ranges are not copied again. Also runs under spark-submit "
            "(mm2py/backfill/submit.py)."
        ),
    )
    add_pair_arguments(p)
    p.add_argument(
        "--topics",
        default=None,
        metavar="REGEX",
        help="only the flow's topics whose (source) name matches in full (default: all)",
    )
    p.add_argument(
        "--from",
        dest="from_",
        default="earliest",
        metavar="WHEN",
        help="earliest (default), an ISO-8601 time (UTC unless it says) or epoch ms: "
        "start at the first record with a timestamp at or after it",
    )
    p.add_argument(
        "--until",
        default="now",
        metavar="WHEN",
        help="now (default: the end offsets when the backfill starts), an ISO-8601 time "
        "or epoch ms: stop before the first record with a timestamp at or after it",
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master (default: spark-submit's, else local[*])",
    )
    p.add_argument(
        "--python-env",
        default=None,
        metavar="ARCHIVE",
        help="the executors' Python: a packed environment (.tar.gz with bin/python, e.g. "
        "from venv-pack or conda-pack; a path or URI) shipped with the job. Default on a "
        "cluster: this Python and mm2py, packed once and cached, unless PYSPARK_PYTHON, "
        "spark.pyspark.python or spark.archives is set",
    )
    p.add_argument(
        "--range-records",
        type=positive,
        default=DEFAULT_RANGE_RECORDS,
        metavar="N",
        help="split partitions into ranges of at most N offsets "
        f"(default {DEFAULT_RANGE_RECORDS:,})",
    )
    p.add_argument(
        "--parallelism",
        type=positive,
        default=None,
        metavar="N",
        help="ranges copying at once (default: Spark's default parallelism, e.g. N of local[N])",
    )
    p.set_defaults(func=run)
