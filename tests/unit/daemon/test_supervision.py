"""The daemon's supervisor with parts that need no cluster: restarts, pauses, status."""

from __future__ import annotations

import functools
import threading
import time
from pathlib import Path

import pytest

from mm2py.config import FlowConfig
from mm2py.daemon import supervisor
from mm2py.daemon.supervisor import Daemon, Supervised
from mm2py.runtime.part import Part
from tests.unit.daemon.conftest import offline_daemon


class Flaky(Part):
    """Fails its first run at once; later runs work until stopped."""

    name = "flaky"

    def __init__(self, flow: FlowConfig, daemon: Daemon, in_place: bool) -> None:
        super().__init__(flow, daemon.metrics)
        self.pauses_in_place = in_place
        self.runs = 0
        self.second_run = threading.Event()

    def run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            raise RuntimeError("num_partitions must be positive, got 0")
        self.second_run.set()
        self.stopping.wait()

    def pause(self) -> None:
        if self.pauses_in_place:
            self.paused = True  # keeps running, as the source part does
        else:
            super().pause()


@pytest.fixture
def daemon(tmp_path: Path) -> Daemon:
    return offline_daemon(tmp_path)


def _supervise_until(daemon: Daemon, done: threading.Event, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        daemon._supervise()
        if done.wait(0.05):
            return True
    return False


def test_a_part_paused_in_place_that_fails_is_restarted_and_shown_failed_meanwhile(
    daemon: Daemon,
) -> None:
    flow = daemon.flows[0]
    part = Flaky(flow, daemon, in_place=True)
    daemon.parts = [Supervised(part)]
    part.pause()
    part.start()
    part._thread.join(5)  # type: ignore[union-attr]
    assert part.error is not None and not part.running
    # Not hidden behind PAUSED: the failure shows with its trace until the restart.
    shown = daemon._part_status(daemon.parts[0])
    assert shown.state == "FAILED" and "num_partitions" in (shown.trace or "")
    assert _supervise_until(daemon, part.second_run, 5), "the failed run was not restarted"
    assert part.paused and daemon._part_status(daemon.parts[0]).state == "PAUSED"
    part.stop()


def test_a_part_paused_by_stopping_is_not_restarted_until_resumed(daemon: Daemon) -> None:
    flow = daemon.flows[0]
    part = Flaky(flow, daemon, in_place=False)
    part.runs = 1  # past its failing run
    daemon.parts = [Supervised(part)]
    part.start()
    assert part.second_run.wait(5)
    part.second_run.clear()
    part.pause()
    part._thread.join(5)  # type: ignore[union-attr]
    assert not part.running
    assert not _supervise_until(daemon, part.second_run, 1.5)
    assert daemon._part_status(daemon.parts[0]).state == "PAUSED"
    part.resume()
    assert part.second_run.wait(5) and part.running
    part.stop()


class CountedTask(Part):
    """Stands in for a TaskPart (whose start spawns a task process): counts its starts."""

    name = "source"

    def __init__(
        self,
        flow: FlowConfig,
        source: object,
        target: object,
        metrics: object,
        slot: object,
        stats: object,
    ) -> None:
        super().__init__(flow, metrics)  # type: ignore[arg-type]
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        super().start()

    def run(self) -> None:
        self.stopping.wait()


class AssignedAtOnce(Part):
    """A member the group gives task 0 as soon as it starts, on a thread of its own."""

    name = "member"

    def __init__(self, flow: FlowConfig, daemon: Daemon) -> None:
        super().__init__(flow, daemon.metrics)
        self.daemon = daemon

    def start(self) -> None:
        assign = functools.partial(self.daemon._tasks_assigned, self.flow, 1, {0})
        threading.Thread(target=assign, daemon=True).start()
        super().start()

    def run(self) -> None:
        self.stopping.wait()


class SlowToStart(Part):
    """A part whose start takes until the task's part is in the daemon's list (or 1 s),
    as starting the other members did on a busy machine."""

    name = "member"

    def __init__(self, flow: FlowConfig, daemon: Daemon) -> None:
        super().__init__(flow, daemon.metrics)
        self.daemon = daemon

    def start(self) -> None:
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline and not _tasks_of(self.daemon):
            time.sleep(0.01)
        super().start()

    def run(self) -> None:
        self.stopping.wait()


def _tasks_of(daemon: Daemon) -> list[CountedTask]:
    return [s.part for s in list(daemon.parts) if isinstance(s.part, CountedTask)]


def test_a_task_assigned_while_the_daemon_starts_its_members_is_started_once(
    daemon: Daemon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fan-in test found a flow's records twice on its target: the daemon's start-up went
    over the list of parts that a member's assignment had just added to, and started the
    task it had already started (two task processes copying the same partitions)."""
    monkeypatch.setattr(supervisor, "TaskPart", CountedTask)
    flow = daemon.flows[0]
    member, other = AssignedAtOnce(flow, daemon), SlowToStart(flow, daemon)
    daemon.parts = [Supervised(member), Supervised(other)]
    daemon._start_parts()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not _tasks_of(daemon):
        time.sleep(0.01)
    tasks = _tasks_of(daemon)
    try:
        assert len(tasks) == 1 and tasks[0].starts == 1
        assert tasks[0].running
    finally:
        for part in (member, other, *tasks):
            part.stop()


class Unanswered(Part):
    """A part stuck in a call to a cluster that does not answer: it sees the stop only
    when `answer` is set."""

    name = "unanswered"

    def __init__(self, flow: FlowConfig, daemon: Daemon) -> None:
        super().__init__(flow, daemon.metrics)
        self.answer = threading.Event()

    def run(self) -> None:
        self.answer.wait(30)


def test_stopping_passes_that_share_a_deadline_wait_for_a_stuck_part_once(
    daemon: Daemon,
) -> None:
    # The daemon stops its members first (each stops its task parts and the flow's
    # once-per-flow parts), then every part: a part stuck in a call is waited for in
    # the first pass, and the second must not wait for it all over again.
    stuck = Unanswered(daemon.flows[0], daemon)
    stuck.start()
    try:
        deadline = time.monotonic() + 1.0
        supervisor._stop_all([stuck], deadline)
        supervisor._stop_all([stuck], deadline)
        assert time.monotonic() < deadline + 0.5  # two full waits would end at +1.0
        assert stuck.running  # left to end on its own
    finally:
        stuck.answer.set()
