"""How a benchmark reports: one JSON line per result on stdout (`emit`), the machine's load
averages beside it, logs under `logs_dir()`, and the `--set KEY=VALUE` option every
benchmark with replicators takes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from mm2py.cache import cache_root

log = logging.getLogger(__name__)


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): a property for every replicator's config, to try
    settings; the parsed value is a list of (key, value), ``dict(args.set)``."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_property_setting,
        metavar="KEY=VALUE",
        help="a property for every replicator's config, e.g. B.producer.linger.ms=5",
    )


def _property_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. B.producer.linger.ms=5)")
    return key.strip(), value


def emit(line: dict[str, Any]) -> None:
    """Print one result as a JSON line on stdout."""
    print(json.dumps(line), flush=True)


def logs_dir() -> Path:
    """Where the perf tools' JVMs log."""
    path = cache_root() / "bench-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def load_averages() -> list[float]:
    """The 1, 5 and 15 minute load averages, for the JSON lines."""
    return [round(x, 2) for x in os.getloadavg()]
