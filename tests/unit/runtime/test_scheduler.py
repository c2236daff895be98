"""The parts' scheduler: when jobs run, what a failure does, against a fake clock."""

from __future__ import annotations

import logging
import math
import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from mm2py.runtime.scheduler import Scheduler


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Count:
    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


def test_jobs_run_at_once_then_every_interval_in_the_order_added() -> None:
    clock, ran = Clock(), []
    s = Scheduler("flow A->B", clock=clock)
    s.add("b", lambda: ran.append("b"), 10)
    s.add("a", lambda: ran.append("a"), 5)
    assert s.run_due() == 5
    assert ran == ["b", "a"]
    clock.now += 5
    assert s.run_due() == 5
    assert ran == ["b", "a", "a"]
    clock.now += 5
    s.run_due()
    assert ran == ["b", "a", "a", "b", "a"]


def test_a_late_run_never_brings_a_burst_to_catch_up() -> None:
    clock, ran = Clock(), []
    s = Scheduler("flow A->B", clock=clock)
    s.add("heartbeat", lambda: ran.append(clock.now), 1)
    s.run_due()
    clock.now += 4.5  # the part was busy for 4.5 intervals
    assert s.run_due() == 1  # one run now, not 4 more to catch up
    clock.now += 1
    s.run_due()
    assert ran == [100.0, 104.5, 105.5]


def test_the_schedule_keeps_its_rhythm_when_a_run_is_a_little_late() -> None:
    clock, ran = Clock(), []
    s = Scheduler("flow A->B", clock=clock)
    s.add("emit", lambda: ran.append(clock.now), 10)
    s.run_due()
    clock.now += 10.3
    s.run_due()
    assert s.run_due() == pytest.approx(9.7)  # due at 120, not 120.3


def test_a_job_without_interval_runs_once_and_a_delay_puts_off_the_first_run() -> None:
    clock, ran = Clock(), []
    s = Scheduler("flow A->B", clock=clock)
    s.add("once", lambda: ran.append("once"), None)
    s.add("later", lambda: ran.append("later"), 60, delay=30)
    assert s.run_due() == 30
    clock.now += 30
    s.run_due()
    clock.now += 60
    s.run_due()
    assert ran == ["once", "later", "later"]
    assert "once" not in s and "later" in s


def test_a_job_may_add_jobs_that_run_in_the_same_turn_and_remove_itself() -> None:
    clock, ran = Clock(), []
    s = Scheduler("flow A->B", clock=clock)

    def open_syncs() -> None:
        ran.append("open")
        s.remove("open")
        s.add("emit", lambda: ran.append("emit"), 60)

    s.add("open", open_syncs, 2)
    s.add("refresh", lambda: ran.append("refresh"), None)
    s.run_due()
    assert ran == ["open", "refresh", "emit"]
    assert "open" not in s


def test_a_failure_of_a_retried_kind_is_logged_counted_and_retried_next_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, errors, calls = Clock(), Count(), []

    def sync() -> None:
        calls.append(clock.now)
        raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    s = Scheduler("flow A->B", errors, clock=clock)
    s.add("syncing topic configs", sync, 600, retry_on=(KafkaException,))
    with caplog.at_level(logging.WARNING):
        assert s.run_due() == 600
    assert errors.value == 1
    assert "flow A->B: syncing topic configs failed (again in 600s): broker down" in caplog.text
    clock.now += 600
    s.run_due()
    assert calls == [100.0, 700.0]


def test_any_other_failure_propagates_and_fails_the_part() -> None:
    s = Scheduler("flow A->B", Count(), clock=Clock())

    def emit() -> None:
        raise RuntimeError("writing checkpoints failed")

    s.add("emit", emit, 60, retry_on=(KafkaException,))
    with pytest.raises(RuntimeError, match="writing checkpoints failed"):
        s.run_due()


def test_run_returns_when_stopping_or_when_no_job_is_left() -> None:
    ran: list[str] = []
    s = Scheduler("flow A->B")
    s.add("once", lambda: ran.append("once"), None)
    s.run(threading.Event())  # returns: nothing left to run
    assert ran == ["once"]
    stopping = threading.Event()
    s.add("stop", stopping.set, 3600)
    s.run(stopping)
    assert s.next_due() > 3000
    assert Scheduler("x").next_due() == math.inf


def test_an_interval_must_be_positive_and_finite() -> None:
    s = Scheduler("flow A->B")
    for bad in (0, -1, math.inf):
        with pytest.raises(ValueError, match="interval of emit"):
            s.add("emit", lambda: None, bad)
