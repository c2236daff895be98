"""The errors a user sees: one line that says what failed and what to do, and an exit status.

Every failure the `mm2py` command reports subclasses `Mm2pyError`; the CLI's `main` is
the one place that prints them (`mm2py <command>: <message>` on stderr) and turns them
into the exit status. Commands raise them or let them propagate; they never print an
error or choose an exit status themselves. Anything else that escapes a command is a
bug and keeps its traceback.

- `Mm2pyError` (exit 1): a failure while running, e.g. a cluster refused the login,
  a range of the backfill failed.
- `UsageError` (exit 2): the command was not carried out, and nothing was written: a
  bad option or config, or a request refused (e.g. `--apply` while the group has
  members).

Errors that stay inside the daemon (a part fails, is logged, and is restarted with
backoff) are plain exceptions, not these.
"""

from __future__ import annotations

from typing import ClassVar

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a command stopped by Ctrl-C


class Mm2pyError(Exception):
    """A failure a user can act on; `str()` is the message, naming what failed and where.

    The default `__init__` is kept so that subclasses pickle (Spark ships errors back
    from its executors).
    """

    exit_status: ClassVar[int] = EXIT_FAILED

    def one_line(self) -> str:
        """The message as the CLI prints it: line breaks and runs of blanks made one space."""
        return " ".join(str(self).split())


class UsageError(Mm2pyError):
    """A bad option, config or request: nothing was done (exit status 2)."""

    exit_status: ClassVar[int] = EXIT_USAGE


class Interrupted(Mm2pyError):
    """The user stopped the command (Ctrl-C); the message says how to continue."""

    exit_status: ClassVar[int] = EXIT_INTERRUPTED
