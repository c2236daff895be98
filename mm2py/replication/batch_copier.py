"""The batch copier (``replication.copy.mode = batch``, at-least-once): the source's record
batches passed through as they are, compressed bytes untouched. Issue 29;
docs/design/batch-passthrough.md.

Contract, per assigned source partition, on the one thread that owns the copier:
- Fetch raw batches from the partition's position (after its progress, else its log start)
  with a `RawFetcher` (read_committed), and `classify` them (mm2py.kafka.record_batches).
- PASS batches go, in order, to the same partition of the remote topic through the
  partition's `IdempotentRawProducer`, which answers with each batch's target base offset;
  a batch of n records from source offset s at target offset t proves s..s+n-1 at
  t..t+n-1. DROP batches (markers, aborted transactions) are skipped.
- RECORDS batches (compaction gaps, a delete horizon, LogAppendTime, magic 0/1, a fetch that
  starts inside the batch) are handed to the record path: the source part's consumer and
  producer (librdkafka: every codec, read_committed, the timestamps a reader sees) copy
  their records one by one, each with a delivery report, and are flushed before the next
  batch is produced, so the remote partition keeps the source's order. aiokafka could
  decode them, but has no zstd, lz4 or snappy codec here.
- Nothing is produced before what was produced before it is acknowledged, so everything
  produced is proven: `PartitionState.acked` is the last source offset on the target.
- Offset syncs follow `SyncRule` (a batch's first record where the distance changes, the
  position past markers and aborted batches, the latest one at each progress write);
  progress, syncs and the statistics go through the `AtLeastOnce` committer, as the
  record copier's do. A PASS batch counts its records, its bytes as stored (compressed),
  and its latency and record age spread from its base to its max timestamp.
- A position outside the log (`OffsetOutOfRange`) continues from the log start, counting
  the offsets below it as deleted before they were copied (`PartitionStats.skipped`).
  A batch or record the target rejects (`BatchRejected`, a delivery error) stops its
  partition, naming it, as the record copier does. Any other fetch or produce that fails
  for good raises (`RawPartitionError`): the part restarts from its progress (records
  after it may be copied twice, as at-least-once allows).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mm2py.kafka.raw_partition import (
    BatchRejected,
    IdempotentRawProducer,
    OffsetOutOfRange,
    RawFetcher,
)
from mm2py.kafka.record_batches import Decision, Reason, RecordBatch, classify, split_batches
from mm2py.logs import partition_fields
from mm2py.replication.committers import AtLeastOnce
from mm2py.replication.copy_loop import NewPartition, describe_partitions
from mm2py.replication.delivery import PartitionState, producer_failed, record_size
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.stats import ReplicationStats

log = logging.getLogger(__name__)

# How long one fetch waits for records when a partition has none: the copier fetches its
# partitions one after another, so an idle round takes this long per partition.
FETCH_WAIT_MS = 100
# The longest a batch handed to the record path may take to read and be acknowledged.
RECORDS_TIMEOUT = 60.0
CONSUME_CHUNK = 500
WATERMARK_TIMEOUT = 10.0

FetcherFactory = Callable[[str, int], RawFetcher]
ProducerFactory = Callable[[str, int], IdempotentRawProducer]


@dataclass
class _Partition:
    """One assigned partition: its copy state, raw clients and next offset to fetch."""

    state: PartitionState
    fetcher: RawFetcher
    producer: IdempotentRawProducer
    position: int


class BatchCopier:
    """Copies the assigned partitions of one flow (A->B) batch by batch (see the module).

    Takes its clients ready-made: the source consumer (with ``enable.partition.eof``) and
    target producer of the record path (confluent-kafka: RECORDS batches, log start
    offsets, and the committer's flushes), and factories of each partition's raw fetcher
    and producer, called (and opened) when the partition is assigned.
    """

    def __init__(
        self,
        flow_name: str,
        target_alias: str,
        consumer: Any,
        producer: Any,
        progress: ProgressStore,
        syncs: OffsetSyncWriter | None,
        stats: ReplicationStats,
        stored: Mapping[SourcePartition, int],
        fetcher_for: FetcherFactory,
        producer_for: ProducerFactory,
        poll_timeout: float = 1.0,
        on_partition_failed: Callable[[], None] | None = None,
    ) -> None:
        """`on_partition_failed`: called when a rejected batch or record stops a partition."""
        self.flow_name = flow_name
        self.target_alias = target_alias
        self.consumer = consumer
        self.producer = producer
        self.stats = stats
        self._stored = dict(stored)
        self._fetcher_for = fetcher_for
        self._producer_for = producer_for
        self._poll_timeout = poll_timeout
        self._on_partition_failed = on_partition_failed
        self.by_source: dict[SourcePartition, PartitionState] = {}
        self.committer = AtLeastOnce(flow_name, producer, progress, syncs, self.by_source)
        self._partitions: dict[SourcePartition, _Partition] = {}
        self.paused = False
        # Batches by reason, for the log and tests (a metric is left for later).
        self.reasons: dict[Reason, int] = dict.fromkeys(Reason, 0)

    # -- which partitions -------------------------------------------------------

    def assign(
        self, found: Sequence[NewPartition], earliest: Mapping[SourcePartition, int]
    ) -> None:
        """Start copying partitions: after their progress, else at `earliest`, else at
        their log start offset."""
        started = []
        for p in found:
            where = (p.topic, p.partition)
            state = self.by_source.get(where)
            if state is None:
                state = PartitionState(
                    p.topic,
                    p.partition,
                    p.remote_topic,
                    self.stats.partition(p.remote_topic, p.partition),
                )
                stored = self._stored.get(where)
                if stored is not None:
                    state.acked = state.committed = state.submitted = stored
                self.by_source[where] = state
            state.gone = False
            old = self._partitions.pop(where, None)
            if old is not None:  # assigned again without being let go: new clients
                _close(old)
            if state.acked >= 0:
                position = state.acked + 1
            else:
                position = earliest.get(where, -1)
                if position < 0:
                    position = self._log_start(state)
            fetcher = self._fetcher_for(p.topic, p.partition)
            producer = self._producer_for(p.remote_topic, p.partition)
            fetcher.open()
            try:
                producer.open()
            except BaseException:
                fetcher.close()
                raise
            self._partitions[where] = _Partition(state, fetcher, producer, position)
            started.append(TopicPartition(p.topic, p.partition, position))
        log.info("flow %s: now copying batches of %s", self.flow_name, describe_partitions(started))

    def _log_start(self, state: PartitionState) -> int:
        low, _ = self.consumer.get_watermark_offsets(
            state.source_tp, timeout=WATERMARK_TIMEOUT, cached=False
        )
        return max(int(low), 0)

    def unassign(self, gone: Sequence[SourcePartition]) -> list[str]:
        """Stop copying partitions (their progress stays); the topics let go."""
        topics = set()
        for where in gone:
            part = self._partitions.pop(where, None)
            if part is None:
                continue
            part.state.gone = True
            part.state.stats.lag = 0
            _close(part)
            topics.add(where[0])
        return sorted(topics)

    def set_paused(self, paused: bool) -> None:
        self.paused = paused
        log.info("flow %s: %s", self.flow_name, "paused" if paused else "resumed")

    def failed_partitions(self) -> dict[str, str]:
        """Partitions stopped by a rejected record, with the reason (from any thread)."""
        return {
            f"{s.remote_topic}-{s.partition}": s.failure
            for s in list(self.by_source.values())
            if s.failure is not None
        }

    # -- copying ------------------------------------------------------------------

    def copy_batch(self, give_up: Callable[[], bool]) -> bool:
        """One fetch per assigned partition, and what it brought copied and proven.
        Raises when the part must restart."""
        parts = [p for p in self._partitions.values() if p.state.failure is None]
        if self.paused or not parts:
            time.sleep(min(self._poll_timeout, 0.1))
        else:
            self.stats.roll(time.time())
            for part in parts:
                if give_up():
                    break
                self._copy_fetch(part)
        self.committer.end_batch(caught_up=True)
        return True

    def _copy_fetch(self, part: _Partition) -> None:
        """Fetch from the partition's position and copy what came, batch by batch."""
        state = part.state
        try:
            fetched = part.fetcher.fetch(part.position)
        except OffsetOutOfRange:
            self._restart_at_log_start(part)
            return
        wall = time.time()
        split = split_batches(fetched.records)
        passing: list[RecordBatch] = []
        for item in classify(split.batches, part.position, fetched.aborted):
            self.reasons[item.reason] += 1
            if item.decision is Decision.PASS:
                passing.append(item.batch)
                continue
            self._pass(part, passing, wall)
            passing = []
            if item.decision is Decision.RECORDS and state.failure is None:
                self._copy_records(part, item.batch)
            if state.failure is not None:
                return
            part.position = item.batch.header.last_offset + 1
        self._pass(part, passing, wall)
        if state.failure is not None:
            return
        state.stats.lag = max(fetched.high_watermark - part.position, 0)
        self._sync_position(part)

    def _restart_at_log_start(self, part: _Partition) -> None:
        """The position is not in the log: continue from the log start, as the record
        copier's consumer does (auto.offset.reset = earliest); offsets below it were
        deleted before they were copied (counted in `skipped` and logged, as there)."""
        state = part.state
        low = self._log_start(state)
        if part.position < low:
            state.stats.skipped += low - part.position
            log.warning(
                "flow %s: %s-%s: offsets %d..%d (%d records) were deleted on the source "
                "before they were copied",
                self.flow_name,
                state.topic,
                state.partition,
                part.position,
                low - 1,
                low - part.position,
                extra=partition_fields(state.topic, state.partition),
            )
        else:
            log.warning(
                "flow %s: %s-%s: offset %d is past the partition's end (truncated or "
                "created again); copying from its log start %d",
                self.flow_name,
                state.topic,
                state.partition,
                part.position,
                low,
                extra=partition_fields(state.topic, state.partition),
            )
        part.position = low

    def _stop_partition(self, state: PartitionState, failure: str) -> None:
        """Stop a partition whose batch or record the target rejected, as the record
        copier does: the others go on; restarting the flow copies it again."""
        state.failure = f"{failure}; the partition is stopped: fix the cause and restart the flow"
        log.error(
            "flow %s: %s",
            self.flow_name,
            state.failure,
            extra=partition_fields(state.topic, state.partition),
        )
        self.committer.rejected(state.failure)
        if self._on_partition_failed is not None:
            self._on_partition_failed()

    def _pass(self, part: _Partition, batches: list[RecordBatch], wall: float) -> None:
        """Produce PASS batches as they are; each proves its records where it landed."""
        if not batches:
            return
        state = part.state
        stats = state.stats
        committer = self.committer
        try:
            bases = part.producer.produce(batches)
        except BatchRejected as exc:
            # Batches before the refused one may be on the target: at-least-once, they
            # count for nothing and are copied again when the flow is restarted.
            first = batches[0].header
            self._stop_partition(
                state,
                f"target {self.target_alias} rejected a batch of {state.topic}-"
                f"{state.partition} (offsets {first.base_offset}..{batches[-1].header.last_offset}"
                f" sent as {len(batches)} batches) for remote topic {state.remote_topic}: {exc}",
            )
            return
        now = time.time()
        for batch, target_base in zip(batches, bases, strict=True):
            header = batch.header
            count = header.record_count
            if state.syncs.on_copied(header.base_offset, target_base):
                committer.on_sync(state, header.base_offset, target_base)
            state.read = state.acked = header.last_offset
            state.acked_downstream = target_base + count - 1
            stats.bytes += header.size
            first_ts, last_ts = header.base_timestamp, header.max_timestamp
            stats.record_age.observe_span(wall - first_ts / 1000.0, wall - last_ts / 1000.0, count)
            committer.on_copied(stats, count, first_ts, last_ts, now)
        part.position = batches[-1].header.last_offset + 1

    def _copy_records(self, part: _Partition, batch: RecordBatch) -> None:
        """Copy the records of `batch` from the partition's position through the record
        path's consumer and producer; returns once every one is acknowledged."""
        state = part.state
        first = max(part.position, batch.header.base_offset)
        last = batch.header.last_offset
        msgs = self._read_records(state, first, last)
        reports: list[tuple[KafkaError | None, int]] = []

        def on_delivery(err: KafkaError | None, msg: Any) -> None:
            reports.append((err, -1 if err is not None else msg.offset()))

        for msg in msgs:
            self.producer.produce(
                state.remote_topic,
                msg.value(),
                msg.key(),
                state.partition,
                on_delivery,
                None,
                msg.timestamp()[1],
                msg.headers(),
            )
        left = self.producer.flush(RECORDS_TIMEOUT)
        if left or len(reports) != len(msgs):
            raise RuntimeError(
                f"flow {self.flow_name}: {len(msgs) - len(reports)} records of "
                f"{state.topic}-{state.partition} offsets {first}..{last} were not "
                f"acknowledged by {self.target_alias} within {RECORDS_TIMEOUT:.0f} s; the part "
                "restarts from its progress"
            )
        now = time.time()
        stats = state.stats
        for msg, (err, downstream) in zip(msgs, reports, strict=True):
            upstream = msg.offset()
            if err is not None:
                if producer_failed(err) or err.code() == KafkaError._MSG_TIMED_OUT:
                    raise RuntimeError(
                        f"flow {self.flow_name}: copying {state.topic}-{state.partition} "
                        f"offset {upstream} to {self.target_alias} failed: {err.str()}; the "
                        "part restarts from its progress"
                    )
                self._stop_partition(
                    state,
                    f"target {self.target_alias} rejected record {state.topic}-"
                    f"{state.partition} offset {upstream} ({record_size(msg)} bytes) for "
                    f"remote topic {state.remote_topic}: {err.str()}",
                )
                return
            if state.syncs.on_copied(upstream, downstream):
                self.committer.on_sync(state, upstream, downstream)
            state.read = state.acked = upstream
            state.acked_downstream = downstream
            ts = msg.timestamp()[1]
            stats.bytes += record_size(msg)
            stats.record_age.observe(now - ts / 1000.0)
            self.committer.on_copied(stats, 1, ts, ts, now)
        log.debug(
            "flow %s: %s-%s offsets %d..%d copied record by record (%d records)",
            self.flow_name,
            state.topic,
            state.partition,
            first,
            last,
            len(msgs),
        )

    def _read_records(self, state: PartitionState, first: int, last: int) -> list[Any]:
        """The records a read_committed reader sees at offsets first..last: read until a
        record past `last`, the position past it, or the end of the partition (the
        consumer reports it: ``enable.partition.eof``). Compaction may have removed the
        batch's last records, so reaching `last` itself is not to be waited for."""
        consumer = self.consumer
        consumer.assign([TopicPartition(state.topic, state.partition, first)])
        msgs: list[Any] = []
        deadline = time.monotonic() + RECORDS_TIMEOUT
        try:
            while True:
                for msg in consumer.consume(CONSUME_CHUNK, 0.1):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            return msgs
                        if err.fatal():
                            raise KafkaException(err)
                        continue
                    if msg.offset() > last:
                        return msgs
                    if msg.offset() >= first:
                        msgs.append(msg)
                (now_at,) = consumer.position([state.source_tp])
                if now_at.offset > last:
                    return msgs
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"flow {self.flow_name}: reading {state.topic}-{state.partition} "
                        f"offsets {first}..{last} took over {RECORDS_TIMEOUT:.0f} s; the part "
                        "restarts from its progress"
                    )
        finally:
            consumer.unassign()

    def _sync_position(self, part: _Partition) -> None:
        """A position past markers or aborted batches after the last record copied gets
        its sync (`SyncRule.on_position`): a group that read to there sits there."""
        state = part.state
        syncs = self.committer.syncs
        if syncs is None or state.acked_downstream < 0 or part.position <= state.acked + 1:
            return
        for sync in state.syncs.on_position(part.position, state.acked, state.acked_downstream):
            syncs.write(state.topic, state.partition, *sync)

    # -- periodic work ------------------------------------------------------------

    def update_lag(self) -> None:
        """Lag is measured at each fetch (its high watermark); nothing to do here."""

    def commit_progress(self, wait_until: float | None = None) -> None:
        """The periodic progress write: `AtLeastOnce.record_progress`."""
        self.committer.record_progress(wait_until)

    def finish(self, deadline: float) -> None:
        """Record progress by `deadline` (monotonic); close the raw clients."""
        log.info(
            "flow %s: batches by reason since the start: %s",
            self.flow_name,
            " ".join(f"{reason.value}={n}" for reason, n in self.reasons.items()),
        )
        try:
            self.committer.finish(deadline)
        finally:
            for part in self._partitions.values():
                _close(part)
            self._partitions.clear()

    @property
    def restart_reason(self) -> str | None:
        return self.committer.restart_reason


def _close(part: _Partition) -> None:
    try:
        part.fetcher.close()
    finally:
        part.producer.close()
