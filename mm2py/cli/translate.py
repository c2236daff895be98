"""`mm2py translate-offsets`: a consumer group's positions on the target, from checkpoints."""

from __future__ import annotations

import argparse
import sys

from mm2py.cli.arguments import Subparsers, add_pair_arguments
from mm2py.errors import EXIT_FAILED, EXIT_OK, Mm2pyError, UsageError


def run(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from mm2py.config import load_config
    from mm2py.tools.translate import (
        apply_offsets,
        check_aliases,
        format_json,
        format_text,
        gather,
    )

    if args.accept_inexact and not args.apply:
        raise UsageError("--accept-inexact goes with --apply")
    config = load_config(args.config)
    flow = check_aliases(config, args.source, args.target)
    try:
        report = gather(config, flow, args.group, args.topic or ())
    except (KafkaException, TimeoutError) as err:
        raise Mm2pyError(f"reading checkpoints on {args.target} failed: {err}") from err
    failure = None
    if args.apply:
        try:
            # ApplyRefused (exit 2) propagates: nothing applied.
            apply_offsets(config, report, args.accept_inexact)
        except KafkaException as err:
            # The report is printed all the same: it shows what --apply tried to commit.
            failure = Mm2pyError(
                f"committing offsets of group {args.group} on {args.target} failed: {err}"
            )
    sys.stdout.write(format_json(report) if args.json else format_text(report))
    if failure is not None:
        raise failure
    return EXIT_OK if report.exact else EXIT_FAILED


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "translate-offsets",
        help="a consumer group's positions on the target cluster, from MM2's checkpoints",
        description=(
            "Print, per remote topic partition, the group's upstream offset, its translated "
            "downstream offset and the checkpoint's age, from <source>.checkpoints.internal "
            "on the target (written by mm2py or by MirrorMaker 2). Partitions that cannot "
            "be translated, or whose position the offset syncs do not prove exact, are "
            "listed with the reason. Exit status: 0 every partition ok (exact; applied with "
            "--apply), 1 something not translated or not exact yet (--apply then commits "
            "nothing, unless --accept-inexact), 2 usage error or --apply refused."
        ),
    )
    add_pair_arguments(
        p, "alias of the cluster the group ran on", "alias of the cluster to fail over to"
    )
    p.add_argument("--group", required=True, help="consumer group id")
    p.add_argument(
        "--topic",
        action="extend",
        nargs="+",
        metavar="T",
        help="only these topics (source or remote names): --topic T U or --topic T --topic U",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--apply",
        action="store_true",
        help="commit the translated offsets to the group on the target, only when every "
        "partition is ok (refused while the group has members there)",
    )
    p.add_argument(
        "--accept-inexact",
        action="store_true",
        help="with --apply, commit the checkpoints even where the offset syncs do not prove "
        "them exact (each at or before the group's position: records may be read twice)",
    )
    p.set_defaults(func=run)
