"""Reading topic configurations from a cluster (DescribeConfigs), for config sync and
for creating remote topics with their source's configs."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from mm2py.compat.topic_configs import ConfigPropertyFilter, ConfigValue, creation_configs
from mm2py.kafka.clients import error_text
from mm2py.kafka.topics import ADMIN_TIMEOUT


def describe_topic_configs(
    admin: AdminClient, cluster_alias: str, topics: Iterable[str]
) -> dict[str, list[ConfigValue] | str]:
    """Each topic's configuration, or the reason it could not be read (never raises)."""
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in sorted(set(topics))]
    if not resources:
        return {}
    out: dict[str, list[ConfigValue] | str] = {}
    try:
        futures = admin.describe_configs(resources, request_timeout=ADMIN_TIMEOUT)
    except KafkaException as exc:
        reason = f"cannot read topic configs on cluster {cluster_alias}: {error_text(exc)}"
        return {r.name: reason for r in resources}
    for resource, future in futures.items():
        try:
            entries: Mapping[str, Any] = future.result(timeout=ADMIN_TIMEOUT)
        except KafkaException as exc:
            out[resource.name] = (
                f"cannot read the configs of topic {resource.name!r} on cluster "
                f"{cluster_alias}: {error_text(exc)}"
            )
            continue
        out[resource.name] = [_config_value(e) for e in entries.values()]
    return out


def _config_value(entry: Any) -> ConfigValue:
    return ConfigValue(
        entry.name,
        entry.value,
        int(entry.source),
        bool(entry.is_read_only),
        bool(entry.is_sensitive),
    )


def remote_topic_configs(
    admin: AdminClient,
    cluster_alias: str,
    topics: Iterable[str],
    prop_filter: ConfigPropertyFilter,
) -> dict[str, dict[str, str] | str]:
    """For new remote topics: each source topic's creation configs, or why they are unknown."""
    return {
        topic: entries if isinstance(entries, str) else creation_configs(entries, prop_filter)
        for topic, entries in describe_topic_configs(admin, cluster_alias, topics).items()
    }
