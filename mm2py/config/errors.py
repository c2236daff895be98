"""The one exception a bad configuration raises."""

from __future__ import annotations

from pathlib import Path

from mm2py.errors import UsageError


class ConfigError(UsageError):
    """A configuration problem, rendered as one line: ``<file>: <key>: <problem>``.

    ``key`` is the MM2 key as the user wrote it (``A->B.topics``, ``A.bootstrap.servers``,
    ``line 12``), or None for problems with the file as a whole. Messages never contain
    secret values.
    """

    def __init__(self, path: str | Path, key: str | None, message: str) -> None:
        self.path = str(path)
        self.key = key
        self.message = " ".join(message.split())  # always one line
        super().__init__(str(self))

    def __str__(self) -> str:
        if self.key is None:
            return f"{self.path}: {self.message}"
        return f"{self.path}: {self.key}: {self.message}"
