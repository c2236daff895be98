"""The raw-batch client's settings from a cluster's librdkafka properties (no broker)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.protocol.transaction import InitProducerIdRequest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from mm2py.kafka.raw_clients import FetchSession
from mm2py.kafka.raw_partition import (
    IdempotentRawProducer,
    RawFetcher,
    RawPartitionError,
    client_settings,
)
from mm2py.kafka.record_batches import AbortedTransaction, RecordBatch, split_batches

CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")


def test_plaintext() -> None:
    assert client_settings({"bootstrap.servers": "a:9092,b:9092", "linger.ms": "5"}) == {
        "bootstrap_servers": "a:9092,b:9092",
        "security_protocol": "PLAINTEXT",
    }


def test_sasl_scram() -> None:
    settings = client_settings(
        {
            "bootstrap.servers": "a:9092",
            "security.protocol": "sasl_plaintext",
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "admin",
            "sasl.password": "secret",
        }
    )
    assert settings == {
        "bootstrap_servers": "a:9092",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "admin",
        "sasl_plain_password": "secret",
    }


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "GSSAPI"),  # librdkafka's default
        ({"security.protocol": "KERBEROS"}, "security.protocol"),
    ],
)
def test_what_raw_batches_cannot_use_is_named(props: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        client_settings({"bootstrap.servers": "a:9092", **props})


@pytest.mark.skipif(not CA_BUNDLE.exists(), reason="no system CA bundle")
def test_ssl_context_from_the_ca_file() -> None:
    settings = client_settings(
        {
            "bootstrap.servers": "a:9093",
            "security.protocol": "SSL",
            "ssl.ca.location": str(CA_BUNDLE),
            "ssl.endpoint.identification.algorithm": "none",
        }
    )
    context = settings["ssl_context"]
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode is ssl.CERT_REQUIRED and not context.check_hostname


def test_construct_makes_no_connection() -> None:
    # nothing listens there: only open() connects
    fetcher = RawFetcher({"bootstrap.servers": "127.0.0.1:1"}, "t", 0)
    producer = IdempotentRawProducer({"bootstrap.servers": "127.0.0.1:1"}, "t", 0)
    assert (producer.producer_id, producer.next_sequence) == (-1, 0)
    with pytest.raises(RuntimeError, match=r"t-0 on 127\.0\.0\.1:1"):
        fetcher.fetch(0)
    fetcher.close()  # closing what never opened is fine


def test_a_cluster_that_does_not_answer_is_a_clear_error() -> None:
    fetcher = RawFetcher({"bootstrap.servers": "127.0.0.1:1"}, "t", 3)
    with pytest.raises(RawPartitionError, match=r"connect to 127.0.0.1:1 failed.*up"):
        fetcher.open()
    fetcher.close()


# -- retries, with a stand-in for AIOKafkaClient --------------------------------------------

NOT_LEADER = 6  # NOT_LEADER_OR_FOLLOWER
OUT_OF_ORDER = 45
TOPIC_AUTHORIZATION_FAILED = 29
OFFSET_OUT_OF_RANGE = 1


class FakeCluster:
    def __init__(self) -> None:
        self.leader = 1
        self.unauthorized_topics: set[str] = set()
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def leader_for_partition(self, _tp: Any) -> int:
        return self.leader

    def partitions_for_topic(self, _topic: str) -> set[int]:
        return {0}


class FakeClient:
    """Answers requests from a script: `answers` maps a request number to an error code
    (0 or absent: success). Produce answers give the next free offset."""

    def __init__(self, answers: dict[int, int] | None = None, failover_to: int = 2) -> None:
        self.cluster = FakeCluster()
        self.answers = answers or {}
        self.failover_to = failover_to
        self.sent: list[tuple[int, Any]] = []
        self.refreshes = 0
        self.end = 0
        self.appended: dict[int, int] = {}  # base sequence -> offset (the broker's dedup)

    async def bootstrap(self) -> None:
        pass

    def add_topic(self, _topic: str) -> None:
        pass

    def get_random_node(self) -> int:
        return 1

    async def close(self) -> None:
        pass

    def force_metadata_update(self) -> asyncio.Future[bool]:
        # as AIOKafkaClient's: a future, awaited or not
        self.refreshes += 1
        self.cluster.leader = self.failover_to
        for listener in self.cluster.listeners:  # as aiokafka's ClusterMetadata does
            listener(self.cluster)
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    async def send(self, node: int, request: Any) -> Any:
        number = len(self.sent)
        self.sent.append((node, request))
        code = self.answers.get(number, 0)
        if isinstance(request, InitProducerIdRequest):
            return SimpleNamespace(error_code=0, producer_id=77, producer_epoch=3)
        if isinstance(request, FetchRequest):
            partition = (0, code, 100, 100, 0, [(5, 10)], -1, b"" if code else b"records")
            return SimpleNamespace(API_VERSION=11, error_code=0, topics=[("t", [partition])])
        payload = request._topics[0][1][0][1]
        header = split_batches(payload).batches[0].header
        offset = -1
        if not code:
            if header.base_sequence not in self.appended:
                self.appended[header.base_sequence] = self.end
                self.end += header.record_count
            offset = self.appended[header.base_sequence]
        return SimpleNamespace(topics=[("t", [(0, code, offset, -1, 0)])])


def batches(count: int) -> list[RecordBatch]:
    out = []
    for i in range(count):
        builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 16)
        for j in range(3):
            builder.append(j, 1000 + j, f"k{i}-{j}".encode(), b"v", [])
        out.append(split_batches(bytes(builder.build())).batches[0])
    return out


def producer_with(client: FakeClient, retry_timeout: float = 5.0) -> IdempotentRawProducer:
    producer = IdempotentRawProducer(
        {"bootstrap.servers": "fake:9092"},
        "t",
        0,
        retry_timeout=retry_timeout,
        client_factory=lambda: client,
    )
    producer.open()
    return producer


def sent_sequences(client: FakeClient) -> list[tuple[int, int]]:
    """(node, base sequence) of each Produce request, in order."""
    return [
        (node, split_batches(request._topics[0][1][0][1]).batches[0].header.base_sequence)
        for node, request in client.sent
        if isinstance(request, ProduceRequest)
    ]


def test_a_leader_change_resends_from_the_failed_batch_with_its_sequence() -> None:
    # request 0 is InitProducerId, request 1 batch 0 alone (the partition is new to the
    # producer); in the first window of 5, batch 1 meets NOT_LEADER and the ones behind it
    # OUT_OF_ORDER (their predecessor is missing)
    client = FakeClient({2: NOT_LEADER} | {n: OUT_OF_ORDER for n in range(3, 7)})
    producer = producer_with(client)
    try:
        assert producer.produce(batches(7)) == [0, 3, 6, 9, 12, 15, 18]
        assert (producer.producer_id, producer.producer_epoch) == (77, 3)
        assert producer.next_sequence == 21
    finally:
        producer.close()
    assert client.refreshes >= 1
    assert sent_sequences(client) == [
        (1, 0),  # alone, to the old leader
        (1, 3), (1, 6), (1, 9), (1, 12), (1, 15),  # the first window of 5
        (2, 3), (2, 6), (2, 9), (2, 12), (2, 15),  # from the failed batch on, to the new one
        (2, 18),
    ]  # fmt: skip


def test_a_lost_answer_is_resent_and_the_broker_dedupes() -> None:
    client = FakeClient()
    producer = producer_with(client)
    try:
        sent = batches(3)
        assert producer.produce(sent[:2]) == [0, 3]
        # the broker took batch 2 but the answer was lost: the window is sent again
        client.answers = {len(client.sent): NOT_LEADER}
        client.appended[6] = 6
        client.end = 9
        assert producer.produce(sent[2:]) == [6]
    finally:
        producer.close()


def test_errors_that_are_not_retriable_raise_at_once() -> None:
    client = FakeClient({1: TOPIC_AUTHORIZATION_FAILED})
    producer = producer_with(client)
    try:
        with pytest.raises(RawPartitionError, match=r"t-0 on fake:9092.*WRITE on the topic"):
            producer.produce(batches(1))
    finally:
        producer.close()


def test_retriable_errors_give_up_after_the_retry_timeout() -> None:
    client = FakeClient({n: NOT_LEADER for n in range(1, 1000)})
    producer = producer_with(client, retry_timeout=0.5)
    try:
        with pytest.raises(RawPartitionError, match=r"NotLeaderForPartition.*still after"):
            producer.produce(batches(1))
    finally:
        producer.close()


def test_fetch_retries_a_leader_change_and_reads_the_answer() -> None:
    client = FakeClient({0: NOT_LEADER})
    fetcher = RawFetcher({"bootstrap.servers": "fake:9092"}, "t", 0, client_factory=lambda: client)
    with fetcher:
        fetched = fetcher.fetch(42)
    assert [node for node, _ in client.sent] == [1, 2]
    assert fetched.records == b"records"
    assert fetched.aborted == [AbortedTransaction(5, 10)]
    assert (fetched.position, fetched.high_watermark, fetched.log_start_offset) == (42, 100, 0)


def test_fetch_out_of_range_says_what_to_do() -> None:
    client = FakeClient({0: OFFSET_OUT_OF_RANGE})
    fetcher = RawFetcher({"bootstrap.servers": "fake:9092"}, "t", 0, client_factory=lambda: client)
    with fetcher, pytest.raises(RawPartitionError, match=r"out of range.*log start"):
        fetcher.fetch(42)


def test_fetches_wait_and_take_what_the_source_consumer_would() -> None:
    """The source consumer's librdkafka fetch keys where the configuration sets them,
    else the consumer defaults."""
    props = {
        "bootstrap.servers": "a:9092",
        "fetch.wait.max.ms": "100",
        "fetch.min.bytes": "65536",
        "max.partition.fetch.bytes": "2097152",
        "fetch.max.bytes": "52428800",
        "linger.ms": "5",
    }
    session = FetchSession.like_consumer(props)
    assert (session.max_wait_ms, session.min_bytes) == (100, 65536)
    assert (session.partition_max_bytes, session.max_bytes) == (2097152, 52428800)
    default = FetchSession.like_consumer({"bootstrap.servers": "a:9092"})
    assert (default.max_wait_ms, default.min_bytes) == (500, 1)
    assert (default.partition_max_bytes, default.max_bytes) == (1 << 20, 16 << 20)
