"""Loading mm2.properties and YAML into the config models: MM2 semantics and defaults."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mm2py.config import ConfigError, FlowSettings, MirrorConfig, load_config
from mm2py.config.client_props import parse_jaas
from mm2py.config.properties import parse_properties

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def write(tmp_path: Path, text: str, name: str = "mm2.properties") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def load(tmp_path: Path, text: str, name: str = "mm2.properties") -> MirrorConfig:
    return load_config(write(tmp_path, text, name))


BASE = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"


# --- the shipped examples ---


def test_example_configs_load_to_equal_models(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        props = load_config(CONFIGS / "mm2.properties")
        yaml_ = load_config(CONFIGS / "mm2.yaml")
    assert caplog.records == []  # every key in the examples is known
    assert props.model_copy(update={"path": yaml_.path}) == yaml_
    assert props.path == CONFIGS / "mm2.properties"


def test_example_config_values() -> None:
    config = load_config(CONFIGS / "mm2.properties")
    assert list(config.clusters) == ["A", "B"]
    assert config.cluster("A").librdkafka("consumer") == {
        "bootstrap.servers": "127.0.0.1:19092",
        "security.protocol": "PLAINTEXT",
    }
    assert [f.name for f in config.enabled_flows()] == ["A->B"]
    assert [f.name for f in config.heartbeat_flows()] == ["A->B", "B->A"]
    settings = config.flow("A", "B").settings
    assert settings.replication_factor == 1
    assert settings.offset_storage_replication_factor == 1
    assert settings.period("refresh.topics") == 5
    assert settings.period("emit.checkpoints") == 5
    assert settings.period("sync.group.offsets") == 5
    assert config.flow("B", "A").enabled is False
    assert config.flow("A", "B").offsets_topic == "mm2-offsets.A.internal"


# --- MM2 defaults ---


def test_defaults_are_mm2s(tmp_path: Path) -> None:
    settings = load(tmp_path, BASE + "A->B.enabled = true\n").flow("A", "B").settings
    # With MM2's defaults nothing keeps the flow from batch pass-through (copy_mode).
    assert settings == FlowSettings.model_validate({}).resolved(copier="batch")
    assert settings.topics == [".*"]
    assert settings.topics_exclude == ["mm2.*\\.internal", ".*\\.replica", "__.*"]
    assert settings.groups == [".*"]
    assert settings.groups_exclude == ["console-consumer-.*", "connect-.*", "__.*"]
    assert "min\\.insync\\.replicas" in settings.config_properties_exclude
    assert len(settings.config_properties_exclude) == 6
    assert settings.replication_policy_class == "DefaultReplicationPolicy"
    assert settings.replication_policy_separator == "."
    assert settings.replication_factor == 2
    assert settings.heartbeats_topic_replication_factor == 3
    assert settings.checkpoints_topic_replication_factor == 3
    assert settings.offset_syncs_topic_replication_factor == 3
    assert settings.offset_storage_replication_factor == 3
    assert settings.offset_storage_partitions == 25
    assert settings.offset_syncs_topic_location == "source"
    assert settings.offset_lag_max == 100
    assert settings.tasks_max == 1
    assert settings.admin_timeout_ms == 60000 and settings.admin_timeout == 60.0
    assert settings.consumer_poll_timeout_ms == 1000 and settings.consumer_poll_timeout == 1.0
    assert settings.emit_offset_syncs_enabled is True
    assert settings.period("refresh.topics") == 600
    assert settings.period("refresh.groups") == 600
    assert settings.period("sync.topic.configs") == 600
    assert settings.period("sync.topic.acls") == 600
    assert settings.period("emit.heartbeats") == 1
    assert settings.period("emit.checkpoints") == 60
    assert settings.period("sync.group.offsets") is None  # disabled by default


def test_flows_exist_for_every_pair_and_are_disabled_unless_enabled(tmp_path: Path) -> None:
    config = load(tmp_path, BASE.replace("A, B", "A, B, C") + "C.bootstrap.servers = c:1\n")
    assert [f.name for f in config.flows] == ["A->B", "A->C", "B->A", "B->C", "C->A", "C->B"]
    assert config.enabled_flows() == []
    # MM2's clusterPairs: heartbeats run for every pair unless disabled.
    assert len(config.heartbeat_flows()) == 6


def test_heartbeats_can_be_disabled_globally_or_per_flow(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "A->B.enabled = true\nB->A.emit.heartbeats.enabled = false\n")
    assert [f.name for f in config.heartbeat_flows()] == ["A->B"]
    config = load(tmp_path, BASE + "A->B.enabled = true\nemit.heartbeats.enabled = false\n")
    assert config.heartbeat_flows() == []
    assert [f.name for f in config.enabled_flows()] == ["A->B"]


def test_global_enabled_applies_to_every_flow(tmp_path: Path) -> None:
    # MM2 copies top-level connector keys, `enabled` included, into every flow.
    config = load(tmp_path, BASE + "enabled = true\nB->A.enabled = false\n")
    assert [f.name for f in config.enabled_flows()] == ["A->B"]


def test_flow_keys_override_global_keys(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE
        + "topics = a.*, b.*\nA->B.topics = orders , payments\\\\..*,\n"
        + "emit.checkpoints.interval.seconds = 7\nB->A.emit.checkpoints.enabled = false\n",
    )
    assert config.flow("A", "B").settings.topics == ["orders", "payments\\..*"]
    assert config.flow("B", "A").settings.topics == ["a.*", "b.*"]
    assert config.flow("A", "B").settings.period("emit.checkpoints") == 7
    assert config.flow("B", "A").settings.period("emit.checkpoints") is None


def test_worker_keys_come_from_the_target_cluster_unless_set_globally(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "B.offset.storage.replication.factor = 1\n")
    assert config.flow("A", "B").settings.offset_storage_replication_factor == 1
    assert config.flow("B", "A").settings.offset_storage_replication_factor == 3
    config = load(
        tmp_path,
        BASE + "B.offset.storage.replication.factor = 1\noffset.storage.replication.factor = 2\n",
    )
    assert config.flow("A", "B").settings.offset_storage_replication_factor == 2


def test_minus_one_disables_an_interval(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "refresh.topics.interval.seconds = -1\n")
    assert config.flow("A", "B").settings.period("refresh.topics") is None


@pytest.mark.parametrize(
    "value",
    [
        "org.apache.kafka.connect.mirror.IdentityReplicationPolicy",
        "IdentityReplicationPolicy",
    ],
)
def test_replication_policy_class_accepts_mm2_names(tmp_path: Path, value: str) -> None:
    config = load(tmp_path, BASE + f"replication.policy.class = {value}\n")
    assert config.flow("A", "B").settings.replication_policy_class == "IdentityReplicationPolicy"


def test_deprecated_blacklist_keys_map_to_exclude(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(tmp_path, BASE + "topics.blacklist = secret.*\n")
    assert config.flow("A", "B").settings.topics_exclude == ["secret.*"]
    assert "topics.blacklist is deprecated" in caplog.text
    config = load(tmp_path, BASE + "topics.exclude = x\ntopics.blacklist = y\n")
    assert config.flow("A", "B").settings.topics_exclude == ["x"]


def test_unknown_properties_keys_are_warnings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(
        tmp_path,
        BASE + "refresh.topic.interval.seconds = 5\nA->B.emit.checkpoint.enabled = true\n"
        "key.converter = x\ndedicated.mode.enable.internal.rest = true\n",
    )
    assert config.flow("A", "B").settings.period("refresh.topics") == 600
    text = caplog.text
    assert "refresh.topic.interval.seconds: ignored" in text
    assert "did you mean 'refresh.topics.interval.seconds'" in text
    assert "A->B.emit.checkpoint.enabled: ignored" in text
    assert "key.converter: ignored" in text


def test_native_yaml_types(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        "clusters:\n  A: {bootstrap.servers: 'a:1', producer: {linger.ms: 5, "
        "enable.idempotence: true}}\n  B:\n    bootstrap.servers: b:1\n"
        "A->B: {enabled: true, topics: [x, 'y.*'], offset.lag.max: 0}\n"
        "sync.topic.acls.enabled: false\n",
        "mm2.yml",
    )
    flow = config.flow("A", "B")
    assert flow.enabled and flow.settings.topics == ["x", "y.*"]
    assert flow.settings.offset_lag_max == 0
    assert flow.settings.period("sync.topic.acls") is None
    producer = config.cluster("A").librdkafka("producer")
    assert producer["linger.ms"] == "5" and producer["enable.idempotence"] == "true"


# --- clients: scoping and the Java -> librdkafka mapping ---


def test_client_keys_per_cluster_and_role(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE + "security.protocol = SASL_PLAINTEXT\nsasl.mechanism = PLAIN\n"
        "B.sasl.mechanism = scram-sha-512\nA.client.rack = r1\n"
        "A.consumer.fetch.min.bytes = 10\nA.producer.linger.ms = 5\nA.admin.client.rack = r2\n",
    )
    a = config.cluster("A")
    assert a.librdkafka("consumer") == {
        "bootstrap.servers": "a:9092",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "client.rack": "r1",
        "fetch.min.bytes": "10",
    }
    assert a.librdkafka("producer")["linger.ms"] == "5"
    assert "fetch.min.bytes" not in a.librdkafka("producer")
    assert a.librdkafka("admin")["client.rack"] == "r2"
    # Cluster-level keys win over top-level defaults; values are normalised.
    assert config.cluster("B").sasl_mechanism == "SCRAM-SHA-512"


def test_java_only_keys_are_dropped_with_one_warning_each(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(
        tmp_path,
        BASE + "A.consumer.key.deserializer = org.apache.kafka.common.serialization.X\n"
        "A.sasl.login.class = com.acme.Login\nA.ssl.truststore.location = /t.jks\n"
        "A.ssl.truststore.password = tpw\nA.producer.buffer.memory = 1000\n"
        "A.consumer.partition.assignment.strategy = "
        "org.apache.kafka.clients.consumer.RangeAssignor\n",
    )
    conf = config.cluster("A").librdkafka("consumer") | config.cluster("A").librdkafka("producer")
    assert set(conf) == {"bootstrap.servers", "security.protocol"}
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for key in (
        "A.consumer.key.deserializer",
        "A.sasl.login.class",
        "A.ssl.truststore.location",
        "A.ssl.truststore.password",
        "A.producer.buffer.memory",
        "A.consumer.partition.assignment.strategy",
    ):
        assert sum(f": {key}: ignored" in message for message in warned) == 1, key
    assert "tpw" not in caplog.text


def test_java_keys_with_librdkafka_equivalents_are_mapped(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE + "A.ssl.truststore.type = PEM\nA.ssl.truststore.location = /ca.pem\n"
        "A.ssl.keystore.type = PEM\nA.ssl.keystore.location = /me.pem\n"
        "A.ssl.endpoint.identification.algorithm =\nA.send.buffer.bytes = 1024\n"
        "A.producer.max.request.size = 2000000\nA.consumer.fetch.max.wait.ms = 100\n"
        "B.ssl.keystore.type = PKCS12\nB.ssl.keystore.location = /b.p12\n"
        "B.ssl.keystore.password = kpw\n",
    )
    a = config.cluster("A")
    assert a.ssl_ca_location == "/ca.pem"
    assert a.ssl_certificate_location == a.ssl_key_location == "/me.pem"
    consumer = a.librdkafka("consumer")
    assert consumer["ssl.endpoint.identification.algorithm"] == "none"
    assert consumer["socket.send.buffer.bytes"] == "1024"
    assert consumer["fetch.wait.max.ms"] == "100"
    assert a.librdkafka("producer")["message.max.bytes"] == "2000000"
    b = config.cluster("B").librdkafka("admin")
    assert b["ssl.keystore.location"] == "/b.p12" and b["ssl.keystore.password"] == "kpw"


@pytest.mark.parametrize(
    ("jaas", "username", "password"),
    [
        (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            'username="admin" password="pa ss;w=rd";',
            "admin",
            "pa ss;w=rd",
        ),
        (
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            'username="a\\"b" password="c\\\\d"',  # escaped quote and backslash, no ';'
            'a"b',
            "c\\d",
        ),
        (
            "org.apache.kafka.common.security.plain.PlainLoginModule optional "
            "password=pw username=user ;",
            "user",
            "pw",
        ),
    ],
)
def test_jaas_maps_to_sasl_username_and_password(jaas: str, username: str, password: str) -> None:
    assert parse_jaas(jaas, "A.sasl.jaas.config", Path("f")) == {
        "sasl.username": username,
        "sasl.password": password,
    }


def test_explicit_sasl_keys_win_over_jaas(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE + "sasl.jaas.config = org.apache.kafka.common.security.plain.PlainLoginModule "
        'required username="top" password="toppw";\nB.sasl.username = bee\n',
    )
    assert config.cluster("A").sasl_username == "top"
    assert config.cluster("B").sasl_username == "bee"
    assert config.cluster("B").librdkafka("consumer")["sasl.password"] == "toppw"


# --- the properties syntax ---


def test_java_properties_syntax(tmp_path: Path) -> None:
    text = (
        "# comment\n! also a comment\n   \n"
        "a=1\nb: 2\nc 3\n  d   =   4  \n"
        "e = one, \\\n    two, \\\n\tthree\n"
        "f\\=g\\:h = \\u0041\\t\\\\x\\y\n"
        "empty\n"
        "# comment ending in backslash \\\n"
        "i = 5\r\nj = 6\rk = 7"
    )
    entries = [(key, value) for key, value, _ in parse_properties(text, tmp_path / "x")]
    assert entries == [
        ("a", "1"),
        ("b", "2"),
        ("c", "3"),
        ("d", "4"),
        ("e", "one, two, three"),
        ("f=g:h", "A\t\\xy"),
        ("empty", ""),
        ("i", "5"),
        ("j", "6"),
        ("k", "7"),
    ]
    lines = [number for _, _, number in parse_properties("a=1\nb=\\\n 2\nc=3", tmp_path)]
    assert lines == [1, 2, 4]


def test_latin1_properties_are_read(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    path.write_bytes((BASE + "A.client.id = caf\u00e9\n").encode("latin-1"))
    assert load_config(path).cluster("A").librdkafka("admin")["client.id"] == "caf\u00e9"


def test_lookups_of_unknown_clusters_and_flows_are_config_errors(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    with pytest.raises(ConfigError, match="X->A: no such flow"):
        config.flow("X", "A")
    with pytest.raises(ConfigError, match="X: no such cluster"):
        config.cluster("X")


def test_schema_registry_keys(tmp_path: Path) -> None:
    config = load(
        tmp_path,
        BASE
        + "A->B.enabled = true\nB->A.enabled = true\n"
        + "schema.registry.sync.enabled = true\nB->A.schema.registry.sync.enabled = false\n"
        + "A->B.schema.registry.unresolved.ids = copy\n"
        + "A.schema.registry.url = http://a:8081\nB.schema.registry.url = http://b:8081\n"
        + "B.schema.registry.basic.auth.user.info = mirror:pw-registry\n",
    )
    a_to_b, b_to_a = config.flow("A", "B").settings, config.flow("B", "A").settings
    assert a_to_b.schema_registry_sync_enabled and a_to_b.schema_registry_unresolved_ids == "copy"
    assert not b_to_a.schema_registry_sync_enabled
    assert b_to_a.schema_registry_unresolved_ids == "fail"
    b = config.cluster("B")
    assert b.schema_registry_url == "http://b:8081"
    assert b.schema_registry_client() == {
        "url": "http://b:8081",
        "basic.auth.user.info": "mirror:pw-registry",
    }
    assert "pw-registry" not in repr(b) and "pw-registry" not in str(config)
    assert config.cluster("A").librdkafka("consumer") == {
        "bootstrap.servers": "a:9092",
        "security.protocol": "PLAINTEXT",
    }


def test_schema_registry_sync_needs_urls_only_for_enabled_flows(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "schema.registry.sync.enabled = true\n")
    assert config.flow("A", "B").settings.schema_registry_sync_enabled
    assert config.enabled_flows() == []


def test_schema_registry_keys_in_yaml(tmp_path: Path) -> None:
    yaml_text = (
        "clusters:\n"
        "  A:\n    bootstrap.servers: a:9092\n    schema.registry.url: http://a:8081\n"
        "  B:\n    bootstrap.servers: b:9092\n    schema.registry.url: http://b:8081\n"
        "    schema.registry.basic.auth.user.info: mirror:pw-registry\n"
        "A->B:\n  enabled: true\n"
        "schema.registry.sync.enabled: true\n"
    )
    config = load(tmp_path, yaml_text, "mm2.yaml")
    assert config.flow("A", "B").settings.schema_registry_sync_enabled
    assert config.cluster("B").schema_registry_client() == {
        "url": "http://b:8081",
        "basic.auth.user.info": "mirror:pw-registry",
    }


def test_replication_copy_mode_per_flow(tmp_path: Path) -> None:
    """`replication.copy.mode`: auto by default, per flow; record is record even where
    batch could go."""
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\nB->A.enabled = true\nA->B.replication.copy.mode = record \n"
    )
    config = load_config(path)
    a_to_b = config.flow("A", "B").settings
    b_to_a = config.flow("B", "A").settings
    assert (a_to_b.replication_copy_mode, a_to_b.copies_batches) == ("record", False)
    assert (b_to_a.replication_copy_mode, b_to_a.copies_batches) == ("auto", True)
