"""Replication policies behave exactly like MirrorMaker 2 (Kafka 4.1.1).

Expected values come from MM2's own unit tests and from running MM2 4.1.1's
classes on the same inputs.
"""

from __future__ import annotations

import pytest

from mm2py.compat.filters import TopicFilter
from mm2py.compat.policy import (
    DEFAULT_POLICY_CLASS,
    IDENTITY_POLICY_CLASS,
    DefaultReplicationPolicy,
    IdentityReplicationPolicy,
    ReplicationPolicy,
    all_sources,
    checkpoint_topic,
    count_hops,
    is_cycle,
    is_remote_topic,
    policy_from_name,
    should_replicate_topic,
)


class _Everything:
    def should_replicate_topic(self, topic: str) -> bool:
        return True


class _Nothing:
    def should_replicate_topic(self, topic: str) -> bool:
        return False


DEFAULT = DefaultReplicationPolicy()


# --- DefaultReplicationPolicy naming -------------------------------------------


@pytest.mark.parametrize(
    ("topic", "source", "upstream", "original"),
    [
        ("t", None, None, "t"),
        ("a.b", "a", "b", "b"),
        ("A.t", "A", "t", "t"),
        ("B.A.t", "B", "A.t", "t"),
        ("C.B.A.t", "C", "B.A.t", "t"),
        ("a..b", "a", ".b", "b"),
        # Java's split keeps a leading empty part: the source is the empty alias.
        (".t", "", "t", "t"),
        (".a.", "", "a.", "a."),
        # ... and drops trailing empty parts, so these are not remote topics.
        ("t.", None, None, "t."),
        ("...", None, None, "..."),
        (".", None, None, "."),
        ("", None, None, ""),
        ("heartbeats", None, None, "heartbeats"),
        ("B.A.heartbeats", "B", "A.heartbeats", "heartbeats"),
        ("mm2-offset-syncs.B.internal", "mm2-offset-syncs", "B.internal", "internal"),
    ],
)
def test_default_policy_source_upstream_original(
    topic: str, source: str | None, upstream: str | None, original: str
) -> None:
    assert DEFAULT.topic_source(topic) == source
    assert DEFAULT.upstream_topic(topic) == upstream
    assert DEFAULT.original_topic(topic) == original


def test_default_policy_formats_remote_topic_with_source_prefix() -> None:
    assert DEFAULT.format_remote_topic("A", "t") == "A.t"
    assert DEFAULT.format_remote_topic("us-west", "topic1") == "us-west.topic1"
    assert DEFAULT.format_remote_topic("A", "B.heartbeats") == "A.B.heartbeats"


def test_default_policy_internal_topic_names() -> None:
    assert DEFAULT.heartbeats_topic() == "heartbeats"
    assert DEFAULT.offset_syncs_topic("B") == "mm2-offset-syncs.B.internal"
    assert DEFAULT.checkpoints_topic("A") == "A.checkpoints.internal"


@pytest.mark.parametrize(
    ("topic", "source", "upstream", "original"),
    [
        ("A_t", "A", "t", "t"),
        ("A_B_t", "A", "B_t", "t"),
        ("a.b", None, None, "a.b"),
        ("B.A.t", None, None, "B.A.t"),
        ("_t", "", "t", "t"),
        ("t_", None, None, "t_"),
        ("A__B__t", "A", "_B__t", "t"),
        ("A_heartbeats", "A", "heartbeats", "heartbeats"),
    ],
)
def test_custom_separator(
    topic: str, source: str | None, upstream: str | None, original: str
) -> None:
    policy = DefaultReplicationPolicy("_")
    assert policy.topic_source(topic) == source
    assert policy.upstream_topic(topic) == upstream
    assert policy.original_topic(topic) == original
    assert policy.format_remote_topic("A", "t") == "A_t"


@pytest.mark.parametrize(
    ("topic", "source", "upstream", "original"),
    [
        ("A__t", "A", "t", "t"),
        ("A__B__t", "A", "B__t", "t"),
        ("source3__source4__source5__topic6", "source3", "source4__source5__topic6", "topic6"),
        # Matches are taken left to right without overlap, as in Java.
        ("a___b", "a", "_b", "_b"),
        ("A_B_t", None, None, "A_B_t"),
        ("__x", "", "x", "x"),
    ],
)
def test_multi_char_separator(
    topic: str, source: str | None, upstream: str | None, original: str
) -> None:
    policy = DefaultReplicationPolicy("__")
    assert policy.topic_source(topic) == source
    assert policy.upstream_topic(topic) == upstream
    assert policy.original_topic(topic) == original
    assert policy.format_remote_topic("A", "t") == "A__t"


def test_separator_is_used_in_internal_topic_names_by_default() -> None:
    policy = DefaultReplicationPolicy("__")
    assert policy.offset_syncs_topic("CLUSTER") == "mm2-offset-syncs__CLUSTER__internal"
    assert policy.checkpoints_topic("CLUSTER") == "CLUSTER__checkpoints__internal"
    assert policy.heartbeats_topic() == "heartbeats"
    assert DefaultReplicationPolicy("_").offset_syncs_topic("B") == "mm2-offset-syncs_B_internal"


def test_internal_topic_separator_can_be_disabled() -> None:
    policy = DefaultReplicationPolicy("__", internal_topic_separator_enabled=False)
    assert policy.offset_syncs_topic("CLUSTER") == "mm2-offset-syncs.CLUSTER.internal"
    assert policy.checkpoints_topic("CLUSTER") == "CLUSTER.checkpoints.internal"
    assert policy.heartbeats_topic() == "heartbeats"
    # Remote topics still use the custom separator.
    assert policy.format_remote_topic("A", "t") == "A__t"
    assert policy.is_checkpoints_topic("A.checkpoints.internal")
    assert policy.is_mm2_internal_topic("mm2-offset-syncs.B.internal")


def test_empty_separator_is_rejected() -> None:
    with pytest.raises(ValueError, match="separator"):
        DefaultReplicationPolicy("")


# --- heartbeats, checkpoints and internal topics ---------------------------------


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("heartbeats", True),
        ("source1.heartbeats", True),
        ("source2.source1.heartbeats", True),
        ("heartbeats!", False),
        ("!heartbeats", False),
        ("source1heartbeats", False),
        ("source1-heartbeats", False),
        ("heartbeats.x", False),
    ],
)
def test_is_heartbeats_topic(topic: str, expected: bool) -> None:
    assert DEFAULT.is_heartbeats_topic(topic) is expected


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("source1.checkpoints.internal", True),
        ("source2.source1.checkpoints.internal", True),
        ("checkpoints.internal", False),
        ("checkpoints-internal", False),
        ("checkpoints.internal!", False),
        ("!checkpoints.internal", False),
        ("source1checkpointsinternal", False),
    ],
)
def test_is_checkpoints_topic(topic: str, expected: bool) -> None:
    assert DEFAULT.is_checkpoints_topic(topic) is expected


@pytest.mark.parametrize(
    ("topic", "mm2_internal", "internal"),
    [
        ("__consumer_offsets", False, True),
        ("__x", False, True),
        (".hidden", False, True),
        (".hiddentopic", False, True),
        ("mm2-offset-syncs.B.internal", True, True),
        ("A.checkpoints.internal", True, True),
        ("mm2-offsets.A.internal", True, True),
        ("mm2-configs.A.internal", True, True),
        ("mm2-status.A.internal", True, True),
        ("mm2x.internal", True, True),
        # Kafka 4.x (KAFKA-17200): user topics that merely look internal are
        # replicated; only MM2's own `mm2*.internal` names and checkpoints are not.
        ("x.internal", False, False),
        ("x-internal", False, False),
        ("mm2-offsets-A-internal", False, False),
        ("mm2-offsets_CLUSTER_internal", False, False),
        ("connect-offsets", False, False),
        ("connect-configs", False, False),
        ("B.mm2-offset-syncs.A.internal", False, False),
        ("heartbeats", False, False),
        ("t", False, False),
    ],
)
def test_internal_topics(topic: str, mm2_internal: bool, internal: bool) -> None:
    assert DEFAULT.is_mm2_internal_topic(topic) is mm2_internal
    assert DEFAULT.is_internal_topic(topic) is internal


def test_internal_topics_follow_the_custom_separator() -> None:
    policy = DefaultReplicationPolicy("_")
    assert policy.is_internal_topic("mm2-offset-syncs_B_internal")
    assert policy.is_checkpoints_topic("A_checkpoints_internal")
    assert policy.is_internal_topic("A_checkpoints_internal")
    # MM2 no longer recognises the dotted names as its own with `_`.
    assert not policy.is_internal_topic("mm2-offset-syncs.B.internal")
    assert not policy.is_checkpoints_topic("A.checkpoints.internal")
    assert not policy.is_internal_topic("A.checkpoints.internal")
    # The Kafka rules do not depend on the separator.
    assert policy.is_internal_topic("__consumer_offsets")
    assert policy.is_internal_topic(".hidden")


def test_base_class_defaults_match_mm2_interface() -> None:
    class Prefix(ReplicationPolicy):
        def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
            return f"{source_cluster_alias}-{topic}"

        def topic_source(self, topic: str) -> str | None:
            return topic.split("-", 1)[0] if "-" in topic else None

        def upstream_topic(self, topic: str) -> str | None:
            return topic.split("-", 1)[1] if "-" in topic else None

    policy = Prefix()
    assert policy.original_topic("B-A-t") == "t"
    assert policy.offset_syncs_topic("B") == "mm2-offset-syncs.B.internal"
    assert policy.checkpoints_topic("A") == "A.checkpoints.internal"
    assert policy.is_heartbeats_topic("A-heartbeats")
    assert policy.is_checkpoints_topic("A.checkpoints.internal")
    assert policy.is_internal_topic("mm2-offsets.A.internal")
    assert not policy.is_internal_topic("x-internal")


# --- IdentityReplicationPolicy ----------------------------------------------------


def test_identity_keeps_names_except_heartbeats() -> None:
    policy = IdentityReplicationPolicy(source_cluster_alias="primary")
    assert policy.format_remote_topic("primary", "topic1") == "topic1"
    assert policy.topic_source("topic1") == "primary"
    assert policy.upstream_topic("topic1") == "topic1"
    assert policy.original_topic("topic1") == "topic1"
    # Heartbeats are handled like the default policy.
    assert policy.format_remote_topic("backup", "heartbeats") == "backup.heartbeats"
    assert policy.topic_source("backup.heartbeats") == "backup"
    assert policy.upstream_topic("backup.heartbeats") == "heartbeats"
    assert policy.topic_source("heartbeats") is None
    assert policy.original_topic("B.A.heartbeats") == "heartbeats"
    assert policy.is_heartbeats_topic("B.A.heartbeats")


def test_identity_heartbeat_check_is_a_suffix_match() -> None:
    # MM2 tests endsWith("heartbeats"), so this user topic is renamed too.
    policy = IdentityReplicationPolicy(source_cluster_alias="A")
    assert policy.format_remote_topic("A", "myheartbeats") == "A.myheartbeats"
    assert policy.topic_source("myheartbeats") is None
    assert not policy.is_heartbeats_topic("myheartbeats")
    # ... while a name merely starting with it is an ordinary topic.
    assert policy.format_remote_topic("A", "heartbeats.x") == "heartbeats.x"


def test_identity_without_source_alias_has_no_sources() -> None:
    policy = IdentityReplicationPolicy()
    assert policy.topic_source("t") is None
    assert policy.topic_source("A.t") is None
    assert policy.upstream_topic("A.t") == "A.t"
    assert policy.topic_source("A.heartbeats") == "A"


def test_identity_heartbeats_use_the_separator() -> None:
    policy = IdentityReplicationPolicy("_", "A")
    assert policy.format_remote_topic("A", "heartbeats") == "A_heartbeats"
    assert policy.topic_source("A_heartbeats") == "A"
    assert policy.is_heartbeats_topic("A_heartbeats")
    # With `_` a dotted heartbeats name is not recognised as remote.
    assert policy.topic_source("A.heartbeats") is None
    assert not policy.is_heartbeats_topic("A.heartbeats")


def test_identity_internal_topic_names() -> None:
    policy = IdentityReplicationPolicy(source_cluster_alias="A")
    assert policy.offset_syncs_topic("B") == "mm2-offset-syncs.B.internal"
    assert policy.checkpoints_topic("A") == "A.checkpoints.internal"
    assert policy.is_internal_topic("A.checkpoints.internal")
    assert not policy.is_internal_topic("x.internal")


# --- cycles -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "target", "expected"),
    [
        ("B.A.t", "A", True),
        ("A.B.t", "A", True),
        ("A.t", "A", True),
        ("A.t", "B", False),
        ("C.B.A.t", "A", True),
        ("C.B.A.t", "D", False),
        ("t", "A", False),
        ("heartbeats", "A", False),
        ("A.heartbeats", "A", True),
        # The empty alias of a leading separator is compared like any other.
        (".t", "", True),
    ],
)
def test_is_cycle_walks_the_whole_chain(topic: str, target: str, expected: bool) -> None:
    assert is_cycle(DEFAULT, topic, target) is expected


def test_no_cycles_from_source_to_target() -> None:
    for topic in (
        "target.topic1",
        "target.source.topic1",
        "source.target.topic1",
        "target.source.target.topic1",
        "source.target.source.topic1",
    ):
        assert not should_replicate_topic(DEFAULT, _Everything(), topic, "target"), topic
    assert should_replicate_topic(DEFAULT, _Everything(), "topic1", "target")
    assert should_replicate_topic(DEFAULT, _Everything(), "source.topic1", "target")


def test_cycle_detection_with_custom_separator() -> None:
    policy = DefaultReplicationPolicy("_")
    assert is_cycle(policy, "B_A_t", "A")
    assert not is_cycle(policy, "B.A.t", "A")


def test_identity_cannot_detect_cycles() -> None:
    # t copied A->B keeps its name, so from B back to A nothing reveals the loop.
    b_to_a = IdentityReplicationPolicy(source_cluster_alias="B")
    assert not is_cycle(b_to_a, "t", "A")
    a_to_b = IdentityReplicationPolicy(source_cluster_alias="A")
    assert not is_cycle(a_to_b, "t", "B")


def test_identity_replication_allows_everything_but_heartbeat_cycles() -> None:
    policy = IdentityReplicationPolicy()
    for topic in (
        "target.topic1",
        "target.source.topic1",
        "source.target.topic1",
        "target.source.target.topic1",
        "source.target.source.topic1",
        "topic1",
        "othersource.topic1",
        "heartbeats",
        "othersource.heartbeats",
    ):
        assert should_replicate_topic(policy, _Everything(), topic, "target"), topic
    for topic in (
        "target.heartbeats",
        "target.source.heartbeats",
        "source.target.heartbeats",
        "target.source.target.heartbeats",
        "source.target.source.heartbeats",
    ):
        assert not should_replicate_topic(policy, _Everything(), topic, "target"), topic


def test_identity_source_alias_equal_to_target_is_a_cycle() -> None:
    # Only a misconfiguration gets here: MM2 sets the alias to the flow's source.
    policy = IdentityReplicationPolicy(source_cluster_alias="A")
    assert is_cycle(policy, "t", "A")


# --- should_replicate_topic ---------------------------------------------------------


def test_replicates_heartbeats_by_default() -> None:
    topics = TopicFilter()
    assert should_replicate_topic(DEFAULT, topics, "heartbeats", "target")
    assert should_replicate_topic(DEFAULT, topics, "us-west.heartbeats", "target")


def test_replicates_heartbeats_despite_filter() -> None:
    assert should_replicate_topic(DEFAULT, _Nothing(), "heartbeats", "target")
    assert should_replicate_topic(DEFAULT, _Nothing(), "us-west.heartbeats", "target")
    assert not should_replicate_topic(DEFAULT, _Nothing(), "t", "target")


def test_heartbeats_replication_can_be_disabled() -> None:
    assert not should_replicate_topic(
        DEFAULT, _Nothing(), "heartbeats", "target", heartbeats_replication_enabled=False
    )
    # The filter alone still lets them through.
    assert should_replicate_topic(
        DEFAULT, TopicFilter(), "heartbeats", "target", heartbeats_replication_enabled=False
    )


def test_heartbeat_cycles_are_not_replicated() -> None:
    assert not should_replicate_topic(DEFAULT, _Nothing(), "target.heartbeats", "target")
    assert not should_replicate_topic(DEFAULT, _Nothing(), "B.target.heartbeats", "target")


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("t", True),
        ("A.t", True),
        ("x.internal", True),
        ("x-internal", True),
        ("connect-offsets", True),
        ("heartbeats", True),
        # internal
        ("__consumer_offsets", False),
        (".hidden", False),
        ("mm2-offset-syncs.B.internal", False),
        ("A.checkpoints.internal", False),
        ("mm2-offsets.A.internal", False),
        # default topics.exclude
        ("foo.replica", False),
        # cycle
        ("B.A.t", False),
    ],
)
def test_should_replicate_topic_with_default_filter(topic: str, expected: bool) -> None:
    assert should_replicate_topic(DEFAULT, TopicFilter(), topic, "B") is expected


def test_internal_topics_are_never_replicated_even_if_included() -> None:
    everything = TopicFilter([".*"], [])
    assert not should_replicate_topic(DEFAULT, everything, "__consumer_offsets", "B")
    assert not should_replicate_topic(DEFAULT, everything, "A.checkpoints.internal", "B")
    assert not should_replicate_topic(DEFAULT, everything, "mm2-offset-syncs.B.internal", "B")
    assert should_replicate_topic(DEFAULT, everything, "foo.replica", "B")


# --- checkpoints, MirrorClient helpers ----------------------------------------------


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("topic3", "source1.topic3"),
        ("target2.topic3", "topic3"),
        ("source6.topic7", "source1.source6.topic7"),
        # A topic that went target -> source -> ... maps to its original name.
        ("target2.source1.t", "t"),
    ],
)
def test_checkpoint_topic(topic: str, expected: str) -> None:
    assert checkpoint_topic(DEFAULT, topic, "source1", "target2") == expected


def test_checkpoint_topic_with_identity_policy() -> None:
    policy = IdentityReplicationPolicy(source_cluster_alias="A")
    assert checkpoint_topic(policy, "t", "A", "B") == "t"
    assert checkpoint_topic(policy, "heartbeats", "A", "B") == "A.heartbeats"
    assert checkpoint_topic(policy, "B.A.heartbeats", "A", "B") == "heartbeats"


@pytest.mark.parametrize(
    ("topic", "alias", "hops"),
    [
        ("topic", "source", -1),
        ("source", "source", -1),
        ("sourcetopic", "source", -1),
        ("source1.topic", "source2", -1),
        ("source1.topic", "source1", 1),
        ("source2.source1.topic", "source2", 1),
        ("source2.source1.topic", "source1", 2),
        ("source3.source2.source1.topic", "source1", 3),
        ("source3.source2.source1.topic", "source4", -1),
        ("A.B.A.t", "A", 1),
        ("A.B.A.t", "B", 2),
    ],
)
def test_count_hops(topic: str, alias: str, hops: int) -> None:
    assert count_hops(DEFAULT, topic, alias) == hops


def test_count_hops_with_identity_policy() -> None:
    policy = IdentityReplicationPolicy(source_cluster_alias="A")
    assert count_hops(policy, "t", "A") == 1
    assert count_hops(policy, "t", "B") == -1
    assert count_hops(policy, "B.A.heartbeats", "A") == 2
    assert count_hops(IdentityReplicationPolicy(), "t", "A") == -1


def test_all_sources() -> None:
    assert all_sources(DEFAULT, "t") == set()
    assert all_sources(DEFAULT, "C.B.A.t") == {"A", "B", "C"}
    assert all_sources(DEFAULT, "A.B.A.t") == {"A", "B"}
    assert all_sources(DEFAULT, "source3.source4.source5.heartbeats") == {
        "source3",
        "source4",
        "source5",
    }
    identity = IdentityReplicationPolicy(source_cluster_alias="source")
    assert all_sources(identity, "source1.source2.heartbeats") == {"source1", "source2"}
    assert all_sources(identity, "topic1") == {"source"}
    assert all_sources(identity, "heartbeats") == set()


def test_is_remote_topic() -> None:
    assert not is_remote_topic(DEFAULT, "topic1")
    assert is_remote_topic(DEFAULT, "source1.topic4")
    assert is_remote_topic(DEFAULT, "source3.source4.source5.topic6")
    assert not is_remote_topic(DEFAULT, "mm2-offsets.A.internal")
    assert is_remote_topic(DefaultReplicationPolicy("__"), "source1__source2__topic5")
    assert not is_remote_topic(DefaultReplicationPolicy("__"), "source1.topic4")
    # The identity policy considers every topic remote, except plain heartbeats.
    identity = IdentityReplicationPolicy(source_cluster_alias="source")
    assert is_remote_topic(identity, "topic1")
    assert not is_remote_topic(identity, "heartbeats")
    assert is_remote_topic(identity, "backup.heartbeats")


# --- factory ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    [DEFAULT_POLICY_CLASS, "DefaultReplicationPolicy", "default", f"  {DEFAULT_POLICY_CLASS} "],
)
def test_policy_from_name_default(name: str) -> None:
    policy = policy_from_name(name, "_", "A")
    assert type(policy) is DefaultReplicationPolicy
    assert policy.format_remote_topic("A", "t") == "A_t"


@pytest.mark.parametrize("name", [IDENTITY_POLICY_CLASS, "IdentityReplicationPolicy", "identity"])
def test_policy_from_name_identity(name: str) -> None:
    policy = policy_from_name(name, ".", "A")
    assert isinstance(policy, IdentityReplicationPolicy)
    assert policy.source_cluster_alias == "A"
    assert policy.topic_source("t") == "A"
    assert policy.format_remote_topic("A", "t") == "t"


def test_policy_from_name_internal_separator() -> None:
    policy = policy_from_name(DEFAULT_POLICY_CLASS, "__", internal_topic_separator_enabled=False)
    assert policy.offset_syncs_topic("B") == "mm2-offset-syncs.B.internal"
    assert policy_from_name("default", "__").offset_syncs_topic("B") == (
        "mm2-offset-syncs__B__internal"
    )


@pytest.mark.parametrize(
    "name",
    ["com.example.MyPolicy", "org.apache.kafka.connect.mirror.LegacyReplicationPolicy", ""],
)
def test_policy_from_name_rejects_other_classes(name: str) -> None:
    with pytest.raises(ValueError, match=r"replication\.policy\.class") as err:
        policy_from_name(name, ".")
    assert repr(name) in str(err.value)
