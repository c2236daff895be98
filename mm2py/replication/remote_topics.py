"""Remote topics: which to create or grow (pure), and doing it in batches.

A remote topic gets its source topic's partition count and its synced configs
(mm2py.compat.topic_configs) at creation; counts never shrink. All the topics one
refresh needs are created in one CreateTopics request and grown in one
CreatePartitions request: 500 new topics cost two requests, not 500.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka.admin import AdminClient

from mm2py.compat.topic_configs import ConfigPropertyFilter, creation_configs
from mm2py.config.rules import FlowRules
from mm2py.kafka.configs import describe_topic_configs
from mm2py.kafka.topics import TopicSpec, create_topics, grow_topics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RemoteTopicPlan:
    """What the target needs so that every replicated source topic has a copy."""

    create: dict[str, int]  # remote topic -> partitions
    grow: dict[str, int]  # remote topic -> new partition count


def plan_remote_topics(wanted: Mapping[str, int], existing: Mapping[str, int]) -> RemoteTopicPlan:
    """Compare the partition counts the remote topics need with what the target has.

    Counts never shrink: a remote topic with more partitions than its source
    keeps them.
    """
    create = {t: n for t, n in wanted.items() if t not in existing}
    grow = {t: n for t, n in wanted.items() if t in existing and existing[t] < n}
    return RemoteTopicPlan(create, grow)


@dataclass
class RemoteTopicsResult:
    """What `ensure_remote_topics` did, by source topic."""

    ready: set[str] = field(default_factory=set)  # their remote topic has every partition
    failed: dict[str, str] = field(default_factory=dict)  # source topic -> why not (one line)
    changed: dict[str, int] = field(default_factory=dict)  # remote topics created or grown


def ensure_remote_topics(
    rules: FlowRules,
    source_admin: AdminClient,
    target_admin: AdminClient,
    topics: Mapping[str, int],
    target_counts: Mapping[str, int],
    prop_filter: ConfigPropertyFilter,
) -> RemoteTopicsResult:
    """Create or grow the remote topics of `topics` (source topic -> partitions).

    `target_counts` is what the target has now. A remote topic is never created
    without its source's configs: with the target's default retention, old
    records would be deleted at once; such a topic is reported failed instead.
    """
    flow = rules.flow
    remote_of = {t: rules.remote_topic(t) for t in topics}
    source_of = {remote: t for t, remote in remote_of.items()}
    plan = plan_remote_topics({remote_of[t]: n for t, n in topics.items()}, target_counts)
    result = RemoteTopicsResult()
    timeout = rules.settings.admin_timeout
    creating = [source_of[r] for r in plan.create]
    configs = describe_topic_configs(source_admin, flow.source, creating, timeout)
    for topic, reason in configs.unreadable.items():
        result.failed[topic] = f"{reason}; not creating {remote_of[topic]} yet"
    specs = [
        TopicSpec(
            remote,
            partitions,
            rules.settings.replication_factor,
            creation_configs(configs.found[source_of[remote]], prop_filter),
        )
        for remote, partitions in sorted(plan.create.items())
        if source_of[remote] in configs.found
    ]
    _created, create_failed = create_topics(target_admin, flow.target, specs, timeout)
    grow_failed = grow_topics(target_admin, flow.target, plan.grow, timeout)
    for remote, exc in {**create_failed, **grow_failed}.items():
        result.failed[source_of[remote]] = str(exc)
    # Created, grown, or created meanwhile by someone else (it exists: not a failure).
    for remote, partitions in [*plan.create.items(), *plan.grow.items()]:
        if source_of[remote] not in result.failed:
            result.changed[remote] = partitions
    result.ready = {t for t in topics if t not in result.failed}
    return result
