"""Raw record batches over Kafka's protocol, for many partitions on one event loop.

confluent-kafka cannot fetch or produce batches as bytes, so this module uses aiokafka's
protocol layer (`AIOKafkaClient.send` with Fetch v11 and Produce v7 against Kafka 4.x).

- `FetchSession` (source): one Fetch at read_committed per leader broker, covering all its
  asked partitions (their own positions, `partition_max_bytes` each, `max_bytes` in all,
  the broker answering after `max_wait_ms` or once `min_bytes` are there). At most one
  request per broker is out; `prefetch` sends the next ones and returns at once; `fetch`
  waits for an answer at most `max_wait_ms` and ANSWER_GRACE (a frozen broker's request
  stays out), so that its caller can stop.
- Catching up (`catch_up_after`, the batch copier's CATCH_UP_AFTER): a prefetched answer
  is read when the copier's produce is acknowledged, and records that reached the leader
  meanwhile would wait for the next round. So an answer read that long after it came,
  that left a partition with records at its last stable offset, is followed at once by a
  Fetch from where the answer ends (max wait 0); what it brings within CATCH_UP_WAIT is
  joined to the answer, one answer per partition from the position asked. One not in by
  then stays out as the leader's Fetch, from where the answers returned end.
- Each leader is fetched in a KIP-227 incremental fetch session (`BrokerFetchSession`):
  the first Fetch names all its partitions and creates the session; later ones name only
  partitions new to it or asked from another position than the broker holds, and forget
  those no longer asked. The broker answers only partitions with records, a moved high
  watermark or log start offset, or an error: an idle partition is answered once, and
  callers keep the watermarks of its last answer. A lost or refused Fetch, a session
  error, a retriable partition error or a pause (`discard`) makes that leader's next
  Fetch full (a new session); a partition whose leader moved is forgotten by the old one.
  Closing the FetchSession closes its sessions on the brokers (a Fetch at epoch -1).
- `IdempotentProduceSession` (target): one producer id; a sequence per partition. Several
  partitions' batches go in one Produce (acks=all) per leader, at most `MAX_IN_FLIGHT`
  batches of a partition out at a time (the broker dedupes a producer's last 5 per
  partition), and a partition is resent from its first failed batch. A partition has one
  batch out until one of it is acknowledged to the producer id (`PRODUCER_STATE_TRUSTED`):
  a broker without the producer's state there takes any first sequence, so a second
  batch could land alone, ahead of a first refused as "not leader".
- Per partition: retriable errors (leader change, lost broker) refresh metadata and are
  retried until `retry_timeout` without progress, then `RawPartitionError` names the
  partition; `OffsetOutOfRange` and `BatchRejected` are results of that partition alone.
  A partition's leader is looked up once per metadata update (`_Session.leaders`).
- A broker that cannot be connected to is asked (`ACCESS_PROBE_INTERVAL`) whether it
  refuses the login or the TLS handshake: `AccessRefused` then, at once, with the text
  the record copier gives (mm2py.kafka.clients.refused_access); retrying cannot fix it.
- `RawLoop` runs the sessions' coroutines on the calling thread, the one that owns the
  clients; `RawCopyClients` is a copier's synchronous facade (construct, then `open()`;
  `close()` closes the sessions and the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from io import BytesIO
from types import TracebackType
from typing import Any, TypeVar

from aiokafka import errors as aiokafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.conn import create_conn
from aiokafka.helpers import create_ssl_context
from aiokafka.protocol.fetch import FetchRequest, FetchRequest_v11
from aiokafka.protocol.produce import ProduceRequest, ProduceRequest_v7
from aiokafka.protocol.transaction import InitProducerIdRequest
from aiokafka.structs import TopicPartition

from mm2py.config.copy_mode import raw_connection_problem
from mm2py.kafka import wire
from mm2py.kafka.clients import refused_access
from mm2py.kafka.record_batches import (
    AbortedTransaction,
    CorruptBatchError,
    RecordBatch,
    next_sequence,
    rewrite_for_produce,
    split_batches,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
TP = tuple[str, int]  # (topic, partition)

READ_COMMITTED = 1
ACKS_ALL = -1
# Kafka's idempotent producer keeps at most 5 batches in flight per partition: the broker
# remembers the last 5 batches of a producer and answers a resent one with its first offset.
MAX_IN_FLIGHT = 5
# A broker that holds no state for a producer on a partition takes any first sequence
# (Kafka's ProducerAppendInfo, since KIP-360). A partition's second batch sent with its
# first could then land alone, ahead of a first refused as "not leader" (its topic just
# created, its leader just moved), and the first's resend be refused as out of order:
# the target would hold the second before the first. So a partition has more than one
# batch out only while a batch of it was acknowledged to this producer id within this
# long (s): the broker keeps a producer's state a day by default
# (producer.id.expiration.ms), and retention drops it only with every batch that made it.
PRODUCER_STATE_TRUSTED = 60.0
MIN_FETCH_VERSION = 11
RETRY_BACKOFF = 0.1
MAX_RETRY_BACKOFF = 1.0
# A consumer's defaults: fetch.wait.max.ms, fetch.min.bytes, max.partition.fetch.bytes.
FETCH_WAIT_MS = 500
FETCH_MIN_BYTES = 1
PARTITION_MAX_BYTES = 1 << 20
FETCH_MAX_BYTES = 16 << 20
# A fetch returns empty-handed once no broker has answered within its max wait and this
# (s); a stop waits at most this long for a session to close.
ANSWER_GRACE = 1.0
CLOSE_TIMEOUT = 2.0
# How long a cancelled call, or what is out at a stop, has to end.
CANCEL_GRACE = 1.0
# A closing FetchSession waits this long (s) for its brokers to close their sessions.
SESSION_CLOSE_WAIT = 1.0
# An answer read this long (s) after it came is caught up (the module), and what that
# brings within CATCH_UP_WAIT (s) is read with it. At 5,000 records/s, 5 ms is where a
# steady round (about 4 ms) ends; over it, the records that came meanwhile would wait a
# round more (docs/benchmarks.md, "Catching up answers that waited").
CATCH_UP_AFTER = 0.005
CATCH_UP_WAIT = 0.05
# The source consumer's librdkafka keys that set a FetchSession's limits, where set.
FETCH_KEYS = {
    "fetch.wait.max.ms": "max_wait_ms",
    "fetch.min.bytes": "min_bytes",
    "max.partition.fetch.bytes": "partition_max_bytes",
    "fetch.max.bytes": "max_bytes",
}
# Batches of several partitions share a Produce request up to this size (a single batch
# may be larger; the broker's socket.request.max.bytes is 100 MiB).
MAX_REQUEST_BYTES = 8 << 20
# Errors of the connection itself (broker down, request lost): retried like a leader change.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    aiokafka_errors.KafkaConnectionError,
    aiokafka_errors.NodeNotReadyError,
    aiokafka_errors.RequestTimedOutError,
    asyncio.TimeoutError,
    OSError,
)
# AIOKafkaClient keeps a refused login or TLS handshake to itself (it logs it and answers
# "node not ready"), so a failing broker is asked why on a connection of its own (closed at
# once), at most this often.
ACCESS_PROBE_INTERVAL = 5.0
ACCESS_PROBE_TIMEOUT = 10.0
SASL_REFUSALS: tuple[type[BaseException], ...] = (
    aiokafka_errors.SaslAuthenticationFailed,
    aiokafka_errors.UnsupportedSaslMechanismError,
)


class _ExpectedTrouble(logging.Filter):
    """Demotes aiokafka's ERROR lines for a broker it cannot connect to, metadata it cannot
    update and a topic missing from metadata (a deleted source topic) to DEBUG: the
    sessions retry these or fail naming the cluster and partition, and the daemon reports
    reachability and deleted topics itself, so they are not mm2py errors. A filter on
    aiokafka's own loggers, installed when this module (which every user of aiokafka
    imports) is imported, so that every process that uses aiokafka has it, however its
    logging is configured; lowering their level would not do, as these lines are logged
    at ERROR."""

    PREFIXES = (
        "Unable connect to",
        "Unable to update metadata",
        "Topic %s not found in cluster metadata",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not str(record.msg).startswith(self.PREFIXES):
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


# aiokafka.client logs as "aiokafka"; a logger's filters see only its own records.
for _name in ("aiokafka", "aiokafka.cluster"):
    logging.getLogger(_name).addFilter(_ExpectedTrouble())


class RawPartitionError(Exception):
    """A raw Fetch or Produce failed for good: the message names the cluster, topic,
    partition and error, and what to do."""


class AccessRefused(RawPartitionError):
    """The cluster refused the login or the TLS handshake: the message is the record
    copier's (mm2py.kafka.clients.refused_access), what to check, without any secret."""


class OffsetOutOfRange(RawPartitionError):
    """The fetch position is not in the partition's log (deleted by retention or
    delete_records, or past the end of a truncated or recreated partition)."""


class ProducerFenced(RawPartitionError):
    """Another producer took this one's transactional id over (a newer epoch): nothing
    it sends or commits is taken any more."""


class BatchRejected(RawPartitionError):
    """The target refused a batch for what it holds (too large, invalid, not authorised),
    not for the producer's state: sending it again cannot succeed. `too_large`: larger
    than the target takes (MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE), where its records
    one by one may still fit."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


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
    librdkafka tuning keys do not apply and are not read. A connection these clients
    cannot make (mm2py.config.copy_mode.raw_connection_problem) is a ValueError; the loader
    keeps such flows on the record copier.
    """
    problem = raw_connection_problem(props)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    settings: dict[str, Any] = {"bootstrap_servers": props["bootstrap.servers"]}
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    settings["security_protocol"] = protocol
    if protocol.startswith("SASL"):
        mechanism = props.get("sasl.mechanism", props.get("sasl.mechanisms", ""))
        settings["sasl_mechanism"] = mechanism.strip().upper()
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


class LoopTimeout(TimeoutError):
    """`RawLoop.run` gave up waiting (not a TimeoutError the coroutine raised itself)."""


class RawLoop:
    """An asyncio loop that runs on the thread that calls `run`, only while it runs: the
    one thread that owns it (a copier's). Requests a call leaves out (a prefetched Fetch)
    go on during the next call; their answers wait in the sockets in between. No thread
    of its own: a call handed to a loop thread and back costs 91-130 us of CPU, run here
    21-31 us (docs/benchmarks.md, "The raw clients' loop on the copy thread")."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop = asyncio.new_event_loop()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """`coro`'s result; past `timeout` (s) it is cancelled and LoopTimeout raised."""
        if timeout is None:
            return self._loop.run_until_complete(coro)
        return self._loop.run_until_complete(self._bounded(coro, timeout))

    async def _bounded(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            # its cancellation runs now (an answer it waited on is dropped); one stuck
            # past CANCEL_GRACE is left to `stop`
            await asyncio.wait({task}, timeout=CANCEL_GRACE)
            raise LoopTimeout(f"{self.name}: no answer within {timeout} s")
        return task.result()  # a TimeoutError here is the coroutine's own

    def stop(self) -> None:
        """Cancel what is still out (prefetched Fetches), let it end, close the loop."""
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()
        if pending:
            self._loop.run_until_complete(asyncio.wait(pending, timeout=CANCEL_GRACE))
        self._loop.run_until_complete(self._loop.shutdown_asyncgens())
        self._loop.close()


def _address(server: str) -> tuple[str, int]:
    """("host", port) of a bootstrap server `host:port` (`[v6]:port`; 9092 if none)."""
    host, _, port = server.strip().rpartition(":")
    if not host or not port.isdigit():
        return server.strip().strip("[]"), 9092
    return host.strip("[]"), int(port)


def error_class(code: int) -> Any:
    return aiokafka_errors.for_code(code)


async def find_coordinator(client: AIOKafkaClient, key_type: int, key: str) -> int:
    """The coordinator of `key` (FindCoordinator's `key_type`: 0 a group, 1 a
    transactional id), as aiokafka's lookup finds it; raises aiokafka's errors.

    A broker that is starting can answer Metadata naming no broker yet, which aiokafka
    keeps out of its view: its lookup then fails an assertion instead of asking. Here the
    metadata is asked again first, and with still no broker known NodeNotReadyError (one
    of CONNECTION_ERRORS) is raised, for the caller to retry."""
    if client.get_random_node() is None:
        await client.force_metadata_update()
        if client.get_random_node() is None:
            raise aiokafka_errors.NodeNotReadyError(
                "no broker known yet: the cluster's metadata named none"
            )
    return int(await client.coordinator_lookup(key_type, key))


def describe(tps: Sequence[TP]) -> str:
    """`t-0, t-1` (the first 5, then how many more)."""
    names = [f"{t}-{p}" for t, p in sorted(tps)]
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return ", ".join(names[:5]) + more


class _Session:
    """What both sessions share: the client (made on the loop), leaders, errors."""

    role = "raw"

    def __init__(
        self,
        props: Mapping[str, str],
        *,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
        alias: str | None = None,
        probe: Callable[[str, int], Awaitable[Any]] | None = None,
    ) -> None:
        self._settings = client_settings(props)
        # tests hand in a stand-in for AIOKafkaClient; it is made on the loop, as
        # AIOKafkaClient must be
        self._client_factory = client_factory or self._aiokafka_client
        # and for the connection that asks a failing broker why (`check_access`)
        self._probe = probe or self._connect
        self._props = props
        self.bootstrap = props["bootstrap.servers"]
        self.alias = alias or self.bootstrap
        self._probed: dict[tuple[str, int], float] = {}
        self.retry_timeout = retry_timeout
        self.request_timeout_ms = request_timeout_ms
        self._client: Any = None
        self._topics: set[str] = set()
        # each partition's known leader, forgotten at every metadata update: aiokafka's
        # lookup costs ~1.1 us a partition, 2 ms for 2,000 at each of an idle copier's
        # two prefetches a round (1% of a core at fetch.wait.max.ms 500)
        self._leader_of: dict[TP, int] = {}
        # `grouped`'s last answer, for the partitions it was for: an idle copier asks
        # the same partitions at each of its two prefetches a round
        self._grouped: tuple[set[TP], dict[int, list[TP]]] | None = None

    def _aiokafka_client(self) -> Any:
        return AIOKafkaClient(
            client_id=f"mm2py-{self.role}",
            request_timeout_ms=self.request_timeout_ms,
            **self._settings,
        )

    async def _connect(self, host: str, port: int) -> Any:
        return await create_conn(
            host,
            port,
            client_id=f"mm2py-{self.role}",
            request_timeout_ms=int(ACCESS_PROBE_TIMEOUT * 1000),
            **{k: v for k, v in self._settings.items() if k != "bootstrap_servers"},
        )

    async def check_access(self, node: int | None) -> None:
        """Raise `AccessRefused` if broker `node` (None: the bootstrap servers) refuses the
        login or the TLS handshake; else (it answers, or cannot be reached) return, for
        the caller to retry. Asks each broker at most once every ACCESS_PROBE_INTERVAL."""
        if node is None:
            addresses = [_address(server) for server in self.bootstrap.split(",")]
        else:
            broker = self._client.cluster.broker_metadata(node)
            addresses = [] if broker is None else [(str(broker.host), int(broker.port))]
        now = time.monotonic()
        for address in addresses:
            if now - self._probed.get(address, -ACCESS_PROBE_INTERVAL) < ACCESS_PROBE_INTERVAL:
                continue
            self._probed[address] = now
            try:
                conn = await asyncio.wait_for(self._probe(*address), ACCESS_PROBE_TIMEOUT)
            except ssl.SSLError as exc:  # before OSError, its base
                raise self.refused(tls=True, detail=str(exc)) from None
            except SASL_REFUSALS as exc:
                raise self.refused(tls=False, detail=str(exc)) from None
            except (*CONNECTION_ERRORS, aiokafka_errors.KafkaError) as exc:
                log.debug("probe of %s:%s: %r", *address, exc)
                continue
            conn.close()

    def refused(self, *, tls: bool, detail: str) -> AccessRefused:
        return AccessRefused(refused_access(self.alias, self._props, tls=tls, detail=detail))

    def error(self, what: str, tps: Sequence[TP], cause: str, advice: str) -> RawPartitionError:
        return RawPartitionError(
            f"{what} for {describe(tps)} on {self.bootstrap} failed: {cause}. {advice}"
        )

    async def open(self) -> None:
        self._client = self._client_factory()
        self._client.cluster.add_listener(self._forget_leaders)
        try:
            await self._client.bootstrap()
        except CONNECTION_ERRORS as exc:
            await self.check_access(None)
            raise RawPartitionError(
                f"connect to {self.bootstrap} failed: {exc}. Check bootstrap.servers and "
                "that the cluster is up"
            ) from exc

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()

    def _forget_leaders(self, _cluster: Any) -> None:
        self._leader_of.clear()
        self._grouped = None

    def grouped(self, asked: Mapping[TP, Any]) -> tuple[dict[int, list[TP]], list[TP]]:
        """`leaders` of the partitions of `asked`; the same answer, not worked out again,
        until the partitions asked or their leaders (a metadata update) change. The lists
        answered are not to be changed."""
        last = self._grouped
        if last is not None and last[0] == asked.keys():
            return last[1], []
        by_leader, unknown = self.leaders(list(asked))
        self._grouped = None if unknown else (set(asked), by_leader)
        return by_leader, unknown

    def leaders(self, tps: Sequence[TP]) -> tuple[dict[int, list[TP]], list[TP]]:
        """The partitions by leader node, and those whose leader is not known (for which
        a metadata refresh is asked)."""
        by_leader: dict[int, list[TP]] = {}
        unknown: list[TP] = []
        known = self._leader_of
        for tp in tps:
            leader = known.get(tp)
            if leader is None:
                if tp[0] not in self._topics:
                    self._topics.add(tp[0])
                    self._client.add_topic(tp[0])
                found = self._client.cluster.leader_for_partition(TopicPartition(*tp))
                if found is None or found < 0:
                    unknown.append(tp)
                    continue
                leader = known[tp] = int(found)
            by_leader.setdefault(leader, []).append(tp)
        if unknown:
            self._client.force_metadata_update()
        return by_leader, unknown

    def no_leader(self, what: str, tps: Sequence[TP]) -> RawPartitionError:
        """Why partitions still have no leader after the retry timeout."""
        topic, partition = tps[0]
        cluster = self._client.cluster
        if topic in cluster.unauthorized_topics:
            return self.error(
                what,
                tps,
                "topic authorization failed",
                "Grant this client's principal DESCRIBE (and READ or WRITE) on the topic",
            )
        known = cluster.partitions_for_topic(topic)
        cause = "no such topic" if known is None else "no leader"
        if known is not None and partition not in known:
            cause = f"no such partition (the topic has {len(known)})"
        return self.error(
            what,
            tps,
            f"{cause} after {self.retry_timeout:.0f} s",
            "Check that the topic exists and its partition has a leader",
        )


# KIP-227 (Kafka's FetchMetadata): a request with session id 0 has no session; epoch 0
# (re)creates one, closing the session id sent, and epoch -1 asks for none.
NO_SESSION = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
MAX_EPOCH = (1 << 31) - 1  # the epoch after it is 1
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
SESSION_ERRORS = frozenset({FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH})


@dataclass(frozen=True)
class FetchPlan:
    """What one Fetch to a leader sends (`send`, `forget`, the session id and epoch) and
    the position each partition its answer may name is fetched from (`answers_for`)."""

    session_id: int
    epoch: int
    send: dict[TP, int]
    forget: list[TP]
    answers_for: dict[TP, int]

    @property
    def full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


class BrokerFetchSession:
    """The client's half of a KIP-227 incremental fetch session with one leader (Kafka's
    FetchSessionHandler): the session id and epoch of its next Fetch, and which partitions
    that Fetch names. No Kafka calls; `FetchSession` sends what `plan` says and reports
    the answer with `answered` or `failed`. `incremental=False`: every Fetch is full and
    sessionless (epoch -1), as aiokafka's own.

    - A. `partitions` is what the broker's session holds once the last planned Fetch is
      handled: each partition at the position it fetches from. The broker fetches a
      partition not named from that position, and answers it only when it has records,
      its high watermark or log start offset moved, or it has an error.
    - B. At epoch 0 the next Fetch is full: it names every partition asked and creates a
      session (closing `session_id`, if not 0). Past it, a Fetch names only partitions new
      to the session or whose position differs from A's, and forgets those not asked.
    - C. Whatever leaves the broker's state in doubt (no answer, a cancelled request, a
      top-level or retriable partition error) sets epoch 0, so the next Fetch is full;
      FETCH_SESSION_ID_NOT_FOUND also forgets the session id.
    """

    def __init__(self, incremental: bool = True) -> None:
        self.incremental = incremental
        self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH if incremental else FINAL_EPOCH
        self.partitions: dict[TP, int] = {}

    def plan(self, asked: Mapping[TP, int]) -> FetchPlan:
        """The next Fetch for `asked` (partition: position); A holds once it is sent."""
        if self.epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            self.partitions = dict(asked)
            every = dict(asked)
            return FetchPlan(self.session_id, self.epoch, every, [], every)
        held = self.partitions
        send = {tp: position for tp, position in asked.items() if held.get(tp) != position}
        forget = [tp for tp in held if tp not in asked]
        for tp in forget:
            del held[tp]
        held.update(send)
        return FetchPlan(self.session_id, self.epoch, send, forget, dict(held))

    def answered(self, session_id: int) -> None:
        """The last Fetch was answered without a top-level or retriable error."""
        if not self.incremental:
            return
        if session_id == NO_SESSION:  # none made (the broker's cache is full), or closed
            self.session_id, self.epoch = NO_SESSION, INITIAL_EPOCH
        elif self.epoch == INITIAL_EPOCH:
            self.session_id, self.epoch = session_id, 1
        else:
            self.epoch = 1 if self.epoch == MAX_EPOCH else self.epoch + 1

    def failed(self, code: int = 0) -> None:
        """The last Fetch has no answer, or one with error `code` (0: a partition's or the
        request's own): the next Fetch is full (C)."""
        if not self.incremental:
            return
        if code == FETCH_SESSION_ID_NOT_FOUND:
            self.session_id = NO_SESSION
        self.epoch = INITIAL_EPOCH


class _WireAnswer:
    """An answer type for aiokafka's connection, which calls `decode` on the buffer past
    the response header: one of `wire`'s decoders, reading the buffer in place."""

    def __init__(self, decode: Callable[[memoryview], Any]) -> None:
        self._decode = decode

    def decode(self, buffer: BytesIO) -> Any:
        return self._decode(buffer.getbuffer()[buffer.tell() :])


class _Encoded:
    """A request struct whose body `wire` encoded: aiokafka's connection sends
    `encode()` after the header it builds from the class's API key and version."""

    def __init__(self, body: bytes) -> None:  # not Struct's: no fields to keep
        self.body = body

    def encode(self) -> bytes:
        return self.body

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.body)} bytes)"


class _EncodedFetch(_Encoded, FetchRequest_v11):  # type: ignore[misc]  # aiokafka is untyped
    RESPONSE_TYPE = _WireAnswer(wire.decode_fetch_answer)


class _SessionFetchRequest(FetchRequest):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's FetchRequest with a `FetchPlan`'s session id, epoch and forgotten
    partitions (aiokafka's own builder always sends session 0, epoch -1); at v11,
    encoded by `wire`."""

    def __init__(self, plan: FetchPlan, *, partition_max_bytes: int, **kwargs: Any) -> None:
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for (topic, partition), position in plan.send.items():
            by_topic.setdefault(topic, []).append((partition, position, partition_max_bytes))
        super().__init__(isolation_level=READ_COMMITTED, topics=list(by_topic.items()), **kwargs)
        self.plan = plan

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION < MIN_FETCH_VERSION:
            return super().build(request_struct_class)  # its answer is refused (`_read`)
        forgotten: dict[str, list[int]] = {}
        for topic, partition in self.plan.forget:
            forgotten.setdefault(topic, []).append(partition)
        # aiokafka's highest Fetch is v11 (MIN_FETCH_VERSION): what it picks from here on
        return _EncodedFetch(
            wire.encode_fetch(
                max_wait_ms=self._max_wait_ms,
                min_bytes=self._min_bytes,
                max_bytes=self._max_bytes,
                isolation_level=self._isolation_level,
                session_id=self.plan.session_id,
                session_epoch=self.plan.epoch,
                topics=self.topics,
                forgotten=list(forgotten.items()),
            )
        )


class FetchSession(_Session):
    """Fetch raw batches of many source partitions at read_committed (see the module)."""

    role = "fetcher"

    def __init__(
        self,
        props: Mapping[str, str],
        *,
        max_wait_ms: int = FETCH_WAIT_MS,
        min_bytes: int = FETCH_MIN_BYTES,
        partition_max_bytes: int = PARTITION_MAX_BYTES,
        max_bytes: int = FETCH_MAX_BYTES,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
        alias: str | None = None,
        probe: Callable[[str, int], Awaitable[Any]] | None = None,
        incremental: bool = True,
        catch_up_after: float | None = None,
        catch_up_wait: float = CATCH_UP_WAIT,
    ) -> None:
        super().__init__(
            props,
            retry_timeout=retry_timeout,
            request_timeout_ms=request_timeout_ms,
            client_factory=client_factory,
            alias=alias,
            probe=probe,
        )
        self.incremental = incremental
        self.catch_up_after = catch_up_after
        self.catch_up_wait = catch_up_wait
        self.max_wait_ms = max_wait_ms
        self.min_bytes = min_bytes
        self.partition_max_bytes = partition_max_bytes
        self.max_bytes = max_bytes
        # the request out to each leader: its task answers what it asked, the answer, and
        # when it came (time.monotonic())
        self._out: dict[int, asyncio.Task[tuple[dict[TP, int], Any, float]]] = {}
        # the fetch session with each leader of partitions asked
        self._sessions: dict[int, BrokerFetchSession] = {}
        self._failing_since: dict[TP, float] = {}
        self._backoff: dict[int, float] = {}

    @classmethod
    def like_consumer(cls, props: Mapping[str, str], alias: str | None = None) -> FetchSession:
        """A session whose fetches wait, and take, what the record copier's consumer's
        would: the source consumer's librdkafka keys (`FETCH_KEYS`) where the
        configuration sets them, else the consumer defaults; an answer that waited
        CATCH_UP_AFTER to be read is caught up (`fetch`). `alias` names the cluster in
        `AccessRefused`."""
        limits = {arg: int(props[key]) for key, arg in FETCH_KEYS.items() if key in props}
        return cls(
            props,
            max_wait_ms=limits.get("max_wait_ms", FETCH_WAIT_MS),
            min_bytes=limits.get("min_bytes", FETCH_MIN_BYTES),
            partition_max_bytes=limits.get("partition_max_bytes", PARTITION_MAX_BYTES),
            max_bytes=limits.get("max_bytes", FETCH_MAX_BYTES),
            alias=alias,
            catch_up_after=CATCH_UP_AFTER,
        )

    async def close(self) -> None:
        await self.discard()
        await self._close_broker_sessions()
        await super().close()

    async def _close_broker_sessions(self) -> None:
        """Close each leader's incremental session on its broker, as Kafka's consumer does
        when it closes: a Fetch at FINAL_EPOCH naming no partition, answered at once. The
        broker's cache (`max.incremental.fetch.session.cache.slots`, 1,000 by default)
        then has its slot free now, not once it evicts the session. Not waited on past
        SESSION_CLOSE_WAIT (a broker that does not answer); its errors change nothing."""
        closing = [
            asyncio.ensure_future(
                self._client.send(
                    leader,
                    self._fetch_request(
                        FetchPlan(session.session_id, FINAL_EPOCH, {}, [], {}), at_once=True
                    ),
                )
            )
            for leader, session in self._sessions.items()
            if session.session_id != NO_SESSION
        ]
        self._sessions.clear()
        if not closing:
            return
        _, late = await asyncio.wait(closing, timeout=SESSION_CLOSE_WAIT)
        for request in late:
            request.cancel()
        for request in closing:
            if request.done() and not request.cancelled() and request.exception() is not None:
                log.debug("closing a fetch session: %r", request.exception())

    def _fetch_request(self, plan: FetchPlan, at_once: bool = False) -> _SessionFetchRequest:
        """The Fetch `plan` says, with this session's limits (`at_once`: answered without
        waiting for records)."""
        return _SessionFetchRequest(
            plan,
            partition_max_bytes=self.partition_max_bytes,
            max_wait_time=0 if at_once else self.max_wait_ms,
            min_bytes=0 if at_once else self.min_bytes,
            max_bytes=self.max_bytes,
        )

    async def discard(self) -> None:
        """Drop the Fetches out, their answers unread (a paused copier reads nothing)."""
        for task in self._out.values():
            task.cancel()
        for leader, task in self._out.items():
            with contextlib.suppress(BaseException):  # cancelled, or failed: dropped
                await task
            # the broker may have handled it, or not; an unread answer's watermarks are
            # not sent again: the next Fetch is full
            self._sessions[leader].failed()
        self._out.clear()

    async def prefetch(self, positions: Mapping[TP, int]) -> None:
        """Send a Fetch to every leader of `positions` that has none out."""
        by_leader, unknown = self.grouped(positions)
        now = time.monotonic()
        for tp in unknown:
            self._failing_since.setdefault(tp, now)
        for leader in [n for n in self._sessions if n not in by_leader and n not in self._out]:
            # it leads none of the partitions asked: those left went with their leader
            del self._sessions[leader]
        for leader, tps in by_leader.items():
            if leader not in self._out:
                session = self._sessions.get(leader)
                if session is None:
                    session = self._sessions[leader] = BrokerFetchSession(self.incremental)
                plan = session.plan({tp: positions[tp] for tp in tps})
                self._out[leader] = asyncio.ensure_future(self._request(leader, session, plan))
        self._check_deadlines(positions)

    async def fetch(self, positions: Mapping[TP, int]) -> dict[TP, Fetched | OffsetOutOfRange]:
        """What the next answers bring for `positions`: sends what `prefetch` sends, waits
        for at least one answer (at most `max_wait_ms` and ANSWER_GRACE), and returns every
        answer in by then, caught up where it waited `catch_up_after` to be read (see the
        module). Partitions that are retrying, whose answer was for another position, or
        that the broker left out of an incremental answer (nothing new: see the module),
        are left out."""
        await self.prefetch(positions)
        if not self._out:  # no leader known for any: wait for metadata
            await asyncio.sleep(RETRY_BACKOFF)
            return {}
        # A broker that neither answers nor drops the connection (a frozen process) is
        # not waited on past its own max wait and ANSWER_GRACE: the caller gets nothing
        # new, can see that it should stop, and the request stays out for the next call.
        await asyncio.wait(
            list(self._out.values()),
            timeout=self.max_wait_ms / 1000 + ANSWER_GRACE,
            return_when=asyncio.FIRST_COMPLETED,
        )
        results: dict[TP, Fetched | OffsetOutOfRange] = {}
        waited = self._take(list(self._out), positions, results)
        if waited:  # only with catch_up_after set
            await self._catch_up(waited, positions, results)
        self._check_deadlines(positions)
        return results

    def _take(
        self,
        leaders: Sequence[int],
        positions: Mapping[TP, int],
        results: dict[TP, Fetched | OffsetOutOfRange],
    ) -> list[int]:
        """The answers in of `leaders`' Fetches read into `results` (`_read`, for
        `positions`); the leaders whose answer came `catch_up_after` or longer ago."""
        now = time.monotonic()
        waited = []
        for leader in leaders:
            task = self._out[leader]
            if not task.done():
                continue
            del self._out[leader]
            asked, response, answered_at = task.result()
            self._read(asked, response, positions, results)
            if self.catch_up_after is not None and now - answered_at >= self.catch_up_after:
                waited.append(leader)
        return waited

    async def _catch_up(
        self,
        leaders: Sequence[int],
        positions: Mapping[TP, int],
        results: dict[TP, Fetched | OffsetOutOfRange],
    ) -> None:
        """Records that came while an answer of `leaders` waited to be read: to each whose
        answer left a partition with records caught up (at its last stable offset), a
        Fetch from where `results` end, answered without waiting; what it brings within
        `catch_up_wait` is joined to `results`. An answer not in by then stays out, as the
        leader's Fetch from where `results` end: the next call reads it."""
        ends: dict[TP, tuple[Fetched, int, int]] = {}  # (answer, end offset, whole bytes)
        for tp, result in results.items():
            if isinstance(result, Fetched):
                whole = _whole_batches(result)
                if whole is not None:
                    ends[tp] = (result, *whole)
        if not ends:
            return
        ahead = {tp: ends[tp][1] if tp in ends else position for tp, position in positions.items()}
        by_leader, _ = self.grouped(positions)
        sent = []
        for leader in leaders:
            tps = by_leader.get(leader, [])
            if leader in self._out or not any(
                tp in ends and ends[tp][1] >= ends[tp][0].last_stable_offset for tp in tps
            ):
                continue
            session = self._sessions[leader]
            plan = session.plan({tp: ahead[tp] for tp in tps})
            task = asyncio.ensure_future(self._request(leader, session, plan, at_once=True))
            self._out[leader] = task
            sent.append(leader)
        if not sent:
            return
        await asyncio.wait([self._out[leader] for leader in sent], timeout=self.catch_up_wait)
        more: dict[TP, Fetched | OffsetOutOfRange] = {}
        self._take(sent, ahead, more)  # not caught up again in this call
        for tp, result in more.items():
            if tp not in ends:
                results[tp] = result  # from the position asked, newer than any before
            elif isinstance(result, Fetched):
                first, _, kept = ends[tp]
                results[tp] = _joined(first, kept, result)

    async def _request(
        self, leader: int, session: BrokerFetchSession, plan: FetchPlan, at_once: bool = False
    ) -> tuple[dict[TP, int], Any, float]:
        """One Fetch to `leader`, as `plan` says (`at_once`: answered without waiting for
        records); answers the positions its partitions are fetched from, the answer (a
        connection error, after a backoff), and when it came."""
        request = self._fetch_request(plan, at_once)
        asked = plan.answers_for
        try:
            response: Any = await self._client.send(leader, request)
        except CONNECTION_ERRORS as exc:
            await self.check_access(leader)
            response = exc
        session_error = not isinstance(response, BaseException) and (
            response.error_code in SESSION_ERRORS
        )
        if session_error:
            # the session was evicted or out of step: the next Fetch, full, at once
            log.debug("fetch session with node %s: error %s", leader, response.error_code)
            session.failed(response.error_code)
            return asked, response, time.monotonic()
        if not _retriable_answer(response):
            # below Fetch v7 there is no session id (and `_read` refuses the answer)
            session.answered(getattr(response, "session_id", NO_SESSION))
            self._backoff.pop(leader, None)
            return asked, response, time.monotonic()
        session.failed()
        # a lost broker or a leader change: wait, and ask again who leads, before the
        # answer is read (and the next request to this node sent)
        backoff = self._backoff.get(leader, RETRY_BACKOFF)
        self._backoff[leader] = min(backoff * 2, MAX_RETRY_BACKOFF)
        log.debug("fetch from node %s: %r; retrying", leader, response)
        await asyncio.sleep(backoff)
        await self._client.force_metadata_update()
        return asked, response, time.monotonic()

    def _read(
        self,
        asked: dict[TP, int],
        response: Any,
        positions: Mapping[TP, int],
        results: dict[TP, Fetched | OffsetOutOfRange],
    ) -> None:
        now = time.monotonic()
        if isinstance(response, BaseException):
            for tp in asked:
                self._failing_since.setdefault(tp, now)
            return
        if response.API_VERSION < MIN_FETCH_VERSION:
            raise self.error(
                "fetch",
                list(asked),
                f"the broker answered Fetch v{response.API_VERSION}",
                f"Raw batches need Fetch v{MIN_FETCH_VERSION} (Kafka 2.3 or newer)",
            )
        if response.error_code in SESSION_ERRORS:
            return  # no partition answered: the next Fetch, full, asks them all again
        if response.error_code:
            for tp in asked:
                self._failing_since.setdefault(tp, now)
            self._client.force_metadata_update()
            return
        for topic, partitions in response.topics:
            # Fetch v11: partition, error_code, highwater_offset, last_stable_offset,
            # log_start_offset, aborted_transactions, preferred_read_replica, message_set
            for number, code, high, stable, start, aborted, _replica, records in partitions:
                tp = (topic, int(number))
                position = asked.get(tp)
                if position is None:
                    continue
                if code:
                    error = error_class(code)
                    if error is aiokafka_errors.OffsetOutOfRangeError:
                        self._failing_since.pop(tp, None)
                        if positions.get(tp) == position:
                            results[tp] = self._out_of_range(tp, position)
                        continue
                    if not error.retriable:
                        raise self.error(
                            "fetch", [tp], error.__name__, "Not retriable; see the broker's log"
                        )
                    log.debug("fetch of %s-%s: %s; retrying", *tp, error.__name__)
                    self._failing_since.setdefault(tp, now)
                    self._client.force_metadata_update()
                    continue
                self._failing_since.pop(tp, None)
                if positions.get(tp) != position:
                    continue  # the copier moved on (or let it go) meanwhile
                results[tp] = Fetched(
                    position=position,
                    records=bytes(records or b""),
                    aborted=[AbortedTransaction(int(p), int(o)) for p, o in aborted or ()],
                    high_watermark=int(high),
                    last_stable_offset=int(stable),
                    log_start_offset=int(start),
                )

    def _out_of_range(self, tp: TP, position: int) -> OffsetOutOfRange:
        return OffsetOutOfRange(
            str(
                self.error(
                    "fetch",
                    [tp],
                    f"offset {position} is out of range",
                    "The records were deleted by retention or the partition was truncated; "
                    "restart the copy from the log start",
                )
            )
        )

    def _check_deadlines(self, positions: Mapping[TP, int]) -> None:
        """Raise for partitions asked for that have failed for `retry_timeout`."""
        for tp in [tp for tp in self._failing_since if tp not in positions]:
            del self._failing_since[tp]
        now = time.monotonic()
        late = [tp for tp, t in self._failing_since.items() if now - t > self.retry_timeout]
        if not late:
            return
        _, unknown = self.leaders(late)
        if unknown:
            raise self.no_leader("fetch", unknown)
        raise self.error(
            "fetch",
            late,
            f"still failing after {self.retry_timeout:.0f} s of retries",
            "Check the cluster's brokers and the partition's leader",
        )


def _whole_batches(result: Fetched) -> tuple[int, int] | None:
    """Where an answer's whole batches end (the offset after them) and their bytes; None
    for an answer without one (or one that cannot be read: the copier says why)."""
    try:
        split = split_batches(result.records)
    except CorruptBatchError:
        return None
    if not split.batches:
        return None
    return split.batches[-1].header.last_offset + 1, len(result.records) - split.truncated


def _joined(first: Fetched, whole: int, then: Fetched) -> Fetched:
    """`first`'s `whole` bytes of whole batches followed by `then`, fetched from where they
    end: one answer from `first`'s position, with `then`'s watermarks."""
    return Fetched(
        position=first.position,
        records=first.records[:whole] + then.records,
        aborted=first.aborted + [a for a in then.aborted if a not in first.aborted],
        high_watermark=then.high_watermark,
        last_stable_offset=then.last_stable_offset,
        log_start_offset=then.log_start_offset,
    )


def _retriable_answer(response: Any) -> bool:
    """Whether a Fetch answer (or the error instead of one) asks for a retry somewhere."""
    if isinstance(response, BaseException):
        return True
    if response.error_code:
        return True
    for _topic, partitions in response.topics:
        for partition in partitions:
            code = partition[1]
            if code and error_class(code).retriable:
                return True
    return False


@dataclass
class _Pending:
    """A partition's batches not yet acknowledged in one `produce` call."""

    payloads: list[bytes]
    sequences: list[int]  # the base sequence of each payload
    end_sequence: int  # the sequence after the last payload
    offsets: list[int]
    deadline: float

    @property
    def done(self) -> bool:
        return len(self.offsets) == len(self.payloads)


class _Retriable(Exception):
    """A retriable error code in a Produce answer."""


class IdempotentProduceSession(_Session):
    """Produce rewritten batches to many target partitions as one idempotent producer."""

    role = "producer"

    def __init__(
        self,
        props: Mapping[str, str],
        *,
        retry_timeout: float = 60.0,
        request_timeout_ms: int = 30_000,
        client_factory: Callable[[], Any] | None = None,
        alias: str | None = None,
        probe: Callable[[str, int], Awaitable[Any]] | None = None,
    ) -> None:
        super().__init__(
            props,
            retry_timeout=retry_timeout,
            request_timeout_ms=request_timeout_ms,
            client_factory=client_factory,
            alias=alias,
            probe=probe,
        )
        self.producer_id = -1
        self.producer_epoch = -1
        self.sequences: dict[TP, int] = {}
        # When a batch of each partition was last acknowledged to this producer id (a
        # monotonic time): the broker holds its state there (PRODUCER_STATE_TRUSTED).
        self.acknowledged_at: dict[TP, float] = {}
        # Set by a transactional session (mm2py.kafka.raw_transactions): batches then go
        # with the transactional bit and the id.
        self.transactional_id: str | None = None

    async def _before_produce(self, tps: Sequence[TP]) -> None:
        """What must happen before batches of `tps` are produced (a transactional
        session adds them to its transaction)."""

    async def open(self) -> None:
        await super().open()
        await self._init_producer_id()

    def new_producer_id(self) -> None:
        """A new producer id or epoch: every partition's sequence starts at 0, and no
        broker holds its state yet."""
        self.sequences.clear()
        self.acknowledged_at.clear()

    def fenced_message(self, cause: str) -> str:
        return (
            f"the producer of transactional id {self.transactional_id} on {self.bootstrap} "
            f"was fenced ({cause}): another producer with that id took over"
        )

    async def _init_producer_id(self) -> None:
        deadline = time.monotonic() + self.retry_timeout
        backoff = RETRY_BACKOFF
        while True:
            node = self._client.get_random_node()
            try:
                response = await self._client.send(
                    node, InitProducerIdRequest(transactional_id=None, transaction_timeout_ms=0)
                )
                error = error_class(response.error_code)
                cause = error.__name__
            except CONNECTION_ERRORS as exc:
                await self.check_access(node)
                error, cause = None, repr(exc)
            if error is aiokafka_errors.NoError:
                self.producer_id = int(response.producer_id)
                self.producer_epoch = int(response.producer_epoch)
                self.new_producer_id()
                log.debug("producer id %d epoch %d", self.producer_id, self.producer_epoch)
                return
            if error is not None and not error.retriable:
                raise RawPartitionError(
                    f"InitProducerId on {self.bootstrap} failed: {cause}. The principal needs "
                    "IDEMPOTENT_WRITE on the cluster (or WRITE on the topic, Kafka 2.8+)"
                )
            if time.monotonic() > deadline:
                raise RawPartitionError(
                    f"InitProducerId on {self.bootstrap} failed: {cause}, still after "
                    f"{self.retry_timeout:.0f} s of retries. Check the cluster's brokers"
                )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF)
            self._client.force_metadata_update()

    async def produce(
        self, batches: Mapping[TP, Sequence[RecordBatch]]
    ) -> dict[TP, list[int] | BatchRejected]:
        """Produce each partition's PASS batches in order: the target base offset of each,
        or `BatchRejected` for a partition whose batch the target refused (the batches
        before it may be on the target)."""
        await self._before_produce([tp for tp, items in batches.items() if items])
        pending: dict[TP, _Pending] = {}
        now = time.monotonic()
        transactional = self.transactional_id is not None
        for tp, items in batches.items():
            if not items:
                continue
            sequence = self.sequences.get(tp, 0)
            payloads, sequences = [], []
            for batch in items:
                payloads.append(
                    bytes(
                        rewrite_for_produce(
                            batch, self.producer_id, self.producer_epoch, sequence, transactional
                        )
                    )
                )
                sequences.append(sequence)
                sequence = next_sequence(sequence, batch.header.record_count)
            pending[tp] = _Pending(payloads, sequences, sequence, [], now + self.retry_timeout)
        results: dict[TP, list[int] | BatchRejected] = {tp: [] for tp in batches}
        backoff = RETRY_BACKOFF
        while pending:
            retrying = await self._window(pending, results)
            for tp in [tp for tp, p in pending.items() if p.done]:
                done = pending.pop(tp)
                self.sequences[tp] = done.end_sequence
                results[tp] = done.offsets
            if not retrying:
                backoff = RETRY_BACKOFF
                continue
            now = time.monotonic()
            late = [tp for tp in retrying if now > pending[tp].deadline]
            if late:
                _, unknown = self.leaders(late)
                if unknown:
                    raise self.no_leader("produce", unknown)
                raise self.error(
                    "produce",
                    late,
                    f"{retrying[late[0]]}, still after {self.retry_timeout:.0f} s of retries",
                    "Check the cluster's brokers and the partition's leader",
                )
            log.debug("produce to %s: %s; retrying", describe(list(retrying)), retrying)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, MAX_RETRY_BACKOFF)
            # a leader change or a lost broker: ask again who leads before the retry
            await self._client.force_metadata_update()
        return results

    async def _window(
        self, pending: dict[TP, _Pending], results: dict[TP, list[int] | BatchRejected]
    ) -> dict[TP, str]:
        """Send up to MAX_IN_FLIGHT batches of every pending partition and read the answers;
        the partitions to retry, with the cause."""
        by_leader, unknown = self.leaders(list(pending))
        retrying = {tp: "no leader known" for tp in unknown}
        # requests on one connection are written and answered in order
        sends: list[tuple[list[tuple[TP, int]], asyncio.Future[Any]]] = []
        trusted_since = time.monotonic() - PRODUCER_STATE_TRUSTED
        for leader, tps in by_leader.items():
            depth = {
                tp: MAX_IN_FLIGHT if self.acknowledged_at.get(tp, -math.inf) > trusted_since else 1
                for tp in tps
            }
            for slot in range(MAX_IN_FLIGHT):
                entries = []
                for tp in tps:
                    index = len(pending[tp].offsets) + slot
                    if slot < depth[tp] and index < len(pending[tp].payloads):
                        entries.append((tp, index))
                for request in _requests(entries, pending):
                    sends.append(
                        (request, asyncio.ensure_future(self._send(leader, request, pending)))
                    )
        answers = await asyncio.gather(*(f for _, f in sends), return_exceptions=True)
        stopped: set[TP] = set(retrying)
        for (entries, _), answer in zip(sends, answers, strict=True):
            for tp, index in entries:
                if tp in stopped:
                    continue  # after its first failure in this window: resent next time
                outcome = answer if isinstance(answer, BaseException) else answer.get(tp)
                if isinstance(outcome, int):
                    pending[tp].offsets.append(outcome)
                    now = time.monotonic()
                    pending[tp].deadline = now + self.retry_timeout
                    self.acknowledged_at[tp] = now
                    continue
                stopped.add(tp)
                if isinstance(outcome, BatchRejected):
                    # the refused batch and those after it were not appended
                    self.sequences[tp] = pending[tp].sequences[index]
                    results[tp] = outcome
                    del pending[tp]
                elif isinstance(outcome, (_Retriable, *CONNECTION_ERRORS)):
                    retrying[tp] = str(outcome) or repr(outcome)
                elif isinstance(outcome, BaseException):
                    raise outcome
                else:
                    raise self.error("produce", [tp], "no answer for it", "Report a bug")
        return retrying

    async def _send(
        self, leader: int, entries: list[tuple[TP, int]], pending: dict[TP, _Pending]
    ) -> dict[TP, int | BaseException]:
        by_topic: dict[str, list[tuple[int, bytes]]] = {}
        for (topic, partition), index in entries:
            by_topic.setdefault(topic, []).append(
                (partition, pending[(topic, partition)].payloads[index])
            )
        request = _Produce(
            transactional_id=self.transactional_id,
            required_acks=ACKS_ALL,
            timeout=self.request_timeout_ms,
            topics=list(by_topic.items()),
        )
        try:
            response = await self._client.send(leader, request)
        except CONNECTION_ERRORS:
            await self.check_access(leader)
            raise
        out: dict[TP, int | BaseException] = {}
        for topic, partitions in response.topics:
            for answer in partitions:
                tp = (topic, int(answer[0]))
                code, base_offset = int(answer[1]), int(answer[2])
                error = error_class(code)
                if error is aiokafka_errors.NoError:
                    out[tp] = base_offset
                elif error.retriable:
                    out[tp] = _Retriable(error.__name__)
                elif code in FENCED:
                    out[tp] = ProducerFenced(self.fenced_message(error.__name__))
                else:
                    failed = self.error(
                        "produce", [tp], error.__name__, PRODUCE_ADVICE.get(code, ADVICE)
                    )
                    out[tp] = (
                        BatchRejected(str(failed), too_large=code in TOO_LARGE)
                        if code in REJECTIONS
                        else failed
                    )
        return out


class _EncodedProduce(_Encoded, ProduceRequest_v7):  # type: ignore[misc]  # aiokafka is untyped
    RESPONSE_TYPE = _WireAnswer(wire.decode_produce_answer)


class _Produce(ProduceRequest):  # type: ignore[misc]  # aiokafka is untyped
    """aiokafka's ProduceRequest, at v7 (its highest; Kafka 2.1 and newer) encoded by
    `wire`."""

    def build(self, request_struct_class: Any) -> Any:
        if request_struct_class.API_VERSION != _EncodedProduce.API_VERSION:
            return super().build(request_struct_class)
        return _EncodedProduce(
            wire.encode_produce(
                self._transactional_id, self._required_acks, self._timeout, self._topics
            )
        )


def _requests(
    entries: list[tuple[TP, int]], pending: dict[TP, _Pending]
) -> list[list[tuple[TP, int]]]:
    """`entries` cut into requests of at most MAX_REQUEST_BYTES (at least one batch each)."""
    out: list[list[tuple[TP, int]]] = []
    size = 0
    for tp, index in entries:
        length = len(pending[tp].payloads[index])
        if not out or size + length > MAX_REQUEST_BYTES:
            out.append([])
            size = 0
        out[-1].append((tp, index))
        size += length
    return out


ADVICE = "Not retriable; see the broker's log"
FENCED = frozenset({47, 90})  # INVALID_PRODUCER_EPOCH, PRODUCER_FENCED
# CORRUPT_MESSAGE, MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE, TOPIC_AUTHORIZATION_FAILED,
# INVALID_TIMESTAMP, INVALID_RECORD: the batch itself is refused (`BatchRejected`).
REJECTIONS = frozenset({2, 10, 18, 29, 32, 87})
TOO_LARGE = frozenset({10, 18})  # MESSAGE_TOO_LARGE, RECORD_LIST_TOO_LARGE
PRODUCE_ADVICE = {
    29: "Grant the principal WRITE on the topic",  # TOPIC_AUTHORIZATION_FAILED
    10: "Raise the target topic's max.message.bytes to the source's",  # MESSAGE_TOO_LARGE
    45: "The producer's sequence went wrong: restart the copy (a new producer id)",
    59: "The broker forgot this producer (expired): restart the copy (a new producer id)",
    87: "The broker refused the batch (see its log): copy this partition record by record",
}


class SessionsOnLoop:
    """Sessions on one `RawLoop`, behind synchronous calls for the one thread that owns
    them: construct (no network), `open()` creates the loop and opens the sessions in
    order, `close()` closes them and the loop."""

    def __init__(self, loop_name: str, what: str, sessions: Sequence[_Session]) -> None:
        self._loop_name = loop_name
        self._what = what  # for "... is not open"
        self._sessions = list(sessions)
        self._loop: RawLoop | None = None

    @property
    def is_open(self) -> bool:
        return self._loop is not None

    def open(self) -> None:
        if self._loop is not None:
            return
        self._loop = RawLoop(self._loop_name)
        try:
            for session in self._sessions:
                self._loop.run(session.open())
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            for session in self._sessions:
                # a broker that does not answer (frozen, cut off) does not hold up a stop
                with contextlib.suppress(LoopTimeout):
                    self._loop.run(session.close(), CLOSE_TIMEOUT)
        finally:
            self._loop.stop()
            self._loop = None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """`coro` run on the loop; past `timeout` (s) cancelled, and RawPartitionError."""
        if self._loop is None:
            coro.close()
            raise RuntimeError(f"{self._what} is not open")
        try:
            return self._loop.run(coro, timeout)
        except LoopTimeout:
            raise RawPartitionError(
                f"{self._what}: no answer within {timeout} s (the operation was cancelled)"
            ) from None


class RawCopyClients(SessionsOnLoop):
    """A copier's raw clients: a `FetchSession` on the source and an
    `IdempotentProduceSession` on the target, both on one `RawLoop` (`open()`
    connects to both clusters and gets a producer id)."""

    def __init__(self, fetch: FetchSession, produce: IdempotentProduceSession, name: str) -> None:
        super().__init__(f"mm2py-raw-{name}", f"raw clients of {name}", [fetch, produce])
        self.fetch_session = fetch
        self.produce_session = produce
        self.name = name

    def __enter__(self) -> RawCopyClients:
        self.open()
        return self

    def fetch(self, positions: Mapping[TP, int]) -> dict[TP, Fetched | OffsetOutOfRange]:
        """`FetchSession.fetch`."""
        return self._run(self.fetch_session.fetch(positions))

    def discard_fetches(self) -> None:
        """`FetchSession.discard`."""
        self._run(self.fetch_session.discard())

    def produce(
        self,
        batches: Mapping[TP, Sequence[RecordBatch]],
        prefetch: Mapping[TP, int] | None = None,
    ) -> dict[TP, list[int] | BatchRejected]:
        """`IdempotentProduceSession.produce`; with `prefetch`, `FetchSession.prefetch` of
        those positions first, in the same call on the loop: the Fetch is out while the
        produce waits for its acknowledgement."""
        return self._run(self._prefetch_and_produce(batches, prefetch))

    async def _prefetch_and_produce(
        self, batches: Mapping[TP, Sequence[RecordBatch]], prefetch: Mapping[TP, int] | None
    ) -> dict[TP, list[int] | BatchRejected]:
        if prefetch is not None:
            await self.fetch_session.prefetch(prefetch)
        if not batches:
            return {}
        return await self.produce_session.produce(batches)
