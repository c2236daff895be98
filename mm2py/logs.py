"""Log output: one line per event, as text for people or JSON for log shippers.

Events about a flow carry `flow` (and `part`) from the thread that logs them: each
part's thread sets its context once (`set_context`), so every line it writes,
librdkafka's included, is attributed without passing the flow around. Events about
one partition add `topic` and `partition` with `extra=partition_fields(...)`.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import sys
import threading
import time
from typing import Any, Final, Literal

LogFormat = Literal["text", "json"]

# Fields an event may carry besides its message, in the order JSON lines show them.
CONTEXT_FIELDS: Final = ("flow", "part", "topic", "partition", "group")

_context = threading.local()
_chosen: tuple[str, LogFormat] = ("INFO", "text")


def chosen() -> tuple[str, LogFormat]:
    """The level and format `configure` was last given (for a task process to log alike)."""
    return _chosen


def set_context(**fields: str | int | None) -> None:
    """Attach fields (flow, part, ...) to every event the current thread logs from now on."""
    _context.fields = {k: v for k, v in fields.items() if v is not None}


def partition_fields(topic: str, partition: int) -> dict[str, Any]:
    """`extra=` for an event about one topic partition."""
    return {"topic": topic, "partition": partition}


class ContextFilter(logging.Filter):
    """Copies the thread's context onto each record (explicit extras win)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in getattr(_context, "fields", {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


def _one_line(text: str) -> str:
    return " ".join(text.split())


class TextFormatter(logging.Formatter):
    """`time level logger message`, on one line; an exception is summarised, not dumped.

    The full traceback of a failed part is in its REST status and in JSON logs.
    """

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text
        record.exc_info, record.exc_text = None, None
        try:
            line = _one_line(super().format(record))
        finally:
            record.exc_info, record.exc_text = saved
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            line += f" [{type(exc).__name__}: {_one_line(str(exc))}]"
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the context fields."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": _iso_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                event[key] = value
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str, ensure_ascii=False)


def _iso_time(created: float) -> str:
    """RFC 3339 in UTC with milliseconds, e.g. 2024-05-01T12:00:00.123Z."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
    return f"{seconds}.{int(created % 1 * 1000):03d}Z"


def configure(level: str = "INFO", fmt: LogFormat = "text") -> None:
    """Send every log event to stderr, one line each, in the chosen format.

    A crash in native code (librdkafka, confluent-kafka) also writes every thread's
    Python stack to stderr (plain text, even in JSON mode) before the process dies, so
    its log says what each thread was doing.
    """
    global _chosen
    _chosen = (level, fmt)
    # A stderr with no file descriptor (io.UnsupportedOperation): no crash report.
    with contextlib.suppress(OSError, ValueError):
        faulthandler.enable(sys.stderr)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
