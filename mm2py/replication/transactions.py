"""Transactions on the target: the one way the daemon's tasks and the backfill write
records exactly once.

A transactional producer writes a batch of records and the progress that says they
were copied (``mm2-offsets.<source>.internal``, on the same cluster) in one
transaction, so a reader with ``isolation.level = read_committed`` sees both or
neither. Offset syncs are written only after the commit, so none points at a record
of an aborted attempt.

Fencing: a transactional id (a task's: mm2py.replication.exactly_once.transactional_id)
belongs to one writer at a time. `init_transactions` on
a producer with that id aborts whatever a previous holder left open and makes its
every later send or commit fail (librdkafka's `_FENCED`); this is how a task that
moves to another node, or a backfill attempt that Spark runs again, fences the one
before it (librdkafka has no FenceProducers admin call, so `fence` initialises the
ids of writers that have no successor).

A record the target rejects fails the whole transaction, but librdkafka says so only
in its log (TXNERR) and leaves the records queued after it until they time out:
`TransactionLog` watches for that line so the writer can abort at once, naming the
target's reason.
"""

from __future__ import annotations

import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from mm2py.kafka import clients
from mm2py.replication.client_settings import PRODUCER_REQUIRED, copy_settings
from mm2py.replication.progress import ProgressStore, SourcePartition

log = logging.getLogger(__name__)

INIT_TIMEOUT = 60.0
FENCE_TIMEOUT = 30.0


class TransactionLog:
    """A transactional producer's librdkafka `logger`: every line goes on to `inner` (the
    cluster's log), and the first failed-transaction line (TXNERR) is kept in `failure`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.failure: str | None = None

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.inner.log(level, fmt, *args)
        if self.failure is None and len(args) == 3 and args[0] == "TXNERR":
            self.failure = re.sub(r"^\[thrd:[^]]*\]: ", "", str(args[2]))


def transactional_producer(
    props: Mapping[str, str],
    tuning: Mapping[str, Any],
    where: str,
    tid: str,
    *,
    timeout_ms: int,
    error_cb: Callable[[KafkaError], None] | None = None,
) -> tuple[Any, TransactionLog]:
    """A producer with transactional id `tid` (not initialised yet) and its log: the
    cluster's settings over `tuning`, then what transactions need (`copy_settings`;
    `where` names the producer in its warnings), with transaction.timeout.ms `timeout_ms`."""
    txn_log = TransactionLog(clients.ClusterLog(str(props.get("bootstrap.servers", ""))))
    required = {**PRODUCER_REQUIRED, "transaction.timeout.ms": timeout_ms}
    overrides: dict[str, Any] = {
        **copy_settings(props, tuning, required, where),
        "transactional.id": tid,
        "logger": txn_log,
    }
    if error_cb is not None:
        overrides["error_cb"] = error_cb
    return clients.producer(props, overrides), txn_log


class TransactionFailed(RuntimeError):
    """The open transaction cannot be committed; the message says why."""


def settle(producer: Any, txn_log: TransactionLog, timeout: float, where: str) -> None:
    """Wait until every record sent is acknowledged (their delivery reports served);
    TransactionFailed with the target's reason when one was rejected, or when that
    takes over `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = producer.flush(min(0.5, max(deadline - time.monotonic(), 0.0)))
        if txn_log.failure is not None:
            raise TransactionFailed(f"{where}: {txn_log.failure}")
        if remaining == 0:
            return
        if time.monotonic() > deadline:
            raise TransactionFailed(
                f"{where}: {remaining} records not acknowledged after {timeout:.0f} s"
            )


def commit(producer: Any, txn_log: TransactionLog, timeout: float, where: str) -> None:
    """Commit the open transaction once every record is acknowledged (`settle`)."""
    deadline = time.monotonic() + timeout
    settle(producer, txn_log, timeout, where)
    try:
        producer.commit_transaction(max(deadline - time.monotonic(), 1.0))
    except KafkaException as exc:
        raise TransactionFailed(f"{where}: {txn_log.failure or exc.args[0].str()}") from None


class TransactionWriter(ABC):
    """The writer whose transactions the exactly-once committer opens, fills with
    progress and ends: librdkafka's transactional producer (`LibrdkafkaTransactions`)
    or the batch copier's raw one (mm2py.replication.batch_transactions)."""

    @property
    def failure(self) -> str | None:
        """Why the open transaction cannot commit, when the writer learnt it on its own
        (librdkafka says so only in its log)."""
        return None

    @abstractmethod
    def begin(self) -> None:
        """Open a transaction."""

    @abstractmethod
    def settle(self, timeout: float, where: str) -> None:
        """Return once everything sent is acknowledged (TransactionFailed if not)."""

    @abstractmethod
    def write_progress(
        self, progress: ProgressStore, last_copied: Mapping[SourcePartition, int], timeout: float
    ) -> None:
        """Send the last copied offsets in the open transaction (TransactionFailed if a
        write that waits for its answer has none within `timeout` s)."""

    @abstractmethod
    def commit(self, timeout: float, where: str) -> None:
        """Commit the open transaction (TransactionFailed if it cannot)."""

    @abstractmethod
    def abort(self, where: str, timeout: float) -> None:
        """Abort the open transaction, if any; a failure is logged, not raised."""


class LibrdkafkaTransactions(TransactionWriter):
    """A confluent-kafka transactional producer (initialised) and its log."""

    def __init__(self, producer: Any, txn_log: TransactionLog) -> None:
        self.producer = producer
        self.log = txn_log

    @property
    def failure(self) -> str | None:
        return self.log.failure

    def begin(self) -> None:
        self.producer.begin_transaction()

    def settle(self, timeout: float, where: str) -> None:
        settle(self.producer, self.log, timeout, where)

    def write_progress(
        self, progress: ProgressStore, last_copied: Mapping[SourcePartition, int], timeout: float
    ) -> None:
        # sent, not waited for: the commit flushes it within its own timeout
        progress.write_in_transaction(self.producer, last_copied)

    def commit(self, timeout: float, where: str) -> None:
        commit(self.producer, self.log, timeout, where)

    def abort(self, where: str, timeout: float) -> None:
        abort(self.producer, where, timeout)


def abort(producer: Any, where: str, timeout: float = INIT_TIMEOUT) -> None:
    """Abort the open transaction, if there is one (a fenced producer has none to abort)."""
    try:
        # Records stuck behind a rejected one would hold the abort up until they time
        # out: drop them, and serve their delivery reports (the abort waits for those).
        producer.purge()
        producer.flush(5)
        producer.abort_transaction(timeout)
    except KafkaException as exc:
        err = exc.args[0]
        if err.code() not in (KafkaError._STATE, KafkaError._FENCED):
            # Read_committed readers of its partitions wait until the next holder of the
            # id (or the transaction timeout) aborts it.
            log.warning("%s: aborting the transaction: %s", where, err.str())


def is_fenced(exc: BaseException) -> bool:
    """Whether `exc` says another producer took this transactional id over."""
    if not isinstance(exc, KafkaException):
        return False
    return bool(exc.args[0].code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED))


def fence(
    props: Mapping[str, str],
    ids: Iterable[str],
    transaction_timeout_ms: int,
    timeout: float = FENCE_TIMEOUT,
) -> None:
    """Fence the writers of `ids`: initialise each id once, then let it go. Its
    producers ask for the flow's `transaction_timeout_ms` (they open no transaction, but
    another value would be warned about as a configured one not used).

    Raises KafkaException when the target refuses (e.g. no ACL for the id)."""
    for tid in ids:
        producer, _ = transactional_producer(
            props, {"linger.ms": 0}, f"fencing {tid}", tid, timeout_ms=transaction_timeout_ms
        )
        producer.init_transactions(timeout)
        producer.flush(1)
