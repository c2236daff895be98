"""The copy of one offset range, run inside a Spark task (a Python executor).

One confluent-kafka consumer reads the source partition `read_committed` from
the range's start; one transactional producer writes each record to the same
partition of the remote topic with its key, value, headers and timestamp.

Records are written in transactions of at most `COMMIT_INTERVAL` seconds, with the
daemon's transactional machinery (mm2py.replication.transactions): each transaction
also writes the partition's progress (the last offset it read; ``end - 1`` at the
end of the range) to ``mm2-offsets.<source>.internal``, as the daemon's tasks do in
exactly-once mode, and its offset syncs are written after it commits. So:

- a copy that is killed or fails leaves only aborted records (and progress) on the
  target, which read_committed consumers never see, and a backfill run again
  continues from the last commit: nothing is copied twice;
- the transactional id is fixed per source partition, so a new attempt fences a
  zombie one and aborts what it left open (the remote partition's last stable
  offset is not held back until the transaction times out);
- offset syncs follow the source part's rules (the first record after a start,
  every change of the distance between source and target offsets, the latest
  record at each commit) and are written only after their commit, so no sync
  points at an aborted copy.

Nothing here imports Spark: the driver ships a `RangeTask` to `copy_range`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mm2py.backfill.plan import OffsetRange, RangeResult
from mm2py.kafka import clients
from mm2py.kafka.consume import consume_batch
from mm2py.kafka.produce import produce_when_room
from mm2py.replication import client_settings, transactions
from mm2py.replication.client_settings import copy_settings
from mm2py.replication.offset_syncs import OffsetSyncWriter, SyncRule
from mm2py.replication.progress import ProgressStore
from mm2py.replication.schemas import (
    RegistryUnavailable,
    SchemaTranslator,
    UnresolvedMode,
    UnresolvedSchema,
    translator_for,
)

log = logging.getLogger(__name__)

BATCH_SIZE = 10_000
POLL_TIMEOUT = 0.5
# A transaction is committed (and progress recorded) at least this often.
COMMIT_INTERVAL = 10.0
# No record and no end-of-partition from the source for this long: the copy fails.
STALL_TIMEOUT = 300.0
FLUSH_TIMEOUT = 300.0
WRITE_TIMEOUT = 60.0

# Bulk reading of one partition: large fetches, records queued ahead of the loop,
# and no 1 s back-off when that queue is full (the source part's finding: 3x faster).
CONSUMER_TUNING: Mapping[str, Any] = {
    "fetch.max.bytes": 52428800,
    "max.partition.fetch.bytes": 4194304,
    # What is fetched beyond the range's end is read for nothing: keep the queue short.
    "queued.max.messages.kbytes": 16384,
    "fetch.queue.backoff.ms": 5,
}
# What the range copy needs beyond the shared requirements (read_committed, no commits).
CONSUMER_REQUIRED: Mapping[str, Any] = {
    **client_settings.CONSUMER_REQUIRED,
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",  # records deleted by retention meanwhile are skipped
}
PRODUCER_TUNING: Mapping[str, Any] = {
    # Connect to the learned brokers at once: with sparse connections, finding the
    # transaction coordinator waits for a 500 ms retry timer on every range.
    "enable.sparse.connections": False,
    "linger.ms": 5,
    "batch.size": 1000000,
    # Each commit waits for the queue to drain: keep it to a fraction of a second.
    "queue.buffering.max.kbytes": 16384,
    "queue.buffering.max.messages": 200000,
}
# A transaction waits up to FLUSH_TIMEOUT for its records to be acknowledged.
TRANSACTION_TIMEOUT_MS = 300_000


class RangeCopyError(RuntimeError):
    """The copy of a range failed; the message says which range and why."""


@dataclass(frozen=True)
class RangeTask:
    """Everything a Spark task needs to copy one range (pickled to the executor)."""

    flow: str  # "A->B", for messages
    source_alias: str
    target_alias: str
    range: OffsetRange
    remote_topic: str
    transactional_id: str
    progress_topic: str
    progress_replication_factor: int
    source_props: Mapping[str, str] = field(repr=False)
    target_props: Mapping[str, str] = field(repr=False)
    # Where offset syncs go (None: emit.offset-syncs.enabled = false).
    syncs_props: Mapping[str, str] | None = field(default=None, repr=False)
    syncs_topic: str = ""
    # Schema registry replication: the source's and the target's registry client settings
    # and schema.registry.unresolved.ids (None: ids are copied as they are).
    schema_registries: tuple[Mapping[str, str], Mapping[str, str], str] | None = field(
        default=None, repr=False
    )


@dataclass
class _Marks:
    """Target offsets of the records that tell where the others landed.

    Within a transaction the copy's records are adjacent on the target, so only
    some records need an acknowledgement with their target offset (a Python call
    for every record would cost a sixth of the copy's CPU): the first record of
    each transaction, each record after a gap in the source offsets, and the last
    record of each consumed batch. A record the target rejects needs none: it
    makes the transaction's commit fail, with the reason.
    """

    task: RangeTask
    acks: list[tuple[int, int, int]] = field(default_factory=list)  # (upstream, index, downstream)
    rule: SyncRule = field(default_factory=SyncRule)  # when a sync is written
    first_downstream: int | None = None
    last: tuple[int, int] | None = None  # (upstream, downstream) of the latest record
    interleaved: int = 0
    failed: bool = False

    def ack(self, upstream: int, index: int, err: KafkaError | None, msg: Any) -> None:
        if err is not None:
            self.failed = True  # stop copying: the commit will fail and say why
            return
        self.acks.append((upstream, index, msg.offset()))

    def committed(self, last_upstream: int, last_index: int) -> list[tuple[int, int]]:
        """The offset syncs of the transaction just committed (its records up to
        `last_upstream`, the `last_index`-th record of the range)."""
        acks, self.acks = sorted(self.acks, key=lambda a: a[1]), []
        if not acks:
            return []
        syncs: list[tuple[int, int]] = []
        previous: tuple[int, int, int] | None = None
        for upstream, index, downstream in acks:
            if previous is not None:
                apart = index - previous[1]
                if downstream - previous[2] > apart:
                    # Another producer wrote to the remote partition meanwhile.
                    self.interleaved += downstream - previous[2] - apart
            if self.rule.on_copied(upstream, downstream):
                syncs.append((upstream, downstream))
            previous = (upstream, index, downstream)
        if self.first_downstream is None:
            self.first_downstream = acks[0][2]
        # The latest record: after the last acknowledged one, with no source gap between.
        upstream, index, downstream = acks[-1]
        self.last = (last_upstream, downstream + last_index - index)
        if self.rule.on_progress(last_upstream):
            syncs.append(self.last)
        return syncs


@dataclass
class _Position:
    """How far the copy of a range got."""

    next_offset: int  # the next source offset to read
    records: int = 0  # records produced so far (the next record's index)
    bytes: int = 0
    done: bool = False  # every offset before the range's end was read


def copy_range(task: RangeTask, attempt: int = 0) -> RangeResult:
    """Copy `task.range` to the remote topic; write offset syncs and progress per commit.

    `attempt` > 0 (Spark retrying the task) starts after the progress an earlier
    attempt recorded, so its committed transactions are not copied again.
    """
    r = task.range
    started = time.monotonic()
    store = ProgressStore(
        task.target_props,
        task.target_alias,
        task.source_alias,
        task.progress_topic,
        task.progress_replication_factor,
    )
    position = _Position(r.start)
    marks = _Marks(task)
    consumer = clients.consumer(
        task.source_props,
        copy_settings(
            task.source_props,
            CONSUMER_TUNING,
            CONSUMER_REQUIRED,
            f"cluster {task.source_alias} consumer",
        ),
    )
    producer, txn_log = transactions.transactional_producer(
        task.target_props,
        PRODUCER_TUNING,
        f"cluster {task.target_alias} producer",
        task.transactional_id,
        timeout_ms=TRANSACTION_TIMEOUT_MS,
    )
    sync_writer = _SyncWriter(task)
    syncs_written = 0
    schemas = _translator(task)
    try:
        producer.init_transactions(WRITE_TIMEOUT)  # fences an earlier attempt
        if attempt:
            recorded = store.load(past_open_transactions=True).get(r.source_partition)
            if recorded is not None:
                position.next_offset = max(r.start, recorded + 1)
        if position.next_offset >= r.end:
            position.done = True
        consumer.assign([TopicPartition(r.topic, r.partition, position.next_offset)])
        while not position.done:
            producer.begin_transaction()
            _copy_records(task, consumer, producer, marks, position, txn_log, schemas)
            last_read = r.end - 1 if position.done else position.next_offset - 1
            if last_read >= r.start:
                store.write_in_transaction(producer, {r.source_partition: last_read})
            transactions.commit(producer, txn_log, FLUSH_TIMEOUT, f"flow {task.flow}: copying {r}")
            syncs = marks.committed(position.next_offset - 1, position.records - 1)
            syncs_written += sync_writer.write(syncs)
    except KafkaException as exc:
        transactions.abort(producer, f"flow {task.flow}: copying {r}", WRITE_TIMEOUT)
        reason = txn_log.failure or exc.args[0].str()
        raise RangeCopyError(f"flow {task.flow}: copying {r}: {reason}") from None
    except transactions.TransactionFailed as exc:
        transactions.abort(producer, f"flow {task.flow}: copying {r}", WRITE_TIMEOUT)
        raise RangeCopyError(str(exc)) from None
    except BaseException:
        transactions.abort(producer, f"flow {task.flow}: copying {r}", WRITE_TIMEOUT)
        raise
    finally:
        consumer.close()
        store.close()
        if schemas is not None:
            schemas.close()
    return RangeResult(
        r,
        position.records,
        position.bytes,
        time.monotonic() - started,
        syncs_written,
        marks.first_downstream,
        marks.last[1] if marks.last else None,
        marks.interleaved,
    )


def _copy_records(
    task: RangeTask,
    consumer: Any,
    producer: Any,
    marks: _Marks,
    position: _Position,
    txn_log: transactions.TransactionLog,
    schemas: SchemaTranslator | None = None,
) -> None:
    """Produce committed records until the range's end or the commit interval is over.
    With `schemas`, framed keys and values get the target registry's schema ids; an id
    that cannot be resolved fails the range (its transaction is aborted)."""
    r = task.range
    end, remote, partition = r.end, task.remote_topic, r.partition
    produce, ack = producer.produce, marks.ack
    expected = -1  # the first record of a transaction is marked
    index, nbytes = position.records, position.bytes
    deadline = time.monotonic() + COMMIT_INTERVAL
    last_seen = time.monotonic()
    try:
        while True:
            msgs = consume_batch(consumer, BATCH_SIZE, POLL_TIMEOUT)
            now = time.monotonic()
            if not msgs:
                if now - last_seen > STALL_TIMEOUT:
                    raise RangeCopyError(
                        f"flow {task.flow}: copying {r}: nothing read from {r.topic}-{partition} "
                        f"at offset {position.next_offset} for {STALL_TIMEOUT:.0f} s; "
                        "is the source cluster reachable?"
                    )
                if now >= deadline:
                    return
                continue
            last_seen = now
            last_msg = msgs[-1]
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if msg.offset() >= end:
                            position.done = True
                            return
                        continue
                    if err.fatal() or not err.retriable():
                        raise RangeCopyError(
                            f"flow {task.flow}: reading {r.topic}-{partition}: {err.str()}"
                        )
                    log.warning(
                        "flow %s: reading %s-%s: %s", task.flow, r.topic, partition, err.str()
                    )
                    continue
                offset = msg.offset()
                if offset >= end:
                    position.done = True
                    return
                key, value = msg.key(), msg.value()
                if schemas is not None:
                    key, value = _translated(task, schemas, offset, key, value)
                timestamp, headers = msg.timestamp()[1], msg.headers()
                marked = offset != expected or msg is last_msg or offset == end - 1
                try:
                    if marked:
                        produce(
                            remote,
                            value,
                            key,
                            partition,
                            on_delivery=partial(ack, offset, index),
                            timestamp=timestamp,
                            headers=headers,
                        )
                    else:
                        produce(remote, value, key, partition, timestamp=timestamp, headers=headers)
                except BufferError:
                    kwargs = {"timestamp": timestamp, "headers": headers}
                    if marked:
                        kwargs["on_delivery"] = partial(ack, offset, index)
                    produce_when_room(producer, (remote, value, key, partition), kwargs)
                expected = position.next_offset = offset + 1
                index += 1
                nbytes += (len(key) if key else 0) + (len(value) if value else 0)
                if offset == end - 1:
                    position.done = True
                    return
            producer.poll(0)
            if marks.failed or txn_log.failure is not None or now >= deadline:
                return
    finally:
        position.records, position.bytes = index, nbytes


def _translator(task: RangeTask) -> SchemaTranslator | None:
    """The range's schema id translator (its topic's subjects copied first), if any."""
    if task.schema_registries is None:
        return None
    source, target, unresolved = task.schema_registries
    mode: UnresolvedMode = "copy" if unresolved == "copy" else "fail"
    schemas = translator_for(task.flow, source, target, mode)
    try:
        schemas.copy_subjects(task.range.topic, task.remote_topic)
    except (UnresolvedSchema, RegistryUnavailable) as exc:
        log.warning(
            "flow %s: the subjects of %s were not copied up front (%s); its schema ids are "
            "resolved when records need them",
            task.flow,
            task.range.topic,
            exc,
        )
    return schemas


def _translated(
    task: RangeTask, schemas: SchemaTranslator, offset: int, key: Any, value: Any
) -> tuple[Any, Any]:
    """A record's key and value with the target's schema ids; RangeCopyError naming the
    record when an id cannot be resolved (nothing is copied with a wrong id)."""
    r = task.range
    try:
        return (
            schemas.translate(r.topic, task.remote_topic, key, True),
            schemas.translate(r.topic, task.remote_topic, value, False),
        )
    except UnresolvedSchema as exc:
        raise RangeCopyError(
            f"flow {task.flow}: copying {r}: record {r.topic}-{r.partition} offset {offset}: "
            f"{exc}; schema.registry.unresolved.ids = copy copies such records unchanged"
        ) from None
    except RegistryUnavailable as exc:
        raise RangeCopyError(f"flow {task.flow}: copying {r}: {exc}") from None


class _SyncWriter:
    """Writes a range's offset syncs after each commit and waits for them."""

    def __init__(self, task: RangeTask) -> None:
        self.task = task
        self._writer: OffsetSyncWriter | None = None
        if task.syncs_props is not None:
            producer = clients.producer(task.syncs_props, {"linger.ms": 0, "acks": "all"})
            self._writer = OffsetSyncWriter(producer, task.syncs_topic)

    def write(self, syncs: list[tuple[int, int]]) -> int:
        """Write `syncs`; return how many were written."""
        writer, task = self._writer, self.task
        if writer is None or not syncs:
            return 0
        r = task.range
        for upstream, downstream in syncs:
            writer.write(r.topic, r.partition, upstream, downstream)
        remaining = writer.flush(WRITE_TIMEOUT)
        if remaining or writer.failures:
            reason = writer.failures[0] if writer.failures else f"{remaining} not acknowledged"
            raise RangeCopyError(
                f"flow {task.flow}: {r}: records were committed but writing their offset "
                f"syncs to {task.syncs_topic} failed: {reason}; run the backfill again"
            )
        return len(syncs)
