"""Periodic work of a part, run on the part's own thread (as MM2's Scheduler).

A part adds named jobs with `add(name, job, interval)`, then calls `run(stopping)` or,
when its loop has a rhythm of its own, `run_due()` once per turn (waiting at most the
seconds it returns).

Invariants:
- a job first runs `delay` seconds after it was added, then every `interval` counted
  from when it was due; a run more than one interval late restarts the rhythm, so runs
  never burst to catch up; `interval=None` runs once;
- jobs due together run in the order they were added; a job may add or remove jobs;
- an exception of a type in the job's `retry_on` is logged, counted in `errors` and
  retried at the next interval; any other propagates and fails the part.
Design: docs/design/runtime.md.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from mm2py.kafka.clients import error_text

log = logging.getLogger(__name__)


class Counter(Protocol):
    """What the scheduler counts failures with (a Prometheus counter child)."""

    def inc(self, amount: float = 1) -> None: ...


@dataclass
class _Job:
    name: str
    run: Callable[[], None]
    interval: float | None
    due: float
    retry_on: tuple[type[Exception], ...]


class Scheduler:
    """Named jobs, each run every `interval` seconds by the thread that owns the scheduler."""

    def __init__(
        self,
        owner: str,
        errors: Counter | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`owner` starts the log lines (e.g. "flow A->B"); `errors` counts retried failures."""
        self.owner = owner
        self._errors = errors
        self._clock = clock
        self._jobs: dict[str, _Job] = {}

    def add(
        self,
        name: str,
        job: Callable[[], None],
        interval: float | None,
        *,
        delay: float = 0.0,
        retry_on: tuple[type[Exception], ...] = (),
    ) -> None:
        """Run `job` `delay` seconds from now, then every `interval` seconds (None: once).

        A job added under a name in use replaces that one.
        """
        if interval is not None and not (0 < interval < math.inf):
            raise ValueError(f"{self.owner}: interval of {name} must be > 0 s, not {interval}")
        self._jobs.pop(name, None)  # a replaced job goes to the end of the order
        self._jobs[name] = _Job(name, job, interval, self._clock() + delay, retry_on)

    def remove(self, name: str) -> None:
        """Run `name` no more (nothing happens if there is no such job)."""
        self._jobs.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._jobs

    def run_due(self) -> float:
        """Run every job that is due; return the seconds until the next one is (inf: none)."""
        now = self._clock()
        ran: set[str] = set()
        while True:
            job = next((j for j in self._jobs.values() if j.due <= now and j.name not in ran), None)
            if job is None:
                break
            ran.add(job.name)
            self._run(job, now)
        return self.next_due()

    def next_due(self) -> float:
        """Seconds until the next job is due (0 if one is overdue, inf if there is none)."""
        if not self._jobs:
            return math.inf
        return max(min(j.due for j in self._jobs.values()) - self._clock(), 0.0)

    def run(self, stopping: threading.Event) -> None:
        """Run the jobs as they fall due until `stopping` is set or no job is left."""
        while not stopping.is_set():
            wait = self.run_due()
            if wait == math.inf:
                return
            stopping.wait(wait)

    def _run(self, job: _Job, now: float) -> None:
        # Scheduled before running, so that the job may remove or replace itself.
        if job.interval is None:
            del self._jobs[job.name]
        else:
            job.due += job.interval
            if job.due <= now:  # over an interval late: start the rhythm again from now
                job.due = now + job.interval
        try:
            job.run()
        except job.retry_on as exc:
            if self._errors is not None:
                self._errors.inc()
            again = "not again" if job.interval is None else f"again in {job.interval:g}s"
            log.warning("%s: %s failed (%s): %s", self.owner, job.name, again, error_text(exc))
