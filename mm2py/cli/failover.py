"""`mm2py failover`: move consumer groups from the source to the target (planned or disaster)."""

from __future__ import annotations

import argparse
import re
import sys

from mm2py.cli.arguments import Subparsers, add_pair_arguments, positive
from mm2py.errors import EXIT_FAILED, EXIT_OK, UsageError


def run(args: argparse.Namespace) -> int:
    from mm2py.config import load_config
    from mm2py.tools.failover import disaster_failover, diverged_tail, planned_failover
    from mm2py.tools.translate import check_aliases

    try:
        groups = re.compile(args.groups) if args.groups is not None else None
    except re.error as err:
        raise UsageError(f"--groups: invalid regular expression: {err}") from None
    config = load_config(args.config)
    flow = check_aliases(config, args.source, args.target)
    if args.diverged:
        result = diverged_tail(config, flow)
    elif args.disaster:
        result = disaster_failover(config, flow, groups, args.dry_run)
    else:
        result = planned_failover(config, flow, groups, args.timeout, args.dry_run)
    sys.stdout.write(result.to_json() if args.json else result.to_text())
    return EXIT_OK if result.ok else EXIT_FAILED


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "failover",
        help="move consumer groups from the source to the target at exact positions",
        description=(
            "A planned failover (producers on the source stopped, the replicator running): "
            "wait until everything the source had when the command started is copied and "
            "every selected group's positions are proven exact by checkpoints and offset "
            "syncs, then commit them on the target, all groups or none. A group with "
            "members on the target refuses the command. Exit status 0 when every group "
            "partition is exact (and committed, unless --dry-run); 1 when the timeout "
            "passes first, naming what is missing; 2 usage error or refused. --disaster reads "
            "only the target: commits the newest checkpoints and lists what was never copied. "
            "Failback after a disaster (A->B): --source B --target A --planned moves the "
            "groups back, those that read A's topics through their copies on B to those "
            "topics on A, translated exactly through A->B's offset syncs; --diverged lists "
            "what A took in that B never got."
        ),
    )
    add_pair_arguments(p)
    p.add_argument(
        "--groups",
        default=None,
        metavar="REGEX",
        help="only the flow's checkpointed groups (failing back, also the groups on the source's "
        "copies of the target's topics) whose name matches in full (default: all)",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--planned",
        action="store_true",
        help="the source is up and its producers stopped: wait for exact positions (default)",
    )
    mode.add_argument(
        "--disaster",
        action="store_true",
        help="the source is lost: commit the newest checkpoints without waiting on it, and "
        "list per partition what was never copied",
    )
    mode.add_argument(
        "--diverged",
        action="store_true",
        help="failback (--source B --target A after a disaster A->B): list per partition the "
        "records A took in that A->B never copied to B; commits nothing",
    )
    p.add_argument(
        "--timeout",
        type=positive,
        default=300,
        metavar="SECONDS",
        help="--planned: how long to wait for the copy and for exact positions (default 300)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="show what it would commit; commit nothing"
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)
