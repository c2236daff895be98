"""Committers: when and how the copy loop records what the target holds, per delivery mode.

`Committer` is the one set of hooks the copy loop and its `DeliveryProof` call; the loop
never asks which mode it runs in (as Kafka Connect's `WorkerSourceTask` and
`ExactlyOnceWorkerSourceTask` implement one set of hooks). Invariants:
- At-least-once (`AtLeastOnce`): offset syncs and counts follow each acknowledgement at
  once; progress is submitted when `record_progress` is called; a run not proven is copied
  again in place (the loop seeks back, `copy_again`).
- Exactly-once (`ExactlyOnce`): a transaction opens with the first records read after a
  commit; progress is written in it; offset syncs and counts wait for its commit, so none
  describes a record of an aborted transaction; any failure (a rejected record, a run not
  proven, a loop-ending error) aborts it and ends the loop.
- The first loop-ending failure is kept (`restart_reason`); a timeout replaces it.
Neither talks to the source consumer; both work on the loop's `by_source` states.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException

from mm2py.replication.delivery import PartitionState, SourcePartition
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.progress import ProgressStore
from mm2py.replication.stats import PartitionStats
from mm2py.replication.transactions import (
    LibrdkafkaTransactions,
    TransactionFailed,
    TransactionLog,
    TransactionWriter,
)

log = logging.getLogger(__name__)

# Longest wait for a transaction's records to be acknowledged and committed.
COMMIT_TIMEOUT = 60.0


@dataclass(frozen=True)
class Transactions:
    """How the loop copies exactly-once: its producer is transactional (initialised),
    and commits every `interval` seconds (0: after every batch), and also after any
    batch that read all the source had when `when_caught_up`."""

    interval: float
    log: TransactionLog | None = None  # the librdkafka producer's, when `writer` is not given
    when_caught_up: bool = False
    writer: TransactionWriter | None = None  # another writer (the batch copier's raw one)


class PartitionRejected(TransactionFailed):
    """The target rejected a record (exactly-once): the transaction is aborted and the
    partition stopped; the message names the record."""


class RunUnproven(RuntimeError):
    """Exactly-once: a run's first and last delivery reports did not prove it copied
    whole. The transaction is aborted, and the next loop copies its partition again from
    the last commit, with a delivery report per record."""


class Committer(ABC):
    """The hooks of one delivery mode. `by_source` is the loop's partition states (the
    same dict: the loop adds and replaces states in it)."""

    def __init__(
        self,
        flow_name: str,
        producer: Any,
        progress: ProgressStore,
        syncs: OffsetSyncWriter | None,
        by_source: Mapping[SourcePartition, PartitionState],
    ) -> None:
        self.flow_name = flow_name
        self.producer = producer
        self.progress = progress
        self.syncs = syncs
        self.by_source = by_source
        # Why the loop must end so that the part restarts (the first failure, or a timeout).
        self.restart_reason: str | None = None
        # Partitions to copy again in place, from their first offset not proven.
        self.copy_again_now: dict[SourcePartition, PartitionState] = {}

    # -- the loop's hooks ---------------------------------------------------------

    def read_wait(self, wait: float) -> float:
        """The longest wait for records, given the loop's `wait`."""
        return wait

    @abstractmethod
    def records_read(self) -> None:
        """Records were read and are about to be sent."""

    @abstractmethod
    def end_batch(self, caught_up: bool) -> None:
        """A batch was sent (`caught_up`: it held all the source had). Raises when the
        loop must end; commits when due."""

    @abstractmethod
    def record_progress(self, wait_until: float | None = None) -> None:
        """The periodic progress write (the source part calls it every second)."""

    @abstractmethod
    def commit(self, timeout: float = COMMIT_TIMEOUT) -> None:
        """Record what is proven now."""

    @abstractmethod
    def copied_through(self, state: PartitionState) -> int:
        """The last source offset of `state` recorded as copied (for position syncs)."""

    @abstractmethod
    def finish(self, deadline: float) -> None:
        """The loop ends: record what is proven by `deadline` (monotonic), or drop it."""

    # -- the proof's hooks --------------------------------------------------------

    @property
    def aborting(self) -> bool:
        """Whether what is in flight will be dropped whatever its reports say."""
        return False

    def fail(self, reason: str, replace: bool = False) -> None:
        """The loop must end (the part restarts); only the first reason is kept, unless
        `replace`."""
        if replace or self.restart_reason is None:
            self.restart_reason = reason

    @abstractmethod
    def on_copied(
        self, stats: PartitionStats, count: int, first_ts: int, last_ts: int, now: float
    ) -> None:
        """`count` more records proven, timestamps `first_ts`..`last_ts` (ms), at `now`."""

    @abstractmethod
    def on_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        """An offset sync the proof found."""

    @abstractmethod
    def copy_again(self, state: PartitionState, offset: int) -> str:
        """`state`'s partition must be copied again from `offset`; says how."""

    @abstractmethod
    def not_proven(self, reason: str) -> None:
        """Records were sent that are not proven (`reason` names them)."""

    @abstractmethod
    def rejected(self, reason: str) -> None:
        """The target rejected a record (`reason` names it); its partition stops."""


class AtLeastOnce(Committer):
    """Syncs and counts at each acknowledgement; progress submitted every second."""

    def records_read(self) -> None:
        pass  # no transaction to open

    def not_proven(self, reason: str) -> None:
        pass  # the records are copied again (`copy_again`) or after a restart

    def rejected(self, reason: str) -> None:
        pass  # only the partition stops

    def end_batch(self, caught_up: bool) -> None:
        if self.restart_reason:
            raise RuntimeError(self.restart_reason)

    def record_progress(self, wait_until: float | None = None) -> None:
        """Record the acknowledged positions (and the latest offset syncs).

        The writes are only submitted (`committed` advances when the target
        acknowledges them), unless `wait_until` (a monotonic deadline) is given.
        """
        self.producer.poll(0)
        changed = {}
        for key, state in self.by_source.items():
            state.acknowledged_so_far()
            if state.acked > state.submitted:
                changed[key] = state.acked
                state.submitted = state.acked
                if state.syncs.on_progress(state.acked):
                    self.on_sync(state, state.acked, state.acked_downstream)
        if self.syncs is not None:
            self.syncs.poll()
        self.progress.submit(changed, self._progress_written)
        if wait_until is not None:
            self.progress.flush(max(wait_until - time.monotonic(), 0.1))

    def _progress_written(self, where: SourcePartition, offset: int) -> None:
        state = self.by_source[where]
        state.committed = max(state.committed, offset)

    def commit(self, timeout: float = COMMIT_TIMEOUT) -> None:
        self.record_progress(time.monotonic() + timeout)

    def copied_through(self, state: PartitionState) -> int:
        return state.acked  # progress: the last record acknowledged

    def finish(self, deadline: float) -> None:
        self.producer.flush(max(deadline - time.monotonic(), 0.1))
        self.record_progress(wait_until=deadline)
        if self.syncs is not None:
            self.syncs.flush(max(deadline - time.monotonic(), 0.1))

    def on_copied(
        self, stats: PartitionStats, count: int, first_ts: int, last_ts: int, now: float
    ) -> None:
        stats.records += count
        # At the moment the report is served, like confluent-kafka's `msg.latency()`;
        # serving reports promptly (copy_loop.ACK_POLL_TIMEOUT) is what makes it exact.
        stats.latency.observe_span(now - first_ts / 1000.0, now - last_ts / 1000.0, count)

    def on_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        if self.syncs is not None:
            self.syncs.write(state.topic, state.partition, upstream, downstream)

    def copy_again(self, state: PartitionState, offset: int) -> str:
        self.copy_again_now[(state.topic, state.partition)] = state
        return f"copying it again from offset {offset}"


class ExactlyOnce(Committer):
    """Records and progress in one transaction; syncs and counts after its commit."""

    def __init__(
        self,
        flow_name: str,
        target_alias: str,
        producer: Any,
        progress: ProgressStore,
        syncs: OffsetSyncWriter | None,
        by_source: Mapping[SourcePartition, PartitionState],
        transactions: Transactions,
    ) -> None:
        super().__init__(flow_name, producer, progress, syncs, by_source)
        self.target_alias = target_alias
        self.txn = transactions
        if transactions.writer is not None:
            self.writer: TransactionWriter = transactions.writer
        elif transactions.log is not None:
            self.writer = LibrdkafkaTransactions(producer, transactions.log)
        else:
            raise ValueError("Transactions needs the producer's log or a writer")
        self._open = False
        self._due = 0.0  # when the open transaction commits (monotonic)
        self._rejected: str | None = None  # why the open transaction must abort
        self._unproven: str | None = None  # a run not proven: the loop must end
        # Of the open transaction: offset syncs, and (stats, records, first and last
        # timestamp in ms) of acknowledged runs; both wait for its commit.
        self._syncs: list[tuple[PartitionState, int, int]] = []
        self._copied: list[tuple[PartitionStats, int, int, int]] = []

    def read_wait(self, wait: float) -> float:
        if self._open:
            return min(wait, max(self._due - time.monotonic(), 0.0))
        return wait

    def records_read(self) -> None:
        if not self._open:
            self.writer.begin()
            self._open = True
            self._due = time.monotonic() + self.txn.interval

    def _raise_if_failed(self) -> None:
        if self._rejected is not None:
            raise PartitionRejected(self._rejected)
        if self._unproven is not None:
            raise RunUnproven(self._unproven)

    def end_batch(self, caught_up: bool) -> None:
        self._raise_if_failed()
        if self.restart_reason:
            raise RuntimeError(self.restart_reason)
        if self.writer.failure is not None:
            raise TransactionFailed(self.writer.failure)
        if self._open and (
            (self.txn.when_caught_up and caught_up) or time.monotonic() >= self._due
        ):
            self.commit()

    def commit(self, timeout: float = COMMIT_TIMEOUT) -> None:
        """Commit the open transaction with the progress of what it copied, within
        `timeout` s in all (the sends settled, the progress written, the commit); then
        write its offset syncs and count its records.

        Raises TransactionFailed (PartitionRejected) when it cannot commit; the caller
        aborts it (`finish`).
        """
        if not self._open:
            return
        where = f"flow {self.flow_name}: committing to cluster {self.target_alias}"
        deadline = time.monotonic() + timeout  # for the three steps together

        def left() -> float:
            return max(deadline - time.monotonic(), 0.1)

        self.writer.settle(left(), where)  # every delivery report served
        self._raise_if_failed()
        if self.restart_reason is not None:
            raise TransactionFailed(self.restart_reason)
        changed = {
            key: state.progress()
            for key, state in self.by_source.items()
            if state.progress() > state.committed and state.acked < state.unproven_from
        }
        self.writer.write_progress(self.progress, changed, left())
        self.writer.commit(left(), where)
        self._open = False
        now = time.time()
        for stats, count, first_ts, last_ts in self._copied:
            stats.records += count
            stats.latency.observe_span(now - first_ts / 1000.0, now - last_ts / 1000.0, count)
        syncs = self.syncs
        for state, upstream, downstream in self._syncs:
            if syncs is not None:
                syncs.write(state.topic, state.partition, upstream, downstream)
        self._copied.clear()
        self._syncs.clear()
        for key, offset in changed.items():
            state = self.by_source[key]
            # The latest record's sync, when it is new (progress past it, at a stop offset,
            # is no record's).
            last = min(offset, state.acked)
            new_record = last > state.committed
            state.committed = state.submitted = offset
            if new_record and syncs is not None and state.syncs.on_progress(last):
                syncs.write(state.topic, state.partition, last, state.acked_downstream)
        if syncs is not None:
            syncs.poll()

    def record_progress(self, wait_until: float | None = None) -> None:
        pass  # progress is written in each transaction

    def copied_through(self, state: PartitionState) -> int:
        return state.committed  # progress committed with the records

    def finish(self, deadline: float) -> None:
        """Commit the open transaction, or abort it when the loop ends on a failure (or
        the commit fails: nothing of it is recorded)."""
        if self._open:
            failed = self._rejected or self._unproven or self.restart_reason or self.writer.failure
            try:
                if failed is not None:
                    raise TransactionFailed(failed)
                self.commit(max(deadline - time.monotonic(), 0.1))
            except (TransactionFailed, RunUnproven, KafkaException) as exc:
                log.warning(
                    "flow %s: the open transaction is aborted (%s); its records are copied "
                    "again from the last commit",
                    self.flow_name,
                    exc,
                )
                self.writer.abort(f"flow {self.flow_name}", max(deadline - time.monotonic(), 1.0))
            self._open = False
        if self.syncs is not None:
            self.syncs.flush(max(deadline - time.monotonic(), 0.1))

    @property
    def aborting(self) -> bool:
        return self._rejected is not None

    def fail(self, reason: str, replace: bool = False) -> None:
        # Once a record was rejected, that is what the loop ends on.
        if replace or (self.restart_reason is None and self._rejected is None):
            self.restart_reason = reason

    def on_copied(
        self, stats: PartitionStats, count: int, first_ts: int, last_ts: int, now: float
    ) -> None:
        self._copied.append((stats, count, first_ts, last_ts))  # counted at the commit

    def on_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        self._syncs.append((state, upstream, downstream))  # written after the commit

    def copy_again(self, state: PartitionState, offset: int) -> str:
        return "the transaction is aborted; the next one copies it again"

    def not_proven(self, reason: str) -> None:
        if self._unproven is None:
            self._unproven = reason

    def rejected(self, reason: str) -> None:
        if self._rejected is None:
            self._rejected = reason


def committer_for(
    transactions: Transactions | None,
    flow_name: str,
    target_alias: str,
    producer: Any,
    progress: ProgressStore,
    syncs: OffsetSyncWriter | None,
    by_source: Mapping[SourcePartition, PartitionState],
) -> Committer:
    """Exactly-once when `transactions` is given, else at-least-once."""
    if transactions is None:
        return AtLeastOnce(flow_name, producer, progress, syncs, by_source)
    return ExactlyOnce(flow_name, target_alias, producer, progress, syncs, by_source, transactions)
