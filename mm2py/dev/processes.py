"""Process trees on Linux, from /proc: for stopping a local service and all it started.

`process_tree(pid)` lists `pid` and its descendants alive now, parents first;
`kill_tree(pid)` SIGKILLs them all at once, as a crash of the machine would;
`signal_tree(pid, sig)` sends any signal (SIGSTOP freezes a tree in place, SIGCONT lets
it go on). Spark's Python workers, for one, run in a process group of their own, so a
process group is not enough. `environment(name, value)` sets a variable for a block: for
this process and what it starts in it.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator


@contextlib.contextmanager
def environment(name: str, value: str) -> Iterator[None]:
    """os.environ[name] = value for the block; what it was before (or unset) after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    with contextlib.suppress(OSError):
        for thread in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{thread}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    return kids


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants alive now, parents first."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        tree.append(current)
        todo.extend(_children(current))
    return tree


def signal_tree(pid: int, sig: signal.Signals) -> None:
    """Send `sig` to `pid` and all its descendants alive now."""
    for member in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all its descendants."""
    signal_tree(pid, signal.SIGKILL)
