"""The `mm2py` command line: one entry point, one module per command.

Each command module has `add_parser(subparsers)` and `run(args) -> int` (its exit
status when it completes). A command that fails raises an `mm2py.errors.Mm2pyError`
or lets one propagate; `main` is the one place that prints it, as one line on stderr,
and returns its exit status. Commands import what they need when they run, so that
`--help` stays quick and the runtime never loads mm2py.dev (`local`, `demo`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from mm2py import __version__
from mm2py.cli import backfill, demo, failover, local, plan, run, status, translate, verify
from mm2py.errors import EXIT_FAILED, Mm2pyError

log = logging.getLogger(__name__)

Command = Callable[[argparse.Namespace], int]

# In the order `--help` lists them.
COMMANDS = (run, plan, failover, translate, verify, backfill, status, local, demo)


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
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text: one line per event; json: one JSON object per line (time, level, "
        "logger, message, flow, topic, partition) for log shippers",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parser(sub)
    return parser


def error_prefix(command: str) -> str:
    """What a command's error line starts with."""
    # `mm2py run` keeps `mm2py: ...`, which the docs and their users' alerts rely on
    # (`mm2py: cluster D: authentication failed ...`); the others name themselves.
    return "mm2py" if command == "run" else f"mm2py {command}"


def run_command(command: str, func: Command, args: argparse.Namespace) -> int:
    """Run one command; an error it raises becomes one stderr line and its exit status.

    Mm2pyError carries its own status; a KafkaException that no command put in words
    is a failure while running (1). Anything else is a bug: it propagates with its
    traceback.
    """
    try:
        return func(args)
    except Mm2pyError as err:
        failure: Exception = err
        line, status = err.one_line(), err.exit_status
    except Exception as err:
        from confluent_kafka import KafkaException  # imported only once something failed

        if not isinstance(err, KafkaException):
            raise
        failure = err
        line, status = " ".join(str(err).split()), EXIT_FAILED
    log.debug("%s failed", command, exc_info=failure)  # the traceback, at --log-level DEBUG
    print(f"{error_prefix(command)}: {line}", file=sys.stderr)
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mm2py` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from mm2py import logs

    logs.configure(args.log_level, args.log_format)
    func: Command = args.func
    return run_command(args.command, func, args)
