"""The copy of one offset range, run inside a Spark task (a Python executor).

A range copy is the daemon's copy core (mm2py.replication: `CopyLoop`, `DeliveryProof`,
the `ExactlyOnce` committer) with one source partition, assigned at the range's start
and stopped at its end (`NewPartition.stop_at`). So, as the daemon's exactly-once tasks:
- the source is read `read_committed`; records and the partition's progress (``end - 1``
  once the range is read) go to the target in one transaction (every COMMIT_INTERVAL s);
  a copy killed or failed leaves only aborted records, and a backfill run again
  continues from the last commit: nothing is copied twice;
- the transactional id is fixed per source partition: a new attempt fences a zombie;
- offset syncs follow the source part's rules and are written only after their commit;
- a run the delivery reports do not prove aborts the transaction, and the copy goes on
  from the last commit with a report per record; a rejected record, a schema id that
  cannot be resolved, or STALL_TIMEOUT s without a record fails the range (RangeCopyError).
Nothing here imports Spark: the driver ships a `RangeTask` to `copy_range`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException

from mm2py.backfill.plan import OffsetRange, RangeResult, SourcePartition
from mm2py.kafka import clients
from mm2py.replication import client_settings, transactions
from mm2py.replication.client_settings import copy_settings
from mm2py.replication.committers import PartitionRejected, RunUnproven, Transactions
from mm2py.replication.copy_loop import CopyLoop, NewPartition
from mm2py.replication.delivery import PartitionState
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore
from mm2py.replication.schemas import (
    SchemaTranslator,
    UnresolvedMode,
    UnresolvedSchema,
    translator_for,
)
from mm2py.replication.stats import ReplicationStats
from mm2py.replication.transactions import TransactionLog

log = logging.getLogger(__name__)

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
class _RangeCopy:
    """What the copy loops of one range found, summed over the loops (a loop ends at the
    range's end, or on a run not proven: the next one starts from the last commit)."""

    task: RangeTask
    stats: ReplicationStats
    # Partitions copied with a report per record since a run was not proven.
    per_record_reports: set[SourcePartition] = field(default_factory=set)
    committed: int | None = None  # the last progress committed, once known
    syncs: int = 0
    # Key and value bytes sent (the statistics count them) when the last transaction
    # committed, and sent in transactions that aborted.
    sent_at_commit: int = 0
    aborted_bytes: int = 0
    first_downstream: int | None = None
    last_downstream: int | None = None
    interleaved: int = 0

    def copy(self, resume: bool, schemas: SchemaTranslator | None) -> None:
        """One copy loop from the range's start, or (`resume`) after the last commit.
        Raises RunUnproven when a run was not proven, RangeCopyError when the range fails."""
        task, r = self.task, self.task.range
        where = r.source_partition
        store = ProgressStore(
            task.target_props,
            task.target_alias,
            task.source_alias,
            task.progress_topic,
            task.progress_replication_factor,
        )
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
        syncs = _sync_writer(task)
        loop: CopyLoop | None = None
        try:
            producer.init_transactions(WRITE_TIMEOUT)  # fences an earlier attempt
            if resume and self.committed is None:
                self.committed = store.load(past_open_transactions=True).get(where)
            stored = self.committed if self.committed is not None else r.start - 1
            if stored >= r.end - 1:
                return  # copied whole by an earlier attempt
            loop = CopyLoop(
                task.flow,
                task.target_alias,
                consumer,
                producer,
                store,
                syncs,
                self.stats,
                {where: stored} if stored >= r.start else {},
                poll_timeout=POLL_TIMEOUT,
                transactions=Transactions(COMMIT_INTERVAL, txn_log),
                per_record_reports=self.per_record_reports,
                schemas=schemas,
            )
            loop.assign(
                [NewPartition(r.topic, r.partition, task.remote_topic, stop_at=r.end)],
                {where: max(r.start, stored + 1)},
            )
            self._copy_to_stop(loop)
            loop.commit_transaction(FLUSH_TIMEOUT)
        except BaseException as exc:
            sent = self.stats.partition(task.remote_topic, r.partition).bytes
            self.aborted_bytes += sent - self.sent_at_commit
            self.sent_at_commit = sent
            if loop is not None:
                # Whatever is open aborts: nothing of it is recorded.
                loop.committer.fail(f"copying {r} failed", replace=True)
                loop.finish(time.monotonic() + WRITE_TIMEOUT)
                self._found(loop.by_source[where], stored)
            else:
                transactions.abort(producer, f"flow {task.flow}: copying {r}", WRITE_TIMEOUT)
            if isinstance(exc, RunUnproven):
                self._written(syncs)
            raise _range_error(task, exc, txn_log, loop) from None
        finally:
            consumer.close()
            store.close()
        loop.finish(time.monotonic() + WRITE_TIMEOUT)  # writes the last syncs
        self._found(loop.by_source[where], stored)
        self._written(syncs)

    def _copy_to_stop(self, loop: CopyLoop) -> None:
        """Copy until every offset before the range's end was read."""
        r = self.task.range
        state = loop.by_source[r.source_partition]
        seen, last_seen = state.read, time.monotonic()
        stats = self.stats.partition(self.task.remote_topic, r.partition)
        committed = state.committed
        while not state.at_stop:
            loop.copy_batch(_never)
            if state.committed != committed:
                # A batch ends with its commit, when due: every record sent is in it.
                committed, self.sent_at_commit = state.committed, stats.bytes
            now = time.monotonic()
            if state.read != seen:
                seen, last_seen = state.read, now
            elif now - last_seen > STALL_TIMEOUT:
                raise RangeCopyError(
                    f"flow {self.task.flow}: copying {r}: nothing read from "
                    f"{r.topic}-{r.partition} after offset {max(seen, r.start - 1)} for "
                    f"{STALL_TIMEOUT:.0f} s; is the source cluster reachable?"
                )

    def _found(self, state: PartitionState, stored: int) -> None:
        """Take in what a loop that started after `stored` committed."""
        self.interleaved += state.foreign
        self.committed = max(stored, state.committed)
        if state.committed <= stored:
            return
        if self.first_downstream is None and state.first_downstream >= 0:
            self.first_downstream = state.first_downstream
        if state.acked_downstream >= 0 and state.acked <= state.committed:
            self.last_downstream = state.acked_downstream

    def _written(self, syncs: OffsetSyncWriter | None) -> None:
        """Count the loop's offset syncs, once the target has them all."""
        if syncs is None:
            return
        remaining = syncs.flush(WRITE_TIMEOUT)
        if remaining or syncs.failures:
            reason = syncs.failures[0] if syncs.failures else f"{remaining} not acknowledged"
            raise RangeCopyError(
                f"flow {self.task.flow}: {self.task.range}: records were committed but "
                f"writing their offset syncs to {self.task.syncs_topic} failed: {reason}; "
                "run the backfill again"
            )
        self.syncs += syncs.written


def copy_range(task: RangeTask, attempt: int = 0) -> RangeResult:
    """Copy `task.range` to the remote topic; write offset syncs and progress per commit.

    `attempt` > 0 (Spark retrying the task) starts after the progress an earlier
    attempt recorded, so its committed transactions are not copied again.
    """
    r = task.range
    started = time.monotonic()
    copy = _RangeCopy(task, ReplicationStats(task.source_alias, task.target_alias))
    schemas = _translator(task)
    try:
        resume = attempt > 0
        while True:
            try:
                copy.copy(resume, schemas)
                break
            except RunUnproven:
                resume = True  # from the last commit, with a report per record
    finally:
        if schemas is not None:
            schemas.close()
    stats = copy.stats.partition(task.remote_topic, r.partition)
    return RangeResult(
        r,
        stats.records,
        stats.bytes - copy.aborted_bytes,
        time.monotonic() - started,
        copy.syncs,
        copy.first_downstream,
        copy.last_downstream,
        copy.interleaved,
    )


def _never() -> bool:
    return False


def _range_error(
    task: RangeTask, exc: BaseException, txn_log: TransactionLog, loop: CopyLoop | None
) -> BaseException:
    """What a failed copy loop raises: RunUnproven as it is (the copy goes on), else a
    RangeCopyError naming the range and the cause (the target's, when it said one)."""
    if isinstance(exc, RunUnproven | RangeCopyError) or not isinstance(exc, Exception):
        return exc
    r = task.range
    state = loop.by_source.get(r.source_partition) if loop is not None else None
    cause = state.failure_cause if state is not None else None
    if cause is not None and isinstance(cause[1], UnresolvedSchema):
        offset, unresolved = cause
        return RangeCopyError(
            f"flow {task.flow}: copying {r}: record {r.topic}-{r.partition} offset {offset}: "
            f"{unresolved}; schema.registry.unresolved.ids = copy copies such records unchanged"
        )
    text = exc.args[0].str() if isinstance(exc, KafkaException) else str(exc)
    failure = txn_log.failure
    if failure is not None and failure not in text:
        # The target's own words (the record it rejected fails the transaction).
        text = f"{text}: {failure}" if isinstance(exc, PartitionRejected) else failure
    return RangeCopyError(f"flow {task.flow}: copying {r}: {text}")


def _translator(task: RangeTask) -> SchemaTranslator | None:
    """The range's schema id translator, if any (the copy loop copies the topic's subjects
    up front when it assigns the partition)."""
    if task.schema_registries is None:
        return None
    source, target, unresolved = task.schema_registries
    mode: UnresolvedMode = "copy" if unresolved == "copy" else "fail"
    return translator_for(task.flow, source, target, mode)


def _sync_writer(task: RangeTask) -> OffsetSyncWriter | None:
    """The writer of a copy loop's offset syncs (None: offset syncs are off)."""
    if task.syncs_props is None:
        return None
    producer = clients.producer(task.syncs_props, {"linger.ms": 0, "acks": "all"})
    return OffsetSyncWriter(producer, task.syncs_topic)
