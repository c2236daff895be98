"""Replication policies: remote topic names, upstream clusters, cycle detection.

Behaves like MirrorMaker 2 (Kafka 4.1) ``ReplicationPolicy``,
``DefaultReplicationPolicy`` and ``IdentityReplicationPolicy``, plus the pure
decisions that MM2 makes with a policy: ``MirrorSourceConnector.isCycle`` /
``shouldReplicateTopic``, ``MirrorCheckpointTask.renameTopicPartition`` and the
topic helpers of ``MirrorClient``. No I/O.

Vocabulary: a *remote topic* is a copy of a topic from another cluster, e.g.
``us-west.orders`` on the target is the remote topic of ``orders`` on ``us-west``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

__all__ = [
    "DEFAULT_POLICY_CLASS",
    "HEARTBEATS_TOPIC",
    "IDENTITY_POLICY_CLASS",
    "SEPARATOR_DEFAULT",
    "DefaultReplicationPolicy",
    "IdentityReplicationPolicy",
    "ReplicationPolicy",
    "TopicFilterLike",
    "all_sources",
    "checkpoint_topic",
    "count_hops",
    "is_cycle",
    "is_remote_topic",
    "policy_from_name",
    "should_replicate_topic",
]

SEPARATOR_DEFAULT = "."
HEARTBEATS_TOPIC = "heartbeats"

DEFAULT_POLICY_CLASS = "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
IDENTITY_POLICY_CLASS = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"

# Every spelling `replication.policy.class` may take, mapped to the policy kind.
_POLICY_NAMES = {
    DEFAULT_POLICY_CLASS: "default",
    "DefaultReplicationPolicy": "default",
    "default": "default",
    IDENTITY_POLICY_CLASS: "identity",
    "IdentityReplicationPolicy": "identity",
    "identity": "identity",
}


class ReplicationPolicy(ABC):
    """Naming rules for remote topics and MM2's internal topics.

    Subclasses provide the three naming operations; everything else has MM2's
    default behaviour (the default methods of Java's ``ReplicationPolicy``).
    """

    @abstractmethod
    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        """Name on the target of ``topic`` copied from ``source_cluster_alias``."""

    @abstractmethod
    def topic_source(self, topic: str) -> str | None:
        """Alias of the cluster ``topic`` was copied from, or None if not remote."""

    @abstractmethod
    def upstream_topic(self, topic: str) -> str | None:
        """Name of ``topic`` on the cluster it was copied from (one hop), or None."""

    def original_topic(self, topic: str) -> str:
        """Name of the topic on the cluster where it was first produced (all hops).

        Returns ``topic`` itself when it is not a remote topic.
        """
        while True:
            upstream = self.upstream_topic(topic)
            # MM2 stops when there is no upstream or the upstream is the topic
            # itself (identity naming), else it would loop forever.
            if upstream is None or upstream == topic:
                return topic
            topic = upstream

    def heartbeats_topic(self) -> str:
        """Name of the heartbeats topic (``heartbeats``)."""
        return HEARTBEATS_TOPIC

    def offset_syncs_topic(self, cluster_alias: str) -> str:
        """Name of the offset-syncs topic for flows towards ``cluster_alias``."""
        return f"mm2-offset-syncs.{cluster_alias}.internal"

    def checkpoints_topic(self, cluster_alias: str) -> str:
        """Name of the checkpoints topic for groups from ``cluster_alias``."""
        return f"{cluster_alias}.checkpoints.internal"

    def is_heartbeats_topic(self, topic: str) -> bool:
        """True for ``heartbeats`` and its remote copies (``A.heartbeats``, ``B.A.heartbeats``)."""
        return self.heartbeats_topic() == self.original_topic(topic)

    def is_checkpoints_topic(self, topic: str) -> bool:
        """True for a checkpoints topic (``<alias>.checkpoints.internal``)."""
        return topic.endswith(".checkpoints.internal")

    def is_mm2_internal_topic(self, topic: str) -> bool:
        """True for MM2's own topics: ``mm2*.internal`` and checkpoints topics."""
        return (topic.startswith("mm2") and topic.endswith(".internal")) or (
            self.is_checkpoints_topic(topic)
        )

    def is_internal_topic(self, topic: str) -> bool:
        """True for topics that are never replicated: ``__*``, ``.*`` and MM2's own.

        Since Kafka 4.0 (KAFKA-17200) a user topic ending in ``.internal`` or
        ``-internal`` is *not* internal unless it is one of MM2's own topics.
        """
        kafka_internal = topic.startswith("__") or topic.startswith(".")
        return self.is_mm2_internal_topic(topic) or kafka_internal


class DefaultReplicationPolicy(ReplicationPolicy):
    """Prefixes the source cluster alias: ``orders`` from ``A`` becomes ``A.orders``.

    ``separator`` is ``replication.policy.separator``. With
    ``internal_topic_separator_enabled`` (``replication.policy.internal.topic.
    separator.enabled``, default true) the separator is also used in the names of
    the offset-syncs and checkpoints topics; when false those keep ``.``.
    """

    def __init__(
        self,
        separator: str = SEPARATOR_DEFAULT,
        *,
        internal_topic_separator_enabled: bool = True,
    ) -> None:
        if not separator:
            # MM2 would split every name into single characters; refuse instead.
            raise ValueError("replication.policy.separator must not be empty")
        self._separator = separator
        self._internal_topic_separator_enabled = internal_topic_separator_enabled

    @property
    def separator(self) -> str:
        """The separator between source alias and topic in remote topic names."""
        return self._separator

    @property
    def internal_topic_separator_enabled(self) -> bool:
        """Whether the separator is also used in offset-syncs/checkpoints names."""
        return self._internal_topic_separator_enabled

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(separator={self._separator!r}, "
            f"internal_topic_separator_enabled={self._internal_topic_separator_enabled})"
        )

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        """``<source_cluster_alias><separator><topic>``."""
        return f"{source_cluster_alias}{self._separator}{topic}"

    def topic_source(self, topic: str) -> str | None:
        """Text before the first separator, or None if the name has no such prefix.

        Mirrors Java's ``Pattern.split``: trailing empty parts are dropped, so
        ``t.`` has no source, while a leading separator gives the empty alias
        (``.t`` has source ``""``).
        """
        parts = topic.split(self._separator)
        while parts and parts[-1] == "":
            parts.pop()
        if len(parts) < 2:
            return None
        return parts[0]

    def upstream_topic(self, topic: str) -> str | None:
        """Text after the first separator (the name one hop upstream), or None."""
        source = self.topic_source(topic)
        if source is None:
            return None
        return topic[len(source) + len(self._separator) :]

    def _internal_separator(self) -> str:
        return self._separator if self._internal_topic_separator_enabled else "."

    def _internal_suffix(self) -> str:
        return self._internal_separator() + "internal"

    def _checkpoints_topic_suffix(self) -> str:
        return self._internal_separator() + "checkpoints" + self._internal_suffix()

    def offset_syncs_topic(self, cluster_alias: str) -> str:
        """``mm2-offset-syncs.<alias>.internal`` (with the internal separator)."""
        sep = self._internal_separator()
        return f"mm2-offset-syncs{sep}{cluster_alias}{self._internal_suffix()}"

    def checkpoints_topic(self, cluster_alias: str) -> str:
        """``<alias>.checkpoints.internal`` (with the internal separator)."""
        return cluster_alias + self._checkpoints_topic_suffix()

    def is_checkpoints_topic(self, topic: str) -> bool:
        """True if ``topic`` ends like a checkpoints topic of this policy."""
        return topic.endswith(self._checkpoints_topic_suffix())

    def is_mm2_internal_topic(self, topic: str) -> bool:
        """True for ``mm2*<sep>internal`` and this policy's checkpoints topics."""
        return (topic.startswith("mm2") and topic.endswith(self._internal_suffix())) or (
            self.is_checkpoints_topic(topic)
        )


class IdentityReplicationPolicy(DefaultReplicationPolicy):
    """Keeps topic names unchanged on the target (MM1-style one-way mirroring).

    Heartbeats are the exception: any name *ending* in ``heartbeats`` is treated
    exactly as by :class:`DefaultReplicationPolicy`, so heartbeats still show
    their path. Names alone cannot tell where a topic came from, so
    ``topic_source`` answers ``source_cluster_alias`` (MM2's
    ``source.cluster.alias``, set to the flow's source by MM2's connectors) for
    every other topic, and cycles cannot be detected.
    """

    def __init__(
        self,
        separator: str = SEPARATOR_DEFAULT,
        source_cluster_alias: str | None = None,
        *,
        internal_topic_separator_enabled: bool = True,
    ) -> None:
        super().__init__(
            separator, internal_topic_separator_enabled=internal_topic_separator_enabled
        )
        self._source_cluster_alias = source_cluster_alias

    @property
    def source_cluster_alias(self) -> str | None:
        """The alias ``topic_source`` reports for non-heartbeat topics."""
        return self._source_cluster_alias

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(separator={self.separator!r}, "
            f"source_cluster_alias={self._source_cluster_alias!r}, "
            f"internal_topic_separator_enabled={self.internal_topic_separator_enabled})"
        )

    def _looks_like_heartbeat(self, topic: str) -> bool:
        # MM2 uses endsWith, so "myheartbeats" counts as a heartbeats topic here.
        return topic.endswith(self.heartbeats_topic())

    def format_remote_topic(self, source_cluster_alias: str, topic: str) -> str:
        """``topic`` unchanged, except heartbeats which get the source prefix."""
        if self._looks_like_heartbeat(topic):
            return super().format_remote_topic(source_cluster_alias, topic)
        return topic

    def topic_source(self, topic: str) -> str | None:
        """The configured source alias (None if unset); heartbeats as Default."""
        if self._looks_like_heartbeat(topic):
            return super().topic_source(topic)
        return self._source_cluster_alias

    def upstream_topic(self, topic: str) -> str | None:
        """``topic`` itself (any topic may be remote); heartbeats as Default."""
        if self._looks_like_heartbeat(topic):
            return super().upstream_topic(topic)
        return topic


def policy_from_name(
    class_name: str,
    separator: str = SEPARATOR_DEFAULT,
    source_alias: str | None = None,
    *,
    internal_topic_separator_enabled: bool = True,
) -> ReplicationPolicy:
    """Build the policy named by ``replication.policy.class``.

    Accepts MM2's fully-qualified class names, the bare class names and the
    short forms ``default``/``identity``. ``source_alias`` is the flow's source
    cluster; only the identity policy uses it. Raises ValueError for any other
    class, since custom Java policies cannot run here.
    """
    kind = _POLICY_NAMES.get(class_name.strip())
    if kind == "default":
        return DefaultReplicationPolicy(
            separator, internal_topic_separator_enabled=internal_topic_separator_enabled
        )
    if kind == "identity":
        return IdentityReplicationPolicy(
            separator,
            source_alias,
            internal_topic_separator_enabled=internal_topic_separator_enabled,
        )
    raise ValueError(
        f"unsupported replication.policy.class {class_name!r}: "
        f"use {DEFAULT_POLICY_CLASS} or {IDENTITY_POLICY_CLASS}"
    )


class TopicFilterLike(Protocol):
    """Anything that decides by name whether a topic is wanted (see mm2py.compat.filters)."""

    def should_replicate_topic(self, topic: str) -> bool:
        """True if the topic is selected by the filter."""
        ...


def is_cycle(policy: ReplicationPolicy, topic: str, target_alias: str) -> bool:
    """True if ``topic`` already came from ``target_alias`` at some hop.

    Walks the chain like ``MirrorSourceConnector.isCycle``: the topic's source is
    checked, then the upstream topic's, until a topic has no source or is its own
    upstream. With the identity policy only heartbeats can be recognised.
    """
    while True:
        source = policy.topic_source(topic)
        if source is None:
            return False
        if source == target_alias:
            return True
        upstream = policy.upstream_topic(topic)
        if upstream is None or upstream == topic:
            return False
        topic = upstream


def should_replicate_topic(
    policy: ReplicationPolicy,
    topic_filter: TopicFilterLike,
    topic: str,
    target_alias: str,
    *,
    heartbeats_replication_enabled: bool = True,
) -> bool:
    """Whether a flow to ``target_alias`` copies ``topic``, as MirrorSourceConnector decides.

    The topic must pass the filter, or be a heartbeats topic (when
    ``heartbeats.replication.enabled``, the default), and must be neither
    internal nor a cycle. Heartbeats therefore flow even when ``topics``
    excludes them; checkpoints and offset-syncs topics never do.
    """
    wanted = topic_filter.should_replicate_topic(topic) or (
        heartbeats_replication_enabled and policy.is_heartbeats_topic(topic)
    )
    return (
        wanted and not policy.is_internal_topic(topic) and not is_cycle(policy, topic, target_alias)
    )


def checkpoint_topic(
    policy: ReplicationPolicy, topic: str, source_alias: str, target_alias: str
) -> str:
    """Topic name on the target for a group's offsets on source ``topic``.

    As ``MirrorCheckpointTask.renameTopicPartition``: a topic that was itself
    copied from the target maps back to its original name; any other topic maps
    to its remote name.
    """
    if policy.topic_source(topic) == target_alias:
        return policy.original_topic(topic)
    return policy.format_remote_topic(source_alias, topic)


def is_remote_topic(policy: ReplicationPolicy, topic: str) -> bool:
    """True if ``topic`` is a non-internal copy from another cluster (MirrorClient)."""
    return not policy.is_internal_topic(topic) and policy.topic_source(topic) is not None


def all_sources(policy: ReplicationPolicy, topic: str) -> set[str]:
    """Every cluster alias on ``topic``'s upstream chain (MirrorClient.allSources)."""
    sources: set[str] = set()
    source = policy.topic_source(topic)
    while source is not None and source not in sources:
        sources.add(source)
        upstream = policy.upstream_topic(topic)
        if upstream is None:
            break
        topic = upstream
        source = policy.topic_source(topic)
    return sources


def count_hops(policy: ReplicationPolicy, topic: str, source_alias: str) -> int:
    """Hops from cluster ``source_alias`` to the cluster holding ``topic``, or -1.

    As ``MirrorClient.countHopsForTopic``: ``A.t`` is 1 hop from ``A``,
    ``B.A.t`` is 2 hops from ``A``; -1 if ``source_alias`` is not upstream.
    """
    hops = 0
    visited: set[str] = set()
    current: str | None = topic
    while current is not None:
        hops += 1
        source = policy.topic_source(current)
        if source is None:
            return -1
        if source == source_alias:
            return hops
        if source in visited:
            return -1
        visited.add(source)
        current = policy.upstream_topic(current)
    # Java would fail on a null upstream here; only a custom policy gets this far.
    return -1
