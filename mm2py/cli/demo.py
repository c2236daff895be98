"""`mm2py demo` (dev tooling): local clusters A and B, live sample traffic replicated.

mm2py.dev is imported only when the command runs: the runtime never loads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mm2py.cli.arguments import Subparsers
from mm2py.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from mm2py.dev.demo import DEFAULT_CONFIG, run_demo

    config = DEFAULT_CONFIG if args.config is None else args.config
    run_demo(config, seconds=args.seconds, rate=args.rate, listen=args.listen)
    return EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "demo",
        help="start local clusters A and B, replicate live sample traffic, show it arriving",
    )
    p.add_argument("--config", type=Path, default=None)  # default: mm2py.dev.demo's
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--rate", type=float, default=5.0, help="orders per second produced to A")
    p.add_argument("--listen", default="127.0.0.1:8083", help="address for /metrics")
    p.set_defaults(func=run)
