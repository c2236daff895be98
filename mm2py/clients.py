"""The one place Kafka clients are built.

Every client gets its connection settings from a cluster's config
(`ClusterConfig.librdkafka(role)`) or, for local test clusters, from the
launcher's recorded properties; tuning for a job is passed as `overrides`.
librdkafka's own log lines go through Python logging, never to stderr.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("mm2py.librdkafka")


def _settings(props: Mapping[str, str], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    settings: dict[str, Any] = dict(props)
    if overrides:
        settings.update(overrides)
    settings.setdefault("logger", _librdkafka_log)
    return settings


def admin_client(
    props: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> AdminClient:
    """An AdminClient for the cluster described by `props`."""
    return AdminClient(_settings(props, overrides))


def producer(props: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Producer:
    """A Producer for the cluster described by `props`."""
    return Producer(_settings(props, overrides))


def consumer(props: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Consumer:
    """A Consumer for the cluster described by `props` (group.id defaults to none)."""
    settings = _settings(props, overrides)
    settings.setdefault("group.id", "mm2py-unused")
    settings.setdefault("enable.auto.commit", False)
    return Consumer(settings)


def describe_cluster(props: Mapping[str, str], timeout: float = 3.0) -> bool:
    """True when the cluster answers a describe-cluster request in time."""
    admin = admin_client(props, {"log_level": 0})
    try:
        admin.describe_cluster(request_timeout=timeout).result(timeout=timeout + 1)
    except Exception:  # any failure means "not ready yet"; callers poll with a deadline
        return False
    return True
