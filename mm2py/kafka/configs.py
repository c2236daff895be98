"""Reading topic configurations from a cluster (DescribeConfigs), for config sync and
for creating remote topics with their source's configs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from mm2py.compat.topic_configs import ConfigValue
from mm2py.kafka.clients import ADMIN_TIMEOUT, admin_result, error_text


@dataclass
class TopicConfigs:
    """Topic configurations read from a cluster, and the topics that could not be read."""

    found: dict[str, list[ConfigValue]] = field(default_factory=dict)
    unreadable: dict[str, str] = field(default_factory=dict)  # topic -> why (one line)


def describe_topic_configs(
    admin: AdminClient,
    cluster_alias: str,
    topics: Iterable[str],
    timeout: float = ADMIN_TIMEOUT,
) -> TopicConfigs:
    """Each topic's configuration in one DescribeConfigs request (never raises)."""
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in sorted(set(topics))]
    out = TopicConfigs()
    if not resources:
        return out
    try:
        futures = admin.describe_configs(resources, request_timeout=timeout)
    except KafkaException as exc:
        reason = f"cannot read topic configs on cluster {cluster_alias}: {error_text(exc)}"
        out.unreadable = {r.name: reason for r in resources}
        return out
    for resource, future in futures.items():
        try:
            entries: Mapping[str, Any] = admin_result(future, timeout)
        except KafkaException as exc:
            out.unreadable[resource.name] = (
                f"cannot read the configs of topic {resource.name!r} on cluster "
                f"{cluster_alias}: {error_text(exc)}"
            )
            continue
        out.found[resource.name] = [_config_value(e) for e in entries.values()]
    return out


def _config_value(entry: Any) -> ConfigValue:
    return ConfigValue(
        entry.name,
        entry.value,
        int(entry.source),
        bool(entry.is_read_only),
        bool(entry.is_sensitive),
    )
