"""Test helpers that talk to the real local clusters: produce, read back, wait."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic

from mm2py.dev.jars import java_command
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.replication.progress import read_recorded

T = TypeVar("T")


# Record timestamps for test data: an hour ago, on whole seconds. The local brokers keep
# Kafka's default retention (7 days) and check it 30 s after they start and every 5 min
# after; records stamped years ago were deleted under the tests that copy them.
RECENT_MS = (int(time.time()) - 3600) * 1000
# The oldest record timestamp `produce` accepts: a day inside the default retention.
_RETAINED_MS = 6 * 24 * 3600 * 1000
# Where a flow A->B writes its offset syncs (on A, the source), under MM2's default
# replication policy: the name MM2 gives it, spelled out as the contract it is.
SYNCS_TOPIC = "mm2-offset-syncs.B.internal"


def wait_until(
    probe: Callable[[], T | None], timeout: float = 30.0, interval: float = 0.2, what: str = ""
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or probe}; last={last!r}")


@dataclass(frozen=True)
class Rec:
    """A record as the tests compare it: everything replication must keep."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp: int

    def content(self) -> tuple[Any, ...]:
        """What must be equal between a source record and its copy."""
        return (self.partition, self.key, self.value, self.headers, self.timestamp)


def end_transaction(producer: Any, commit: bool, timeout: float = 30) -> None:
    """Commit or abort `producer`'s open transaction.

    An aborted transaction's records are flushed first: so they reach the log and take
    offsets (what a replicator must skip), rather than being purged unsent; and because
    librdkafka (2.16) fails an abort with a fatal INVALID_TXN_STATE, now and then, when
    its records are still unsent (librdkafka issue 4849; seen in CI).
    """
    if commit:
        producer.commit_transaction(timeout)
        return
    producer.flush(timeout)
    producer.abort_transaction(timeout)


# Answers of a group coordinator that is moving or still loading: an admin tool (Kafka's
# AdminClient) asks again.
_COORDINATOR_NOT_READY = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
    }
)


def commit_offsets(
    cluster: LocalCluster,
    group: str,
    offsets: dict[tuple[str, int], int],
    metadata: str = "",
    timeout: float = 30.0,
) -> None:
    """Commit offsets for a group without members, as an admin tool would: asked again
    while the coordinator is not ready (e.g. still loading the group offsets after a
    broker's restart, which an earlier test on the same cluster may have just done),
    until `timeout`."""
    partitions = [
        TopicPartition(t, p, o, metadata) if metadata else TopicPartition(t, p, o)
        for (t, p), o in offsets.items()
    ]
    deadline = time.monotonic() + timeout
    consumer = clients.consumer(cluster.client_properties(), {"group.id": group})
    try:
        while True:
            try:
                consumer.commit(offsets=partitions, asynchronous=False)
                return
            except KafkaException as exc:
                not_ready = exc.args[0].code() in _COORDINATOR_NOT_READY
                if not not_ready or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)
    finally:
        consumer.close()


def transaction_timeout_ms(cluster: LocalCluster, transactional_id: str) -> int:
    """The transaction timeout `cluster`'s coordinator holds for `transactional_id`, as
    Kafka's own tool describes it (``kafka-transactions.sh describe``, from the jars)."""
    command = java_command(
        "org.apache.kafka.tools.TransactionsCommand",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "describe",
        "--transactional-id",
        transactional_id,
        heap="256m",
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"describe {transactional_id}: {done.stderr or done.stdout}"
    lines = [line.split() for line in done.stdout.splitlines() if line.strip()]
    header, row = lines[0], lines[1]
    return int(row[header.index("TransactionTimeoutMs")])


def create_topic(
    cluster: LocalCluster, name: str, partitions: int = 1, config: dict[str, str] | None = None
) -> None:
    admin = clients.admin_client(cluster.client_properties())
    futures = admin.create_topics(
        [NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})]
    )
    futures[name].result(timeout=30)


def produce(
    cluster: LocalCluster,
    topic: str,
    records: Iterable[tuple[int, bytes | None, bytes | None]]
    | Iterable[tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]], int]],
    user: str = "admin",
    overrides: dict[str, Any] | None = None,
) -> int:
    """Produce (partition, key, value[, headers, timestamp]) tuples and wait for all acks."""
    producer = clients.producer(
        cluster.client_properties(user), {"linger.ms": 5, **(overrides or {})}
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    count = 0
    for rec in records:
        kwargs: dict[str, Any] = {"partition": rec[0], "key": rec[1], "value": rec[2]}
        if len(rec) > 3:
            stamp: int = rec[4]  # type: ignore[misc]
            if stamp < time.time() * 1000 - _RETAINED_MS:
                raise ValueError(
                    f"record timestamp {stamp} for {topic}[{rec[0]}] is older than the "
                    "brokers' default 7-day retention, which deletes it under the test: "
                    "use RECENT_MS + n"
                )
            kwargs["headers"] = list(rec[3])  # type: ignore[misc]
            kwargs["timestamp"] = stamp
        while True:
            try:
                producer.produce(topic, on_delivery=on_delivery, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        count += 1
    producer.flush(60)
    if errors:
        raise KafkaException(errors[0])
    return count


# A read up to the current end learns that it is there from a fetch answered with nothing
# (_PARTITION_EOF). The broker holds such a fetch for fetch.wait.max.ms (500 ms by default)
# in case records arrive, so every read to the end waited half a second at its end (0.52-0.72
# s against 0.04-0.10 s for 30 records in three partitions, one empty). Reads that wait for
# records to arrive (`expected`) keep the default, whose long poll is what they want.
_READ_EOF = {"enable.partition.eof": True}
READ_TO_END = {**_READ_EOF, "fetch.wait.max.ms": 10}


def read_all(
    cluster: LocalCluster,
    topic: str,
    expected: int | None = None,
    timeout: float = 30.0,
    isolation: str = "read_committed",
) -> list[Rec]:
    """Every record of `topic` from the beginning up to the current end offsets.

    With `expected`, keep reading until that many records arrived (or time out), from a
    topic that may not exist yet: a daemon just started creates its remote topics after
    the caller starts reading.
    """
    consumer = clients.consumer(
        cluster.client_properties(),
        {"isolation.level": isolation, **(READ_TO_END if expected is None else _READ_EOF)},
    )
    try:
        deadline = time.monotonic() + timeout
        parts = _partitions(consumer, topic)
        while not parts and expected is not None and time.monotonic() < deadline:
            time.sleep(0.2)
            parts = _partitions(consumer, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        out: list[Rec] = []
        eof: set[int] = set()
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                if expected is None and len(eof) == len(parts):
                    break
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    eof.add(msg.partition())
                    if expected is None and len(eof) == len(parts):
                        break
                    continue
                raise KafkaException(msg.error())
            eof.discard(msg.partition())
            out.append(
                Rec(
                    partition=msg.partition(),
                    offset=msg.offset(),
                    key=msg.key(),
                    value=msg.value(),
                    headers=tuple(msg.headers() or ()),
                    timestamp=msg.timestamp()[1],
                )
            )
            if expected is not None and len(out) >= expected:
                break
        return out
    finally:
        consumer.close()


def _partitions(consumer: Any, topic: str, timeout: float = 10.0) -> list[int]:
    """`topic`'s partitions, none while it does not exist."""
    meta = consumer.list_topics(topic, timeout=timeout).topics[topic]
    return [] if meta.error is not None else sorted(meta.partitions)


# Errors of a partition whose leader is not known yet, as right after its topic was
# created: asking again soon answers.
_LEADER_NOT_YET = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


def end_offsets(cluster: LocalCluster, topic: str, timeout: float = 10.0) -> dict[int, int]:
    """The high watermark of each partition of `topic` ({} when it does not exist).

    A partition whose leader is not known yet (its topic was just created) is asked
    again until `timeout`.
    """
    consumer = clients.consumer(cluster.client_properties())
    deadline = time.monotonic() + timeout
    try:
        out: dict[int, int] = {}
        for p in _partitions(consumer, topic, timeout):
            while p not in out:
                try:
                    out[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)[1]
                except KafkaException as exc:
                    if exc.args[0].code() not in _LEADER_NOT_YET or time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        return out
    finally:
        consumer.close()


def topic_names(cluster: LocalCluster) -> set[str]:
    admin = clients.admin_client(cluster.client_properties())
    return set(admin.list_topics(timeout=10).topics)


def awkward_records(count: int, partitions: int) -> list[tuple[Any, ...]]:
    """Records for `produce` that test a copy: null keys and values, binary and repeated
    headers, an empty and a null header value, distinct timestamps."""
    sent: list[tuple[Any, ...]] = []
    for i in range(count):
        key = None if i % 7 == 0 else f"key-{i}".encode()
        value = None if i % 11 == 0 else bytes([i % 256]) * (i % 50)
        headers = [("h", b"\x00\x01"), ("h", f"{i}".encode()), ("empty", b""), ("n", None)]
        sent.append((i % partitions, key, value, headers, RECENT_MS + i * 1000))
    return sent


# -- the live producer ---------------------------------------------------------------------


ROUNDS_PER_S = 100  # a LiveProducer's rounds a second, at most


@dataclass(frozen=True)
class Transactions:
    """What a `LiveProducer` writes in transactions, beside its plain records: every
    `every`-th round opens with a transaction of `per_partition` records a partition, and
    every `abort_every`-th transaction (the 2nd, 2nd + abort_every, ...) is aborted."""

    every: int = 1
    per_partition: int = 1
    abort_every: int = 3


class LiveProducer:
    """Numbered records into every partition of its topics on `cluster`, from a thread of
    its own, about `rate` plain records a second in all, until stopped.

    Each round writes plain records to every partition (one, or as many as `rate` needs at
    ROUNDS_PER_S rounds a second), from an idempotent producer, so
    the source holds them once each, in sending order: value `<partition>:<n>`, n counted
    per topic partition from 0 (`sent(topic)` once stopped), key `k<i>`, timestamps now.
    With `transactions`, a transactional producer writes values `txn:<partition>:<i>`
    (committed) or `aborted:<partition>:<i>` (aborted) too. `stop()` returns once every
    record is acknowledged and asserts that none failed; `committed` counts the records a
    read_committed reader will see (plain ones once acknowledged), `aborted` the others.
    `acknowledged(topic)` gives the offset the broker acknowledged for each plain record.
    Leaving its `with` block stops it (and asserts, unless the block raised).
    """

    def __init__(
        self,
        cluster: LocalCluster,
        topics: dict[str, int],
        rate: float = 200.0,
        transactions: Transactions | None = None,
    ) -> None:
        self.cluster = cluster
        self.rate = rate
        self.transactions = transactions
        self.committed = 0
        self.aborted = 0
        self.errors: list[str] = []
        self._transactional = 0  # records written in transactions, for their values
        self._sent = {topic: [0] * partitions for topic, partitions in topics.items()}
        # (topic, partition) -> {n: offset} of the plain records acknowledged.
        self._acked: dict[tuple[str, int], dict[int, int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread()  # started by start()

    def add(self, topic: str, partitions: int) -> None:
        """Produce into `topic` too from now on."""
        with self._lock:
            self._sent[topic] = [0] * partitions

    def sent(self, topic: str) -> list[int]:
        """How many plain records each partition of `topic` was sent."""
        with self._lock:
            return list(self._sent[topic])

    def acknowledged(self, topic: str) -> dict[int, dict[int, int]]:
        """The offset acknowledged for each plain record sent, by partition and n."""
        with self._lock:
            return {p: dict(self._acked.get((topic, p), {})) for p in range(len(self._sent[topic]))}

    def wait_committed(self, count: int) -> None:
        """Wait until `count` records are committed (or the producer failed)."""
        wait_until(lambda: self.committed >= count or self.errors, what=f"{count} produced")

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
            return
        self.committed += 1
        n = int(msg.value().split(b":")[1])
        with self._lock:
            self._acked.setdefault((msg.topic(), msg.partition()), {})[n] = msg.offset()

    def _run(self, plain: Any, txn: Any) -> None:
        try:
            i = 0
            next_round = time.monotonic()
            for round_ in range(1 << 62):
                if self._stop.is_set():
                    break
                with self._lock:
                    topics = [(topic, len(sent)) for topic, sent in self._sent.items()]
                mix = self.transactions
                if txn is not None and mix is not None and round_ % mix.every == 0:
                    self._transaction(txn, topics, round_ // mix.every % mix.abort_every != 1)
                # At most ROUNDS_PER_S rounds a second: a fast producer writes several
                # records a partition each round rather than waking up more often.
                total = sum(p for _t, p in topics)
                each = max(1, int(self.rate / ROUNDS_PER_S / max(total, 1)))
                for topic, partitions in topics:
                    for p in range(partitions):
                        with self._lock:
                            first = self._sent[topic][p]
                        for n in range(first, first + each):
                            self._produce(plain, topic, p, f"{p}:{n}", f"k{i}")
                            i += 1
                        with self._lock:
                            self._sent[topic][p] = first + each
                plain.poll(0)
                next_round += total * each / self.rate
                self._stop.wait(max(next_round - time.monotonic(), 0.0))
        except Exception as exc:  # shown by stop()
            self.errors.append(repr(exc))
        if plain.flush(120) != 0:
            self.errors.append("records still unsent 120 s after the producer stopped")

    def _produce(self, producer: Any, topic: str, p: int, value: str, key: str) -> None:
        now_ms = max(int(time.time() * 1000), RECENT_MS)
        while True:
            try:
                producer.produce(
                    topic,
                    key=key.encode(),
                    value=value.encode(),
                    partition=p,
                    timestamp=now_ms,
                    on_delivery=self._on_delivery,
                )
                return
            except BufferError:  # the broker is slow or stopped: let the queue drain
                producer.poll(0.1)

    def _transaction(self, txn: Any, topics: list[tuple[str, int]], commit: bool) -> None:
        assert self.transactions is not None
        word = "txn" if commit else "aborted"
        count = 0
        txn.begin_transaction()
        for topic, partitions in topics:
            for p in range(partitions):
                for _ in range(self.transactions.per_partition):
                    value = f"{word}:{p}:{self._transactional}"
                    txn.produce(topic, value=value.encode(), partition=p)
                    self._transactional += 1
                    count += 1
        end_transaction(txn, commit)
        if commit:
            self.committed += count
        else:
            self.aborted += count

    def start(self) -> LiveProducer:
        """Start producing. The transactional producer is initialised first, here: the
        cluster's transaction coordinator is loaded before anything else needs it."""
        props = self.cluster.client_properties()
        plain = clients.producer(props, {"enable.idempotence": True, "linger.ms": 5})
        txn = None
        if self.transactions is not None:
            first = next(iter(self._sent))
            txn = clients.producer(props, {"transactional.id": f"live-{first}", "linger.ms": 5})
            txn.init_transactions(30)
        self._thread = threading.Thread(
            target=self._run, args=(plain, txn), name="live-producer", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop producing; return once every record sent is acknowledged."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(150)
        assert not self._thread.is_alive(), "the live producer did not stop"
        assert not self.errors, f"the live producer failed: {self.errors[:3]}"
        with self._lock:
            unacknowledged = {
                (topic, p): sent - len(self._acked.get((topic, p), {}))
                for topic, counts in self._sent.items()
                for p, sent in enumerate(counts)
                if sent != len(self._acked.get((topic, p), {}))
            }
        assert not unacknowledged, f"records sent but never acknowledged: {unacknowledged}"

    def __enter__(self) -> LiveProducer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.stop()
        else:
            self._stop.set()
            self._thread.join(150)


def recorded_progress(target: LocalCluster, source: str, topic: str) -> dict[int, int]:
    """The last copied offset of each partition of `source`'s `topic` recorded on `target`
    (mm2-offsets.<source>.internal, read by the daemon's own decoder: what a task's next
    owner starts after)."""
    found = read_recorded(
        target.client_properties(), target.alias, source, f"mm2-offsets.{source}.internal", 30.0
    )
    return {partition: offset for (t, partition), offset in found.items() if t == topic}
