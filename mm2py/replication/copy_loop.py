"""The copy loop: records of the partitions it is given, from the source to their remote
partitions, with progress and offset syncs. The design: docs/design/copy-path.md.

Invariants:
- A record keeps its partition, key, value, headers and timestamp; the source is read
  `read_committed`, on the one thread that owns the loop (`failed_partitions()` and the
  statistics may be read from any thread).
- Progress (``mm2-offsets.<source>.internal``) never passes a source offset whose record,
  and every one before it, the target has not acknowledged; exactly-once, it is written in
  the transaction that holds the records.
- A run (consecutive source offsets of one partition in one batch) counts only once its
  first and last delivery reports prove it contiguous on the target; a partition with a
  run not proven is copied again from there with a report per record.
- Offset syncs follow `SyncRule`, and describe acknowledged (exactly-once: committed)
  records only.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from mm2py.compat.schema_framing import HEADER_SIZE
from mm2py.kafka.consume import consume_batch
from mm2py.kafka.produce import produce_when_room
from mm2py.logs import partition_fields
from mm2py.replication.deleted_records import DeletedRecordWatch
from mm2py.replication.offset_syncs import OffsetSyncWriter, SyncRule
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.schemas import RegistryUnavailable, SchemaTranslator, UnresolvedSchema
from mm2py.replication.stats import PartitionStats, ReplicationStats
from mm2py.replication.transactions import (
    TransactionFailed,
    TransactionLog,
    abort,
    commit,
    settle,
)

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
# How long a caught-up loop waits, after asking the producer to send at once, for
# acknowledgements (librdkafka sends only if its sender wakes before this ends; else
# the records go at the end of linger.ms).
SEND_WAIT = 0.001
# Stopping while the target's queue is full, the longest wait for room for one more
# record, the last of a run, so that its report proves the run (`_end_run_at_stop`).
ROOM_AT_STOP = 1.0
# Longest wait for a transaction's records to be acknowledged and committed.
COMMIT_TIMEOUT = 60.0
# Show at most this many partitions in an INFO line; the whole list goes to DEBUG.
LOGGED_PARTITIONS = 20
# `PartitionState.failed_at` of a partition nothing failed in.
NOT_FAILED = 2**62
# A run's record count while records are still being added to it.
OPEN_RUN = 2**62
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


@dataclass(frozen=True)
class Transactions:
    """How the loop copies exactly-once: its producer is transactional (initialised),
    and commits every `interval` seconds (0: after every batch), and also after any
    batch short of BATCH_SIZE when `when_caught_up`."""

    interval: float
    log: TransactionLog
    when_caught_up: bool = False


class PartitionRejected(TransactionFailed):
    """The target rejected a record (exactly-once): the transaction is aborted and the
    partition stopped; the message names the record."""


class RunUnproven(RuntimeError):
    """Exactly-once: a run's first and last delivery reports did not prove it copied
    whole. The transaction is aborted, and the next loop copies its partition again from
    the last commit, with a delivery report per record (the `careful` set)."""


@dataclass(frozen=True)
class NewPartition:
    """A source partition to start copying, and its remote topic."""

    topic: str
    partition: int
    remote_topic: str


@dataclass
class PartitionState:
    """The copy state of one source partition and its remote partition."""

    topic: str
    partition: int
    remote_topic: str
    stats: PartitionStats
    read: int = -1  # last source offset produced to the target
    acked: int = -1  # last source offset the target acknowledged
    acked_downstream: int = -1
    submitted: int = -1  # last offset sent to the progress topic
    committed: int = -1  # last offset the progress topic acknowledged
    syncs: SyncRule = field(default_factory=SyncRule)
    failure: str | None = None
    # The first source offset not known to be copied: one the target rejected, or the
    # first one after a run's first record when the run was not proven. Nothing from
    # there counts as acknowledged.
    failed_at: int = NOT_FAILED
    careful: bool = False  # a delivery report for every record (see the module doc)
    # Where the consumer was sent anew for this partition (a copy again, an assignment
    # after its topic was created again): until a record at or past it is read, the
    # consumer's position may still be the one before (a seek takes effect later).
    sought: int = -1
    acking: Run | None = None  # the run whose delivery reports come now
    gone: bool = False  # its source topic was deleted; unassigned until it exists again
    failed_size: int = 0
    # The source partition as the consumer's calls take it, made once: `update_lag` asks
    # for every partition's watermarks each second, and a new TopicPartition per call was
    # a third of that pass's CPU (2,000 partitions: 8.3 ms, 5.1 ms with this one).
    source_tp: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.source_tp = TopicPartition(self.topic, self.partition)


class Run:
    """Records of one source partition with consecutive offsets, produced in one batch.

    Reports come in the order the records were produced. `on_end` is the callback of
    its first and last records (the others have none): the last is expected where the
    first says the run ends; anything else goes to the loop's `_end_report`. A careful
    partition's `on_delivery` is every record's: target offsets are expected to follow
    each other, a record at `expect` is counted with one comparison; anything else (the
    run's first report, a gap on the target, an error) goes to `_delivery_slow`.
    """

    __slots__ = (
        "base",
        "count",
        "errors",
        "expect",
        "first",
        "loop",
        "state",
        "stop",
        "ts",
        "ts_last",
    )

    def __init__(self, loop: CopyLoop, state: PartitionState, first: int, ts: int) -> None:
        self.loop = loop
        self.state = state
        self.first = first  # source offset of its first record
        self.ts = ts  # timestamp (ms) of its first record
        self.ts_last = ts  # and of its last
        self.count = OPEN_RUN  # records produced; set when the run is closed
        self.expect = -1  # target offset of the next record; -1 before the first report
        self.base = 0  # target offset its first record would have at the current distance
        self.errors = 0  # reports with an error before the first acknowledgement
        self.stop = -1  # `expect` once every record is acknowledged (known when closed)

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() == self.expect:
            self.expect += 1
            if self.expect == self.stop:
                self.loop._run_acknowledged(self)
            return
        self.loop._delivery_slow(self, err, msg)

    def on_end(self, err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() == self.stop - 1:
            self.expect = self.stop
            self.loop._run_acknowledged(self)
            return
        self.loop._end_report(self, err, msg)

    def close(self, count: int) -> None:
        """No more records: `count` were produced."""
        self.count = count
        if self.expect >= 0:
            self.stop = self.base + count
            if self.expect == self.stop:
                self.loop._run_acknowledged(self)


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
        send_when_caught_up: bool = False,
        careful: set[SourcePartition] | None = None,
        schemas: SchemaTranslator | None = None,
    ) -> None:
        """`poll_timeout`: the longest wait for records when nothing is in flight
        (``consumer.poll.timeout.ms``). `transactions`: copy exactly-once. `failed`:
        partitions stopped by a rejected record, kept by the caller across loops
        (exactly-once); the loop adds those it stops and does not copy them.
        `send_when_caught_up`: after a batch short of BATCH_SIZE (all the source had),
        send the records the producer holds for its linger.ms at once. `careful`:
        partitions copied with a delivery report per record, kept by the caller across
        loops; the loop adds those whose run it could not prove (see the module doc).
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
        self._send_when_caught_up = send_when_caught_up
        self._poll_timeout = poll_timeout
        self._ack_poll_max = min(poll_timeout, ACK_POLL_MAX)
        # When the loop last saw an acknowledgement, or began waiting for one (monotonic).
        self._ack_seen_at: float | None = None
        self._acked = False  # a delivery report was served since `_ack_wait` last looked
        self.by_source: dict[SourcePartition, PartitionState] = {}
        # Set (from any thread) when the loop must end so that the part restarts.
        self.restart_reason: str | None = None
        self.paused = False
        # Records the source deleted before they were copied (see `deleted_records`).
        self.deletions = DeletedRecordWatch(self._deleted_before_copy)
        self._starts: dict[SourcePartition, int] = {}  # where each partition was assigned
        self._txn = transactions
        self._failed = failed if failed is not None else {}
        self._careful = careful if careful is not None else set()
        self._schemas = schemas
        # Exactly-once: why the loop must end, a run not proven (`RunUnproven`).
        self._unproven: str | None = None
        # At-least-once: partitions to copy again from their first offset not proven.
        self._copy_again: dict[SourcePartition, PartitionState] = {}
        self._txn_open = False
        self._txn_due = 0.0  # when the open transaction commits (monotonic)
        self._rejected: str | None = None  # why the open transaction must abort
        # Of the open transaction: offset syncs, and (stats, records, first and last
        # timestamp in ms) of acknowledged runs; both wait for its commit.
        self._txn_syncs: list[tuple[PartitionState, int, int]] = []
        self._txn_copied: list[tuple[PartitionStats, int, int, int]] = []

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
                state.careful = (p.topic, p.partition) in self._careful
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
        if self._txn_open:
            wait = min(wait, max(self._txn_due - time.monotonic(), 0.0))
        msgs = consume_batch(self.consumer, BATCH_SIZE, wait)
        if msgs and self._txn is not None and not self._txn_open:
            self.producer.begin_transaction()
            self._txn_open = True
            self._txn_due = time.monotonic() + self._txn.interval
        if self.deletions:
            self.deletions.check(msgs)
        wall = time.time()
        self.stats.roll(wall)  # MM2's metric windows, when enabled: once a batch
        for state, first, end in self._runs(msgs):
            if state.failed_at != NOT_FAILED:
                continue  # stopped, or an earlier run of it in this batch was not proven
            if not self._copy_run(msgs, first, end, state, wall, give_up):
                return False
        if self._send_when_caught_up and 0 < len(msgs) < BATCH_SIZE:
            # flush() makes the producer send what lingers now; it also serves delivery
            # reports, as poll does, for up to SEND_WAIT.
            self.producer.flush(SEND_WAIT)
        else:
            self.producer.poll(0)
        if self._copy_again:
            self._start_again()
        if self._txn is not None and self._rejected is not None:
            raise PartitionRejected(self._rejected)
        if self._unproven is not None:
            raise RunUnproven(self._unproven)
        if self.restart_reason:
            raise RuntimeError(self.restart_reason)
        if self._txn is not None:
            if self._txn.log.failure is not None:
                raise TransactionFailed(self._txn.log.failure)
            if self._txn_open and (
                (self._txn.when_caught_up and len(msgs) < BATCH_SIZE)
                or time.monotonic() >= self._txn_due
            ):
                self.commit_transaction()
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
        run = Run(self, state, head.offset(), head.timestamp()[1])
        count = end - first
        if state.careful:
            reports: list[Any] = [run.on_delivery] * count
        elif count == 1:
            reports = [run.on_end]
        else:
            reports = [run.on_end, *([None] * (count - 2)), run.on_end]
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
                    ending = not state.careful and msg.offset() > run.first
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
            what = "key" if is_key else "value"
            failure = (
                f"schema id {exc.schema_id} of the {what} of record {state.topic}-"
                f"{state.partition} offset {offset} cannot be resolved: {exc.reason}; the "
                "partition is stopped (schema.registry.unresolved.ids = copy copies such "
                "records unchanged): fix the registries and restart the flow"
            )
            self._fail_partition(state, offset, failure, _size(msg), failure=failure)
        except RegistryUnavailable as exc:
            offset = msg.offset()
            self._cut_run(run, state, offset, size, ts, wall)
            state.failed_at = min(state.failed_at, offset)  # nothing after it is copied
            if self.restart_reason is None:
                self.restart_reason = f"{exc} (at {state.topic}-{state.partition} offset {offset})"
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
        """`run` ends before source offset `stop`, which was not sent. Unless careful,
        the last record sent asked for no report: nothing after the run's first record
        can be proven copied (at-least-once copies it again after a restart; an open
        transaction is aborted)."""
        produced = stop - run.first
        self._close_run(run, state, produced, size, ts, wall)
        if produced > 1 and not state.careful:
            state.failed_at = min(state.failed_at, run.first + 1)
            if self._txn is not None and self._unproven is None:
                self._unproven = (
                    f"flow {self.flow_name}: {state.topic}-{state.partition} offsets "
                    f"{run.first + 1}..{stop - 1} were sent without the report that proves them"
                )

    def _refused(self, exc: KafkaException, state: PartitionState, offset: int, msg: Any) -> None:
        """The produce call refused a record: its partition stops, unless the producer
        as a whole cannot go on (fenced, or a fatal error): then the loop ends."""
        err = exc.args[0]
        if _producer_failed(err) or (self._txn is not None and self._rejected is not None):
            raise exc
        self._fail_partition(state, offset, err.str(), _size(msg))

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
        log.warning(
            "flow %s: %s %s-%s: offsets %d..%d (%d records) were deleted on cluster %s "
            "before they were copied",
            self.flow_name,
            self.stats.source,
            where[0],
            where[1],
            expected,
            end - 1,
            end - expected,
            self.stats.source,
            extra=partition_fields(*where),
        )
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
        if self._acked or self._ack_seen_at is None:
            self._ack_seen_at = now
            self._acked = False
        waited = now - self._ack_seen_at
        return min(max(waited / 10, ACK_POLL_TIMEOUT), self._ack_poll_max)

    def _delivery_slow(self, run: Run, err: KafkaError | None, msg: Any) -> None:
        """A delivery report of `run` that is not the next contiguous acknowledgement:
        its first, one after a gap on the target, or an error."""
        self._acked = True
        state = run.state
        # The record's place in the run: reports come in order, and a rejected record
        # takes no target offset.
        index = run.errors if run.expect < 0 else run.expect - run.base
        upstream = run.first + index
        if err is not None:
            if run.expect < 0:
                run.errors += 1
            else:
                run.base -= 1
            if self._ends_loop(state, upstream, err):
                return
            if state.failure is None and run.expect >= 0:
                # The records before it in this run were acknowledged.
                self._acknowledged(state, upstream - 1, run.expect - 1, index, run, time.time())
            self._fail_partition(state, upstream, err.str(), _size(msg))
            return
        downstream = msg.offset()
        if state.failure is None and state.syncs.on_copied(upstream, downstream):
            self._write_sync(state, upstream, downstream)
        state.acking = run
        run.base = downstream - index
        run.expect = downstream + 1
        if run.count != OPEN_RUN:
            run.stop = run.base + run.count
            if run.expect == run.stop:
                self._run_acknowledged(run)

    def _ends_loop(self, state: PartitionState, upstream: int, err: KafkaError) -> bool:
        """A delivery error that is not the target refusing the record `upstream`: the
        producer failed, the loop is aborting, or the record timed out (True)."""
        if _producer_failed(err) or (self._txn is not None and self._rejected is not None):
            # The loop ends (an open transaction aborts): only the first failure says why.
            if self.restart_reason is None and self._rejected is None:
                self.restart_reason = f"writing to {self.target_alias}: {err.str()}"
            return True
        if err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            return True  # dropped by an abort
        if err.code() == KafkaError._MSG_TIMED_OUT:
            # Nothing is lost: the part restarts from its last progress.
            self.restart_reason = (
                f"copying {state.topic}-{state.partition} offset {upstream} to "
                f"{state.remote_topic} on {self.target_alias} failed: {err.str()}"
            )
            return True
        return False

    def _end_report(self, run: Run, err: KafkaError | None, msg: Any) -> None:
        """A report of `run`'s first or last record (not careful) that does not end it:
        the first (where the target offsets start), an error, or the last where the
        first did not say."""
        self._acked = True
        if run.errors:
            return  # its first record's report was an error, handled then
        state = run.state
        at_first = run.expect < 0
        if err is not None:
            if at_first:
                run.errors = 1
            upstream = run.first if at_first else run.first + run.count - 1
            if not self._ends_loop(state, upstream, err):
                self._unproven_run(
                    state,
                    run,
                    run.first if at_first else run.first + 1,
                    f"the target refused offset {upstream}: {err.str()}",
                )
            return
        downstream = msg.offset()
        if not at_first:
            self._unproven_run(
                state,
                run,
                run.first + 1,
                f"its {run.count} records went to {state.remote_topic} offsets {run.base} "
                f"to {downstream}, not one after another",
            )
            return
        if (
            state.failure is None
            and run.first < state.failed_at
            and state.syncs.on_copied(run.first, downstream)
        ):
            self._write_sync(state, run.first, downstream)
        state.acking = run
        run.base = downstream
        run.expect = downstream + 1
        if run.count != OPEN_RUN:
            run.stop = run.base + run.count
            if run.expect == run.stop:
                self._run_acknowledged(run)

    def _unproven_run(self, state: PartitionState, run: Run, offset: int, detail: str) -> None:
        """Nothing of `state`'s partition from `offset` counts; it is copied again from
        there with a report per record (exactly-once: the loop ends, the transaction is
        aborted, and the next loop copies it from the last commit)."""
        if offset >= state.failed_at:
            return  # already: this run's first report, or an earlier run
        if offset > run.first:  # its first record is proven
            self._acknowledged(state, run.first, run.base, 1, run, time.time())
        state.failed_at = offset
        where = (state.topic, state.partition)
        self._careful.add(where)
        last = run.first + run.count - 1
        if self._txn is None:
            again = f"copying it again from offset {offset}"
            self._copy_again[where] = state
        else:
            again = "the transaction is aborted; the next one copies it again"
        reason = (
            f"flow {self.flow_name}: copying {state.topic}-{state.partition} offsets "
            f"{offset}..{last} to {self.target_alias} is not proven: {detail}; {again}, with "
            "a delivery report per record"
        )
        log.warning("%s", reason, extra=partition_fields(*where))
        if self._txn is not None and self._unproven is None:
            self._unproven = reason

    def _start_again(self) -> None:
        """At-least-once: copy the partitions whose run was not proven again, from their
        first offset not proven, with a report per record. Their new state continues the
        old one's progress and syncs; their records still in flight count for nothing
        (reported to the old state, past its `failed_at`)."""
        tps = []
        for where, old in self._copy_again.items():
            if old.failure is not None:
                continue  # stopped
            state = PartitionState(
                old.topic,
                old.partition,
                old.remote_topic,
                old.stats,
                read=old.failed_at - 1,
                acked=old.acked,
                acked_downstream=old.acked_downstream,
                submitted=old.submitted,
                committed=old.committed,
                syncs=old.syncs,
                careful=True,
                gone=old.gone,
                sought=old.failed_at,
            )
            self.by_source[where] = state
            if not state.gone:  # else `assign` starts it after its progress
                tps.append(TopicPartition(old.topic, old.partition, old.failed_at))
        self._copy_again.clear()
        for tp in tps:
            self.consumer.seek(tp)

    def _run_acknowledged(self, run: Run) -> None:
        """Every record of `run` was acknowledged, the last at `run.expect - 1`."""
        self._acked = True
        last = run.first + run.count - 1
        if last < run.state.failed_at:
            self._acknowledged(run.state, last, run.expect - 1, run.count, run, time.time())

    def _acknowledged(
        self,
        state: PartitionState,
        upstream: int,
        downstream: int,
        count: int,
        run: Run,
        now: float,
    ) -> None:
        """Progress to `upstream` (at `downstream`), `count` more records of `run` copied."""
        if count <= 0:
            return
        state.acked = upstream
        state.acked_downstream = downstream
        # The last record's timestamp is known only for a whole run (a partial one: its first).
        last_ts = run.ts_last if count == run.count else run.ts
        if self._txn is not None:
            self._txn_copied.append((state.stats, count, run.ts, last_ts))
            return
        stats = state.stats
        stats.records += count
        # At the moment the report is served, like confluent-kafka's `msg.latency()`;
        # serving reports promptly (ACK_POLL_TIMEOUT) is what makes it exact.
        stats.latency.observe_span(now - run.ts / 1000.0, now - last_ts / 1000.0, count)

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
        state.failed_at = min(state.failed_at, offset)
        if self._txn is not None and self._rejected is None:
            self._rejected = failure or (
                f"target {self.target_alias} rejected record {state.topic}-{state.partition} "
                f"offset {offset}: {reason}"
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

    def _write_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        if self._txn is not None:
            self._txn_syncs.append((state, upstream, downstream))  # after the commit
        elif self.syncs is not None:
            self.syncs.write(state.topic, state.partition, upstream, downstream)

    def _consume_error(self, msg: Any) -> None:
        err = msg.error()
        if err.fatal():
            raise KafkaException(err)
        log.warning(
            "flow %s: reading %s-%s: %s",
            self.flow_name,
            msg.topic(),
            msg.partition(),
            err.str(),
            extra=partition_fields(msg.topic(), msg.partition()),
        )

    # -- periodic work ------------------------------------------------------------

    def commit_progress(self, wait_until: float | None = None) -> None:
        """Record the acknowledged positions (and the latest offset syncs).

        The writes are only submitted (`committed` advances when the target
        acknowledges them), unless `wait_until` (a monotonic deadline) is given.
        """
        self.producer.poll(0)
        changed = {}
        for key, state in self.by_source.items():
            run = state.acking
            if run is not None and run.expect >= 0:
                # Part of a run acknowledged so far (the whole run is counted at its end).
                upstream = run.first + run.expect - run.base - 1
                if state.acked < upstream < state.failed_at:
                    state.acked = upstream
                    state.acked_downstream = run.expect - 1
            if state.acked > state.submitted:
                changed[key] = state.acked
                state.submitted = state.acked
                if state.syncs.on_progress(state.acked):
                    self._write_sync(state, state.acked, state.acked_downstream)
        if self.syncs is not None:
            self.syncs.poll()
        self.progress.submit(changed, self._progress_written)
        if wait_until is not None:
            self.progress.flush(max(wait_until - time.monotonic(), 0.1))

    def commit_transaction(self, timeout: float = COMMIT_TIMEOUT) -> None:
        """Exactly-once: commit the open transaction with the progress of what it copied;
        then write its offset syncs and count its records.

        Raises TransactionFailed (PartitionRejected) when it cannot commit; the caller
        aborts it (`finish`).
        """
        txn = self._txn
        assert txn is not None
        if not self._txn_open:
            return
        where = f"flow {self.flow_name}: committing to cluster {self.target_alias}"
        settle(self.producer, txn.log, timeout, where)  # every delivery report served
        if self._rejected is not None:
            raise PartitionRejected(self._rejected)
        if self._unproven is not None:
            raise RunUnproven(self._unproven)
        if self.restart_reason is not None:
            raise TransactionFailed(self.restart_reason)
        changed = {
            key: state.acked
            for key, state in self.by_source.items()
            if state.acked > state.committed and state.acked < state.failed_at
        }
        self.progress.write_in_transaction(self.producer, changed)
        commit(self.producer, txn.log, timeout, where)
        self._txn_open = False
        now = time.time()
        for stats, count, first_ts, last_ts in self._txn_copied:
            stats.records += count
            stats.latency.observe_span(now - first_ts / 1000.0, now - last_ts / 1000.0, count)
        syncs = self.syncs
        for state, upstream, downstream in self._txn_syncs:
            if syncs is not None:
                syncs.write(state.topic, state.partition, upstream, downstream)
        self._txn_copied.clear()
        self._txn_syncs.clear()
        for key, offset in changed.items():
            state = self.by_source[key]
            state.committed = state.submitted = offset
            if syncs is not None and state.syncs.on_progress(offset):
                syncs.write(state.topic, state.partition, offset, state.acked_downstream)
        if syncs is not None:
            syncs.poll()

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
            copied = state.acked if self._txn is None else state.committed
            if (
                state.acked_downstream >= 0  # copied since this loop started
                and copied == state.acked >= state.read >= state.sought
                and state.failed_at == NOT_FAILED
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

    def _progress_written(self, where: SourcePartition, offset: int) -> None:
        state = self.by_source[where]
        state.committed = max(state.committed, offset)

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

    def finish(self, deadline: float) -> None:
        """Flush what is in flight and record progress, by `deadline` (monotonic).

        Exactly-once: commit the open transaction, or abort it when the loop ends on
        a failure (or the commit fails: nothing of it is recorded)."""
        if self._txn is None:
            self.producer.flush(max(deadline - time.monotonic(), 0.1))
            self.commit_progress(wait_until=deadline)
        elif self._txn_open:
            failed = (
                self._rejected or self._unproven or self.restart_reason or self._txn.log.failure
            )
            try:
                if failed is not None:
                    raise TransactionFailed(failed)
                self.commit_transaction(max(deadline - time.monotonic(), 0.1))
            except (TransactionFailed, RunUnproven, KafkaException) as exc:
                log.warning(
                    "flow %s: the open transaction is aborted (%s); its records are copied "
                    "again from the last commit",
                    self.flow_name,
                    exc,
                )
                abort(
                    self.producer, f"flow {self.flow_name}", max(deadline - time.monotonic(), 1.0)
                )
            self._txn_open = False
        if self.syncs is not None:
            self.syncs.flush(max(deadline - time.monotonic(), 0.1))


def _producer_failed(err: KafkaError) -> bool:
    """The producer as a whole cannot go on (a fatal error; fenced by another holder of
    its transactional id), as opposed to one record refused."""
    return bool(err.fatal() or err.code() in (KafkaError._FATAL, KafkaError._FENCED))


def describe_partitions(tps: Sequence[TopicPartition]) -> str:
    """`t-0, t-1` for a few partitions; `2000 partitions of 500 topics` for many."""
    if len(tps) <= LOGGED_PARTITIONS:
        return ", ".join(f"{tp.topic}-{tp.partition}" for tp in tps)
    topics = len({tp.topic for tp in tps})
    return f"{len(tps)} partitions of {topics} topics (the list is logged at DEBUG)"


def _size(msg: Any) -> int:
    """Key plus value bytes of a record."""
    key, value = msg.key(), msg.value()
    return (len(key) if key else 0) + (len(value) if value else 0)
