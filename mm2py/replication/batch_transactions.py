"""The batch copier's transactions (exactly-once with batch pass-through, issue 29): the
`TransactionWriter` the exactly-once committer drives, over the copier's raw clients.

Contract: one transaction at a time on the copier's `RawTransactionalClients`
(mm2py.kafka.raw_transactions), whose transactional id is the task's, as the record
copier's; opening the clients fenced the id's previous holder. Produce calls return once
acknowledged, so there is nothing to settle. Progress goes in the transaction as the
records Connect's offsets topic holds (`ProgressStore.record`), produced by the same
raw producer, all of a commit's offsets-topic partitions in one call (one
AddPartitionsToTxn and one Produce, not one of each a partition), within the commit's
timeout (a stop's deadline). A commit or a progress write that fails raises
TransactionFailed; an abort that fails is logged (a fenced
writer has nothing left to abort). A commit or an abort not answered within its timeout
is cancelled: its outcome is the coordinator's, and the id's next holder finds it out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from mm2py.kafka.raw_clients import TP, BatchRejected, ProducerFenced, RawPartitionError
from mm2py.kafka.raw_transactions import RawTransactionalClients, Record
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.transactions import TransactionFailed, TransactionWriter

log = logging.getLogger(__name__)


class RawTransactions(TransactionWriter):
    """Transactions of the batch copier's raw producer (see the module)."""

    def __init__(self, raw: RawTransactionalClients) -> None:
        self.raw = raw

    def begin(self) -> None:
        self.raw.begin()

    def settle(self, timeout: float, where: str) -> None:
        pass  # every produce returned acknowledged

    def write_progress(
        self, progress: ProgressStore, last_copied: Mapping[SourcePartition, int], timeout: float
    ) -> None:
        now_ms = int(time.time() * 1000)
        by_partition: dict[TP, list[Record]] = {}
        for where, offset in last_copied.items():
            partition, key, value = progress.record(where, offset)
            by_partition.setdefault((progress.topic, partition), []).append(
                (key, value, now_ms, ())
            )
        try:
            outcomes = self.raw.produce_records(by_partition, timeout)
        except RawPartitionError as exc:
            raise TransactionFailed(f"writing progress to {progress.topic}: {exc}") from None
        for outcome in outcomes.values():
            if isinstance(outcome, BatchRejected):
                raise TransactionFailed(f"writing progress to {progress.topic}: {outcome}")

    def commit(self, timeout: float, where: str) -> None:
        try:
            self.raw.end(commit=True, timeout=timeout)
        except RawPartitionError as exc:
            raise TransactionFailed(f"{where}: {exc}") from None

    def abort(self, where: str, timeout: float) -> None:
        try:
            self.raw.end(commit=False, timeout=timeout)
        except ProducerFenced:
            pass  # the id's new holder aborted it
        except RawPartitionError as exc:
            # Read_committed readers of its partitions wait until the next holder of the
            # id (or the transaction timeout) aborts it.
            log.warning("%s: aborting the transaction: %s", where, exc)
