"""Where mm2py keeps files between runs: ``$MM2PY_CACHE``, else ``~/.cache/mm2py`` (the
jars of local clusters, their state, packed executor Pythons)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder (not created here)."""
    return Path(os.environ.get("MM2PY_CACHE", Path.home() / ".cache" / "mm2py"))
