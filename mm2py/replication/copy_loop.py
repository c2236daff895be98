"""The copy loop: reads the partitions it is given from the source and sends each record to
its remote partition; the pieces below it say what that proves and when it is recorded.
The design: docs/design/copy-path.md.

Invariants:
- A record keeps its partition, key, value, headers and timestamp; the source is read
  `read_committed`, on the one thread that owns the loop (`failed_partitions()` and the
  statistics may be read from any thread).
- Records go out in runs (consecutive source offsets of one partition in one batch) with
  the delivery callbacks of its `DeliveryProof` (mm2py.replication.delivery): what counts
  as copied, and what must be copied again, is the proof's, never the loop's.
- After each batch the loop asks its `Committer` (mm2py.replication.committers) whether
  it goes on and whether to commit; it never branches on the delivery mode.
- Offset syncs follow `SyncRule` and describe recorded records only.
- A partition given a stop offset (`NewPartition.stop_at`) copies nothing from it on.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from mm2py.compat.schema_framing import HEADER_SIZE
from mm2py.kafka.consume import consume_batch
from mm2py.kafka.produce import produce_when_room
from mm2py.logs import partition_fields
from mm2py.replication.committers import COMMIT_TIMEOUT, Transactions, committer_for
from mm2py.replication.deleted_records import DeletedRecordWatch
from mm2py.replication.delivery import (
    NO_STOP,
    NONE_UNPROVEN,
    DeliveryProof,
    PartitionState,
    Run,
    producer_failed,
    record_size,
)
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.schemas import RegistryUnavailable, SchemaTranslator, UnresolvedSchema
from mm2py.replication.stats import ReplicationStats

log = logging.getLogger(__name__)

BATCH_SIZE = 5000
# While records await acknowledgement, wait at most this long for new ones: their
# delivery reports (progress, offset syncs, latency) are served between batches, so a
# report waits for the end of the current wait or batch. This bounds how late the
# replication latency taken in it can be (plus the batch's copying time, ~3 us a
# record). When no acknowledgement came for a while (a slow or unreachable target)
# the wait grows to a tenth of that time, up to ACK_POLL_MAX: a report is then late by
# at most ~10% of its latency, and a loop waiting on a dead target wakes 10 times a
# second, not 1,000 (~3% of a core).
ACK_POLL_TIMEOUT = 0.001
ACK_POLL_MAX = 0.1
LEARN_TOPIC_TIMEOUT = 2.0
# Stopping while the target's queue is full, the longest wait for room for one more
# record, the last of a run, so that its report proves the run (`_end_run_at_stop`).
ROOM_AT_STOP = 1.0
# Show at most this many partitions in an INFO line; the whole list goes to DEBUG.
LOGGED_PARTITIONS = 20
# librdkafka's line (facility OFFSET) when it resets a partition's position, e.g.
# "[thrd:main]: t [0]: offset reset (at offset 20 (leader epoch -1), broker 1) to ...".
_OFFSET_RESET = re.compile(r"(?:^|: )(\S+) \[(\d+)\]: offset reset \(at offset (\d+)")


class OffsetResetLog:
    """The copy consumer's librdkafka `logger`: passes every line on to `inner` and
    tells `on_reset` (the copy loop's `offset_reset`) which partition was reset, and
    the position it was reset from."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.on_reset: Callable[[str, int, int], None] | None = None

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.inner.log(level, fmt, *args)
        if self.on_reset is not None and len(args) == 3 and args[0] == "OFFSET":
            found = _OFFSET_RESET.search(str(args[2]))
            if found:
                self.on_reset(found[1], int(found[2]), int(found[3]))


class SourceReadFailed(Exception):
    """A partition copied up to a stop offset could not be read, for good."""


@dataclass(frozen=True)
class NewPartition:
    """A source partition to start copying, and its remote topic; with `stop_at`, copying
    ends before that source offset (`PartitionState.at_stop` tells when it is reached: the
    record before it read, or a later offset, or the partition's end with
    ``enable.partition.eof``)."""

    topic: str
    partition: int
    remote_topic: str
    stop_at: int | None = None


class CopyLoop:
    """Copies the assigned partitions of one flow (A->B) on the caller's thread.

    Takes its clients ready-made: a consumer of the source (read_committed, no
    group), a producer for the target, the progress store and the sync writer.
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
        on_partition_failed: Callable[[], None] | None = None,
        poll_timeout: float = 1.0,
        transactions: Transactions | None = None,
        failed: dict[SourcePartition, str] | None = None,
        per_record_reports: set[SourcePartition] | None = None,
        schemas: SchemaTranslator | None = None,
    ) -> None:
        """`poll_timeout`: the longest wait for records when nothing is in flight
        (``consumer.poll.timeout.ms``). `transactions`: copy exactly-once. `failed`:
        partitions stopped by a rejected record, kept by the caller across loops
        (exactly-once); the loop adds those it stops and does not copy them.
        `per_record_reports`: partitions copied with a delivery report per record, kept
        by the caller across loops; the loop adds those whose run it could not prove.
        `schemas`: give framed keys and values the target registry's schema ids (a record
        whose id cannot be resolved stops its partition, naming it)."""
        self.flow_name = flow_name
        self.target_alias = target_alias
        self.consumer = consumer
        self.producer = producer
        self.progress = progress
        self.syncs = syncs
        self.stats = stats
        self._stored = dict(stored)  # progress found at start
        self._on_partition_failed = on_partition_failed
        self._poll_timeout = poll_timeout
        self._ack_poll_max = min(poll_timeout, ACK_POLL_MAX)
        # When the loop last saw an acknowledgement, or began waiting for one (monotonic).
        self._ack_seen_at: float | None = None
        self.by_source: dict[SourcePartition, PartitionState] = {}
        # When and how what the target acknowledged is recorded (the delivery mode).
        self.committer = committer_for(
            transactions, flow_name, target_alias, producer, progress, syncs, self.by_source
        )
        # Which offsets the target holds, from the delivery reports.
        self.proof = DeliveryProof(
            flow_name, target_alias, self.committer, self._fail_partition, per_record_reports
        )
        self.paused = False
        # Records the source deleted before they were copied (see `deleted_records`).
        self.deletions = DeletedRecordWatch(self._deleted_before_copy)
        self._starts: dict[SourcePartition, int] = {}  # where each partition was assigned
        self._failed = failed if failed is not None else {}
        self._schemas = schemas

    # -- which partitions -------------------------------------------------------

    def assign(
        self, found: Sequence[NewPartition], earliest: Mapping[SourcePartition, int]
    ) -> None:
        """Start copying partitions: after their progress, else at `earliest` (their log
        start offsets), else at the beginning."""
        new: list[TopicPartition] = []
        for topic in sorted({p.topic for p in found}):
            self._learn_topic(topic)
        if self._schemas is not None:
            self._copy_subjects({p.topic: p.remote_topic for p in found})
        for p in found:
            state = self.by_source.get((p.topic, p.partition))
            if state is not None:
                # Its topic was deleted and exists again: continue after the last copied
                # offset (beyond the new topic's end, the consumer starts at its earliest).
                state.gone = False
                stored: int | None = state.acked if state.acked >= 0 else None
                state.sought = max(state.read, state.acked) + 1
            else:
                state = PartitionState(
                    p.topic,
                    p.partition,
                    p.remote_topic,
                    self.stats.partition(p.remote_topic, p.partition),
                )
                state.report_every_record = (p.topic, p.partition) in self.proof.per_record_reports
                if p.stop_at is not None:
                    state.stop_at = p.stop_at
                stored = self._stored.get((p.topic, p.partition))
                if stored is not None:
                    state.acked = state.committed = state.submitted = stored
                self.by_source[(p.topic, p.partition)] = state
                failure = self._failed.get((p.topic, p.partition))
                if failure is not None:
                    state.failure = failure  # stopped by an earlier loop: not copied
                    continue
            if stored is not None:
                start = stored + 1
            else:
                start = earliest.get((p.topic, p.partition), OFFSET_BEGINNING)
            new.append(TopicPartition(p.topic, p.partition, start))
            if start >= 0:
                self.deletions.start((p.topic, p.partition), start)
                self._starts[(p.topic, p.partition)] = start
        self.consumer.incremental_assign(new)
        if self.paused:
            self.consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in new])
        log.info("flow %s: now copying %s", self.flow_name, describe_partitions(new))
        if len(new) > LOGGED_PARTITIONS:
            log.debug(
                "flow %s: now copying %s",
                self.flow_name,
                ", ".join(f"{tp.topic}-{tp.partition}" for tp in new),
            )

    def _copy_subjects(self, remote_topics: Mapping[str, str]) -> None:
        """Copy the schema registry subjects of topics about to be copied (ids met later
        are resolved on demand: a failure here only costs a lookup then)."""
        assert self._schemas is not None
        for topic, remote in sorted(remote_topics.items()):
            try:
                self._schemas.copy_subjects(topic, remote)
            except UnresolvedSchema as exc:
                log.warning(
                    "flow %s: the subjects of %s were not copied up front (%s); its schema "
                    "ids are resolved when records need them",
                    self.flow_name,
                    topic,
                    exc,
                )
            except RegistryUnavailable as exc:
                # Each request waits for the client's retries: the other topics' would too.
                log.warning(
                    "flow %s: no subjects copied up front (%s); schema ids are resolved "
                    "when records need them",
                    self.flow_name,
                    exc,
                )
                return

    def unassign(self, gone: Sequence[SourcePartition]) -> list[str]:
        """Stop copying partitions (their progress stays); the topics let go."""
        tps = []
        for where in gone:
            state = self.by_source.get(where)
            if state is not None and not state.gone:
                state.gone = True
                state.stats.lag = 0
                self.deletions.forget(where)
                tps.append(TopicPartition(*where))
        if not tps:
            return []
        self.consumer.incremental_unassign(tps)
        return sorted({tp.topic for tp in tps})

    def _learn_topic(self, topic: str) -> None:
        """Make the consumer's metadata show `topic` (on the loop's thread).

        The consumer fetches nothing from a partition its metadata does not show (a
        topic created a moment ago, e.g. by another flow) until a periodic refresh,
        up to 10 s later. A consumer's metadata must not be asked for from another
        thread while it polls: librdkafka then never answers.
        """
        try:
            self.consumer.list_topics(topic, timeout=LEARN_TOPIC_TIMEOUT)
        except KafkaException as exc:
            log.warning(
                "flow %s: no metadata for %s yet (%s); copying starts when the "
                "consumer's next refresh shows it",
                self.flow_name,
                topic,
                exc.args[0].str(),
            )

    # -- pausing in place: the consumer stops fetching; positions, progress and
    # connections stay, so resuming continues with the next record.

    def set_paused(self, paused: bool) -> None:
        tps = [
            TopicPartition(s.topic, s.partition)
            for s in self.by_source.values()
            if s.failure is None and not s.gone
        ]
        if paused:
            self.consumer.pause(tps)
            log.info("flow %s: paused; no records are read until resumed", self.flow_name)
        else:
            self.consumer.resume(tps)
            log.info("flow %s: resumed", self.flow_name)
        self.paused = paused

    def failed_partitions(self) -> dict[str, str]:
        """Partitions stopped by a rejected record, with the reason (from any thread)."""
        return {
            f"{s.remote_topic}-{s.partition}": s.failure
            for s in list(self.by_source.values())  # a copy: the loop may add partitions
            if s.failure is not None
        }

    # -- copying ------------------------------------------------------------------

    def copy_batch(self, give_up: Callable[[], bool]) -> bool:
        """Copy what the source has now (waits for a first record up to the poll timeout,
        or ACK_POLL_TIMEOUT while records await acknowledgement).

        False when `give_up()` said to stop while the target's queue was full (the
        records after the one then waiting are not sent; it is, as its run's last, if
        room comes within ROOM_AT_STOP: progress, acknowledged records only, stays
        right). Raises RuntimeError when the part must restart.
        """
        if len(self.producer):
            wait = self._ack_wait()
        else:
            wait = self._poll_timeout
            self._ack_seen_at = None
        committer = self.committer
        msgs = consume_batch(self.consumer, BATCH_SIZE, committer.read_wait(wait))
        if msgs:
            committer.records_read()
        if self.deletions:
            self.deletions.check(msgs)
        wall = time.time()
        self.stats.roll(wall)  # MM2's metric windows, when enabled: once a batch
        for state, first, end in self._runs(msgs):
            if state.unproven_from != NONE_UNPROVEN:
                continue  # stopped, or an earlier run of it in this batch was not proven
            # A run's offsets are consecutive: those from its stop offset on are cut off.
            past_stop = msgs[end - 1].offset() - state.stop_at + 1
            if past_stop >= 0:
                end = max(end - past_stop, first)
            if end > first and not self._copy_run(msgs, first, end, state, wall, give_up):
                return False
            if past_stop >= 0:
                state.at_stop = True
        self.producer.poll(0)
        if committer.copy_again_now:
            self._start_again()
        committer.end_batch(caught_up=len(msgs) < BATCH_SIZE)
        return True

    def _runs(self, msgs: Sequence[Any]) -> list[tuple[PartitionState, int, int]]:
        """The runs of a batch: (partition, index of its first record, index after its
        last). Consume errors are logged and split runs; records of a stopped partition
        are left out (until its pause takes effect)."""
        runs: list[tuple[PartitionState, int, int]] = []
        by_source = self.by_source
        state: PartitionState | None = None
        topic, partition = "", -1
        # The source offset that continues the current run (a run's offsets are
        # consecutive; anything else is a gap: markers, aborted or deleted records).
        nxt = first = -1
        for i, msg in enumerate(msgs):
            if msg.error() is not None:
                if state is not None:
                    runs.append((state, first, i))
                    state = None
                nxt = -1
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    self._end_of_partition(msg)
                else:
                    self._consume_error(msg)
                continue
            offset = msg.offset()
            if offset != nxt or msg.partition() != partition or msg.topic() != topic:
                if state is not None:
                    runs.append((state, first, i))
                topic, partition, first = msg.topic(), msg.partition(), i
                state = by_source[(topic, partition)]
                if state.failure is not None:
                    state = None
            nxt = offset + 1
        if state is not None:
            runs.append((state, first, len(msgs)))
        return runs

    def _copy_run(
        self,
        msgs: Sequence[Any],
        first: int,
        end: int,
        state: PartitionState,
        wall: float,
        give_up: Callable[[], bool],
    ) -> bool:
        """Produce `msgs[first:end]`, one run of `state`'s partition. False when
        `give_up()` said to stop while the target's queue was full."""
        head = msgs[first]
        run = self.proof.start_run(state, head.offset(), head.timestamp()[1])
        count = end - first
        reports = self.proof.reports(run, count)
        produce = self.producer.produce
        remote, partition = state.remote_topic, state.partition
        size = ts = 0  # key+value bytes, last timestamp
        # Schema ids: source framing header -> the target's (mm2py.replication.schemas).
        heads = self._schemas.heads(state.topic) if self._schemas is not None else None
        translated = 0
        for msg, on_delivery in zip(msgs[first:end], reports, strict=True):
            key = msg.key()
            value = msg.value()
            ts = msg.timestamp()[1]
            if heads is not None:
                # A known header is framed data (it starts with 0 and has 5 bytes); a
                # framed one not known yet is asked of the registries.
                if value:
                    head = heads.get(value[:5])
                    if head is None and value[0] == 0 and len(value) >= HEADER_SIZE:
                        head = self._resolve_schema(run, state, msg, False, size, ts, wall)
                        if head is None:
                            return True
                    if head is not None:
                        value = head + value[5:]
                        translated += 1
                if key:
                    head = heads.get(key[:5])
                    if head is None and key[0] == 0 and len(key) >= HEADER_SIZE:
                        head = self._resolve_schema(run, state, msg, True, size, ts, wall)
                        if head is None:
                            return True
                    if head is not None:
                        key = head + key[5:]
                        translated += 1
            # Positional arguments: keywords cost a third of the call (0.9 -> 0.6 us).
            # The sixth is the `on_delivery` alias of the fifth (`callback`).
            try:
                produce(remote, value, key, partition, on_delivery, None, ts, msg.headers())
            except BufferError:
                # The target is slower than the source: wait for acknowledgements.
                args = (remote, value, key, partition, on_delivery, None, ts, msg.headers())
                try:
                    sent = produce_when_room(self.producer, args, {}, give_up)
                except KafkaException as exc:
                    self._cut_run(run, state, msg.offset(), size, ts, wall)
                    self._refused(exc, state, msg.offset(), msg)
                    return True
                if not sent:
                    ending = not state.report_every_record and msg.offset() > run.first
                    if ending and self._end_run_at_stop(args, run.on_end):
                        # This record ends the run: its report proves the run.
                        size += len(msg) + (len(key) if key is not None else 0)
                        self._close_run(run, state, msg.offset() - run.first + 1, size, ts, wall)
                    else:
                        self._cut_run(run, state, msg.offset(), size, ts, wall)
                    return False
            except KafkaException as exc:
                self._cut_run(run, state, msg.offset(), size, ts, wall)
                self._refused(exc, state, msg.offset(), msg)
                return True
            size += len(msg)  # the value's length
            if key is not None:
                size += len(key)
        self._close_run(run, state, count, size, ts, wall)
        if translated:
            assert self._schemas is not None
            self._schemas.stats.ids_translated += translated
        return True

    def _resolve_schema(
        self,
        run: Run,
        state: PartitionState,
        msg: Any,
        is_key: bool,
        size: int,
        ts: int,
        wall: float,
    ) -> bytes | None:
        """The target's framing header for the schema id of `msg`'s key or value, asked of
        the registries. None when it has none: the run ends before `msg`, and its
        partition stops (an id that cannot be resolved) or the loop ends (a registry that
        cannot be asked; the part restarts): nothing is copied with a wrong id."""
        assert self._schemas is not None
        data = msg.key() if is_key else msg.value()
        try:
            return self._schemas.resolve(
                state.topic, state.remote_topic, data[:HEADER_SIZE], is_key
            )
        except UnresolvedSchema as exc:
            offset = msg.offset()
            self._cut_run(run, state, offset, size, ts, wall)
            state.failure_cause = (offset, exc)
            what = "key" if is_key else "value"
            failure = (
                f"schema id {exc.schema_id} of the {what} of record {state.topic}-"
                f"{state.partition} offset {offset} cannot be resolved: {exc.reason}; the "
                "partition is stopped (schema.registry.unresolved.ids = copy copies such "
                "records unchanged): fix the registries and restart the flow"
            )
            self._fail_partition(state, offset, failure, record_size(msg), failure=failure)
        except RegistryUnavailable as exc:
            offset = msg.offset()
            self._cut_run(run, state, offset, size, ts, wall)
            state.unproven_from = min(state.unproven_from, offset)  # nothing after it is copied
            self.committer.fail(f"{exc} (at {state.topic}-{state.partition} offset {offset})")
        return None

    def _end_run_at_stop(self, args: tuple[Any, ...], on_end: Callable[..., None]) -> bool:
        """The loop is stopping while the target's queue is full, in a run whose last
        record sent asked for no report: send the record of `args` as the run's last,
        with a report, if the queue has room within ROOM_AT_STOP (True). Else nothing
        after the run's first record could be proven, and a restart would copy it
        again."""
        until = time.monotonic() + ROOM_AT_STOP
        ending = (*args[:4], on_end, *args[5:])
        return produce_when_room(self.producer, ending, {}, lambda: time.monotonic() > until)

    def _cut_run(
        self, run: Run, state: PartitionState, stop: int, size: int, ts: int, wall: float
    ) -> None:
        """`run` ends before source offset `stop`, which was not sent (`DeliveryProof.cut`:
        at-least-once copies what it cannot prove again after a restart; an open
        transaction is aborted)."""
        self._close_run(run, state, stop - run.first, size, ts, wall)
        self.proof.cut(run, stop)

    def _refused(self, exc: KafkaException, state: PartitionState, offset: int, msg: Any) -> None:
        """The produce call refused a record: its partition stops, unless the producer
        as a whole cannot go on (fenced, or a fatal error): then the loop ends."""
        err = exc.args[0]
        if producer_failed(err) or self.committer.aborting:
            raise exc
        self._fail_partition(state, offset, err.str(), record_size(msg))

    def _close_run(
        self, run: Run, state: PartitionState, produced: int, size: int, ts: int, wall: float
    ) -> None:
        """`produced` records of `run` were sent, the last with timestamp `ts` (ms)."""
        if produced:
            state.read = run.first + produced - 1
            stats = state.stats
            stats.bytes += size
            stats.record_age.observe_span(wall - run.ts / 1000.0, wall - ts / 1000.0, produced)
            run.ts_last = ts
        run.close(produced)

    def _deleted_before_copy(self, where: SourcePartition, expected: int, offset: int) -> bool:
        """The partition's records from `expected` were not read, `offset` was: those
        below its log start offset were deleted (counted and logged: True); the others
        were transaction markers or aborted records."""
        tp = TopicPartition(*where)
        try:
            # Cached: every fetch response carries the log start offset, and the one that
            # brought `offset` came after the reset to it.
            low = self.consumer.get_watermark_offsets(tp, timeout=1, cached=True)[0]
            if low < 0:
                low = self.consumer.get_watermark_offsets(tp, timeout=5, cached=False)[0]
        except KafkaException as exc:
            log.warning(
                "flow %s: %s-%s: offsets %d..%d were not read and its log start offset is "
                "unknown (%s); records deleted before they were copied are not counted",
                self.flow_name,
                where[0],
                where[1],
                expected,
                offset - 1,
                exc.args[0].str(),
            )
            return False
        end = min(low, offset)  # exclusive
        if end <= expected:
            return False
        state = self.by_source[where]
        state.stats.skipped += end - expected
        log_deleted_before_copy(self.flow_name, self.stats.source, where, expected, end)
        return True

    def offset_reset(self, topic: str, partition: int, position: int) -> None:
        """librdkafka reset the partition's fetch `position` (out of range): records from
        there to the first one read after it were deleted, unless markers. Called by
        `OffsetResetLog` on the loop's thread, before the records fetched after it."""
        where = (topic, partition)
        state = self.by_source.get(where)
        if state is None or state.gone or state.failure is not None:
            return
        self.deletions.reset(where, position)

    def _last_read(self, state: PartitionState) -> int | None:
        """The last offset the loop took of a partition; before any, the one before its
        start (None when it started at the beginning, wherever that was)."""
        last_read = max(state.read, state.acked)
        if last_read < 0:
            start = self._starts.get((state.topic, state.partition))
            return None if start is None else start - 1
        return last_read

    def _ack_wait(self) -> float:
        """How long to wait for records while acknowledgements are due (see ACK_POLL_MAX)."""
        now = time.monotonic()
        proof = self.proof
        if proof.report_served or self._ack_seen_at is None:
            self._ack_seen_at = now
            proof.report_served = False
        waited = now - self._ack_seen_at
        return min(max(waited / 10, ACK_POLL_TIMEOUT), self._ack_poll_max)

    def _start_again(self) -> None:
        """At-least-once: copy the partitions whose run was not proven again, from their
        first offset not proven, with a report per record. Their new state continues the
        old one's progress and syncs; their records still in flight count for nothing
        (reported to the old state, past its `unproven_from`)."""
        tps = []
        again = self.committer.copy_again_now
        for where, old in again.items():
            if old.failure is not None:
                continue  # stopped
            state = PartitionState(
                old.topic,
                old.partition,
                old.remote_topic,
                old.stats,
                read=old.unproven_from - 1,
                acked=old.acked,
                acked_downstream=old.acked_downstream,
                submitted=old.submitted,
                committed=old.committed,
                syncs=old.syncs,
                report_every_record=True,
                gone=old.gone,
                sought=old.unproven_from,
                stop_at=old.stop_at,
                first_downstream=old.first_downstream,
                foreign=old.foreign,
            )
            self.by_source[where] = state
            if not state.gone:  # else `assign` starts it after its progress
                tps.append(TopicPartition(old.topic, old.partition, old.unproven_from))
        again.clear()
        for tp in tps:
            self.consumer.seek(tp)

    def _fail_partition(
        self, state: PartitionState, offset: int, reason: str, size: int, failure: str | None = None
    ) -> None:
        """Stop a partition whose record the target rejected, naming the record.

        The target rejects a whole batch when one record is too large, so every
        record of the batch reports the error; the largest one is named. `failure`: the
        whole message, when the record was not rejected by the target but cannot be
        copied (a schema id that cannot be resolved).
        """
        first = state.failure is None
        state.unproven_from = min(state.unproven_from, offset)
        self.committer.rejected(
            failure
            or (
                f"target {self.target_alias} rejected record {state.topic}-{state.partition} "
                f"offset {offset}: {reason}"
            )
        )
        if not first and size <= state.failed_size:
            return
        state.failed_size = size
        state.failure = failure or (
            f"target {self.target_alias} rejected record {state.topic}-{state.partition} "
            f"offset {offset} ({size} bytes) for remote topic {state.remote_topic}: {reason}; "
            "the partition is stopped: fix the cause and restart the flow"
        )
        log.error(
            "flow %s: %s",
            self.flow_name,
            state.failure,
            extra=partition_fields(state.topic, state.partition),
        )
        self._failed[(state.topic, state.partition)] = state.failure
        if first:
            if self._on_partition_failed is not None:
                self._on_partition_failed()
            self.consumer.pause([TopicPartition(state.topic, state.partition)])

    def _end_of_partition(self, msg: Any) -> None:
        """The consumer read all a partition has (``enable.partition.eof``; the daemon's
        consumer leaves it off): at or past its stop offset, the partition is at its stop."""
        state = self.by_source.get((msg.topic(), msg.partition()))
        if state is not None and state.stop_at != NO_STOP and msg.offset() >= state.stop_at:
            state.at_stop = True

    def _consume_error(self, msg: Any) -> None:
        """A fatal error ends the loop. A partition copied up to a stop offset (a range)
        cannot reach it when its reads fail for good, so a non-retriable error ends the loop
        too, naming the partition; the daemon's partitions wait for the source, as MM2's
        consumer does."""
        err = msg.error()
        if err.fatal():
            raise KafkaException(err)
        state = self.by_source.get((msg.topic(), msg.partition()))
        if state is not None and state.stop_at != NO_STOP and not err.retriable():
            raise SourceReadFailed(f"reading {msg.topic()}-{msg.partition()}: {err.str()}")
        log.warning(
            "flow %s: reading %s-%s: %s",
            self.flow_name,
            msg.topic(),
            msg.partition(),
            err.str(),
            extra=partition_fields(msg.topic(), msg.partition()),
        )

    # -- periodic work ------------------------------------------------------------

    def _sync_positions(self, ending: list[PartitionState]) -> None:
        """Sync the source consumer's position of each partition of `ending` whose every
        record read is copied (exactly-once: committed) when the consumer skipped offsets
        after the last one (`SyncRule.on_position`): a group that read the partition to
        its end sits there. One `position()` call for the partitions that qualify; not
        for one sent elsewhere since its last record read (`PartitionState.sought`): its
        position may still be past records to be copied again (seen: a position sync
        past a run copied again made its records translate to the first copy)."""
        if self.syncs is None:
            return
        idle = []
        for state in ending:
            # Progress: the last record acknowledged; exactly-once, committed with it.
            copied = self.committer.copied_through(state)
            if (
                state.acked_downstream >= 0  # copied since this loop started
                and copied == state.acked >= state.read >= state.sought
                and state.unproven_from == NONE_UNPROVEN
                and state.failure is None
                and not state.gone
            ):
                idle.append(state)
        if not idle:
            return
        tps = self.consumer.position([TopicPartition(s.topic, s.partition) for s in idle])
        for state, tp in zip(idle, tps, strict=True):
            if tp.offset < 0:
                continue  # no position yet
            for sync in state.syncs.on_position(tp.offset, state.acked, state.acked_downstream):
                self.syncs.write(state.topic, state.partition, *sync)
        self.syncs.poll()

    def update_lag(self) -> None:
        """Source end offset minus the next offset to copy, per partition; and the offset
        syncs of positions past offsets a partition ends with (`SyncRule.wants_position`:
        the consumer's position is asked for only where the end offset is past the last
        copied record's next offset and past the last position synced)."""
        # A paused partition is not fetched, so its cached end offset would stand still.
        cached = not self.paused
        watermarks = self.consumer.get_watermark_offsets
        deletions = self.deletions
        ending = []
        for state in self.by_source.values():
            if state.gone:
                continue
            try:
                low, high = watermarks(state.source_tp, timeout=1, cached=cached)
            except KafkaException:
                continue
            # `behind` acts only on a partition watched already or whose log start passed
            # the last offset read (before any: its start, at least 0); this pass runs for
            # every partition each second, so the others skip the call.
            where = (state.topic, state.partition)
            if low > max(state.read, state.acked) + 1 or (deletions and where in deletions):
                stopped = state.failure is not None
                deletions.behind(where, low, high, self._last_read(state), stopped)
            if high < 0:
                continue
            nxt = state.acked + 1 if state.acked >= 0 else low
            state.stats.lag = max(high - max(nxt, low), 0)
            if state.syncs.wants_position(high, state.acked):
                ending.append(state)
        if ending:
            self._sync_positions(ending)

    # -- recording what the target holds (the committer's) ------------------------------

    def commit_progress(self, wait_until: float | None = None) -> None:
        """The periodic progress write (at-least-once; exactly-once writes progress in
        each transaction): `Committer.record_progress`."""
        self.committer.record_progress(wait_until)

    def commit_transaction(self, timeout: float = COMMIT_TIMEOUT) -> None:
        """Record what is proven now (exactly-once: commit the open transaction)."""
        self.committer.commit(timeout)

    def finish(self, deadline: float) -> None:
        """Flush what is in flight and record progress, by `deadline` (monotonic);
        exactly-once, commit the open transaction or abort it (`Committer.finish`)."""
        self.committer.finish(deadline)

    @property
    def restart_reason(self) -> str | None:
        """Why the loop must end so that the part restarts."""
        return self.committer.restart_reason


def log_deleted_before_copy(
    flow_name: str, source: str, where: SourcePartition, first: int, end: int
) -> None:
    """Log, once per gap, that offsets first..end-1 of a source partition were deleted on
    cluster `source` before they were copied (both copiers, in the same words)."""
    log.warning(
        "flow %s: %s %s-%s: offsets %d..%d (%d records) were deleted on cluster %s "
        "before they were copied",
        flow_name,
        source,
        where[0],
        where[1],
        first,
        end - 1,
        end - first,
        source,
        extra=partition_fields(*where),
    )


def describe_partitions(tps: Sequence[TopicPartition]) -> str:
    """`t-0, t-1` for a few partitions; `2000 partitions of 500 topics` for many."""
    if len(tps) <= LOGGED_PARTITIONS:
        return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)
    topics = len({tp.topic for tp in tps})
    return f"{len(tps)} partitions of {topics} topics (the list is logged at DEBUG)"
