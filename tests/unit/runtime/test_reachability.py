"""Cluster reachability: unreachable after the grace, back on the first answer, one line each."""

from __future__ import annotations

import logging
import time

import pytest
from confluent_kafka import KafkaError

from mm2py.runtime.reachability import Reachability, ReachabilityCollector, clock_time


class FakeClock:
    def __init__(self) -> None:
        self.mono = 1000.0
        self.wall = 1_750_000_000.0

    def advance(self, seconds: float) -> None:
        self.mono += seconds
        self.wall += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def tracker(clock: FakeClock, grace: float = 30.0) -> Reachability:
    return Reachability(
        {"A": "127.0.0.1:19092", "B": "127.0.0.1:29092"},
        {"A": grace, "B": grace},
        clock=lambda: clock.mono,
        wall=lambda: clock.wall,
    )


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [
        (r.levelno, r.getMessage())
        for r in caplog.records
        if r.name == "mm2py.runtime.reachability"
    ]


def test_unreachable_only_after_the_grace_and_since_the_first_failure(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    reach = tracker(clock)
    since = clock.wall
    reach.failed("B")
    with caplog.at_level(logging.INFO):
        for _ in range(29):
            clock.advance(1)
            reach.failed("B")  # later failures do not move "since"
            reach.check()
        assert reach.outage("B") is None and messages(caplog) == []
        clock.advance(1)
        reach.check()
        reach.check()
    outage = reach.outage("B")
    assert outage is not None and outage.since == since
    assert outage.describe() == f"cluster B (127.0.0.1:29092) since {clock_time(since)}"
    assert reach.outage("A") is None
    logged = messages(caplog)
    assert len(logged) == 1 and logged[0][0] == logging.WARNING
    assert "cluster B (127.0.0.1:29092) is unreachable: no answer since" in logged[0][1]
    assert clock_time(since) in logged[0][1] and "(30 s)" in logged[0][1]


def test_the_first_answer_makes_it_reachable_again_with_one_line(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    reach = tracker(clock, grace=3)
    reach.failed("A")
    clock.advance(5)
    reach.check()
    assert reach.outage("A") is not None
    caplog.clear()  # the "unreachable" line
    with caplog.at_level(logging.INFO):
        reach.succeeded("A")
        reach.succeeded("A")
        reach.check()
    assert reach.outage("A") is None
    assert messages(caplog) == [
        (
            logging.INFO,
            "cluster A (127.0.0.1:19092) is reachable again, after 5 s without an answer",
        )
    ]
    # A new outage counts from its own first failure.
    reach.failed("A")
    clock.advance(2)
    assert reach.outage("A") is None
    clock.advance(1)
    assert reach.outage("A") is not None


def test_an_answer_within_the_grace_clears_the_failure_silently(
    clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    reach = tracker(clock, grace=3)
    with caplog.at_level(logging.DEBUG):
        reach.failed("B")  # e.g. an idle connection closed by the broker
        clock.advance(2)
        reach.succeeded("B")
        clock.advance(10)
        reach.check()
    assert reach.outage("B") is None and messages(caplog) == []


def test_a_failure_counts_from_when_the_unanswered_request_was_sent(clock: FakeClock) -> None:
    reach = tracker(clock, grace=3)
    asked, asked_wall = clock.mono, clock.wall
    clock.advance(3)  # the request timed out just now
    reach.failed("B", at=asked)
    outage = reach.outage("B")
    assert outage is not None and outage.since == asked_wall


def test_error_cb_counts_transport_errors_only(clock: FakeClock) -> None:
    reach = tracker(clock, grace=1)
    note = reach.error_cb("B")
    note(KafkaError(KafkaError._MSG_TIMED_OUT))
    note(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED))
    clock.advance(2)
    assert reach.outage("B") is None
    note(KafkaError(KafkaError._ALL_BROKERS_DOWN))
    clock.advance(1)
    assert reach.outage("B") is not None
    reach.error_cb("A")(KafkaError(KafkaError._TRANSPORT))
    clock.advance(1)
    assert [o.alias for o in reach.outages(["B", "A", "B", "C"])] == ["B", "A"]


def test_a_refused_login_is_an_answer_until_the_cluster_answers_again(clock: FakeClock) -> None:
    reach = tracker(clock, grace=1)
    note = reach.error_cb("B")
    reach.unanswered("B", asked=clock.mono)
    note(KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED))  # it answered: "no"
    for _ in range(5):  # the probe's requests then get no answer: still reachable
        asked = clock.mono
        clock.advance(2)
        reach.unanswered("B", asked)
    assert reach.outage("B") is None
    reach.succeeded("B")  # a real answer ends the refusal
    asked = clock.mono
    clock.advance(2)
    reach.unanswered("B", asked)
    assert reach.outage("B") is not None
    # A transport error counts even while refused.
    reach.succeeded("A")
    reach.error_cb("A")(KafkaError(KafkaError._SSL))
    reach.error_cb("A")(KafkaError(KafkaError._TRANSPORT))
    clock.advance(1)
    assert reach.outage("A") is not None


def test_the_gauge_says_which_cluster_answers(clock: FakeClock) -> None:
    reach = tracker(clock, grace=1)
    reach.failed("B")
    clock.advance(1)
    (family,) = ReachabilityCollector(reach).collect()
    assert family.name == "mm2py_cluster_reachable"
    assert {s.labels["cluster"]: s.value for s in family.samples} == {"A": 1.0, "B": 0.0}


def test_clock_time_is_local_hours_minutes_seconds() -> None:
    wall = time.mktime((2026, 11, 23, 12, 3, 4, 0, 0, -1))
    assert clock_time(wall) == "12:03:04"
