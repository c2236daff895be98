"""One line for a failed Spark task, from the text of the error Spark gives the driver (pure).

A failed range reaches the driver as a Py4J error whose text is Spark's: the job's
abort reason, the executor's Python traceback, then Java stack frames ending in
``... 1 more``. `task_failure_line` finds in it:

- the copier's own message (`RangeCopyError: ...`), which already names the range
  and the Kafka error, and is returned as it is;
- otherwise the executor's Python exception (its type and message: the last line of
  the last Python traceback), where it ran (host and executor), how many attempts
  Spark made, and the Python the executors were told to start;
- without a Python traceback (e.g. the executor could not start its Python), the
  Java exception Spark reports for the lost task.

The line ends with what to do. It never ends in a stack frame.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_COPY_ERROR = re.compile(r"RangeCopyError: (.+)")
_LOST_TASK = re.compile(
    r"Lost task [\d.]+ in stage [\d.]+ \(TID \d+\) \((?P<host>\S+) executor (?P<executor>[^)]+)\):"
    r" (?P<cause>.*)"
)
_ATTEMPTS = re.compile(r"failed (\d+) times")
_PYTHON_EXCEPTION = re.compile(
    r"^(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt))(?::\s*(?P<message>.*))?$"
)
_TRACEBACK = "Traceback (most recent call last):"
_FRAME = re.compile(r"^\s*(at |\.\.\. \d+ more|Caused by: |\^)")

IMPORT_HINT = (
    "the executors' Python cannot import what the range copy needs: leave PYSPARK_PYTHON, "
    "spark.pyspark.python and spark.archives unset so that mm2py ships its own packed "
    "Python, or give --python-env with an environment that holds mm2py and confluent-kafka"
)
START_HINT = (
    "the executor could not start its Python: check --python-env or PYSPARK_PYTHON, "
    "and the executor's stderr (Spark's UI, or the worker's work/<app>/<executor>/stderr)"
)
OTHER_HINT = (
    "see the executor's stderr (Spark's UI, or the worker's work/<app>/<executor>/stderr); "
    "run the backfill again to continue from each partition's last commit"
)


@dataclass(frozen=True)
class TaskFailure:
    """What Spark's error text says about a failed task."""

    python_type: str | None  # e.g. "ModuleNotFoundError"; None: no Python traceback
    python_message: str
    host: str | None
    executor: str | None
    attempts: int | None
    java_cause: str | None  # Spark's one-line cause for the lost task


def parse_task_failure(text: str) -> TaskFailure:
    python_type, python_message = None, ""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith(_TRACEBACK)]
    if starts:
        for line in lines[starts[-1] + 1 :]:
            if line.startswith("\tat ") or line.startswith("Caused by: "):
                break
            found = _PYTHON_EXCEPTION.match(line.strip()) if not line.startswith(" ") else None
            if found:
                python_type, python_message = found["type"], (found["message"] or "").strip()
    lost = _LOST_TASK.search(text)
    attempts = _ATTEMPTS.search(text)
    cause = None
    if lost:
        cause = lost["cause"].strip()
        cause = cause.removesuffix(_TRACEBACK).strip().removesuffix(":").strip() or None
    return TaskFailure(
        python_type,
        python_message,
        lost["host"] if lost else None,
        lost["executor"] if lost else None,
        int(attempts[1]) if attempts else None,
        cause,
    )


def task_failure_line(text: str, what: str, python: str) -> str:
    """The line for a failed task copying `what` (a range) with executors' `python`."""
    copy_errors = _COPY_ERROR.findall(text)
    if copy_errors:
        return str(copy_errors[-1]).strip()
    failure = parse_task_failure(text)
    where = []
    if failure.executor is not None:
        where.append(f"on executor {failure.executor} at {failure.host}")
    if failure.attempts is not None:
        where.append(f"after {failure.attempts} attempts")
    where.append(f"executors' Python: {python}")
    context = f"copying {what} failed ({', '.join(where)})"
    if failure.python_type is not None:
        error = failure.python_type + (
            f": {failure.python_message}" if failure.python_message else ""
        )
        imports = failure.python_type in ("ModuleNotFoundError", "ImportError")
        return f"{context}: {error}; {IMPORT_HINT if imports else OTHER_HINT}"
    if failure.java_cause is not None:
        starting = "Cannot run program" in failure.java_cause
        return f"{context}: {failure.java_cause}; {START_HINT if starting else OTHER_HINT}"
    meaningful = [
        line.strip() for line in text.splitlines() if line.strip() and not _FRAME.match(line)
    ]
    last = meaningful[-1] if meaningful else "no reason given"
    return f"{context}: {last}; {OTHER_HINT}"
