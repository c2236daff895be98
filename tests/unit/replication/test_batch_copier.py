"""The batch copier with stand-in clients: which batches go as they are, which are dropped
or go record by record, and the offset syncs, progress and counts that follow."""

from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from mm2py.kafka.raw_partition import BatchRejected, Fetched, OffsetOutOfRange
from mm2py.kafka.record_batches import (
    CONTROL_TYPE_ABORT,
    CONTROL_TYPE_COMMIT,
    AbortedTransaction,
    Reason,
    RecordBatch,
    merge,
    split_batches,
)
from mm2py.replication.batch_copier import BatchCopier
from mm2py.replication.copy_loop import NewPartition
from mm2py.replication.stats import ReplicationStats
from tests.unit.kafka.test_record_batches import TS, batch, control, record, txn
from tests.unit.replication.test_copy_loop import FakeConsumer, FakeProducer, FakeProgress, Record

TARGET_START = 100  # the remote partition holds other records before the copies


class FakeFetcher:
    """Answers each fetch with the batches of `log` from the one holding the position."""

    def __init__(self, log: list[bytes], aborted: list[AbortedTransaction] = ()) -> None:  # type: ignore[assignment]
        self.log = log
        self.aborted = list(aborted)
        self.fetches: list[int] = []
        self.log_start = 0
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.closed = True

    def fetch(self, position: int) -> Fetched:
        self.fetches.append(position)
        if position < self.log_start:
            raise OffsetOutOfRange(f"offset {position} is out of range")
        data = b""
        end = 0
        for raw in self.log:
            base = int.from_bytes(raw[:8], "big", signed=True)
            last = base + int.from_bytes(raw[23:27], "big", signed=True)
            end = last + 1
            if last >= position:
                data += raw
        return Fetched(position, data, self.aborted, end, end, 0)


class FakeRawProducer:
    """Appends batches to the remote partition; answers each one's target base offset."""

    def __init__(self) -> None:
        self.end = TARGET_START
        self.refuse: set[int] = set()  # source base offsets of batches the target refuses
        self.too_large: set[int] = set()  # ... refuses as larger than it takes
        self.produced: list[int] = []  # source base offsets, in order
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.closed = True

    def produce(self, batches: list[RecordBatch]) -> list[int]:
        bases = []
        for b in batches:
            if b.header.base_offset in self.refuse:
                raise BatchRejected("produce for A.t-0 failed: InvalidRecordError")
            if b.header.base_offset in self.too_large:
                raise BatchRejected("produce for A.t-0 failed: RecordListTooLargeError", True)
            bases.append(self.end)
            self.end += b.header.record_count
            self.produced.append(b.header.base_offset)
        return bases


class FakeRaw:
    """The copier's raw clients: a FakeFetcher per source partition and a FakeRawProducer
    per remote partition; records each fetch round, prefetch and produce call. Like the
    real ones (`SessionsOnLoop`), a call before `open()` raises."""

    def __init__(
        self,
        fetchers: dict[tuple[str, int], FakeFetcher],
        producers: dict[tuple[str, int], FakeRawProducer],
    ) -> None:
        self.fetchers = fetchers
        self.producers = producers
        self.rounds: list[dict[tuple[str, int], int]] = []
        self.prefetched: list[dict[tuple[str, int], int]] = []
        self.produce_calls: list[list[tuple[str, int]]] = []
        self.opened = self.closed = False

    def open(self) -> None:
        self.opened = True

    def close(self) -> None:
        self.closed = True

    @property
    def is_open(self) -> bool:
        return self.opened and not self.closed

    def _check_open(self) -> None:
        if not self.is_open:
            raise RuntimeError("raw clients of A->B is not open")

    def fetch(self, positions: dict[tuple[str, int], int]) -> dict[tuple[str, int], Any]:
        self._check_open()
        self.rounds.append(dict(positions))
        out: dict[tuple[str, int], Any] = {}
        for key, position in positions.items():
            try:
                out[key] = self.fetchers[key].fetch(position)
            except OffsetOutOfRange as exc:
                out[key] = exc
        return out

    def discard_fetches(self) -> None:
        self._check_open()
        self.discarded += 1

    discarded = 0

    def produce(
        self,
        batches: dict[tuple[str, int], list[RecordBatch]],
        prefetch: dict[tuple[str, int], int] | None = None,
    ) -> dict[tuple[str, int], Any]:
        self._check_open()
        if prefetch is not None:
            self.prefetched.append(dict(prefetch))
        if not batches:
            return {}
        self.produce_calls.append(sorted(batches))
        out: dict[tuple[str, int], Any] = {}
        for key, items in batches.items():
            try:
                out[key] = self.producers[key].produce(items)
            except BatchRejected as exc:
                out[key] = exc
        return out


class RecordsConsumer(FakeConsumer):
    """FakeConsumer with the assign/unassign the record path's hand-over uses."""

    def assign(self, tps: list[TopicPartition]) -> None:
        self.assigned = list(tps)

    def unassign(self) -> None:
        self.assigned = []

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        return (self.log_start, 100)

    log_start = 0


class RecordingSyncs:
    def __init__(self) -> None:
        self.written: list[tuple[int, int, bool]] = []

    def write(
        self, topic: str, partition: int, upstream: int, downstream: int, position: bool = False
    ) -> None:
        self.written.append((upstream, downstream, position))

    def poll(self) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0


def _copier(
    log: list[bytes],
    aborted: list[AbortedTransaction] = (),  # type: ignore[assignment]
    stored: dict[tuple[str, int], int] | None = None,
) -> tuple[BatchCopier, FakeFetcher, FakeRawProducer, RecordingSyncs, FakeProgress]:
    fetcher, raw, syncs, progress = (
        FakeFetcher(log, aborted),
        FakeRawProducer(),
        RecordingSyncs(),
        FakeProgress(),
    )
    copier = _copier_over(FakeRaw({("t", 0): fetcher}, {("A.t", 0): raw}), stored, progress, syncs)
    copier.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    return copier, fetcher, raw, syncs, progress


def _copier_over(
    raw: FakeRaw,
    stored: dict[tuple[str, int], int] | None = None,
    progress: FakeProgress | None = None,
    syncs: RecordingSyncs | None = None,
) -> BatchCopier:
    """A copier over `raw` with the progress `stored` before it, nothing assigned yet."""
    return BatchCopier(
        "A->B",
        "B",
        RecordsConsumer(),
        FakeProducer(),
        FakeProgress() if progress is None else progress,  # type: ignore[arg-type]
        RecordingSyncs() if syncs is None else syncs,  # type: ignore[arg-type]
        ReplicationStats("A", "B"),
        stored or {},
        raw,  # type: ignore[arg-type]
    )


def _records(base: int, n: int) -> bytes:
    return batch(base, [record(i, i, b"k", b"v") for i in range(n)], max_ts=TS + n - 1)


def test_whole_batches_pass_aborted_and_markers_drop_syncs_follow_the_distance() -> None:
    log = [
        txn(0, producer_id=7, records=2),  # aborted below
        control(2, producer_id=7, kind=CONTROL_TYPE_ABORT),
        _records(3, 3),
        _records(6, 2),
    ]
    copier, fetcher, raw, syncs, progress = _copier(log, [AbortedTransaction(7, 0)])
    assert copier.raw.opened  # type: ignore[attr-defined]
    copier.copy_batch(lambda: False)
    assert raw.produced == [3]  # the small batches at 3 and 6 go merged, as one
    # One sync where the distance is set (3 -> 100); 6 -> 103 keeps it.
    assert syncs.written == [(3, TARGET_START, False)]
    state = copier.by_source[("t", 0)]
    assert (state.acked, state.acked_downstream) == (7, TARGET_START + 4)
    merged = merge([split_batches(data).batches[0] for data in log[2:]])
    assert state.stats.records == 5 and state.stats.bytes == merged.header.size
    assert sum(state.stats.latency.counts) == 5
    copier.commit_progress()
    assert progress.written == {("t", 0): 7}
    assert syncs.written[-1] == (7, TARGET_START + 4, False)  # the progress sync
    copier.copy_batch(lambda: False)
    assert fetcher.fetches == [0, 8]
    assert (copier.reasons[Reason.WHOLE.value], copier.reasons[Reason.ABORTED.value]) == (2, 1)
    assert copier.reasons[Reason.CONTROL.value] == 1


def test_a_trailing_marker_gets_a_position_sync() -> None:
    log = [
        batch(0, [record(i, 0, b"k", b"v") for i in range(3)], attributes=0x10, producer_id=9,
              producer_epoch=0, base_sequence=0),
        control(3, producer_id=9, kind=CONTROL_TYPE_COMMIT),
    ]  # fmt: skip
    copier, _, raw, syncs, _ = _copier(log)
    copier.copy_batch(lambda: False)
    assert raw.produced == [0]
    # A group that read to the end sits at 4, past the marker: it goes to 103.
    assert syncs.written == [
        (0, TARGET_START, False),
        (2, TARGET_START + 2, False),
        (4, TARGET_START + 3, True),
    ]


def test_a_batch_fetched_from_inside_goes_record_by_record_through_the_record_path() -> None:
    log = [_records(0, 4), _records(4, 2)]
    copier, _, raw, syncs, progress = _copier(log, stored={("t", 0): 1})
    consumer: RecordsConsumer = copier.consumer
    # librdkafka hands out the records from the position (2) on, and one past the batch.
    consumer.queued = [Record("t", 0, o, key=b"k", value=f"v{o}".encode()) for o in (2, 3, 4)]
    producer: FakeProducer = copier.producer
    producer.skip("A.t", 0, TARGET_START)
    raw.end = TARGET_START + 2  # after the two records the record path copies
    copier.copy_batch(lambda: False)
    assert [(r.offset(), r.value()) for r in producer.written] == [
        (TARGET_START, b"v2"),
        (TARGET_START + 1, b"v3"),
    ]
    assert consumer.assigned == []  # handed back
    assert raw.produced == [4]  # the next batch as it is, after the records
    assert syncs.written == [(2, TARGET_START, False)]
    state = copier.by_source[("t", 0)]
    assert (state.acked, state.acked_downstream) == (5, TARGET_START + 3)
    assert state.stats.records == 4
    copier.commit_progress()
    assert progress.written == {("t", 0): 5}


def test_finish_records_progress_and_closes_the_raw_clients() -> None:
    copier, _, _, _, progress = _copier([_records(0, 2)])
    copier.copy_batch(lambda: False)
    copier.finish(0.0)
    assert progress.written == {("t", 0): 1}
    assert copier.raw.closed  # type: ignore[attr-defined]


def test_records_deleted_before_they_were_copied_are_counted_and_skipped() -> None:
    copier, fetcher, raw, syncs, _ = _copier([_records(5, 3)], stored={("t", 0): 1})
    fetcher.log_start = 5
    consumer: RecordsConsumer = copier.consumer
    consumer.log_start = 5
    copier.copy_batch(lambda: False)  # 2 is out of range: on from the log start
    copier.copy_batch(lambda: False)
    assert fetcher.fetches == [2, 5]
    state = copier.by_source[("t", 0)]
    assert state.stats.skipped == 3 and state.stats.records == 3
    assert raw.produced == [5] and syncs.written == [(5, TARGET_START, False)]


def test_a_compacted_batch_at_the_end_is_read_until_the_partitions_end() -> None:
    """Compaction removed the batch's last records (offsets 2 and 3): the record path reads
    what is left and stops at the end of the partition, not waiting for offset 3."""
    gaps = batch(0, [record(0, 0, b"k", b"v0"), record(1, 0, b"k", b"v1")], last_offset_delta=3)
    copier, fetcher, raw, syncs, _ = _copier([gaps])
    consumer: RecordsConsumer = copier.consumer
    eof = KafkaError(KafkaError._PARTITION_EOF)
    consumer.queued = [Record("t", 0, 0), Record("t", 0, 1), Record("t", 0, 2, error=eof)]
    copier.copy_batch(lambda: False)
    producer: FakeProducer = copier.producer
    assert [r.offset() for r in producer.written] == [0, 1] and raw.produced == []
    assert copier.reasons[Reason.OFFSET_GAPS.value] == 1
    state = copier.by_source[("t", 0)]
    assert (state.acked, state.acked_downstream) == (1, 1)
    # A group that read everything sits at 4, past the removed offsets.
    assert syncs.written == [(0, 0, False), (1, 1, False), (4, 2, True)]
    copier.copy_batch(lambda: False)
    assert fetcher.fetches == [0, 4]


def test_a_rejected_batch_stops_its_partition_naming_it() -> None:
    copier, fetcher, raw, _, progress = _copier([_records(0, 2), _records(2, 2)])
    failures: list[None] = []
    copier._on_partition_failed = lambda: failures.append(None)
    raw.refuse = {0}
    copier.copy_batch(lambda: False)
    copier.copy_batch(lambda: False)
    assert fetcher.fetches == [0]  # stopped: not fetched again
    failed = copier.failed_partitions()
    assert list(failed) == ["A.t-0"] and "rejected a batch of t-0 (offsets 0..3" in failed["A.t-0"]
    assert "InvalidRecordError" in failed["A.t-0"] and len(failures) == 1
    copier.commit_progress()
    assert progress.written == {} and copier.by_source[("t", 0)].acked == -1


def test_a_record_rejected_on_the_record_path_stops_its_partition_after_the_ones_before() -> None:
    copier, _, raw, _, progress = _copier([_records(0, 4), _records(4, 2)], stored={("t", 0): 0})
    consumer: RecordsConsumer = copier.consumer
    consumer.queued = [Record("t", 0, o, value=b"x" * o) for o in (1, 2, 3)]
    producer: FakeProducer = copier.producer
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    producer.outcome = lambda r: too_large if r.value() == b"xx" else None
    copier.copy_batch(lambda: False)
    failed = copier.failed_partitions()["A.t-0"]
    assert "rejected record t-0 offset 2 (2 bytes)" in failed and raw.produced == []
    copier.commit_progress()
    assert progress.written == {("t", 0): 1}  # offset 1 was copied before it


def test_assigned_again_continues_after_progress() -> None:
    copier, fetcher, _, _, _ = _copier([_records(0, 2)])
    copier.copy_batch(lambda: False)
    copier.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    copier.copy_batch(lambda: False)
    assert fetcher.fetches == [0, 2]


def test_one_round_fetches_every_partition_and_produces_them_together() -> None:
    """Three partitions: two whose batches all pass share one produce; the third has a
    batch fetched from inside, copied record by record, then its next batch produced.
    The next round's fetch goes out from where this one ends, before producing."""
    fetchers = {
        ("t", 0): FakeFetcher([_records(0, 2), _records(2, 3)]),
        ("t", 1): FakeFetcher([_records(0, 4)]),
        ("t", 2): FakeFetcher([_records(0, 4), _records(4, 2)]),
        ("t", 3): FakeFetcher([]),  # idle
    }
    producers = {("A.t", p): FakeRawProducer() for p in range(4)}
    raw = FakeRaw(fetchers, producers)
    copier = _copier_over(raw, {("t", 2): 1})
    copier.assign([NewPartition("t", p, "A.t") for p in range(4)], {})
    consumer: RecordsConsumer = copier.consumer
    consumer.queued = [Record("t", 2, o, key=b"k", value=b"v") for o in (2, 3, 4)]
    producer: FakeProducer = copier.producer
    producer.skip("A.t", 2, TARGET_START)
    producers[("A.t", 2)].end = TARGET_START + 2  # after the two records the record path copies
    copier.copy_batch(lambda: False)
    assert raw.rounds == [{("t", 0): 0, ("t", 1): 0, ("t", 2): 2, ("t", 3): 0}]
    assert raw.prefetched == [{("t", 0): 5, ("t", 1): 4, ("t", 2): 6, ("t", 3): 0}]
    assert raw.produce_calls == [[("A.t", 0), ("A.t", 1)], [("A.t", 2)]]
    # t-0's two small batches go merged, as one
    assert producers[("A.t", 0)].produced == [0] and producers[("A.t", 1)].produced == [0]
    assert producers[("A.t", 2)].produced == [4]
    acked = {p: (s.acked, s.acked_downstream) for (_, p), s in copier.by_source.items()}
    assert acked == {
        0: (4, TARGET_START + 4),
        1: (3, TARGET_START + 3),
        2: (5, TARGET_START + 3),
        3: (-1, -1),
    }
    copier.copy_batch(lambda: False)
    assert raw.rounds[-1] == {("t", 0): 5, ("t", 1): 4, ("t", 2): 6, ("t", 3): 0}


def test_a_rejected_partition_stops_alone() -> None:
    fetchers = {("t", p): FakeFetcher([_records(0, 2)]) for p in range(2)}
    producers = {("A.t", p): FakeRawProducer() for p in range(2)}
    producers[("A.t", 1)].refuse = {0}
    raw = FakeRaw(fetchers, producers)
    copier = _copier_over(raw)
    copier.assign([NewPartition("t", p, "A.t") for p in range(2)], {("t", 0): 0, ("t", 1): 0})
    copier.copy_batch(lambda: False)
    copier.copy_batch(lambda: False)
    assert list(copier.failed_partitions()) == ["A.t-1"]
    assert raw.rounds[-1] == {("t", 0): 2}  # the stopped partition is not fetched again
    assert copier.by_source[("t", 0)].acked == 1


def test_paused_reads_nothing_drops_fetches_out_and_measures_lag_from_the_source() -> None:
    """A paused copier fetches nothing, drops the answers of fetches already out (what
    they bring was read while paused), and measures lag from the source's high
    watermark, which no fetch brings now."""
    copier, _fetcher, _raw, _syncs, _progress = _copier([_records(0, 3)])
    clients = copier.raw
    copier.copy_batch(lambda: False)
    rounds = len(clients.rounds)  # type: ignore[attr-defined]
    copier.set_paused(True)
    copier.copy_batch(lambda: False)
    assert len(clients.rounds) == rounds  # type: ignore[attr-defined]
    assert clients.discarded == 1  # type: ignore[attr-defined]
    copier.update_lag()
    state = copier.by_source[("t", 0)]
    assert state.stats.lag == 100 - 3  # RecordsConsumer's high watermark, from position 3
    copier.set_paused(False)
    copier.copy_batch(lambda: False)
    assert len(clients.rounds) == rounds + 1  # type: ignore[attr-defined]


def test_paused_before_any_partition_touches_no_client() -> None:
    """A flow whose topics do not exist yet has no partition, so its raw clients were
    never opened; paused so, its copier waits, where it once asked the unopened clients to
    drop fetches and failed its part ("raw clients of A->B is not open")."""
    raw = FakeRaw({}, {})
    copier = _copier_over(raw)
    copier.set_paused(True)
    assert copier.copy_batch(lambda: False)
    assert not raw.opened and raw.discarded == 0 and raw.rounds == []


def test_a_batch_too_large_for_the_target_goes_record_by_record() -> None:
    """The target's max.message.bytes below the source's batch: its records go one by
    one; the one that still does not fit stops the partition naming its offset."""
    copier, _, raw, _, progress = _copier([_records(0, 3), _records(3, 2)])
    raw.too_large = {0}
    consumer: RecordsConsumer = copier.consumer
    consumer.queued = [Record("t", 0, o, value=b"x" * (o + 1)) for o in range(5)]
    producer: FakeProducer = copier.producer
    producer.outcome = lambda r: (
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE) if r.value() == b"xxx" else None
    )
    copier.copy_batch(lambda: False)
    failed = copier.failed_partitions()["A.t-0"]
    assert "rejected record t-0 offset 2 (3 bytes)" in failed and raw.produced == []
    copier.commit_progress()
    assert progress.written == {("t", 0): 1}  # offsets 0 and 1 were copied before it


def test_a_batch_too_large_whose_records_fit_is_copied_and_the_next_passes() -> None:
    """The produce that carried the refused batch is copied record by record (the batches
    after it in the same request too); the next round passes batches again."""
    copier, fetcher, raw, _, progress = _copier([_records(0, 3), _records(3, 2)])
    raw.too_large = {0}
    consumer: RecordsConsumer = copier.consumer
    consumer.queued = [Record("t", 0, o, value=b"x") for o in range(5)]
    copier.copy_batch(lambda: False)
    assert copier.failed_partitions() == {} and raw.produced == []
    copier.commit_progress()
    assert progress.written == {("t", 0): 4}
    fetcher.log.append(_records(5, 2))
    copier.copy_batch(lambda: False)
    assert raw.produced == [5]  # the next batch passed as it is
