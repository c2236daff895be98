"""The spare task process: kept only while the node may be given more tasks, one at a time.

Real processes, forked by the task server as a node's are (the first spare starts the
server, in this test's process: an interpreter importing the copy path).
"""

from __future__ import annotations

import multiprocessing
import time

from mm2py.cluster.task import SpareProcess


def _settled(spares: SpareProcess, timeout: float = 60.0) -> None:
    """Until no spare is starting (the refill thread has handed its process over)."""
    deadline = time.monotonic() + timeout
    while spares._starting and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not spares._starting


def _children() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.pid is not None}


def test_a_node_that_may_be_given_tasks_keeps_one_spare_and_a_full_one_none() -> None:
    may_be_given = [True]
    spares = SpareProcess()
    taken = []
    try:
        spares.prime(lambda: may_be_given[0])
        _settled(spares)
        primed = spares._ready
        assert primed is not None and primed[0].is_alive()

        taken.append(spares.take())  # the primed one; another takes its place
        assert taken[0][0] is primed[0]
        _settled(spares)
        second = spares._ready
        assert second is not None and second[0].is_alive()

        may_be_given[0] = False  # the node now runs every task of its flows
        taken.append(spares.take())  # the spare; none started after it
        assert taken[1][0] is second[0]
        _settled(spares)
        assert spares._ready is None
        assert _children() == {taken[0][0].pid, taken[1][0].pid}

        may_be_given[0] = True  # a task went to another node: it may come back
        spares.refill()
        spares.refill()  # one at a time
        _settled(spares)
        third = spares._ready
        assert third is not None
        assert _children() == {taken[0][0].pid, taken[1][0].pid, third[0].pid}
    finally:
        spares.close()  # waits 2 s for the ready one; on a busy machine its import may take longer
        for _process, conn in taken:
            conn.close()  # a spare with no task exits when its pipe closes (after its import)
        for child in multiprocessing.active_children():
            child.join(60)
    assert not _children()


def test_a_closed_node_starts_no_spare() -> None:
    spares = SpareProcess()
    spares.close()
    spares.prime(lambda: True)
    spares.refill()
    assert spares._ready is None and not spares._starting
    assert not _children()
