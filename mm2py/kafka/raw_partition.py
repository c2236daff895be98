"""The raw-batch data path of one partition: Fetch and Produce with record-batch bytes.

confluent-kafka cannot fetch or produce batches as bytes, so this module uses aiokafka's
protocol layer (`AIOKafkaClient.send` with Fetch and Produce requests), and is the only
module that talks to it. Control-plane work stays on confluent-kafka (mm2py.kafka.clients).

- `RawFetcher`: Fetch at read_committed from one source partition's leader; returns the
  records bytes as the broker sent them and the aborted-transactions list.
- `IdempotentRawProducer`: InitProducerId (no transactional id), then Produce (acks=all)
  of `record_batches.rewrite_for_produce` batches with this producer's id, epoch and
  per-partition sequence; returns each batch's target base offset. At most
  `MAX_IN_FLIGHT` requests are in flight (the broker dedupes the last 5 batches per producer
  and partition, so a window is resent whole after a retriable error).
- Leader changes and other retriable errors refresh metadata and retry until
  `retry_timeout`; anything else raises `RawPartitionError` naming topic, partition, error
  and what to do.
- Each object has its own event loop on a thread of its own; its methods are synchronous
  and meant for one caller thread (the copy thread: a producer's sequence is its state).
  Construct (no network), then `open()`; `close()` stops the loop.
- Versions: aiokafka 0.14 picks the highest it has within the broker's range. Against Kafka
  4.1.1 (Fetch 4-18, Produce 0-13, InitProducerId 0-5, Metadata 0-13) that is Fetch v11,
  Produce v7, InitProducerId v0, Metadata v5. Fetch v11 is checked for (isolation level,
  aborted transactions and log start offset in its answer; Kafka 2.3+).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from aiokafka import errors as aiokafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.protocol.transaction import InitProducerIdRequest
from aiokafka.structs import TopicPartition

from mm2py.kafka.record_batches import (
    AbortedTransaction,
    RecordBatch,
    next_sequence,
    rewrite_for_produce,
)

log = logging.getLogger(__name__)

T = TypeVar("T")

READ_COMMITTED = 1
ACKS_ALL = -1
# Kafka's idempotent producer keeps at most 5 requests in flight per partition: the broker
# remembers the last 5 batches of a producer and answers a resent one with its first offset.
MAX_IN_FLIGHT = 5
MIN_FETCH_VERSION = 11
RETRY_BACKOFF = 0.1
MAX_RETRY_BACKOFF = 1.0
# Errors of the connection itself (broker down, request lost): retried like a leader change.
_CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aiokafka_errors.KafkaConnectionError,
    aiokafka_errors.NodeNotReadyError,
    aiokafka_errors.RequestTimedOutError,
    asyncio.TimeoutError,
    OSError,
)


class RawPartitionError(Exception):
    """A raw Fetch or Produce failed for good: the message names the cluster, topic,
    partition and error, and what to do."""


class OffsetOutOfRange(RawPartitionError):
    """The fetch position is not in the partition's log (deleted by retention or
    delete_records, or past the end of a truncated or recreated partition)."""


class BatchRejected(RawPartitionError):
    """The target refused a batch for what it holds (too large, invalid, not authorised),
    not for the producer's state: sending it again cannot succeed."""


@dataclass(frozen=True)
class Fetched:
    """One Fetch answer for a partition, at read_committed."""

    position: int  # the offset asked for
    records: bytes  # record batches as stored; the last may be cut short
    aborted: list[AbortedTransaction]
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int


def client_settings(props: Mapping[str, str]) -> dict[str, Any]:
    """AIOKafkaClient's keyword arguments from a cluster's librdkafka properties.

    Connection keys only (bootstrap, security protocol, SASL PLAIN/SCRAM, TLS files);
    librdkafka tuning keys do not apply and are not read.
    """
    settings: dict[str, Any] = {"bootstrap_servers": props["bootstrap.servers"]}
    protocol = props.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"security.protocol {protocol!r} is not one raw batches can use")
    settings["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", "GSSAPI")).upper()
        if mechanism not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            raise ValueError(
                f"sasl.mechanism {mechanism!r}: raw batches support PLAIN and SCRAM-SHA-256/512"
            )
        settings["sasl_mechanism"] = mechanism
        settings["sasl_plain_username"] = props.get("sasl.username")
        settings["sasl_plain_password"] = props.get("sasl.password")
    if protocol.endswith("SSL"):
        context = create_ssl_context(
            cafile=props.get("ssl.ca.location"),
            certfile=props.get("ssl.certificate.location"),
            keyfile=props.get("ssl.key.location"),
            password=props.get("ssl.key.password"),
        )
        if props.get("enable.ssl.certificate.verification", "true").lower() == "false":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        elif props.get("ssl.endpoint.identification.algorithm", "https").lower() == "none":
            context.check_hostname = False
        settings["ssl_context"] = context
    return settings


class _EventLoopThread:
    """An asyncio loop on a thread of its own; `run` waits for a coroutine on it."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class _RawPartition:
    """What fetcher and producer share: the client, the partition's leader, retries."""

    role = "raw"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        *,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        self._settings = client_settings(props)
        # tests hand in a stand-in for AIOKafkaClient; it is made on the loop, as
        # AIOKafkaClient must be
        self._client_factory = client_factory or self._aiokafka_client
        self.bootstrap = props["bootstrap.servers"]
        self.topic = topic
        self.partition = partition
        self.retry_timeout = retry_timeout
        self.request_timeout_ms = request_timeout_ms
        self._tp = TopicPartition(topic, partition)
        self._loop: _EventLoopThread | None = None
        self._client: Any = None  # AIOKafkaClient, made on the loop

    def open(self) -> None:
        """Start the loop and connect (bootstrap metadata)."""
        if self._loop is not None:
            return
        self._loop = _EventLoopThread(f"mm2py-{self.role}-{self.topic}-{self.partition}")
        try:
            self._loop.run(self._open())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            if self._client is not None:
                self._loop.run(self._client.close())
        finally:
            self._client = None
            self._loop.stop()
            self._loop = None

    def __enter__(self) -> _RawPartition:
        self.open()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self.role} for {self.where()} is not open")
        return self._loop.run(coro)

    def _aiokafka_client(self) -> Any:
        return AIOKafkaClient(
            client_id=f"mm2py-{self.role}",
            request_timeout_ms=self.request_timeout_ms,
            **self._settings,
        )

    async def _open(self) -> None:
        self._client = self._client_factory()
        try:
            await self._client.bootstrap()
        except _CONNECTION_ERRORS as exc:
            raise self.error(
                "connect", str(exc), "Check bootstrap.servers and that the cluster is up"
            ) from exc
        self._client.add_topic(self.topic)

    def where(self) -> str:
        return f"{self.topic}-{self.partition} on {self.bootstrap}"

    def error(self, what: str, cause: str, advice: str) -> RawPartitionError:
        return RawPartitionError(f"{what} for {self.where()} failed: {cause}. {advice}")

    async def _leader(self, deadline: float) -> int:
        """The partition leader's node id, refreshing metadata until it is known."""
        backoff = RETRY_BACKOFF
        while True:
            leader = self._client.cluster.leader_for_partition(self._tp)
            if leader is not None and leader >= 0:
                return int(leader)
            if self.topic in self._client.cluster.unauthorized_topics:
                raise self.error(
                    "metadata",
                    "topic authorization failed",
                    "Grant this client's principal DESCRIBE (and READ or WRITE) on the topic",
                )
            if time.monotonic() > deadline:
                known = self._client.cluster.partitions_for_topic(self.topic)
                cause = "no such topic" if known is None else "no leader"
                if known is not None and self.partition not in known:
                    cause = f"no such partition (the topic has {len(known)})"
                raise self.error(
                    "metadata",
                    f"{cause} after {self.retry_timeout:.0f} s",
                    "Check that the topic exists and its partition has a leader",
                )
            self._client.add_topic(self.topic)
            await self._client.force_metadata_update()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF)

    async def _retry_later(self, backoff: float, deadline: float, what: str, cause: str) -> float:
        """Refresh metadata and wait before a retry; raise once the deadline passed."""
        if time.monotonic() > deadline:
            raise self.error(
                what,
                f"{cause}, still after {self.retry_timeout:.0f} s of retries",
                "Check the cluster's brokers and the partition's leader",
            )
        log.debug("%s for %s: %s; retrying", what, self.where(), cause)
        await asyncio.sleep(backoff)
        # a leader change or a lost broker: ask again who leads before the retry
        await self._client.force_metadata_update()
        return min(backoff * 2, MAX_RETRY_BACKOFF)


def _error_class(code: int) -> Any:
    return aiokafka_errors.for_code(code)


class RawFetcher(_RawPartition):
    """Fetch raw record batches of one source partition at read_committed."""

    role = "fetcher"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        *,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 500,
        retry_timeout: float = 60.0,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(
            props, topic, partition, retry_timeout=retry_timeout, client_factory=client_factory
        )
        self.max_bytes = max_bytes
        self.max_wait_ms = max_wait_ms

    def fetch(self, position: int) -> Fetched:
        """The batches from the one holding `position` on (none when it is the end)."""
        return self._run(self._fetch(position))

    async def _fetch(self, position: int) -> Fetched:
        deadline = time.monotonic() + self.retry_timeout
        backoff = RETRY_BACKOFF
        request = FetchRequest(
            max_wait_time=self.max_wait_ms,
            min_bytes=1,
            max_bytes=self.max_bytes,
            isolation_level=READ_COMMITTED,
            topics=[(self.topic, [(self.partition, position, self.max_bytes)])],
        )
        while True:
            leader = await self._leader(deadline)
            try:
                response = await self._client.send(leader, request)
            except _CONNECTION_ERRORS as exc:
                backoff = await self._retry_later(backoff, deadline, "fetch", repr(exc))
                continue
            if response.API_VERSION < MIN_FETCH_VERSION:
                raise self.error(
                    "fetch",
                    f"the broker answered Fetch v{response.API_VERSION}",
                    f"Raw batches need Fetch v{MIN_FETCH_VERSION} (Kafka 2.3 or newer)",
                )
            code, data = self._partition_data(response, position)
            if data is not None:
                return data
            error = _error_class(code)
            if error is aiokafka_errors.OffsetOutOfRangeError:
                raise OffsetOutOfRange(
                    str(
                        self.error(
                            "fetch",
                            f"offset {position} is out of range",
                            "The records were deleted by retention or the partition was "
                            "truncated; restart the copy from the log start",
                        )
                    )
                )
            if not error.retriable:
                raise self.error("fetch", error.__name__, "Not retriable; see the broker's log")
            backoff = await self._retry_later(backoff, deadline, "fetch", error.__name__)

    def _partition_data(self, response: Any, position: int) -> tuple[int, Fetched | None]:
        if response.error_code:
            # a top-level error (fetch sessions only; none is used here)
            return int(response.error_code), None
        for topic, partitions in response.topics:
            if topic != self.topic:
                continue
            # Fetch v11: partition, error_code, highwater_offset, last_stable_offset,
            # log_start_offset, aborted_transactions, preferred_read_replica, message_set
            for number, code, high, stable, start, aborted, _replica, records in partitions:
                if number != self.partition:
                    continue
                if code:
                    return int(code), None
                return 0, Fetched(
                    position=position,
                    records=bytes(records or b""),
                    aborted=[AbortedTransaction(int(p), int(o)) for p, o in aborted or ()],
                    high_watermark=int(high),
                    last_stable_offset=int(stable),
                    log_start_offset=int(start),
                )
        raise self.error("fetch", "the answer has no data for the partition", "Report a bug")


class IdempotentRawProducer(_RawPartition):
    """Produce rewritten batches to one target partition as an idempotent producer."""

    role = "producer"

    def __init__(
        self,
        props: Mapping[str, str],
        topic: str,
        partition: int,
        *,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(
            props,
            topic,
            partition,
            retry_timeout=retry_timeout,
            request_timeout_ms=request_timeout_ms,
            client_factory=client_factory,
        )
        self.producer_id = -1
        self.producer_epoch = -1
        self.next_sequence = 0

    async def _open(self) -> None:
        await super()._open()
        await self._init_producer_id()

    async def _init_producer_id(self) -> None:
        deadline = time.monotonic() + self.retry_timeout
        backoff = RETRY_BACKOFF
        while True:
            node = self._client.get_random_node()
            try:
                response = await self._client.send(
                    node, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=0)
                )
            except _CONNECTION_ERRORS as exc:
                backoff = await self._retry_later(backoff, deadline, "InitProducerId", repr(exc))
                continue
            error = _error_class(response.error_code)
            if error is aiokafka_errors.NoError:
                self.producer_id = int(response.producer_id)
                self.producer_epoch = int(response.producer_epoch)
                self.next_sequence = 0
                log.debug(
                    "producer id %d epoch %d for %s",
                    self.producer_id,
                    self.producer_epoch,
                    self.where(),
                )
                return
            if not error.retriable:
                raise self.error(
                    "InitProducerId",
                    error.__name__,
                    "The principal needs IDEMPOTENT_WRITE on the cluster (or WRITE on the "
                    "topic, Kafka 2.8+)",
                )
            backoff = await self._retry_later(backoff, deadline, "InitProducerId", error.__name__)

    def produce(self, batches: Sequence[RecordBatch]) -> list[int]:
        """Produce PASS batches in order; the target base offset of each."""
        return self._run(self._produce(batches))

    async def _produce(self, batches: Sequence[RecordBatch]) -> list[int]:
        # sequences are given out now, in order, and kept across retries of a window
        payloads: list[bytes] = []
        sequence = self.next_sequence
        for batch in batches:
            payloads.append(
                bytes(
                    rewrite_for_produce(
                        batch, self.producer_id, self.producer_epoch, sequence, False
                    )
                )
            )
            sequence = next_sequence(sequence, batch.header.record_count)
        offsets: list[int] = []
        deadline = time.monotonic() + self.retry_timeout
        backoff = RETRY_BACKOFF
        while len(offsets) < len(payloads):
            window = payloads[len(offsets) : len(offsets) + MAX_IN_FLIGHT]
            leader = await self._leader(deadline)
            # requests on one connection are written and answered in order
            sends = [asyncio.ensure_future(self._send(leader, payload)) for payload in window]
            answers = await asyncio.gather(*sends, return_exceptions=True)
            for answer in answers:
                if isinstance(answer, int):
                    offsets.append(answer)
                    continue
                if isinstance(answer, RawPartitionError):
                    raise answer
                if not isinstance(answer, _CONNECTION_ERRORS) and not isinstance(
                    answer, _Retriable
                ):
                    raise answer
                backoff = await self._retry_later(backoff, deadline, "produce", str(answer))
                break  # the rest of the window is resent (the broker dedupes)
            else:
                deadline = time.monotonic() + self.retry_timeout
                backoff = RETRY_BACKOFF
        self.next_sequence = sequence
        return offsets

    async def _send(self, leader: int, payload: bytes) -> int:
        request = ProduceRequest(
            transactional_id=None,
            required_acks=ACKS_ALL,
            timeout=self.request_timeout_ms,
            topics=[(self.topic, [(self.partition, payload)])],
        )
        response = await self._client.send(leader, request)
        for topic, partitions in response.topics:
            for answer in partitions:
                if topic != self.topic or answer[0] != self.partition:
                    continue
                code, base_offset = int(answer[1]), int(answer[2])
                error = _error_class(code)
                if error is aiokafka_errors.NoError:
                    return base_offset
                if error.retriable:
                    raise _Retriable(error.__name__)
                failed = self.error("produce", error.__name__, _PRODUCE_ADVICE.get(code, _ADVICE))
                if code in _REJECTIONS:
                    raise BatchRejected(str(failed))
                raise failed
        raise self.error("produce", "the answer has no result for the partition", "Report a bug")


class _Retriable(Exception):
    """A retriable error code in a Produce answer."""


_ADVICE = "Not retriable; see the broker's log"
# CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED,
# INVALID_TIMESTAMP, INVALID_RECORD: the batch itself is refused (`BatchRejected`).
_REJECTIONS = frozenset({2, 10, 18, 29, 32, 87})
_PRODUCE_ADVICE = {
    29: "Grant the principal WRITE on the topic",  # TOPIC_AUTHORIZATION_FAILED
    10: "Raise the target topic's max.message.bytes to the source's",  # MESSAGE_TOO_LARGE
    45: "The producer's sequence went wrong: restart the copy (a new producer id)",
    59: "The broker forgot this producer (expired): restart the copy (a new producer id)",
    87: "The broker refused the batch (see its log): copy this partition record by record",
}
