"""Which copier `replication.copy.mode` gives a flow (mm2py.config.copy_mode), through the
loader: auto takes batch pass-through unless something stands in its way, and says what."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm2py.config import ConfigError, load_config
from mm2py.config.copy_mode import raw_connection_problem

BASE = (
    "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
    "A->B.enabled = true\n"
)

# (case, extra properties, the key the reason names, words of the reason)
OBSTACLES = [
    (
        "registry",
        "A->B.schema.registry.sync.enabled = true\nA.schema.registry.url = http://a\n"
        "B.schema.registry.url = http://b\n",
        "A->B.schema.registry.sync.enabled",
        "schema ids",
    ),
    (
        "producer-compression",
        "B.producer.compression.type = zstd\n",
        "B.producer.compression.type",
        "keep the source's compression",
    ),
    (
        "cluster-compression",
        "B.compression.type = lz4\n",
        "B.compression.type",
        "keep the source's compression",
    ),
    (
        "read-uncommitted",
        "A.consumer.isolation.level = read_uncommitted\n",
        "A.consumer.isolation.level",
        "read_committed",
    ),
    (
        "reset-latest",
        "A.consumer.auto.offset.reset = latest\n",
        "A.consumer.auto.offset.reset",
        "log start",
    ),
    (
        "gssapi",
        "A.security.protocol = SASL_PLAINTEXT\nA.sasl.mechanism = GSSAPI\n",
        "A.sasl.mechanism",
        "PLAIN or SCRAM",
    ),
    (
        "oauth",
        "B.security.protocol = SASL_SSL\nB.sasl.mechanism = OAUTHBEARER\n",
        "B.sasl.mechanism",
        "PLAIN or SCRAM",
    ),
    (
        "inline-ca",
        "B.security.protocol = SSL\nB.producer.ssl.ca.pem = -----BEGIN X\n",
        "B.producer.ssl.ca.pem",
        "PEM files only",
    ),
]


def load(tmp_path: Path, extra: str) -> tuple[str, str]:
    path = tmp_path / "mm2.properties"
    path.write_text(BASE + extra)
    settings = load_config(path).flow("A", "B").settings
    return settings.copier, settings.copier_reason


@pytest.mark.parametrize(
    ("extra", "key", "why"), [case[1:] for case in OBSTACLES], ids=[case[0] for case in OBSTACLES]
)
def test_auto_copies_records_naming_what_stands_in_the_way(
    tmp_path: Path, extra: str, key: str, why: str
) -> None:
    copier, reason = load(tmp_path, extra)
    assert copier == "record"
    assert reason.startswith(f"{key}: ") and why in reason, reason


@pytest.mark.parametrize(
    ("extra", "key", "why"), [case[1:] for case in OBSTACLES], ids=[case[0] for case in OBSTACLES]
)
def test_batch_where_it_cannot_keep_a_guarantee_fails_the_load(
    tmp_path: Path, extra: str, key: str, why: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load(tmp_path, extra + "A->B.replication.copy.mode = batch\n")
    message = str(err.value)
    assert ": A->B.replication.copy.mode: batch cannot copy flow A->B: " in message
    assert f"{key}: " in message and why in message
    assert message.endswith("set A->B.replication.copy.mode = record or auto")


@pytest.mark.parametrize(
    "extra",
    [
        "",
        "B.producer.linger.ms = 20\nA.consumer.fetch.max.bytes = 1000000\n",
        "A.consumer.isolation.level = read_committed\nA.consumer.auto.offset.reset = earliest\n",
        "A.security.protocol = SASL_SSL\nA.sasl.mechanism = SCRAM-SHA-512\n"
        "A.sasl.username = u\nA.sasl.password = p\nA.ssl.ca.location = /etc/ca.pem\n",
        "B.security.protocol = SSL\nB.ssl.certificate.location = /c.pem\n"
        "B.ssl.key.location = /k.pem\n",
    ],
    ids=["defaults", "tuning", "committed-earliest", "sasl-scram-tls", "tls-files"],
)
def test_auto_passes_batches_through_where_nothing_stands_in_the_way(
    tmp_path: Path, extra: str
) -> None:
    assert load(tmp_path, extra) == ("batch", "")


def test_a_disabled_flow_with_batch_and_an_obstacle_loads(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(
        BASE.replace("A->B.enabled = true", "A->B.enabled = false")
        + "B.producer.compression.type = zstd\nA->B.replication.copy.mode = batch\n"
    )
    assert load_config(path).flow("A", "B").settings.copier == "record"


def test_raw_connection_problem_names_the_key() -> None:
    assert raw_connection_problem({"bootstrap.servers": "a:1"}) is None
    assert raw_connection_problem({"security.protocol": "sasl_plaintext"}) == (
        "sasl.mechanisms",
        "GSSAPI: batch pass-through logs in with PLAIN or SCRAM only",
    )
    assert raw_connection_problem({"security.protocol": "SSL", "ssl.keystore.location": "k.p12"})
    assert raw_connection_problem({"security.protocol": "PLAINTEXT", "ssl.ca.pem": "x"}) is None


def test_exactly_once_passes_batches_under_auto_and_copies_records_when_asked(
    tmp_path: Path,
) -> None:
    eos = "B.exactly.once.source.support = enabled\n"
    assert load(tmp_path, eos) == ("batch", "")
    assert load(tmp_path, eos + "A->B.replication.copy.mode = record\n") == ("record", "")
