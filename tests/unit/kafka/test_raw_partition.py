"""The raw-batch client's settings from a cluster's librdkafka properties (no broker)."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from mm2py.kafka.raw_partition import (
    IdempotentRawProducer,
    RawFetcher,
    RawPartitionError,
    client_settings,
)

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
    with pytest.raises(RawPartitionError, match=r"connect for t-3 on 127.0.0.1:1 failed.*up"):
        fetcher.open()
    fetcher.close()
