"""The batch copier (``replication.copy.mode = batch``, at-least-once or exactly-once): the
source's record batches passed through as they are, compressed bytes untouched. Issue 29;
docs/design/batch-passthrough.md.

Contract, on the one thread that owns the copier, with one `RawCopyClients` (one event
loop, run on that thread: mm2py.kafka.raw_clients) for all its partitions:
- Each round fetches every assigned partition from its position (after its progress, else
  its log start) at read_committed, one Fetch per source leader, and `classify`s the
  batches (mm2py.kafka.record_batches). The next round's Fetch goes out before this
  round's batches are produced; its answers are used only after they are acknowledged,
  caught up with what reached the source while they waited (`FetchSession`).
- PASS batches go, in order, to the same partition of the remote topic through the one
  idempotent producer (batches of several partitions share a Produce), which answers with
  each batch's target base offset. Runs of small uncompressed batches go merged, one
  batch each (`merge_small`: a producer with linger 0 writes a batch a record, and a
  Produce request carries one batch a partition). A batch of n records from source
  offset s at target offset t proves s..s+n-1 at t..t+n-1. DROP batches (markers,
  aborted transactions) are skipped.
- RECORDS batches (compaction gaps, a delete horizon, LogAppendTime, magic 0/1, a fetch that
  starts inside the batch) are handed to the record path: the source part's consumer and
  producer (librdkafka: every codec, read_committed, the timestamps a reader sees) copy
  their records one by one, each with a delivery report, and are flushed before the next
  batch is produced, so the remote partition keeps the source's order. aiokafka could
  decode them, but has no zstd, lz4 or snappy codec here.
- Nothing of a partition is produced before what was produced of it before is acknowledged,
  so everything produced is proven: `PartitionState.acked` is the last source offset on
  the target.
- Offset syncs follow `SyncRule` (a batch's first record where the distance changes, the
  position past markers and aborted batches, the latest one at each progress write);
  progress, syncs and the statistics go through the committer of the flow's delivery
  mode, as the record copier's do. A PASS batch counts its records, its bytes as stored
  (compressed), and its latency and record age spread from its base to its max timestamp.
- Exactly-once: the raw clients are `RawTransactionalClients` with the task's
  transactional id; a round that fetched batches opens a transaction (`records_read`),
  the committer commits it with the progress at its interval (`RawTransactions`), and
  counts and syncs wait for the commit. RECORDS batches are read on the record path but
  produced by the raw producer, in batches built for them, inside the transaction. A
  round that fails aborts the open transaction (`Committer.fail`), as nothing proves
  what its failed produce left in it.
- A position outside the log (`OffsetOutOfRange`) continues from the log start, counting
  the offsets below it as deleted before they were copied (`PartitionStats.skipped`).
  A batch the target refuses as too large goes record by record; a batch or record the
  target rejects otherwise (`BatchRejected`, a delivery error) stops its partition,
  naming it (of records refused together, the largest), as the record copier does.
  Paused, the copier reads nothing (fetches already out are dropped) and measures lag
  from the source's high watermarks. Any other fetch or produce that fails
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

from mm2py.kafka.raw_clients import BatchRejected, Fetched, OffsetOutOfRange, RawCopyClients
from mm2py.kafka.raw_transactions import RawTransactionalClients
from mm2py.kafka.record_batches import (
    Classified,
    Decision,
    Reason,
    RecordBatch,
    classify,
    merge_small,
    split_batches,
)
from mm2py.logs import partition_fields
from mm2py.replication.committers import Transactions, committer_for
from mm2py.replication.copy_loop import NewPartition, describe_partitions, log_deleted_before_copy
from mm2py.replication.delivery import PartitionState, producer_failed, record_size
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.stats import ReplicationStats

log = logging.getLogger(__name__)

# The longest a batch handed to the record path may take to read and be acknowledged.
RECORDS_TIMEOUT = 60.0
CONSUME_CHUNK = 500
WATERMARK_TIMEOUT = 10.0
PAUSED_LAG_TIMEOUT = 1.0


@dataclass
class _Partition:
    """One assigned partition: its copy state and next offset to fetch."""

    state: PartitionState
    position: int

    @property
    def remote(self) -> tuple[str, int]:
        """The remote partition, as the raw producer names it."""
        return (self.state.remote_topic, self.state.partition)


@dataclass
class _Round:
    """One partition's share of a fetch: its batches, classified, and where it goes on."""

    part: _Partition
    fetched: Fetched
    items: list[Classified]

    @property
    def end(self) -> int:
        """The position after this round's whole batches."""
        if not self.items:
            return self.part.position
        return self.items[-1].batch.header.last_offset + 1

    @property
    def passes_only(self) -> bool:
        return all(item.decision is not Decision.RECORDS for item in self.items)


class BatchCopier:
    """Copies the assigned partitions of one flow (A->B) batch by batch (see the module).

    Takes its clients ready-made: the source consumer (with ``enable.partition.eof``) and
    target producer of the record path (confluent-kafka: RECORDS batches, log start
    offsets, and the committer's flushes), and the raw clients (opened at the first
    assignment, closed by `finish`).
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
        raw: RawCopyClients,
        poll_timeout: float = 1.0,
        on_partition_failed: Callable[[], None] | None = None,
        transactions: Transactions | None = None,
    ) -> None:
        """`on_partition_failed`: called when a rejected batch or record stops a partition.
        `transactions` (exactly-once): their writer is `RawTransactions` over `raw`, a
        `RawTransactionalClients`, which then also produces the record path's records."""
        self.flow_name = flow_name
        self.target_alias = target_alias
        self.consumer = consumer
        self.producer = producer
        self.stats = stats
        self._stored = dict(stored)
        self.raw = raw
        self._poll_timeout = poll_timeout
        self._on_partition_failed = on_partition_failed
        self.by_source: dict[SourcePartition, PartitionState] = {}
        self.committer = committer_for(
            transactions, flow_name, target_alias, producer, progress, syncs, self.by_source
        )
        self._transactional = isinstance(raw, RawTransactionalClients)
        if (transactions is not None) != self._transactional:
            raise ValueError("exactly-once needs transactional raw clients, and only it")
        self._partitions: dict[SourcePartition, _Partition] = {}
        # Those of `_partitions` not stopped, kept until one is assigned, let go or stopped
        # (or all are let go at `finish`).
        self._copying: dict[SourcePartition, _Partition] | None = None
        self.paused = False
        # Batches by reason (mm2py_batches_total), counted since the flow's first copier.
        if stats.batches is None:
            stats.batches = {reason.value: 0 for reason in Reason}
        self.reasons: dict[str, int] = stats.batches

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
            if state.acked >= 0:
                position = state.acked + 1
            else:
                position = earliest.get(where, -1)
                if position < 0:
                    position = self._log_start(state)
            # assigned again without being let go: on from its progress (an answer to the
            # old position that is still out is not used)
            self._partitions[where] = _Partition(state, position)
            self._copying = None
            started.append(TopicPartition(p.topic, p.partition, position))
        if started:
            self.raw.open()
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
            self._copying = None
            part.state.gone = True
            part.state.stats.lag = 0
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
        """One fetch round over every assigned partition, and what it brought copied and
        proven. Raises when the part must restart."""
        parts = self._copying
        if parts is None:
            parts = {k: p for k, p in self._partitions.items() if p.state.failure is None}
            self._copying = parts
        if self.paused:
            # Nothing is read while paused: answers to fetches sent before are dropped.
            # Clients not open yet (no partition was ever assigned) sent no fetch.
            if self.raw.is_open:
                self.raw.discard_fetches()
            time.sleep(min(self._poll_timeout, 0.1))
        elif not parts:
            time.sleep(min(self._poll_timeout, 0.1))
        else:
            self.stats.roll(time.time())
            try:
                self._copy_round(parts, give_up)
            except BaseException as exc:
                # Exactly-once: a produce that failed may have left batches in the open
                # transaction that nothing proves; `finish` aborts it rather than commit.
                self.committer.fail(f"flow {self.flow_name}: {exc}")
                raise
        self.committer.end_batch(caught_up=True)
        if self._transactional:
            # Positions past markers get their syncs once the records before are
            # committed, which may have been just now.
            for part in parts.values():
                self._sync_position(part)
        return True

    def _copy_round(
        self, parts: dict[SourcePartition, _Partition], give_up: Callable[[], bool]
    ) -> None:
        positions = {k: p.position for k, p in parts.items()}
        fetched = self.raw.fetch(positions)
        wall = time.time()
        rounds: dict[SourcePartition, _Round] = {}
        for where, result in fetched.items():
            part = parts[where]
            if isinstance(result, OffsetOutOfRange):
                self._restart_at_log_start(part)
                positions[where] = part.position
                continue
            items = classify(split_batches(result.records).batches, part.position, result.aborted)
            for item in items:
                self.reasons[item.reason.value] += 1
            rounds[where] = _Round(part, result, merge_small(items))
        # The next fetch goes out with this round's produce, from where this round ends:
        # its answers are read in the next round, after this round's batches are
        # acknowledged.
        ahead = None
        if not give_up():
            ahead = positions | {k: r.end for k, r in rounds.items()}
        if any(r.items for r in rounds.values()):
            self.committer.records_read()  # exactly-once: a transaction is open
        self._pass_rounds([r for r in rounds.values() if r.passes_only], wall, ahead)
        for r in rounds.values():
            if not r.passes_only and r.part.state.failure is None:
                self._copy_in_order(r, wall)
        for r in rounds.values():
            if r.part.state.failure is None:
                r.part.state.stats.lag = max(r.fetched.high_watermark - r.part.position, 0)
                self._sync_position(r.part)

    def _pass_rounds(
        self, rounds: list[_Round], wall: float, ahead: Mapping[SourcePartition, int] | None
    ) -> None:
        """Produce the PASS batches of partitions that have nothing to go record by record,
        all in one `produce`, which first sends the next fetch, from `ahead` (None: none);
        DROP batches only move the position."""
        batches = {
            r.part.remote: [i.batch for i in r.items if i.decision is Decision.PASS] for r in rounds
        }
        produced = self.raw.produce({k: v for k, v in batches.items() if v}, prefetch=ahead)
        for r in rounds:
            key = r.part.remote
            outcome = produced.get(key)
            if outcome is not None and not self._acknowledged(r.part, batches[key], outcome, wall):
                continue
            r.part.position = r.end

    def _copy_in_order(self, r: _Round, wall: float) -> None:
        """A fetch with batches to go record by record: PASS runs produced before and after
        each of them, in log order."""
        part, state = r.part, r.part.state
        passing: list[RecordBatch] = []
        for item in r.items:
            if item.decision is Decision.PASS:
                passing.append(item.batch)
                continue
            self._pass(part, passing, wall)
            passing = []
            if state.failure is not None:
                return
            if item.decision is Decision.RECORDS:
                self._copy_records(part, item.batch)
                if state.failure is not None:
                    return
            part.position = item.batch.header.last_offset + 1
        self._pass(part, passing, wall)

    def _restart_at_log_start(self, part: _Partition) -> None:
        """The position is not in the log: continue from the log start, as the record
        copier's consumer does (auto.offset.reset = earliest); offsets below it were
        deleted before they were copied (counted in `skipped` and logged, as there)."""
        state = part.state
        low = self._log_start(state)
        if part.position < low:
            state.stats.skipped += low - part.position
            log_deleted_before_copy(
                self.flow_name,
                self.stats.source,
                (state.topic, state.partition),
                part.position,
                low,
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
        self._copying = None
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
        """Produce one partition's PASS batches as they are (see `_acknowledged`)."""
        if not batches:
            return
        key = part.remote
        if self._acknowledged(part, batches, self.raw.produce({key: batches})[key], wall):
            part.position = batches[-1].header.last_offset + 1

    def _acknowledged(
        self,
        part: _Partition,
        batches: list[RecordBatch],
        outcome: list[int] | BatchRejected,
        wall: float,
    ) -> bool:
        """Record what produced PASS batches prove, each where it landed; False when the
        target rejected one (the partition is stopped)."""
        state = part.state
        stats = state.stats
        committer = self.committer
        if isinstance(outcome, BatchRejected) and outcome.too_large:
            return self._copy_too_large(part, batches, outcome)
        if isinstance(outcome, BatchRejected):
            exc = outcome
            # Batches before the refused one may be on the target: at-least-once, they
            # count for nothing and are copied again when the flow is restarted.
            first = batches[0].header
            self._stop_partition(
                state,
                f"target {self.target_alias} rejected a batch of {state.topic}-"
                f"{state.partition} (offsets {first.base_offset}..{batches[-1].header.last_offset}"
                f" sent as {len(batches)} batches) for remote topic {state.remote_topic}: {exc}",
            )
            return False
        now = time.time()
        for batch, target_base in zip(batches, outcome, strict=True):
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
        return True

    def _copy_too_large(
        self, part: _Partition, batches: list[RecordBatch], refused: BatchRejected
    ) -> bool:
        """Batches the target refused as larger than it takes (its max.message.bytes may
        be below the source's): their records go one by one, so that each one the target
        cannot take stops the partition naming its offset, as with the record copier.
        False when one was refused (the partition is stopped)."""
        state = part.state
        log.warning(
            "flow %s: %s-%s offsets %d..%d: the target refused the batches as too large (%s);"
            " copying their records one by one",
            self.flow_name,
            state.topic,
            state.partition,
            batches[0].header.base_offset,
            batches[-1].header.last_offset,
            refused,
            extra=partition_fields(state.topic, state.partition),
        )
        self._copy_records(part, *batches)
        return state.failure is None

    def _copy_records(self, part: _Partition, *batches: RecordBatch) -> None:
        """Copy the records of `batches` (consecutive in the log) from the partition's
        position through the record path's consumer and producer; returns once every one
        is acknowledged."""
        state = part.state
        first = max(part.position, batches[0].header.base_offset)
        last = batches[-1].header.last_offset
        msgs = self._read_records(state, first, last)
        if self._transactional:
            self._copy_records_in_transaction(state, msgs)
            return
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
        for msg, (err, downstream) in zip(msgs, reports, strict=True):
            upstream = msg.offset()
            if err is not None:
                if producer_failed(err) or err.code() == KafkaError._MSG_TIMED_OUT:
                    raise RuntimeError(
                        f"flow {self.flow_name}: copying {state.topic}-{state.partition} "
                        f"offset {upstream} to {self.target_alias} failed: {err.str()}; the "
                        "part restarts from its progress"
                    )
                # The target refuses a whole batch when one record is too large, so every
                # record of it reports the error: the largest is named, as the record
                # copier does.
                refused = [(m, e) for m, (e, _) in zip(msgs, reports, strict=True) if e is not None]
                msg, err = max(refused, key=lambda r: record_size(r[0]))
                self._stop_partition(
                    state,
                    f"target {self.target_alias} rejected record {state.topic}-"
                    f"{state.partition} offset {msg.offset()} ({record_size(msg)} bytes) for "
                    f"remote topic {state.remote_topic}: {err.str()}",
                )
                return
            self._record_copied(state, msg, downstream, now)
        log.debug(
            "flow %s: %s-%s offsets %d..%d copied record by record (%d records)",
            self.flow_name,
            state.topic,
            state.partition,
            first,
            last,
            len(msgs),
        )

    def _copy_records_in_transaction(self, state: PartitionState, msgs: list[Any]) -> None:
        """Exactly-once: the records go through the raw transactional producer, in
        batches built for them (the record path's producer is outside the transaction)."""
        if not msgs:
            return
        assert isinstance(self.raw, RawTransactionalClients)
        remote = (state.remote_topic, state.partition)
        outcome = self.raw.produce_records(
            {remote: [(m.key(), m.value(), m.timestamp()[1], m.headers() or ()) for m in msgs]}
        )[remote]
        if isinstance(outcome, BatchRejected):
            msg = max(msgs, key=record_size)  # the largest of those refused together
            self._stop_partition(
                state,
                f"target {self.target_alias} rejected record {state.topic}-"
                f"{state.partition} offset {msg.offset()} ({record_size(msg)} bytes) for "
                f"remote topic {state.remote_topic}: {outcome}",
            )
            return
        now = time.time()
        for msg, downstream in zip(msgs, outcome, strict=True):
            self._record_copied(state, msg, downstream, now)

    def _record_copied(self, state: PartitionState, msg: Any, downstream: int, now: float) -> None:
        """One record copied on the record path, acknowledged at `downstream`."""
        upstream = msg.offset()
        if state.syncs.on_copied(upstream, downstream):
            self.committer.on_sync(state, upstream, downstream)
        state.read = state.acked = upstream
        state.acked_downstream = downstream
        ts = msg.timestamp()[1]
        state.stats.bytes += record_size(msg)
        state.stats.record_age.observe(now - ts / 1000.0)
        self.committer.on_copied(state.stats, 1, ts, ts, now)

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
        if self.committer.copied_through(state) < state.acked:
            return  # exactly-once: once the last record copied is committed
        for sync in state.syncs.on_position(part.position, state.acked, state.acked_downstream):
            syncs.write(state.topic, state.partition, *sync)

    # -- periodic work ------------------------------------------------------------

    def update_lag(self) -> None:
        """Lag is measured at each fetch (its high watermark); while paused, when nothing
        is fetched, from the source's high watermark of each partition (a request each;
        a source that does not answer within PAUSED_LAG_TIMEOUT ends the pass, so that
        resuming and stopping are not held up)."""
        if not self.paused:
            return
        for part in list(self._partitions.values()):
            state = part.state
            if state.failure is not None:
                continue
            try:
                _, high = self.consumer.get_watermark_offsets(
                    state.source_tp, timeout=PAUSED_LAG_TIMEOUT, cached=False
                )
            except KafkaException:
                return  # unknown for now; measured again in a second
            state.stats.lag = max(int(high) - part.position, 0)

    def commit_progress(self, wait_until: float | None = None) -> None:
        """The periodic progress write: `AtLeastOnce.record_progress`."""
        self.committer.record_progress(wait_until)

    def finish(self, deadline: float) -> None:
        """Record progress by `deadline` (monotonic); close the raw clients."""
        log.info(
            "flow %s: batches by reason since the start: %s",
            self.flow_name,
            " ".join(f"{reason}={n}" for reason, n in self.reasons.items()),
        )
        try:
            self.committer.finish(deadline)
        finally:
            self._partitions.clear()
            self._copying = None
            self.raw.close()

    @property
    def restart_reason(self) -> str | None:
        return self.committer.restart_reason
