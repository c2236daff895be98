"""`mm2py plan`: what `mm2py run` would do with a config, read from the clusters; writes nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mm2py.cli.arguments import Subparsers, aliases
from mm2py.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from mm2py.config import ConfigError, load_config
    from mm2py.tools.plan import format_plan, make_plan, plan_json

    config = load_config(args.config)
    for alias in args.clusters or []:
        if alias not in config.clusters:
            known = ", ".join(config.clusters)
            raise ConfigError(
                args.config, "--clusters", f"unknown cluster {alias!r}; known: {known}"
            )
    plan = make_plan(config, args.clusters)
    sys.stdout.write(plan_json(plan) if args.json else format_plan(plan))
    return EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "plan",
        help="show what `mm2py run` would do with a config; writes nothing",
        description=(
            "Read every cluster the config's flows use and show, per flow: the topics it "
            "would copy (remote name, the rule that selected each) and leave out (why), "
            "remote topics to create or grow with their configs, config changes to remote "
            "topics, ACLs to create, groups to checkpoint, the backlog; and the internal "
            "topics it would create. Exit status 0; 2 for a bad config; 1 when a cluster "
            "cannot be read (it is named)."
        ),
    )
    p.add_argument("config", type=Path, help="mm2.properties (MM2 format) or .yaml/.yml")
    p.add_argument(
        "--clusters",
        type=aliases,
        default=None,
        help="only flows whose target is one of these aliases (as `mm2py run --clusters`)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=run)
