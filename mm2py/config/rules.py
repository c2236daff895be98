"""The naming and filtering rules of one flow, built once from its settings (pure);
and the name of the group a flow's nodes form (`group_id`)."""

from __future__ import annotations

from typing import TypeVar

from mm2py.compat.filters import GroupFilter, TopicFilter
from mm2py.compat.policy import ReplicationPolicy, policy_from_name, should_replicate_topic
from mm2py.config.models import FlowConfig, FlowSettings

T = TypeVar("T")


def group_id(prefix: str, source: str, target: str) -> str:
    """The consumer group on the target cluster whose members are the flow's nodes
    (``cluster.group.prefix``, default mm2py)."""
    return f"{prefix}-{source}->{target}"


class FlowRules:
    """Which topics a flow copies and what they are called on the target."""

    def __init__(self, flow: FlowConfig) -> None:
        self.flow = flow
        self.settings: FlowSettings = flow.settings
        s = self.settings
        self.policy: ReplicationPolicy = policy_from_name(
            s.replication_policy_class,
            s.replication_policy_separator,
            source_alias=flow.source,
            internal_topic_separator_enabled=s.replication_policy_internal_topic_separator_enabled,
        )
        self.topic_filter = TopicFilter(s.topics, s.topics_exclude)
        self.group_filter = GroupFilter(s.groups, s.groups_exclude)
        self._remote: dict[str, str] = {}

    def should_replicate(self, topic: str) -> bool:
        """MM2's decision: passes the filter (or is a heartbeats topic), not internal, no cycle."""
        return should_replicate_topic(self.policy, self.topic_filter, topic, self.flow.target)

    def remote_topic(self, topic: str) -> str:
        """The name of `topic`'s copy on the target."""
        remote = self._remote.get(topic)
        if remote is None:
            remote = self._remote[topic] = self.policy.format_remote_topic(self.flow.source, topic)
        return remote

    def offset_syncs_holder(self, source: T, target: T) -> T:
        """Of the flow's source and target (their aliases, configs or clients), the one whose
        cluster holds the offset syncs (``offset-syncs.topic.location``): the one place
        that decides it."""
        return source if self.settings.offset_syncs_topic_location == "source" else target

    @property
    def offset_syncs_topic(self) -> str:
        """`mm2-offset-syncs.<target>.internal`, kept where offset-syncs.topic.location says."""
        return self.policy.offset_syncs_topic(self.flow.target)

    @property
    def refresh_topics_interval(self) -> float:
        """Seconds between looks for new topics and partitions (MM2: -1 or disabled = never)."""
        s = self.settings
        if not s.refresh_topics_enabled or s.refresh_topics_interval_seconds < 0:
            return float("inf")
        return float(s.refresh_topics_interval_seconds)
