"""The copy loop's accounting against fake clients: which offset syncs it writes,
what progress it records, what a rejected or timed-out record does.

The fakes stand for librdkafka's behaviour that matters here: a producer that
assigns target offsets and reports deliveries when polled, a consumer that hands
out queued records. Byte equality and real delivery are the integration tests'.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition

from mm2py.compat.formats import (
    AFTER_START_SYNC_HEADER,
    CONTIGUOUS_SYNC_HEADER,
    POSITION_SYNC_HEADER,
    OffsetSync,
)
from mm2py.replication import copy_loop
from mm2py.replication.client_settings import (
    CONSUMER_REQUIRED,
    PRODUCER_REQUIRED,
    copy_settings,
)
from mm2py.replication.committers import PartitionRejected, RunUnproven, Transactions
from mm2py.replication.copy_loop import (
    CopyLoop,
    NewPartition,
    SourceReadFailed,
    describe_partitions,
)
from mm2py.replication.offset_syncs import OffsetSyncWriter, SyncRule
from mm2py.replication.stats import ReplicationStats
from mm2py.replication.transactions import TransactionLog


class Record:
    """A consumed (or produced) record, shaped like confluent_kafka.Message."""

    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        value: bytes | None = b"v",
        key: bytes | None = None,
        headers: Any = None,
        error: KafkaError | None = None,
    ) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._value, self._key, self._headers, self._error = value, key, headers, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Any:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def error(self) -> KafkaError | None:
        return self._error

    def __len__(self) -> int:
        return len(self._value) if self._value else 0


class FakeConsumer:
    def __init__(self) -> None:
        self.queued: list[Record] = []
        self.assigned: list[TopicPartition] = []
        self.paused: list[tuple[str, int]] = []
        self.seeks: list[tuple[str, int, int]] = []
        # Past the last record handed out, as librdkafka moves it past the transaction
        # markers and aborted records that follow; set by the test. And end offsets.
        self.positions: dict[tuple[str, int], int] = {}
        self.ends: dict[tuple[str, int], int] = {}
        self.position_calls: list[list[tuple[str, int]]] = []

    def consume(self, n: int, timeout: float) -> list[Record]:
        out, self.queued = self.queued[:n], self.queued[n:]
        for r in out:
            where = (r.topic(), r.partition())
            self.positions[where] = max(self.positions.get(where, 0), r.offset() + 1)
        return out

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        self.position_calls.append([(tp.topic, tp.partition) for tp in tps])
        return [
            TopicPartition(
                tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)
            )
            for tp in tps
        ]

    def poll(self, timeout: float) -> Record | None:
        return self.queued.pop(0) if self.queued else None

    def incremental_assign(self, tps: list[TopicPartition]) -> None:
        self.assigned += tps

    def incremental_unassign(self, tps: list[TopicPartition]) -> None:
        pass

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in tps]

    def resume(self, tps: list[TopicPartition]) -> None:
        pass

    def seek(self, tp: TopicPartition) -> None:
        """Records of the partition fetched before are dropped, as librdkafka does."""
        self.seeks.append((tp.topic, tp.partition, tp.offset))
        self.queued = [
            r for r in self.queued if (r.topic(), r.partition()) != (tp.topic, tp.partition)
        ]

    def list_topics(self, topic: str, timeout: float) -> None:
        pass

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        return (0, self.ends.get((tp.topic, tp.partition), 100))


class FakeProducer:
    """Appends to target partitions; deliveries are reported on poll/flush.

    `outcome(record)` may return a KafkaError to fail a delivery; `skip` makes the
    target offsets jump (another writer, or a transaction marker on the target).
    """

    def __init__(self) -> None:
        self.ends: dict[tuple[str, int], int] = {}
        self.pending: list[tuple[Callable[..., None] | None, Record, KafkaError | None]] = []
        self.written: list[Record] = []
        self.outcome: Callable[[Record], KafkaError | None] = lambda _r: None
        self.hold = False  # True: poll() reports nothing (acknowledgements still to come)
        # Another writer's records land before the n-th record produced: {n: how many}.
        self.foreign_before: dict[int, int] = {}
        self.calls = 0
        self.flushes = 0
        self.full = 0  # the next this many produce calls find the queue full

    def produce(
        self,
        topic: str,
        value: bytes | None = None,
        key: bytes | None = None,
        partition: int = -1,
        callback: Callable[..., None] | None = None,
        on_delivery: Callable[..., None] | None = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent_kafka's signature, positional arguments included."""
        if self.full:
            self.full -= 1
            raise BufferError("Local: Queue full")
        self.skip(topic, partition, self.foreign_before.get(self.calls, 0))
        self.calls += 1
        offset = self.ends.get((topic, partition), 0)
        record = Record(topic, partition, offset, value, key, headers)
        err = self.outcome(record)
        if err is None:
            self.ends[(topic, partition)] = offset + 1
            self.written.append(record)
        self.pending.append((callback or on_delivery, record, err))

    def __len__(self) -> int:
        return len(self.pending)

    def skip(self, topic: str, partition: int, n: int) -> None:
        self.ends[(topic, partition)] = self.ends.get((topic, partition), 0) + n

    def poll(self, timeout: float = 0) -> int:
        if self.hold:
            return 0
        pending, self.pending = self.pending, []
        for callback, record, err in pending:
            if callback is not None:
                callback(err, record)
        return len(pending)

    def flush(self, timeout: float = 0) -> int:
        self.flushes += 1
        self.poll()
        return 0


class FakeProgress:
    def __init__(self) -> None:
        self.written: dict[tuple[str, int], int] = {}

    def submit(self, last_copied: dict[tuple[str, int], int], on_written: Any) -> None:
        for where, offset in last_copied.items():
            self.written[where] = offset
            on_written(where, offset)

    def flush(self, timeout: float) -> bool:
        return True


def _loop(
    stored: dict[tuple[str, int], int] | None = None,
    per_record_reports: set[tuple[str, int]] | None = None,
    on_partition_failed: Callable[[], None] | None = None,
) -> tuple[CopyLoop, FakeProducer]:
    consumer, producer = FakeConsumer(), FakeProducer()
    syncs = OffsetSyncWriter(FakeProducer(), "mm2-offset-syncs.B.internal")
    loop = CopyLoop(
        "A->B",
        "B",
        consumer,
        producer,
        FakeProgress(),  # type: ignore[arg-type]
        syncs,
        ReplicationStats("A", "B"),
        stored or {},
        per_record_reports=per_record_reports,
        on_partition_failed=on_partition_failed,
    )
    return loop, producer


def _queue(loop: CopyLoop, *offsets: int, topic: str = "t", partition: int = 0) -> None:
    loop.consumer.queued += [Record(topic, partition, o) for o in offsets]


def _syncs(loop: CopyLoop, positions: tuple[int, ...] = ()) -> list[tuple[str, int, int, int]]:
    """The offset syncs written, decoded, in order (each partition's first marked as the
    first after a start; those at the indexes `positions` as syncs of a position)."""
    assert loop.syncs is not None
    fake: FakeProducer = loop.syncs._producer
    fake.poll()
    out = []
    for i, record in enumerate(fake.written):
        assert record.topic() == "mm2-offset-syncs.B.internal" and record.partition() == 0
        sync = OffsetSync.decode(record.key(), record.value())
        first = all((t, p) != (sync.topic, sync.partition) for t, p, _u, _d in out)
        marks = [CONTIGUOUS_SYNC_HEADER, *([AFTER_START_SYNC_HEADER] if first else [])]
        if i in positions:
            marks.append(POSITION_SYNC_HEADER)
        assert record.headers() == marks
        out.append((sync.topic, sync.partition, sync.upstream_offset, sync.downstream_offset))
    return out


def _never() -> bool:
    return False


def test_contiguous_records_need_the_first_sync_and_the_latest_at_progress() -> None:
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 10})
    assert loop.consumer.assigned[0].offset == 10  # the log start looked up outside
    _queue(loop, 10, 11, 12, 13)
    assert loop.copy_batch(_never)
    producer.poll()
    loop.commit_progress()
    assert _syncs(loop) == [("t", 0, 10, 0), ("t", 0, 13, 3)]
    assert loop.progress.written == {("t", 0): 13}  # type: ignore[attr-defined]
    assert [r.offset() for r in producer.written] == [0, 1, 2, 3]
    assert loop.stats.partition("A.t", 0).records == 4


def test_a_gap_on_either_side_writes_a_sync_where_the_distance_changes() -> None:
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _queue(loop, 0, 1, 5, 6)  # 2..4: an aborted transaction and its marker on the source
    loop.copy_batch(_never)
    producer.poll()
    producer.skip("A.t", 0, 3)  # another writer's records on the target
    _queue(loop, 7)
    loop.copy_batch(_never)
    producer.poll()
    loop.commit_progress()
    assert _syncs(loop) == [("t", 0, 0, 0), ("t", 0, 5, 2), ("t", 0, 7, 7)]


def test_a_foreign_record_inside_a_run_reported_per_record_gets_a_sync_at_the_next_record() -> None:
    loop, producer = _loop(per_record_reports={("t", 0)})
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.foreign_before = {3: 2, 5: 1}  # two land before the 4th record, one before the 6th
    _queue(loop, *range(8))  # one run: consecutive source offsets
    loop.copy_batch(_never)
    producer.poll()
    loop.commit_progress()
    assert [r.offset() for r in producer.written] == [0, 1, 2, 5, 6, 8, 9, 10]
    assert _syncs(loop) == [("t", 0, 0, 0), ("t", 0, 3, 5), ("t", 0, 5, 8), ("t", 0, 7, 10)]
    stats = loop.stats.partition("A.t", 0)
    assert stats.records == 8 and stats.bytes == 8
    assert sum(stats.latency.counts) == 8 and sum(stats.record_age.counts) == 8


def test_runs_split_at_source_gaps_and_partitions_interleaved_in_a_batch() -> None:
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    _queue(loop, 0, 1, 2)
    _queue(loop, 0, 1, partition=1)
    _queue(loop, 3, 7, 8)  # 4..6: a marker and aborted records
    producer.foreign_before = {3: 1}  # before partition 1's first record
    loop.copy_batch(_never)
    producer.poll()
    loop.commit_progress()
    assert sorted(_syncs(loop)) == [
        ("t", 0, 0, 0),
        ("t", 0, 7, 4),
        ("t", 0, 8, 5),
        ("t", 1, 0, 1),
        ("t", 1, 1, 2),
    ]
    assert loop.progress.written == {("t", 0): 8, ("t", 1): 1}  # type: ignore[attr-defined]


def test_a_record_rejected_inside_a_run_reported_per_record_is_named_and_progress_stops_before_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop, producer = _loop(per_record_reports={("t", 0)})
    loop.assign([NewPartition("t", 0, "A.t")], {})
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    # The target rejects the batch holding source offsets 3..5, the largest being 4.
    producer.outcome = lambda r: too_large if r.value() in (b"v3", b"v44", b"v5") else None
    loop.consumer.queued += [
        Record("t", 0, o, value=b"v44" if o == 4 else f"v{o}".encode()) for o in range(8)
    ]
    with caplog.at_level(logging.ERROR):
        loop.copy_batch(_never)
        producer.poll()
    assert "rejected record t-0 offset 4 (3 bytes)" in loop.failed_partitions()["A.t-0"]
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 2}  # type: ignore[attr-defined]
    assert loop.stats.partition("A.t", 0).records == 3


def test_progress_counts_only_acknowledged_records_and_resumes_after_stored_progress() -> None:
    loop, producer = _loop(stored={("t", 0): 41}, per_record_reports={("t", 0)})
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    assert loop.consumer.assigned[0].offset == 42  # after the stored progress
    _queue(loop, 42, 43, 44)
    producer.hold = True
    loop.copy_batch(_never)
    # Acknowledge the first two only.
    first_two, producer.pending = producer.pending[:2], producer.pending[2:]
    for callback, record, err in first_two:
        assert callback is not None
        callback(err, record)
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 43}  # type: ignore[attr-defined]
    producer.hold = False
    producer.poll()
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 44}  # type: ignore[attr-defined]


def test_a_rejected_record_stops_its_partition_naming_it_while_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    failures: list[int] = []
    loop, producer = _loop(
        per_record_reports={("big", 0)}, on_partition_failed=lambda: failures.append(1)
    )
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    producer.outcome = lambda r: too_large if r.topic() == "A.big" else None
    loop.assign([NewPartition("big", 0, "A.big"), NewPartition("t", 0, "A.t")], {})
    _queue(loop, 0, topic="big")
    _queue(loop, 0, 1)
    with caplog.at_level(logging.ERROR):
        loop.copy_batch(_never)
        producer.poll()
    failed = loop.failed_partitions()
    assert list(failed) == ["A.big-0"]
    assert "rejected record big-0 offset 0" in failed["A.big-0"]
    assert ("big", 0) in loop.consumer.paused and failures == [1]
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 1}  # type: ignore[attr-defined]


def test_only_a_runs_first_and_last_records_ask_for_a_report_unless_per_record() -> None:
    loop, producer = _loop(per_record_reports={("t", 1)})
    loop.assign([NewPartition("t", p, "A.t") for p in range(3)], {})
    _queue(loop, 0, 1, 2, 3)
    _queue(loop, 0, 1, 2, partition=1)
    _queue(loop, 5, partition=2)
    producer.hold = True
    loop.copy_batch(_never)
    asks = [(r.partition(), callback is not None) for callback, r, _err in producer.pending]
    assert asks == [(0, True), (0, False), (0, False), (0, True)] + [(1, True)] * 3 + [(2, True)]
    producer.hold = False
    producer.poll()
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 3, ("t", 1): 2, ("t", 2): 5}  # type: ignore[attr-defined]
    assert [loop.stats.partition("A.t", p).records for p in range(3)] == [4, 3, 1]
    assert sum(loop.stats.partition("A.t", 0).latency.counts) == 4
    assert _syncs(loop) == [
        ("t", 0, 0, 0),
        ("t", 1, 0, 0),
        ("t", 2, 5, 0),
        ("t", 0, 3, 3),
        ("t", 1, 2, 2),
    ]


def test_a_foreign_record_inside_a_run_shows_at_its_last_report_and_it_is_copied_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    per_record: set[tuple[str, int]] = set()
    loop, producer = _loop(per_record_reports=per_record)
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    producer.foreign_before = {3: 2}  # two land before partition 0's 4th record
    _queue(loop, *range(8))
    _queue(loop, 0, 1, partition=1)
    producer.hold = True
    loop.copy_batch(_never)
    _queue(loop, 8, 9)  # sent before the reports come: copies too many, counted for nothing
    loop.copy_batch(_never)
    producer.hold = False
    with caplog.at_level(logging.WARNING):
        producer.poll()
    assert per_record == {("t", 0)}
    assert (
        "t-0 offsets 1..7 to B is not proven: its 8 records went to A.t offsets 0 to 9, "
        "not one after another; copying it again from offset 1"
    ) in caplog.text
    loop.commit_progress()
    # Only what is proven counts: partition 0's first record, all of partition 1.
    assert loop.progress.written == {("t", 0): 0, ("t", 1): 1}  # type: ignore[attr-defined]
    assert loop.stats.partition("A.t", 0).records == 1
    assert loop.consumer.seeks == []  # type: ignore[attr-defined]
    loop.copy_batch(_never)  # nothing new came: it starts partition 0 again at offset 1
    assert loop.consumer.seeks == [("t", 0, 1)]  # type: ignore[attr-defined]
    # The consumer's position may still be the one before the seek (10), past a marker
    # at 8, say: no position sync until a record after the seek is read.
    loop.consumer.positions[("t", 0)] = 10  # type: ignore[attr-defined]
    loop.update_lag()
    assert loop.consumer.position_calls == [[("t", 1)]]  # type: ignore[attr-defined]
    # The copy again lands after the 12 records now on A.t-0, a foreign one before its 3rd.
    producer.foreign_before = {producer.calls + 2: 1}
    _queue(loop, *range(1, 10))
    assert loop.copy_batch(_never)
    producer.poll()
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 9, ("t", 1): 1}  # type: ignore[attr-defined]
    assert _syncs(loop) == [
        ("t", 0, 0, 0),
        ("t", 1, 0, 0),
        ("t", 1, 1, 1),
        ("t", 0, 1, 12),
        ("t", 0, 3, 15),
        ("t", 0, 9, 21),
    ]
    assert loop.stats.partition("A.t", 0).records == 10


def test_a_record_rejected_between_a_runs_first_and_last_is_named_by_the_copy_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    records = [Record("t", 0, o, value=b"v44" if o == 4 else f"v{o}".encode()) for o in range(8)]
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.outcome = lambda r: too_large if r.value() in (b"v3", b"v44", b"v5") else None
    loop.consumer.queued += records
    with caplog.at_level(logging.WARNING):
        loop.copy_batch(_never)
    assert "offsets 1..7 to B is not proven: its 8 records went to A.t offsets 0 to 4" in (
        caplog.text
    )
    assert loop.failed_partitions() == {}  # not known yet which record it was
    loop.consumer.queued += records[1:]
    with caplog.at_level(logging.ERROR):
        loop.copy_batch(_never)
        producer.poll()
    assert loop.consumer.seeks == [("t", 0, 1)]  # type: ignore[attr-defined]
    assert "rejected record t-0 offset 4 (3 bytes)" in loop.failed_partitions()["A.t-0"]
    loop.commit_progress()
    assert loop.progress.written == {("t", 0): 2}  # type: ignore[attr-defined]


def test_a_runs_first_record_refused_makes_it_copied_again_from_that_record() -> None:
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.outcome = lambda r: (
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if r.value() == b"big" else None
    )
    records = [Record("t", 0, 0, value=b"big"), Record("t", 0, 1)]
    loop.consumer.queued += records
    loop.copy_batch(_never)
    loop.commit_progress()
    assert loop.progress.written == {}  # type: ignore[attr-defined]
    assert _syncs(loop) == [] and loop.failed_partitions() == {}
    loop.consumer.queued += records
    loop.copy_batch(_never)
    assert loop.consumer.seeks == [("t", 0, 0)]  # type: ignore[attr-defined]
    assert "rejected record t-0 offset 0" in loop.failed_partitions()["A.t-0"]


@pytest.mark.parametrize("per_record", [False, True])
def test_stopping_with_the_queue_full_ends_the_run_with_a_report_so_progress_is_exact(
    per_record: bool,
) -> None:
    loop, producer = _loop(per_record_reports={("t", 0)} if per_record else None)
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _queue(loop, *range(6))
    producer.hold = True
    real_produce = producer.produce
    filled: list[int] = []

    def fill_at_the_fourth(*args: Any) -> None:
        if producer.calls == 3 and not filled:
            filled.append(1)
            producer.full = 2  # the 4th record finds the queue full, and again after a wait
        real_produce(*args)

    producer.produce = fill_at_the_fourth  # type: ignore[method-assign]
    assert not loop.copy_batch(lambda: True)  # stopping: it gives up waiting for room
    asks = [callback is not None for callback, _r, _err in producer.pending]
    # Unless reported per record, the 4th record is sent after all, as the run's last.
    assert asks == ([True] * 3 if per_record else [True, False, False, True])
    producer.hold = False
    loop.finish(time.monotonic() + 5)
    assert loop.progress.written == {("t", 0): 2 if per_record else 3}  # type: ignore[attr-defined]


def test_a_timed_out_delivery_ends_the_loop_for_a_restart_from_progress() -> None:
    loop, producer = _loop()
    producer.outcome = lambda r: KafkaError(KafkaError._MSG_TIMED_OUT)
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _queue(loop, 0)
    with pytest.raises(RuntimeError, match=r"copying t-0 offset 0 to A\.t on B failed"):
        loop.copy_batch(_never)  # its delivery report comes when the batch polls
    loop.commit_progress()
    assert loop.progress.written == {}  # type: ignore[attr-defined]


def test_sync_rule_alone() -> None:
    rule = SyncRule()
    assert rule.on_copied(5, 0)  # the first record
    assert not rule.on_copied(6, 1)
    assert rule.on_copied(9, 2)  # distance changed
    assert rule.on_progress(12)  # latest at a progress commit
    assert not rule.on_progress(12)
    assert not rule.on_copied(13, 6)  # same distance as the last sync: 9 - 2 = 7


def test_sync_rule_syncs_a_position_past_offsets_skipped_at_the_end() -> None:
    """Issue 24: a partition that ends with a transaction marker (or aborted records) left
    a group that read everything past the last copied record, where no sync proved it."""
    rule = SyncRule()
    assert rule.on_copied(0, 0)
    assert not rule.wants_position(250, 249)  # the source ends with the last record copied
    assert rule.wants_position(251, 249)
    assert rule.on_position(250, 249, 249) == ()  # the next offset: nothing skipped
    # Record 249's sync not written yet (within the second): it goes first.
    assert rule.on_position(251, 249, 249) == ((249, 249, False), (251, 250, True))
    assert rule.on_position(251, 249, 249) == ()  # once
    assert not rule.wants_position(251, 249)
    assert not rule.on_progress(249)
    # More skipped later (an aborted transaction, its marker): the new position.
    assert rule.on_position(262, 249, 249) == ((262, 250, True),)
    # The record at 262 continues the position's sync (same distance) but is synced as
    # a record when acknowledged, and only a later skip asks for a position again.
    assert not rule.on_copied(262, 250)
    assert rule.on_progress(262)
    assert rule.on_position(263, 262, 250) == ()
    assert rule.on_position(265, 262, 250) == ((265, 251, True),)
    assert rule.on_copied(270, 251)  # the distance changed again


def test_a_partition_ending_past_its_last_record_gets_its_position_synced_once() -> None:
    loop, producer = _loop()
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    _queue(loop, 0, 1, 2)
    _queue(loop, 0, 1, partition=1)
    assert loop.copy_batch(_never)
    _queue(loop, 3, 4)
    assert loop.copy_batch(_never)
    producer.poll()
    # t-0 ends with a marker at 5; t-1 with its last record: its position is not asked.
    loop.consumer.positions[("t", 0)] = loop.consumer.ends[("t", 0)] = 6  # type: ignore[attr-defined]
    loop.consumer.ends[("t", 1)] = 2  # type: ignore[attr-defined]
    loop.update_lag()
    assert loop.consumer.position_calls == [[("t", 0)]]  # type: ignore[attr-defined]
    # t-0's last record, (4, 4), not synced yet, is synced before the position's (6, 5).
    assert _syncs(loop, positions=(3,)) == [
        ("t", 0, 0, 0),
        ("t", 1, 0, 0),
        ("t", 0, 4, 4),
        ("t", 0, 6, 5),
    ]
    loop.update_lag()  # synced up to the end: not asked again
    loop.commit_progress()  # t-1's latest, (1, 1)
    assert _syncs(loop, positions=(3,))[4:] == [("t", 1, 1, 1)]
    assert len(loop.consumer.position_calls) == 1  # type: ignore[attr-defined]
    # A record in flight: its partition is not asked for until it is acknowledged.
    producer.hold = True
    _queue(loop, 6)
    loop.consumer.ends[("t", 0)] = 9  # type: ignore[attr-defined]
    assert loop.copy_batch(_never)
    loop.update_lag()
    assert len(loop.consumer.position_calls) == 1  # type: ignore[attr-defined]
    producer.hold = False
    producer.poll()
    loop.commit_progress()
    # Where the position was: same distance (no sync at the copy), synced as a record.
    assert _syncs(loop, positions=(3,))[5:] == [("t", 0, 6, 5)]


def test_exactly_once_syncs_a_position_only_once_its_records_are_committed() -> None:
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _queue(loop, 0, 1, 2)
    loop.copy_batch(_never)
    producer.poll()
    loop.consumer.positions[("t", 0)] = loop.consumer.ends[("t", 0)] = 4  # type: ignore[attr-defined]
    loop.update_lag()  # acknowledged, not committed: nothing
    assert _syncs(loop) == []
    loop.commit_transaction()
    loop.update_lag()
    assert _syncs(loop, positions=(2,)) == [("t", 0, 0, 0), ("t", 0, 2, 2), ("t", 0, 4, 3)]


def test_many_partitions_are_counted_not_listed() -> None:
    tps = [TopicPartition(f"t{i}", p) for i in range(500) for p in range(4)]
    assert describe_partitions(tps) == (
        "2000 partitions of 500 topics (the list is logged at DEBUG)"
    )
    assert describe_partitions(tps[:2]) == "t0-0, t0-1"


def test_client_settings_user_wins_over_tuning_and_correctness_is_enforced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    props = {"bootstrap.servers": "x", "linger.ms": "20", "acks": "1"}
    with caplog.at_level(logging.WARNING):
        first = copy_settings(props, {"linger.ms": 1, "batch.size": 5}, PRODUCER_REQUIRED, "w1")
        again = copy_settings(props, {"linger.ms": 1}, PRODUCER_REQUIRED, "w1")
    assert "linger.ms" not in first  # the user's 20 stays
    assert first["batch.size"] == 5 and first["acks"] == "all" and again["acks"] == "all"
    assert first["enable.idempotence"] is True
    warnings = [r.getMessage() for r in caplog.records if "acks" in r.getMessage()]
    assert len(warnings) == 1 and "w1" in warnings[0] and "acks = all" in warnings[0]
    consumer = copy_settings({"isolation.level": "read_committed"}, {}, CONSUMER_REQUIRED, "c")
    assert consumer["isolation.level"] == "read_committed"


# --- exactly-once ----------------------------------------------------------------


class FakeTransactionalProducer(FakeProducer):
    """A FakeProducer with transactions: what was produced since `begin_transaction`,
    and each commit's records (progress included) as one list."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[Record] | None = None
        self.commits: list[list[Record]] = []
        self.aborts = 0

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        assert self.open is not None, "produced outside a transaction"
        before = len(self.written)
        super().produce(topic, *args, **kwargs)
        self.open += self.written[before:]

    def begin_transaction(self) -> None:
        assert self.open is None
        self.open = []

    def commit_transaction(self, timeout: float = 0) -> None:
        assert self.open is not None
        self.flush()
        self.commits.append(self.open)
        self.open = None

    def purge(self) -> None:
        self.pending = [(cb, r, KafkaError(KafkaError._PURGE_QUEUE)) for cb, r, _ in self.pending]

    def abort_transaction(self, timeout: float = 0) -> None:
        self.aborts += 1
        self.open = None


class FakeTransactionalProgress(FakeProgress):
    """Progress written through the loop's producer, in its transaction."""

    def write_in_transaction(self, producer: Any, last_copied: dict[tuple[str, int], int]) -> None:
        for (topic, partition), offset in last_copied.items():
            producer.produce("mm2-offsets.A.internal", f"{topic}-{partition}:{offset}".encode())


def _eos_loop(
    failed: dict[tuple[str, int], str] | None = None,
    when_caught_up: bool = False,
    per_record_reports: set[tuple[str, int]] | None = None,
) -> tuple[CopyLoop, FakeTransactionalProducer]:
    consumer, producer = FakeConsumer(), FakeTransactionalProducer()
    syncs = OffsetSyncWriter(FakeProducer(), "mm2-offset-syncs.B.internal")
    loop = CopyLoop(
        "A->B",
        "B",
        consumer,
        producer,
        FakeTransactionalProgress(),  # type: ignore[arg-type]
        syncs,
        ReplicationStats("A", "B"),
        {},
        transactions=Transactions(
            interval=3600.0,
            log=TransactionLog(logging.getLogger("t")),
            when_caught_up=when_caught_up,
        ),
        failed=failed,
        per_record_reports=per_record_reports,
    )
    return loop, producer


def test_exactly_once_commits_records_with_their_progress_then_writes_syncs_and_counts() -> None:
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    _queue(loop, 0, 1, 2)
    _queue(loop, 0, 1, partition=1)
    loop.copy_batch(_never)
    producer.poll()
    # Acknowledged but not committed: no sync, no progress, nothing counted yet.
    assert _syncs(loop) == [] and producer.commits == []
    assert loop.stats.partition("A.t", 0).records == 0
    loop.commit_transaction()
    [committed] = producer.commits
    assert [(r.topic(), r.value()) for r in committed[-2:]] == [
        ("mm2-offsets.A.internal", b"t-0:2"),
        ("mm2-offsets.A.internal", b"t-1:1"),
    ]
    assert len(committed) == 7  # five records, then both partitions' progress
    assert _syncs(loop) == [("t", 0, 0, 0), ("t", 1, 0, 0), ("t", 0, 2, 2), ("t", 1, 1, 1)]
    assert loop.stats.partition("A.t", 0).records == 3
    assert sum(loop.stats.partition("A.t", 1).latency.counts) == 2
    # Nothing new: nothing to commit, nothing opened.
    loop.copy_batch(_never)
    loop.commit_transaction()
    assert len(producer.commits) == 1


def test_exactly_once_caught_up_commits_at_once_behind_waits_for_the_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop, producer = _eos_loop(when_caught_up=True)
    loop.assign([NewPartition("t", 0, "A.t")], {})
    monkeypatch.setattr(copy_loop, "BATCH_SIZE", 3)
    _queue(loop, 0, 1, 2, 3)
    loop.copy_batch(_never)  # a full batch: behind, the transaction stays open
    assert producer.commits == []
    loop.copy_batch(_never)  # the rest, short of a batch: caught up, it commits
    [committed] = producer.commits
    assert [r.value() for r in committed][-1] == b"t-0:3"
    assert loop.stats.partition("A.t", 0).records == 4


def test_exactly_once_an_unproven_run_aborts_and_the_next_loop_reports_every_record() -> None:
    per_record: set[tuple[str, int]] = set()
    loop, producer = _eos_loop(per_record_reports=per_record)
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.foreign_before = {2: 1}
    _queue(loop, 0, 1, 2)
    with pytest.raises(RunUnproven, match=r"t-0 offsets 1\.\.2"):
        loop.copy_batch(_never)  # the reports come when the batch polls
    loop.finish(time.monotonic() + 5)
    assert producer.aborts == 1 and producer.commits == []
    assert per_record == {("t", 0)} and _syncs(loop) == []
    assert loop.stats.partition("A.t", 0).records == 0


def test_exactly_once_rejected_record_aborts_and_the_next_loop_leaves_its_partition_out() -> None:
    failed: dict[tuple[str, int], str] = {}
    loop, producer = _eos_loop(failed, per_record_reports={("t", 1)})
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    producer.outcome = lambda r: (
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if r.partition() == 1 else None
    )
    _queue(loop, 0, 1)
    _queue(loop, 0, partition=1)
    producer.hold = True
    loop.copy_batch(_never)  # the rejection is reported when acknowledgements are served
    producer.hold = False
    with pytest.raises(PartitionRejected, match=r"rejected record t-1 offset 0"):
        loop.copy_batch(_never)
    loop.finish(time.monotonic() + 5)
    assert producer.aborts == 1 and producer.commits == []
    assert _syncs(loop) == [] and loop.stats.partition("A.t", 0).records == 0
    assert list(failed) == [("t", 1)]
    # The next loop (from the committed progress) copies only partition 0.
    again, _ = _eos_loop(failed)
    again.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    assert [(tp.topic, tp.partition) for tp in again.consumer.assigned] == [("t", 0)]
    assert "rejected record t-1 offset 0" in again.failed_partitions()["A.t-1"]


# --- a partition copied up to a stop offset (a backfill range) -------------------------


def _eof(partition: int, offset: int) -> Record:
    """The end of a partition as librdkafka reports it (``enable.partition.eof``)."""
    return Record("t", partition, offset, error=KafkaError(KafkaError._PARTITION_EOF))


def test_a_stop_offset_cuts_the_run_there_and_commits_through_its_last_record() -> None:
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t", stop_at=13)], {("t", 0): 10})
    state = loop.by_source[("t", 0)]
    _queue(loop, 10, 11)
    loop.copy_batch(_never)
    assert not state.at_stop
    _queue(loop, 12, 13, 14)  # read ahead of the stop: 13 and 14 are not copied
    loop.copy_batch(_never)
    assert state.at_stop
    loop.commit_transaction()
    [committed] = producer.commits
    assert [r.value() for r in committed] == [b"v", b"v", b"v", b"t-0:12"]
    assert _syncs(loop) == [("t", 0, 10, 0), ("t", 0, 12, 2)]
    assert state.first_downstream == 0 and state.acked_downstream == 2 and state.foreign == 0
    assert loop.stats.partition("A.t", 0).records == 3


def test_offsets_before_the_stop_that_are_no_records_are_progress_but_no_sync() -> None:
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t", stop_at=20)], {})
    state = loop.by_source[("t", 0)]
    _queue(loop, 0, 1)
    loop.consumer.queued.append(_eof(0, 5))  # type: ignore[attr-defined]  # below the stop
    loop.copy_batch(_never)
    assert not state.at_stop
    # 2..19 are markers and aborted records: the partition's end comes at 20.
    loop.consumer.queued.append(_eof(0, 20))  # type: ignore[attr-defined]
    loop.copy_batch(_never)
    assert state.at_stop
    loop.commit_transaction()
    [committed] = producer.commits
    assert [r.value() for r in committed][-1] == b"t-0:19"
    # The latest sync is the last record's: offset 19 is not the record at target 1.
    assert _syncs(loop) == [("t", 0, 0, 0), ("t", 0, 1, 1)]
    assert state.committed == 19


def test_a_stop_reached_with_no_record_left_commits_the_progress_alone() -> None:
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t", stop_at=30)], {})
    loop.consumer.queued.append(_eof(0, 30))  # type: ignore[attr-defined]
    loop.copy_batch(_never)
    loop.commit_transaction()
    assert [[r.value() for r in c] for c in producer.commits] == [[b"t-0:29"]]
    assert _syncs(loop) == []


def test_a_range_whose_source_cannot_be_read_for_good_fails_naming_it() -> None:
    loop, _ = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t", stop_at=30)], {})
    transient = KafkaError(KafkaError._TRANSPORT, "broker down", retriable=True)
    loop.consumer.queued.append(Record("t", 0, 0, error=transient))  # type: ignore[attr-defined]
    loop.copy_batch(_never)  # logged; the range waits for the source
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Topic authorization failed")
    loop.consumer.queued.append(Record("t", 0, 0, error=denied))  # type: ignore[attr-defined]
    with pytest.raises(SourceReadFailed, match="reading t-0: Topic authorization failed"):
        loop.copy_batch(_never)
    # The daemon's partitions (no stop) wait for the source, as MM2's consumer does.
    loop, _ = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    loop.consumer.queued.append(Record("t", 0, 0, error=denied))  # type: ignore[attr-defined]
    loop.copy_batch(_never)


def test_the_proof_counts_other_writers_records_it_sees_among_a_partition_s() -> None:
    loop, producer = _loop(per_record_reports={("t", 0)})
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.foreign_before = {0: 4, 3: 2, 5: 1}  # before the 1st, the 4th and 6th records
    _queue(loop, *range(8))
    loop.copy_batch(_never)
    producer.poll()
    state = loop.by_source[("t", 0)]
    # Those before the first record are not among the partition's: only 3 are counted.
    assert state.first_downstream == 4 and state.foreign == 3
    # Without a report per record, the run's last report shows them.
    loop, producer = _eos_loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    producer.foreign_before = {2: 2}
    _queue(loop, 0, 1, 2)
    with pytest.raises(RunUnproven):
        loop.copy_batch(_never)
    assert loop.by_source[("t", 0)].foreign == 2
