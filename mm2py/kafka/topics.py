"""Topic administration on a cluster: internal topics and remote topics.

Planning (which remote topics to create or grow) is pure; applying the plan
is a few AdminClient calls whose failures say which topic, which cluster, why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

log = logging.getLogger(__name__)

ADMIN_TIMEOUT = 30.0


class TopicAdminError(RuntimeError):
    """A topic could not be created or grown on a cluster."""


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


def partition_counts(admin: AdminClient, timeout: float = ADMIN_TIMEOUT) -> dict[str, int]:
    """Every topic of a cluster with its partition count."""
    meta = admin.list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def await_partitions(
    client: Any,
    cluster_alias: str,
    name: str,
    at_least: int = 1,
    timeout: float = ADMIN_TIMEOUT,
) -> int:
    """The partition count of `name` once `client`'s metadata shows at least `at_least`.

    A topic created a moment ago may still be missing from the metadata, or show no
    partitions; producing to it then fails with "unknown partition". `client` is any
    confluent-kafka client (each has its own metadata cache).
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            meta = client.list_topics(name, timeout=min(10.0, timeout)).topics.get(name)
        except KafkaException:
            meta = None
        if meta is not None and meta.error is None and len(meta.partitions) >= at_least:
            return len(meta.partitions)
        if time.monotonic() > deadline:
            raise TopicAdminError(
                f"cluster {cluster_alias} does not show {at_least} partition(s) of topic "
                f"{name!r} after {timeout:.0f} s"
            )
        time.sleep(0.2)


def list_offsets(
    admin: AdminClient, cluster_alias: str, specs: Mapping[TopicPartition, Any]
) -> dict[tuple[str, int], int]:
    """Offsets by (topic, partition) for OffsetSpecs, as a read_committed consumer sees them.

    Raises TopicAdminError naming the partition and cluster when one cannot be read.
    """
    if not specs:
        return {}
    futures = admin.list_offsets(
        dict(specs), isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=ADMIN_TIMEOUT
    )
    out: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        try:
            out[(tp.topic, tp.partition)] = int(future.result(timeout=ADMIN_TIMEOUT).offset)
        except KafkaException as exc:
            raise TopicAdminError(
                f"reading the offsets of {tp.topic}-{tp.partition} on cluster {cluster_alias}: "
                f"{exc.args[0].str()}"
            ) from None
    return out


def create_topic(
    admin: AdminClient,
    cluster_alias: str,
    name: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str] | None = None,
) -> bool:
    """Create a topic; False if it already exists. Raises TopicAdminError otherwise."""
    new = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    try:
        admin.create_topics([new], request_timeout=ADMIN_TIMEOUT)[name].result(
            timeout=ADMIN_TIMEOUT
        )
    except KafkaException as exc:
        err = exc.args[0]
        if err.name() == "TOPIC_ALREADY_EXISTS":
            return False
        raise TopicAdminError(
            f"cannot create topic {name!r} ({partitions} partitions, replication factor "
            f"{replication_factor}) on cluster {cluster_alias}: {err.str()}"
        ) from None
    log.info("created topic %s on cluster %s (%d partitions)", name, cluster_alias, partitions)
    return True


def grow_topic(admin: AdminClient, cluster_alias: str, name: str, partitions: int) -> None:
    """Raise a topic's partition count to `partitions`."""
    try:
        admin.create_partitions([NewPartitions(name, partitions)], request_timeout=ADMIN_TIMEOUT)[
            name
        ].result(timeout=ADMIN_TIMEOUT)
    except KafkaException as exc:
        err = exc.args[0]
        raise TopicAdminError(
            f"cannot add partitions to topic {name!r} on cluster {cluster_alias} "
            f"(to {partitions}): {err.str()}"
        ) from None
    log.info("grew topic %s on cluster %s to %d partitions", name, cluster_alias, partitions)


def ensure_internal_topic(
    admin: AdminClient,
    cluster_alias: str,
    name: str,
    partitions: int,
    replication_factor: int,
    extra_config: Mapping[str, str] | None = None,
) -> None:
    """Create one of MM2's compacted internal topics if it is missing."""
    create_topic(
        admin,
        cluster_alias,
        name,
        partitions,
        replication_factor,
        {"cleanup.policy": "compact", **(extra_config or {})},
    )
