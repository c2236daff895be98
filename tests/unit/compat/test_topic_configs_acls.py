"""Topic config and ACL sync decisions (MM2's rules), and the identity-loop refusal. No broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm2py.compat.acls import TopicAcl, missing_acls, target_acls
from mm2py.compat.topic_configs import (
    SOURCE_DEFAULT,
    SOURCE_STATIC_BROKER,
    SOURCE_TOPIC,
    ConfigPropertyFilter,
    ConfigValue,
    config_changes,
    creation_configs,
)
from mm2py.config import ConfigError, load_config
from mm2py.config.loops import candidate_topics
from mm2py.config.models import DEFAULT_CONFIG_PROPERTIES_EXCLUDE

DYNAMIC_DEFAULT_BROKER = 3
MM2_FILTER = ConfigPropertyFilter(DEFAULT_CONFIG_PROPERTIES_EXCLUDE)

SOURCE = [
    ConfigValue("retention.ms", "3600000", SOURCE_TOPIC),
    ConfigValue("cleanup.policy", "compact", SOURCE_TOPIC),
    ConfigValue("segment.bytes", "1073741824", SOURCE_DEFAULT),
    ConfigValue("max.message.bytes", "1048588", SOURCE_DEFAULT),
    ConfigValue("flush.messages", "1", SOURCE_STATIC_BROKER),  # server.properties
    ConfigValue("min.insync.replicas", "2", SOURCE_TOPIC),  # excluded by MM2's default list
    ConfigValue("message.timestamp.type", "LogAppendTime", SOURCE_TOPIC),  # excluded too
    ConfigValue("compression.type", "zstd", DYNAMIC_DEFAULT_BROKER),  # differs from the default
    ConfigValue("secret.thing", None, SOURCE_TOPIC, sensitive=True),
    ConfigValue("read.only.thing", "1", SOURCE_TOPIC, read_only=True),
]


def test_remote_topics_are_created_with_the_non_default_configs_minus_exclusions() -> None:
    assert creation_configs(SOURCE, MM2_FILTER) == {
        "retention.ms": "3600000",
        "cleanup.policy": "compact",
        "compression.type": "zstd",
    }


def test_exclude_patterns_match_whole_names_like_java() -> None:
    prop_filter = ConfigPropertyFilter([r"retention\..*", "cleanup"])
    assert not prop_filter.should_replicate("retention.ms")
    assert prop_filter.should_replicate("cleanup.policy")  # `cleanup` must match the whole name
    assert ConfigPropertyFilter([]).should_replicate("min.insync.replicas")


def test_sync_sets_what_differs_and_removes_overrides_the_source_does_not_have() -> None:
    target = [
        ConfigValue("retention.ms", "604800000", SOURCE_DEFAULT),
        ConfigValue("cleanup.policy", "compact", SOURCE_TOPIC),  # already equal: no op
        ConfigValue("segment.bytes", "1000000", SOURCE_TOPIC),  # source is default: removed
        ConfigValue("max.message.bytes", "1048588", SOURCE_DEFAULT),  # both default: no op
        ConfigValue("min.insync.replicas", "1", SOURCE_TOPIC),  # excluded: left alone
        ConfigValue("compression.type", "zstd", DYNAMIC_DEFAULT_BROKER),  # same value, not a
        # topic override: set so the remote topic keeps it whatever the target's brokers say
    ]
    changes = config_changes(SOURCE, target, MM2_FILTER)
    assert changes.set == {"retention.ms": "3600000", "compression.type": "zstd"}
    assert changes.delete == ("segment.bytes",)
    assert changes.describe() == (
        "set compression.type=zstd, retention.ms=3600000; removed segment.bytes"
    )


def test_nothing_to_do_when_the_remote_topic_already_matches() -> None:
    target = [
        ConfigValue("retention.ms", "3600000", SOURCE_TOPIC),
        ConfigValue("cleanup.policy", "compact", SOURCE_TOPIC),
        ConfigValue("compression.type", "zstd", SOURCE_TOPIC),
        ConfigValue("segment.bytes", "1073741824", SOURCE_DEFAULT),
    ]
    assert not config_changes(SOURCE, target, MM2_FILTER)


def _acl(topic: str, op: str, perm: str = "ALLOW", who: str = "User:alice", pattern: str = "LITERAL"
         ) -> TopicAcl:  # fmt: skip
    return TopicAcl(topic, who, "*", op, perm, pattern)


def test_acls_follow_mm2s_rules() -> None:
    source = [
        _acl("orders", "READ"),
        _acl("orders", "WRITE"),  # ALLOW WRITE: dropped
        _acl("orders", "ALL", who="User:bob"),  # ALLOW ALL -> ALLOW READ
        _acl("orders", "WRITE", perm="DENY", who="User:mallory"),  # DENY: copied as is
        _acl("orders", "ALL", perm="DENY", who="User:eve"),  # DENY ALL stays ALL
        _acl("ord", "READ", pattern="PREFIXED"),  # only LITERAL bindings
        _acl("payments", "READ"),  # not replicated
        _acl("A.orders", "READ"),  # a copy from the target itself: a cycle
    ]
    wanted = target_acls(
        source,
        lambda t: t in ("orders", "ord", "A.orders"),
        lambda t: f"A.{t}",
    )
    assert wanted == sorted(
        [
            _acl("A.orders", "READ"),
            _acl("A.orders", "READ", who="User:bob"),
            _acl("A.orders", "WRITE", perm="DENY", who="User:mallory"),
            _acl("A.orders", "ALL", perm="DENY", who="User:eve"),
            _acl("A.A.orders", "READ"),
        ]
    )
    # The same READ from ALLOW READ and from ALLOW ALL is one binding.
    assert target_acls([_acl("t", "READ"), _acl("t", "ALL")], bool, str) == [_acl("t", "READ")]


def test_only_missing_acls_are_created() -> None:
    wanted = [_acl("A.t", "READ"), _acl("A.t", "READ", who="User:bob")]
    assert missing_acls(wanted, [_acl("A.t", "READ"), _acl("other", "READ")]) == [wanted[1]]


# -- the identity-policy loop refusal -------------------------------------------------------

IDENTITY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"


def _two_way(tmp_path: Path, lines: str, policy: str = IDENTITY) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        f"A->B.enabled = true\nB->A.enabled = true\nreplication.policy.class = {policy}\n" + lines
    )
    return path


@pytest.mark.parametrize(
    ("lines", "shared"),
    [
        ("", "x"),  # MM2's default topics = .*
        ("A->B.topics = orders, payments\nB->A.topics = orders, payments\n", "orders"),
        ("A->B.topics = .*\nB->A.topics = orders-eu\n", "orders-eu"),
        # In a properties file a regex backslash is written twice.
        ("A->B.topics = orders\\\\..*\nB->A.topics = orders\\\\.eu\n", "orders.eu"),
        ("A->B.topics = orders.*\nB->A.topics = ord.*\n", "orders"),
        ("A->B.topics = .*-events\nB->A.topics = click.*\n", "click-events"),
        # Mixed policies loop as well: B.t on A comes back to B under its own name.
        ("A->B.replication.policy.class = DefaultReplicationPolicy\n", "x"),
    ],
)
def test_two_way_identity_with_overlapping_topics_is_refused(
    tmp_path: Path, lines: str, shared: str
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_two_way(tmp_path, lines))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{tmp_path / 'mm2.properties'}: A->B.topics: ")
    assert f"would copy topic {shared!r}" in message
    assert "IdentityReplicationPolicy" in message


@pytest.mark.parametrize(
    "lines",
    [
        "A->B.topics = us-.*\nB->A.topics = eu-.*\n",
        "A->B.topics = orders\nB->A.topics = payments\n",
        # Excludes make the sets disjoint although one side lists .*.
        "A->B.topics = .*\nA->B.topics.exclude = from-b-.*\nB->A.topics = from-b-.*\n",
        "B->A.enabled = false\n",
    ],
)
def test_two_way_identity_with_disjoint_topics_or_one_way_is_accepted(
    tmp_path: Path, lines: str
) -> None:
    config = load_config(_two_way(tmp_path, lines))
    assert config.enabled_flows()


def test_two_way_default_policy_is_accepted(tmp_path: Path) -> None:
    path = _two_way(tmp_path, "", policy="org.apache.kafka.connect.mirror.DefaultReplicationPolicy")
    assert len(load_config(path).enabled_flows()) == 2


def test_candidates_come_from_literal_beginnings_and_endings() -> None:
    names = candidate_topics([r"orders\.eu-.*", ".*-events$", "ab?c"])
    assert "orders.eu-" in names and "orders.eu-x" in names
    assert "x-events" in names
    assert "a" in names and "ax" in names


CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.mark.parametrize(
    ("name", "flows", "policy"),
    [
        ("active-active", ["A->B", "B->A"], "DefaultReplicationPolicy"),
        ("fan-in", ["A->C", "B->C"], "DefaultReplicationPolicy"),
        ("chain", ["A->B", "B->C"], "DefaultReplicationPolicy"),
        ("identity", ["A->B"], "IdentityReplicationPolicy"),
        ("secured", ["D->E"], "DefaultReplicationPolicy"),
    ],
)
def test_example_configs_load(name: str, flows: list[str], policy: str) -> None:
    config = load_config(CONFIGS / f"{name}.properties")
    assert [f.name for f in config.enabled_flows()] == flows
    assert {f.settings.replication_policy_class for f in config.enabled_flows()} == {policy}


def test_secured_example_maps_the_jaas_line_to_librdkafka() -> None:
    props = load_config(CONFIGS / "secured.properties").cluster("D").librdkafka("admin")
    assert props["security.protocol"] == "SASL_PLAINTEXT"
    assert props["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (props["sasl.username"], props["sasl.password"]) == ("admin", "change-me")
