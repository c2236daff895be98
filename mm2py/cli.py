"""The `mm2py` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from mm2py import __version__

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _aliases(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


# -- mm2py local ----------------------------------------------------------------


def _local(args: argparse.Namespace) -> int:
    from mm2py.local.launcher import LocalClusterError, LocalKafka

    kafka = LocalKafka(args.dir)
    try:
        if args.action == "up":
            clusters = kafka.up(args.clusters or ["A", "B"], secure=args.secure)
            for cluster in clusters:
                extra = ""
                if cluster.secure:
                    extra = (
                        f"  SASL_PLAINTEXT SCRAM-SHA-512, users {', '.join(cluster.users)} "
                        f"(passwords in {cluster.home / 'cluster.json'})"
                    )
                print(f"{cluster.alias}  {cluster.bootstrap_servers}{extra}")
        elif args.action == "down":
            stopped = kafka.down(args.clusters)
            print(
                "stopped " + (", ".join(stopped) if stopped else "nothing (no clusters recorded)")
            )
        else:
            known = kafka.known()
            if not known:
                print(f"no local clusters under {kafka.state_dir}")
            for cluster in known:
                state = "running" if kafka.is_running(cluster.alias) else "stopped"
                secured = " secured" if cluster.secure else ""
                print(f"{cluster.alias}  {cluster.bootstrap_servers}  {state}{secured}")
    except LocalClusterError as err:
        print(f"mm2py local {args.action}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "local",
        help="start/stop real single-node Kafka clusters on 127.0.0.1 (for demos and tests)",
        description=(
            "Real Apache Kafka (KRaft) clusters from Maven Central jars: A on 127.0.0.1:19092, "
            "B on :29092, C on :39092, D on :49092, E on :59092."
        ),
    )
    p.add_argument("action", choices=["up", "down", "status"])
    p.add_argument(
        "--clusters",
        type=_aliases,
        default=None,
        help="comma-separated aliases (default A,B; `down` defaults to all)",
    )
    p.add_argument(
        "--secure",
        type=_aliases,
        default=[],
        help="aliases to start with SASL_PLAINTEXT/SCRAM-SHA-512 and the StandardAuthorizer",
    )
    p.add_argument(
        "--dir", type=Path, default=None, help="state folder (default ~/.cache/mm2py/local)"
    )
    p.set_defaults(func=_local)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for tests and --help)."""
    parser = argparse.ArgumentParser(
        prog="mm2py",
        description="Replicate Kafka topics between clusters; compatible with MirrorMaker 2.",
    )
    parser.add_argument("--version", action="version", version=f"mm2py {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_local(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mm2py` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
