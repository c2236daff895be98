"""The two committers through the hooks the copy loop and the delivery proof call, with
fake clients: what each records when, and what ends the loop."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import pytest

from mm2py.replication import committers
from mm2py.replication.committers import (
    AtLeastOnce,
    ExactlyOnce,
    PartitionRejected,
    RunUnproven,
    Transactions,
)
from mm2py.replication.delivery import PartitionState
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.stats import ReplicationStats
from mm2py.replication.transactions import TransactionLog, TransactionWriter
from tests.unit.replication.test_copy_loop import (
    FakeProducer,
    FakeProgress,
    FakeTransactionalProducer,
    FakeTransactionalProgress,
)

TS = 1_700_000_000_000


def _state() -> PartitionState:
    return PartitionState("t", 0, "A.t", ReplicationStats("A", "B").partition("A.t", 0))


def _written_syncs(syncs: OffsetSyncWriter) -> int:
    fake: FakeProducer = syncs._producer
    fake.poll()
    return len(fake.written)


def _at_least_once() -> tuple[AtLeastOnce, PartitionState, OffsetSyncWriter, FakeProgress]:
    state = _state()
    syncs = OffsetSyncWriter(FakeProducer(), "mm2-offset-syncs.B.internal")
    progress = FakeProgress()
    committer = AtLeastOnce(
        "A->B",
        FakeProducer(),
        progress,  # type: ignore[arg-type]
        syncs,
        {("t", 0): state},
    )
    return committer, state, syncs, progress


def _exactly_once(
    interval: float = 3600.0,
) -> tuple[ExactlyOnce, PartitionState, OffsetSyncWriter, FakeTransactionalProducer]:
    state = _state()
    syncs = OffsetSyncWriter(FakeProducer(), "mm2-offset-syncs.B.internal")
    producer = FakeTransactionalProducer()
    committer = ExactlyOnce(
        "A->B",
        "B",
        producer,
        FakeTransactionalProgress(),  # type: ignore[arg-type]
        syncs,
        {("t", 0): state},
        Transactions(interval, TransactionLog(logging.getLogger("t"))),
    )
    return committer, state, syncs, producer


def test_at_least_once_writes_syncs_and_counts_at_once_and_progress_when_asked() -> None:
    committer, state, syncs, progress = _at_least_once()
    committer.on_sync(state, 0, 0)
    committer.on_copied(state.stats, 3, TS, TS, TS / 1000.0)
    assert _written_syncs(syncs) == 1 and state.stats.records == 3
    state.acked, state.acked_downstream = 2, 2
    committer.record_progress()
    assert progress.written == {("t", 0): 2} and state.committed == 2
    assert committer.copied_through(state) == 2


def test_at_least_once_copies_again_in_place_and_ends_the_loop_on_a_failure() -> None:
    committer, state, _syncs, _progress = _at_least_once()
    assert "again from offset 5" in committer.copy_again(state, 5)
    assert committer.copy_again_now == {("t", 0): state}
    committer.not_proven("not proven")  # copied again in place: the loop goes on
    committer.rejected("rejected")  # only the partition stops
    committer.end_batch(caught_up=True)
    committer.fail("first")
    committer.fail("second")
    with pytest.raises(RuntimeError, match=r"^first$"):
        committer.end_batch(caught_up=True)


def test_exactly_once_holds_syncs_and_counts_until_the_commit_with_progress() -> None:
    committer, state, syncs, producer = _exactly_once()
    committer.records_read()
    assert producer.open == []  # a transaction opened with the records read
    committer.on_sync(state, 0, 0)
    committer.on_copied(state.stats, 3, TS, TS, TS / 1000.0)
    state.acked, state.acked_downstream = 2, 2
    assert _written_syncs(syncs) == 0 and state.stats.records == 0
    committer.record_progress()  # progress goes in the transaction, not every second
    assert producer.commits == []
    committer.commit()
    [committed] = producer.commits
    assert [r.value() for r in committed] == [b"t-0:2"]
    assert _written_syncs(syncs) == 2  # the held one, then the latest at progress
    assert state.stats.records == 3 and committer.copied_through(state) == 2


def test_exactly_once_commits_when_its_interval_is_due() -> None:
    committer, _, _, producer = _exactly_once(interval=0.0)
    assert committer.read_wait(1.0) == 1.0  # nothing open: the loop's wait
    committer.records_read()
    assert committer.read_wait(1.0) == 0.0  # due at once
    committer.end_batch(caught_up=False)
    assert len(producer.commits) == 1


def test_exactly_once_a_rejection_or_an_unproven_run_ends_the_loop_and_aborts() -> None:
    committer, state, _syncs, producer = _exactly_once()
    committer.records_read()
    assert committer.copy_again(state, 5) == (
        "the transaction is aborted; the next one copies it again"
    )
    assert committer.copy_again_now == {}
    committer.not_proven("run 1 not proven")
    with pytest.raises(RunUnproven, match="run 1 not proven"):
        committer.end_batch(caught_up=False)
    committer.rejected("record 7 rejected")
    assert committer.aborting
    committer.fail("a later failure")  # once a record was rejected, that is the reason
    assert committer.restart_reason is None
    with pytest.raises(PartitionRejected, match="record 7 rejected"):
        committer.end_batch(caught_up=False)
    committer.finish(deadline=0.0)
    assert producer.aborts == 1 and producer.commits == []


class _TimedWriter(TransactionWriter):
    """A TransactionWriter whose settle and progress write take `took` s of a fake clock;
    records the timeout each step is given."""

    def __init__(self, clock: list[float], took: dict[str, float]) -> None:
        self.clock = clock
        self.took = took
        self.given: list[tuple[str, float]] = []

    def _step(self, name: str, timeout: float) -> None:
        self.given.append((name, timeout))
        self.clock[0] += self.took.get(name, 0.0)

    def begin(self) -> None:
        pass

    def settle(self, timeout: float, where: str) -> None:
        self._step("settle", timeout)

    def write_progress(
        self, progress: ProgressStore, last_copied: Mapping[SourcePartition, int], timeout: float
    ) -> None:
        self._step("progress", timeout)

    def commit(self, timeout: float, where: str) -> None:
        self._step("commit", timeout)

    def abort(self, where: str, timeout: float) -> None:
        self._step("abort", timeout)


def test_a_commit_takes_its_timeout_for_all_its_steps_together(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop's deadline bounds the whole commit: the progress write and the commit get
    what the steps before them left (the batch copier's progress write waits for its
    answer; it had been given 60 s of retries whatever the deadline)."""
    clock = [1000.0]
    monkeypatch.setattr(committers.time, "monotonic", lambda: clock[0])
    writer = _TimedWriter(clock, {"settle": 4.0, "progress": 3.0})
    state = _state()
    committer = ExactlyOnce(
        "A->B",
        "B",
        FakeTransactionalProducer(),
        FakeTransactionalProgress(),  # type: ignore[arg-type]
        None,
        {("t", 0): state},
        Transactions(3600.0, writer=writer),
    )
    committer.records_read()
    state.acked, state.acked_downstream = 2, 2
    committer.commit(10.0)
    assert writer.given == [("settle", 10.0), ("progress", 6.0), ("commit", 3.0)]
