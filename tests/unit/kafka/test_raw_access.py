"""A cluster that refuses the raw sessions' login or TLS handshake fails them at once,
with the record copier's text (clients.access_problem); one that cannot be reached is
retried; aiokafka's lines for either are not ERRORs."""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable, Coroutine
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import errors as aiokafka_errors
from confluent_kafka import KafkaError

from mm2py.kafka import clients
from mm2py.kafka.raw_clients import (
    AccessRefused,
    FetchSession,
    IdempotentProduceSession,
    RawPartitionError,
)
from tests.unit.kafka.test_raw_clients import Client, Cluster, batches

PASSWORD = "s3cret-never-shown"
SASL = {
    "bootstrap.servers": "boot:9092",
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "rotating-1234",
    "sasl.password": PASSWORD,
}
TLS = {"bootstrap.servers": "boot:9093", "security.protocol": "SSL"}
TLS_DETAIL = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"


class Brokers(Cluster):
    def broker_metadata(self, node: int) -> Any:
        return SimpleNamespace(host=f"b{node}", port=9092)


class NotReady(Client):
    """Every broker's connection fails as AIOKafkaClient reports a refused login: the
    node is not ready."""

    def __init__(self, *, bootstraps: bool = True) -> None:
        super().__init__({("t", 0): 1})
        self.cluster = Brokers(self.cluster.leaders)
        self.bootstraps = bootstraps

    async def bootstrap(self) -> None:
        if not self.bootstraps:
            raise aiokafka_errors.KafkaConnectionError("Unable to bootstrap from [('boot', 9092)]")

    async def send(self, node: int, request: Any) -> Any:
        raise aiokafka_errors.NodeNotReadyError(f"Attempt to send a request to node {node}")


class Probe:
    """A stand-in for aiokafka.conn.create_conn: raises `answer`, counting the calls."""

    def __init__(self, answer: BaseException) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> Any:
        self.asked.append((host, port))
        raise self.answer


def run(make: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    return asyncio.run(make())


def sasl_refused() -> BaseException:
    return aiokafka_errors.SaslAuthenticationFailed(
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512"
    )


def test_the_text_is_the_record_copiers() -> None:
    refused = KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, "bad")
    assert clients.access_problem("D", SASL, refused) == (
        "cluster D: authentication failed (SASL SCRAM-SHA-512 as user rotating-1234): "
        "check sasl.jaas.config (or D.sasl.username and sasl.password)"
    )
    assert clients.access_problem("D", TLS, KafkaError(KafkaError._SSL, TLS_DETAIL)) == (
        f"cluster D: TLS handshake failed ({TLS_DETAIL}): check D.ssl.truststore.location "
        "(or ssl.ca.location) and the brokers' certificates"
    )


def test_a_refused_login_fails_a_fetch_at_once_naming_the_cluster() -> None:
    probe = Probe(sasl_refused())
    session = FetchSession(SASL, client_factory=NotReady, alias="D", probe=probe, retry_timeout=60)

    async def fetch() -> None:
        await session.open()
        try:
            while True:
                await session.fetch({("t", 0): 0})
        finally:
            await session.close()

    started = time.monotonic()
    with pytest.raises(AccessRefused) as refused:
        run(fetch)
    assert time.monotonic() - started < 5
    assert str(refused.value) == clients.access_problem(
        "D", SASL, KafkaError(KafkaError.SASL_AUTHENTICATION_FAILED, "")
    )
    assert PASSWORD not in str(refused.value)
    assert probe.asked == [("b1", 9092)]


def test_a_refused_certificate_fails_a_produce_at_once_naming_the_cluster() -> None:
    probe = Probe(ssl.SSLCertVerificationError(1, TLS_DETAIL))  # as the ssl module raises it
    session = IdempotentProduceSession(
        TLS, client_factory=NotReady, alias="E", probe=probe, retry_timeout=60
    )
    with pytest.raises(AccessRefused) as refused:
        run(session.open)  # InitProducerId goes to a broker that refuses it
    assert str(refused.value) == clients.access_problem(
        "E", TLS, KafkaError(KafkaError._SSL, TLS_DETAIL)
    )

    # a producer that has its id and loses its connection later
    later = IdempotentProduceSession(TLS, alias="E", probe=probe, retry_timeout=60)

    async def produce() -> None:
        later._client = NotReady()
        later.producer_id, later.producer_epoch = 5, 0
        await later.produce({("t", 0): batches(1)})

    with pytest.raises(AccessRefused, match=r"^cluster E: TLS handshake failed"):
        run(produce)


def test_a_refused_login_at_bootstrap_names_the_cluster() -> None:
    probe = Probe(sasl_refused())
    session = FetchSession(
        SASL, client_factory=lambda: NotReady(bootstraps=False), alias="D", probe=probe
    )
    with pytest.raises(AccessRefused, match=r"^cluster D: authentication failed"):
        run(session.open)
    assert probe.asked == [("boot", 9092)]


def test_an_unreachable_broker_is_retried_and_asked_at_most_every_few_seconds() -> None:
    probe = Probe(ConnectionRefusedError(111, "Connection refused"))
    session = FetchSession(SASL, client_factory=NotReady, alias="D", probe=probe)
    session.retry_timeout = 0.5

    async def fetch() -> None:
        await session.open()
        try:
            while True:
                await session.fetch({("t", 0): 0})
        finally:
            await session.close()

    with pytest.raises(RawPartitionError, match="still failing after") as failed:
        run(fetch)
    assert not isinstance(failed.value, AccessRefused)
    assert probe.asked == [("b1", 9092)]  # one probe in 0.5 s of retries


@pytest.mark.parametrize(
    ("logger", "message", "args"),
    [
        ("aiokafka", "Unable connect to node with id %s: %s", (1, "[Error 58] refused")),
        ("aiokafka", 'Unable connect to "%s:%s": %s', ("boot", 9092, "refused")),
        ("aiokafka", "Unable to update metadata from %s", ([1],)),
        ("aiokafka.cluster", "Topic %s not found in cluster metadata", ("gone",)),
    ],
)
def test_aiokafkas_lines_for_expected_trouble_are_not_errors(
    caplog: pytest.LogCaptureFixture, logger: str, message: str, args: tuple[Any, ...]
) -> None:
    caplog.set_level(logging.INFO)
    logging.getLogger(logger).error(message, *args)
    logging.getLogger(logger).error("something else")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("ERROR", "something else")]
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    logging.getLogger(logger).error(message, *args)
    assert [r.levelname for r in caplog.records] == ["DEBUG"]
