"""Argument types and option groups that several commands share."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import TypeAlias

from mm2py.errors import UsageError

# A string: argparse's class is not subscriptable at run time.
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def aliases(text: str) -> list[str]:
    """A comma-separated list of cluster aliases (`A,B`)."""
    return [a.strip() for a in text.split(",") if a.strip()]


def positive(text: str) -> int:
    """An integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def add_pair_arguments(
    p: argparse.ArgumentParser,
    source_help: str = "alias of the source cluster",
    target_help: str = "alias of the target cluster",
) -> None:
    """CONFIG, --source and --target: the flow a command works on."""
    p.add_argument("config", type=Path, help="mm2.properties (MM2 format) or .yaml/.yml")
    p.add_argument("--source", required=True, help=source_help)
    p.add_argument("--target", required=True, help=target_help)


def topics_pattern(text: str | None) -> re.Pattern[str] | None:
    """The --topics REGEX compiled, or UsageError naming the option."""
    if text is None:
        return None
    try:
        return re.compile(text)
    except re.error as err:
        raise UsageError(f"--topics: invalid regular expression: {err}") from None
