"""`mm2py verify`: prove the target's copies equal their source, partition by partition."""

from __future__ import annotations

import argparse
import sys

from mm2py.cli.arguments import Subparsers, add_pair_arguments, topics_pattern
from mm2py.errors import EXIT_FAILED, EXIT_OK


def run(args: argparse.Namespace) -> int:
    from mm2py.config import load_config
    from mm2py.tools.digest import format_json, format_text
    from mm2py.tools.translate import check_aliases
    from mm2py.tools.verify import PROGRESS_MIN_RECORDS, ProgressBar, Verifier

    config = load_config(args.config)
    flow = check_aliases(config, args.source, args.target)
    topics_pattern(args.topics)  # a bad --topics is a usage error before any cluster is read
    verifier = Verifier(config, flow)
    bar = None
    try:
        if sys.stderr.isatty():
            total = verifier.estimate(args.topics)
            if total >= PROGRESS_MIN_RECORDS:
                bar = ProgressBar(total)
        report = verifier.run(args.topics, bar)
    finally:
        if bar is not None:
            bar.close()
    sys.stdout.write(format_json(report) if args.json else format_text(report))
    return EXIT_OK if report.ok else EXIT_FAILED


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "verify",
        help="prove the target's copies equal their source, partition by partition",
        description=(
            "Read every replicated partition on both clusters (the source read_committed) "
            "and compare them record by record: count, and a digest over key, value, "
            "headers and timestamp in order, over the records both sides have. Status per "
            "partition: match; behind (equal so far, the rest not copied yet); mismatch; "
            "extra (the target has records its source does not); missing; unaligned "
            "(retention deleted the start on one side and no offset sync places it). "
            "Exit status 0 when every partition matches (or is behind), 1 otherwise, "
            "2 on a usage error."
        ),
    )
    add_pair_arguments(p)
    p.add_argument(
        "--topics",
        default=None,
        metavar="REGEX",
        help="only replicated topics whose source or remote name matches (default: all "
        "but heartbeats)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)
