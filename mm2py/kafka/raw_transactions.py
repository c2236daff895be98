"""Transactions over Kafka's protocol for raw record batches: the batch copier's
exactly-once writer (issue 29; docs/design/batch-passthrough.md).

`TransactionalProduceSession` is an `IdempotentProduceSession` whose producer id comes
from the transaction coordinator of its transactional id: FindCoordinator, then
InitProducerId, which fences the id's previous holder (its open transaction is aborted,
and everything it sends or commits after is refused). Then, one transaction at a time:
- `begin()`; each partition is added to the transaction (AddPartitionsToTxn, to the
  coordinator) before its first batch in it is produced;
- `produce` sends batches with the transactional bit and the id; `produce_records`
  builds uncompressed batches of records and produces them the same way (the progress
  records, and records that cannot pass as they are);
- `end(commit)` (EndTxn): the coordinator writes the commit or abort markers.

Versions: aiokafka has InitProducerId, AddPartitionsToTxn and EndTxn v0, which Kafka
4.x still serves (transactions of protocol 1: the client adds the partitions).

Errors: the coordinator moving or loading, CONCURRENT_TRANSACTIONS (the previous
transaction's markers still being written) and lost connections are retried until
`retry_timeout`; INVALID_PRODUCER_EPOCH and PRODUCER_FENCED raise `ProducerFenced`;
TRANSACTIONAL_ID_AUTHORIZATION_FAILED raises `RawPartitionError` naming the ACL to grant.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from aiokafka import errors as aiokafka_errors
from aiokafka.protocol.transaction import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
)
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mm2py.kafka.raw_clients import (
    CONNECTION_ERRORS,
    FENCED,
    MAX_RETRY_BACKOFF,
    RETRY_BACKOFF,
    TP,
    BatchRejected,
    FetchSession,
    IdempotentProduceSession,
    ProducerFenced,
    RawCopyClients,
    RawPartitionError,
    error_class,
    find_coordinator,
)
from mm2py.kafka.record_batches import RecordBatch, split_batches

log = logging.getLogger(__name__)

TRANSACTION_COORDINATOR = 1  # FindCoordinator's key type for a transactional id
COORDINATOR_MOVED = frozenset({14, 15, 16})  # LOAD_IN_PROGRESS, NOT_AVAILABLE, NOT_COORDINATOR
CONCURRENT_TRANSACTIONS = 51
CONCURRENT_BACKOFF = (
    0.005  # the previous transaction's markers: measured 30 -> 13 ms a cycle against 20 ms
)
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
OPERATION_NOT_ATTEMPTED = 55
RECORDS_BATCH_BYTES = 1 << 20  # a built batch closes past this size (one record at least)

# A record to produce: key, value, timestamp (ms), headers.
Record = tuple[bytes | None, bytes | None, int, Sequence[tuple[str, bytes | None]]]


class TransactionalProduceSession(IdempotentProduceSession):
    """Produce raw batches in transactions of one transactional id (see the module)."""

    def __init__(
        self,
        props: Mapping[str, str],
        transactional_id: str,
        *,
        transaction_timeout_ms: int,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
        alias: str | None = None,
    ) -> None:
        super().__init__(
            props,
            retry_timeout=retry_timeout,
            request_timeout_ms=request_timeout_ms,
            client_factory=client_factory,
            alias=alias,
        )
        self.transactional_id: str = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.in_transaction = False
        self._coordinator: int | None = None
        self._added: set[TP] = set()

    # -- the coordinator ------------------------------------------------------------

    async def _to_coordinator(self, request: Any, what: str) -> Any:
        """`request`'s answer from the transaction coordinator, retried while it moves,
        loads or finishes the previous transaction; raises on any other error."""
        deadline = time.monotonic() + self.retry_timeout
        backoff = RETRY_BACKOFF
        while True:
            try:
                if self._coordinator is None:
                    self._coordinator = await find_coordinator(
                        self._client, TRANSACTION_COORDINATOR, self.transactional_id
                    )
                response = await self._client.send(self._coordinator, request)
                code = _error_code(response)
                cause = error_class(code).__name__
            except CONNECTION_ERRORS as exc:
                await self.check_access(self._coordinator)
                code, cause = -1, repr(exc)
                self._coordinator = None
            except aiokafka_errors.KafkaError as exc:  # from FindCoordinator
                code, cause = -1, repr(exc)
                if not exc.retriable:
                    raise RawPartitionError(
                        f"{what} for transactional id {self.transactional_id} on "
                        f"{self.bootstrap} failed: {cause}"
                    ) from exc
                self._coordinator = None
            if code == 0:
                return response
            if code in FENCED:
                raise ProducerFenced(self.fenced_message(cause))
            if code == TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
                raise RawPartitionError(
                    f"{what} on {self.bootstrap} failed: {cause}: grant the principal WRITE "
                    f"and DESCRIBE on TransactionalId {self.transactional_id}"
                )
            if code in COORDINATOR_MOVED:
                self._coordinator = None
            elif code not in (-1, CONCURRENT_TRANSACTIONS) and not error_class(code).retriable:
                raise RawPartitionError(
                    f"{what} for transactional id {self.transactional_id} on {self.bootstrap}"
                    f" failed: {cause}. Not retriable; see the broker's log"
                )
            if time.monotonic() > deadline:
                raise RawPartitionError(
                    f"{what} for transactional id {self.transactional_id} on {self.bootstrap}"
                    f" failed: {cause}, still after {self.retry_timeout:.0f} s of retries. "
                    "Check the cluster's brokers and its __transaction_state topic"
                )
            log.debug("%s: %s; retrying", what, cause)
            if code == CONCURRENT_TRANSACTIONS:  # markers being written: soon done
                await asyncio.sleep(CONCURRENT_BACKOFF)
                continue
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF)

    async def _init_producer_id(self) -> None:
        response = await self._to_coordinator(
            InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.transaction_timeout_ms,
            ),
            "InitProducerId",
        )
        self.producer_id = int(response.producer_id)
        self.producer_epoch = int(response.producer_epoch)
        self.new_producer_id()
        self.in_transaction = False
        self._added.clear()
        log.debug(
            "transactional id %s: producer id %d epoch %d",
            self.transactional_id,
            self.producer_id,
            self.producer_epoch,
        )

    # -- a transaction ----------------------------------------------------------------

    def begin(self) -> None:
        """Open a transaction (nothing is sent until its first batch)."""
        if self.in_transaction:
            raise RuntimeError(f"transactional id {self.transactional_id}: already in one")
        self.in_transaction = True
        self._added.clear()

    async def _before_produce(self, tps: Sequence[TP]) -> None:
        if not tps:
            return
        if not self.in_transaction:
            raise RuntimeError(
                f"transactional id {self.transactional_id}: produce outside a transaction"
            )
        new = [tp for tp in tps if tp not in self._added]
        if not new:
            return
        topics: dict[str, list[int]] = {}
        for topic, partition in new:
            topics.setdefault(topic, []).append(partition)
        await self._to_coordinator(
            AddPartitionsToTxnRequest(
                transactional_id=self.transactional_id,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                topics=list(topics.items()),
            ),
            "AddPartitionsToTxn",
        )
        self._added.update(new)

    async def produce_records(
        self, records: Mapping[TP, Sequence[Record]]
    ) -> dict[TP, list[int] | BatchRejected]:
        """Produce each partition's `records` in the open transaction, in batches built
        here (uncompressed, CreateTime), the partitions together (one AddPartitionsToTxn,
        one Produce a leader): by partition, each record's target offset, or
        BatchRejected."""
        batches = {tp: build_batches(recs) for tp, recs in records.items() if recs}
        outcomes = await self.produce(batches)
        placed: dict[TP, list[int] | BatchRejected] = {}
        for tp, outcome in outcomes.items():
            placed[tp] = (
                outcome
                if isinstance(outcome, BatchRejected)
                else [
                    base + i
                    for batch, base in zip(batches[tp], outcome, strict=True)
                    for i in range(batch.header.record_count)
                ]
            )
        return placed

    async def end(self, commit: bool) -> None:
        """Commit or abort the open transaction (none open: nothing to do)."""
        if not self.in_transaction:
            return
        if self._added:
            await self._to_coordinator(
                EndTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=self.producer_id,
                    producer_epoch=self.producer_epoch,
                    transaction_result=commit,
                ),
                "EndTxn",
            )
        self.in_transaction = False
        self._added.clear()


def build_batches(records: Sequence[Record]) -> list[RecordBatch]:
    """`records` as v2 batches of at most about RECORDS_BATCH_BYTES each (offsets from 0 in
    each; producer id, epoch and sequence are set when they are produced)."""
    out: list[RecordBatch] = []
    builder: Any = None
    offset = 0

    def close() -> None:
        assert builder is not None
        out.extend(split_batches(bytes(builder.build())).batches)

    for key, value, timestamp, headers in records:
        if builder is not None:
            appended = builder.append(offset, timestamp, key, value, list(headers))
            if appended is not None:
                offset += 1
                continue
            close()
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, RECORDS_BATCH_BYTES)
        offset = 0
        if builder.append(offset, timestamp, key, value, list(headers)) is None:
            raise ValueError("a record could not be put in a batch of its own")
        offset += 1
    if builder is not None:
        close()
    return out


def _error_code(response: Any) -> int:
    """A coordinator's answer's error: AddPartitionsToTxn's first partition error (the
    others then say OPERATION_NOT_ATTEMPTED), the others' one error code."""
    if hasattr(response, "errors"):
        codes = [int(code) for _, partitions in response.errors for _, code in partitions]
        failed = [code for code in codes if code not in (0, OPERATION_NOT_ATTEMPTED)]
        return failed[0] if failed else 0
    return int(response.error_code)


class RawTransactionalClients(RawCopyClients):
    """A copier's raw clients that write in transactions: `RawCopyClients` over a
    `TransactionalProduceSession` (`open()` fences the id's previous holder)."""

    def __init__(
        self, fetch: FetchSession, produce: TransactionalProduceSession, name: str
    ) -> None:
        super().__init__(fetch, produce, name)
        self.transactions = produce

    @property
    def in_transaction(self) -> bool:
        return self.transactions.in_transaction

    def begin(self) -> None:
        """`TransactionalProduceSession.begin`."""
        self.transactions.begin()

    def produce_records(
        self, records: Mapping[TP, Sequence[Record]], timeout: float | None = None
    ) -> dict[TP, list[int] | BatchRejected]:
        """`TransactionalProduceSession.produce_records`, cancelled past `timeout` (s):
        RawPartitionError (what the cancelled produce left in the transaction is unknown:
        it must not commit)."""
        return self._run(self.transactions.produce_records(records), timeout)

    def end(self, commit: bool, timeout: float | None = None) -> None:
        """`TransactionalProduceSession.end`, cancelled past `timeout` (s): RawPartitionError."""
        self._run(self.transactions.end(commit), timeout)
