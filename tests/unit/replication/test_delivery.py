"""The delivery proof through its API, fed delivery reports by hand: which source offsets
count as copied, which must be copied again, and what it tells its committer. No client.
"""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError

from mm2py.replication.committers import Committer
from mm2py.replication.delivery import (
    NONE_UNPROVEN,
    DeliveryProof,
    PartitionState,
    Run,
)
from mm2py.replication.stats import PartitionStats, ReplicationStats
from tests.unit.replication.test_copy_loop import Record

TS = 1_700_000_000_000


class RecordingCommitter(Committer):
    """Keeps what the proof tells it."""

    def __init__(self) -> None:
        super().__init__("A->B", None, None, None, {})  # type: ignore[arg-type]
        self.copied: list[tuple[int, int, int]] = []  # (count, first ts, last ts)
        self.found_syncs: list[tuple[int, int]] = []
        self.again: list[int] = []
        self.unproven: list[str] = []
        self.rejections: list[str] = []

    def end_batch(self, caught_up: bool) -> None:
        raise AssertionError("not the proof's")

    def records_read(self) -> None:
        raise AssertionError("not the proof's")

    def record_progress(self, wait_until: float | None = None) -> None:
        raise AssertionError("not the proof's")

    def commit(self, timeout: float = 0) -> None:
        raise AssertionError("not the proof's")

    def copied_through(self, state: PartitionState) -> int:
        raise AssertionError("not the proof's")

    def finish(self, deadline: float) -> None:
        raise AssertionError("not the proof's")

    def on_copied(
        self, stats: PartitionStats, count: int, first_ts: int, last_ts: int, now: float
    ) -> None:
        self.copied.append((count, first_ts, last_ts))

    def on_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        self.found_syncs.append((upstream, downstream))

    def copy_again(self, state: PartitionState, offset: int) -> str:
        self.again.append(offset)
        return f"again from {offset}"

    def not_proven(self, reason: str) -> None:
        self.unproven.append(reason)

    def rejected(self, reason: str) -> None:
        self.rejections.append(reason)


class Setup:
    def __init__(self, per_record: bool = False) -> None:
        self.committer = RecordingCommitter()
        self.stopped: list[tuple[int, str, int]] = []
        self.per_record_reports: set[tuple[str, int]] = set()
        self.proof = DeliveryProof(
            "A->B",
            "B",
            self.committer,
            lambda _state, offset, reason, size: self.stopped.append((offset, reason, size)),
            self.per_record_reports,
        )
        stats = ReplicationStats("A", "B").partition("A.t", 0)
        self.state = PartitionState("t", 0, "A.t", stats, report_every_record=per_record)

    def run(self, first: int, count: int, ts: int = TS) -> tuple[Run, list[Any]]:
        """A run of `count` records from `first`, sent (closed) with their callbacks."""
        run = self.proof.start_run(self.state, first, ts)
        callbacks = self.proof.reports(run, count)
        run.close(count)
        return run, callbacks


def _ack(callback: Any, target_offset: int) -> None:
    callback(None, Record("A.t", 0, target_offset))


def _refuse(callback: Any, code: int, value: bytes = b"v") -> None:
    callback(KafkaError(code), Record("A.t", 0, -1, value=value))


def test_a_run_asks_for_its_first_and_last_reports_unless_every_record_reports() -> None:
    one = Setup()
    run, callbacks = one.run(10, 4)
    assert callbacks == [run.on_end, None, None, run.on_end]
    single_run, single = one.run(30, 1)
    assert single == [single_run.on_end]
    every = Setup(per_record=True)
    run, callbacks = every.run(10, 3)
    assert callbacks == [run.on_delivery] * 3


def test_first_and_last_reports_count_apart_prove_the_run() -> None:
    s = Setup()
    _run, callbacks = s.run(10, 4, ts=TS)
    _ack(callbacks[0], 100)
    assert s.state.acked == -1  # only its first record is known so far
    _ack(callbacks[3], 103)
    assert (s.state.acked, s.state.acked_downstream) == (13, 103)
    assert s.committer.copied == [(4, TS, TS)]
    assert s.committer.found_syncs == [(10, 100)]  # the first record after a start
    assert s.state.unproven_from == NONE_UNPROVEN and s.proof.report_served
    assert s.committer.again == [] and s.committer.unproven == []


def test_a_gap_between_first_and_last_leaves_only_the_first_record_proven() -> None:
    s = Setup()
    _run, callbacks = s.run(10, 4)
    _ack(callbacks[0], 100)
    _ack(callbacks[3], 105)  # another writer's two records landed inside the run
    assert s.state.acked == 10 and s.state.unproven_from == 11
    assert s.committer.copied == [(1, TS, TS)]
    assert s.committer.again == [11] and s.per_record_reports == {("t", 0)}
    [reason] = s.committer.unproven
    assert "offsets 11..13 to B is not proven" in reason and "not one after another" in reason
    assert "again from 11" in reason


def test_a_refused_first_record_makes_the_whole_run_copied_again() -> None:
    s = Setup()
    _run, callbacks = s.run(10, 3)
    _refuse(callbacks[0], KafkaError.MSG_SIZE_TOO_LARGE)
    _refuse(callbacks[2], KafkaError.MSG_SIZE_TOO_LARGE)  # handled with the first
    assert s.state.acked == -1 and s.state.unproven_from == 10
    assert s.committer.again == [10] and s.committer.copied == []
    assert s.stopped == []  # which record it was shows when each reports


def test_per_record_reports_sync_after_a_gap_and_name_a_rejected_record() -> None:
    s = Setup(per_record=True)
    _run, callbacks = s.run(0, 6)
    _ack(callbacks[0], 0)
    _ack(callbacks[1], 1)
    _ack(callbacks[2], 3)  # a foreign record at 2
    _refuse(callbacks[3], KafkaError.MSG_SIZE_TOO_LARGE, value=b"big")
    assert s.committer.found_syncs == [(0, 0), (2, 3)]
    assert s.stopped == [(3, KafkaError(KafkaError.MSG_SIZE_TOO_LARGE).str(), 3)]
    # Records 0..2 were acknowledged before the rejected one.
    assert (s.state.acked, s.state.acked_downstream) == (2, 3)
    assert s.committer.copied == [(3, TS, TS)]


def test_acknowledged_so_far_counts_a_run_still_reporting() -> None:
    s = Setup(per_record=True)
    _run, callbacks = s.run(40, 5)
    for i, callback in enumerate(callbacks[:3]):
        _ack(callback, 200 + i)
    assert s.state.acked == -1  # a whole run is counted at its end
    s.state.acknowledged_so_far()
    assert (s.state.acked, s.state.acked_downstream) == (42, 202)
    for i, callback in enumerate(callbacks[3:], start=3):
        _ack(callback, 200 + i)
    assert s.state.acked == 44 and s.committer.copied == [(5, TS, TS)]


def test_a_timed_out_record_ends_the_loop_and_counts_nothing() -> None:
    s = Setup()
    s.committer.fail("an earlier failure")
    _run, callbacks = s.run(10, 2)
    _refuse(callbacks[0], KafkaError._MSG_TIMED_OUT)
    # A timeout replaces an earlier reason: the part restarts from its last progress.
    assert s.committer.restart_reason is not None
    assert "copying t-0 offset 10 to A.t on B failed" in s.committer.restart_reason
    assert s.state.unproven_from == NONE_UNPROVEN and s.committer.again == []
    assert s.state.acked == -1 and s.stopped == []


def test_a_fatal_producer_error_ends_the_loop_with_the_first_reason() -> None:
    s = Setup(per_record=True)
    _run, callbacks = s.run(10, 2)
    fatal = KafkaError(KafkaError._FENCED, fatal=True)
    callbacks[0](fatal, Record("A.t", 0, -1))
    callbacks[1](fatal, Record("A.t", 0, -1))
    assert s.committer.restart_reason == f"writing to B: {fatal.str()}"
    assert s.stopped == [] and s.state.acked == -1


def test_a_run_cut_before_its_last_report_is_unproven_past_its_first_record() -> None:
    s = Setup()
    run = s.proof.start_run(s.state, 10, TS)
    callbacks = s.proof.reports(run, 5)
    run.close(3)  # only three were sent: the third asked for no report
    s.proof.cut(run, 13)
    assert s.state.unproven_from == 11
    [reason] = s.committer.unproven
    assert "t-0 offsets 11..12 were sent without the report that proves them" in reason
    _ack(callbacks[0], 50)
    assert s.state.acked == -1 and s.committer.copied == []
    # Reporting every record, a cut run is proven record by record.
    every = Setup(per_record=True)
    run = every.proof.start_run(every.state, 10, TS)
    run.close(3)
    every.proof.cut(run, 13)
    assert every.state.unproven_from == NONE_UNPROVEN and every.committer.unproven == []
