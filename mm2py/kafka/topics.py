"""Topic administration on a cluster: internal topics and remote topics.

Many topics are created (or grown) in one request; failures say which topic, which
cluster, why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic

from mm2py.kafka.clients import ADMIN_TIMEOUT, admin_result

log = logging.getLogger(__name__)


class TopicAdminError(RuntimeError):
    """A topic could not be created or grown on a cluster."""


def partition_counts(admin: AdminClient, timeout: float = ADMIN_TIMEOUT) -> dict[str, int]:
    """Every topic of a cluster with its partition count."""
    meta = admin.list_topics(timeout=timeout)
    return {name: len(t.partitions) for name, t in meta.topics.items() if t.error is None}


def topic_partitions(
    admin: AdminClient,
    keep: Callable[[str], bool] = lambda _topic: True,
    timeout: float = ADMIN_TIMEOUT,
) -> list[tuple[str, int]]:
    """Every (topic, partition) of the cluster's topics that `keep` accepts."""
    return [
        (topic, p)
        for topic, n in partition_counts(admin, timeout).items()
        if keep(topic)
        for p in range(n)
    ]


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


def await_topics(
    client: Any, cluster_alias: str, counts: Mapping[str, int], timeout: float = ADMIN_TIMEOUT
) -> None:
    """Return once `client`'s metadata shows every topic of `counts` with at least that
    many partitions (one metadata request for all of them per try).

    For many topics at once, e.g. the remote topics a refresh just created; see
    `await_partitions` for why a client must see them first.
    """
    deadline = time.monotonic() + timeout
    missing = dict(counts)
    while missing:
        try:
            topics = client.list_topics(timeout=min(10.0, timeout)).topics
        except KafkaException:
            topics = {}
        for name in list(missing):
            meta = topics.get(name)
            if meta is not None and meta.error is None and len(meta.partitions) >= missing[name]:
                del missing[name]
        if not missing:
            return
        if time.monotonic() > deadline:
            shown = ", ".join(sorted(missing)[:5]) + (" ..." if len(missing) > 5 else "")
            raise TopicAdminError(
                f"cluster {cluster_alias} does not show all partitions of {len(missing)} "
                f"topic(s) after {timeout:.0f} s: {shown}"
            )
        time.sleep(0.2)


def list_offsets(
    admin: AdminClient,
    cluster_alias: str,
    specs: Mapping[TopicPartition, Any],
    timeout: float = ADMIN_TIMEOUT,
    *,
    committed: bool = True,
) -> dict[tuple[str, int], int]:
    """Offsets by (topic, partition) for OffsetSpecs, as a read_committed consumer sees them
    (`committed` False: as a read_uncommitted one, e.g. the end past open transactions).

    Raises TopicAdminError naming the partition and cluster when one cannot be read.
    """
    if not specs:
        return {}
    isolation = IsolationLevel.READ_COMMITTED if committed else IsolationLevel.READ_UNCOMMITTED
    futures = admin.list_offsets(dict(specs), isolation_level=isolation, request_timeout=timeout)
    out: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        try:
            out[(tp.topic, tp.partition)] = int(admin_result(future, timeout).offset)
        except KafkaException as exc:
            raise TopicAdminError(
                f"reading the offsets of {tp.topic}-{tp.partition} on cluster {cluster_alias}: "
                f"{exc.args[0].str()}"
            ) from None
    return out


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create."""

    name: str
    partitions: int
    replication_factor: int
    config: Mapping[str, str] = field(default_factory=dict)


def create_topics(
    admin: AdminClient,
    cluster_alias: str,
    specs: Sequence[TopicSpec],
    timeout: float = ADMIN_TIMEOUT,
) -> tuple[list[str], dict[str, TopicAdminError]]:
    """Create topics in one CreateTopics request: (created, failures by topic).

    A topic that exists already is neither created nor a failure.
    """
    if not specs:
        return [], {}
    new = [
        NewTopic(
            s.name,
            num_partitions=s.partitions,
            replication_factor=s.replication_factor,
            config=dict(s.config),
        )
        for s in specs
    ]
    by_name = {s.name: s for s in specs}
    created: list[str] = []
    failed: dict[str, TopicAdminError] = {}
    futures = admin.create_topics(new, request_timeout=timeout)
    for name, future in futures.items():
        spec = by_name[name]
        try:
            admin_result(future, timeout)
        except KafkaException as exc:
            err = exc.args[0]
            if err.name() != "TOPIC_ALREADY_EXISTS":
                failed[name] = TopicAdminError(
                    f"cannot create topic {name!r} ({spec.partitions} partitions, replication "
                    f"factor {spec.replication_factor}) on cluster {cluster_alias}: {err.str()}"
                )
            continue
        created.append(name)
    if len(created) == 1:
        name = created[0]
        log.info(
            "created topic %s on cluster %s (%d partitions)",
            name,
            cluster_alias,
            by_name[name].partitions,
        )
    elif created:
        # Thousands of names would make one unreadable line: they go to DEBUG.
        log.info(
            "created %d topics on cluster %s (%d partitions)",
            len(created),
            cluster_alias,
            sum(by_name[n].partitions for n in created),
        )
        log.debug("created on cluster %s: %s", cluster_alias, ", ".join(sorted(created)))
    return created, failed


def create_topic(
    admin: AdminClient,
    cluster_alias: str,
    name: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str] | None = None,
    timeout: float = ADMIN_TIMEOUT,
) -> bool:
    """Create a topic; False if it already exists. Raises TopicAdminError otherwise."""
    spec = TopicSpec(name, partitions, replication_factor, dict(config or {}))
    created, failed = create_topics(admin, cluster_alias, [spec], timeout)
    if name in failed:
        raise failed[name]
    return bool(created)


def grow_topics(
    admin: AdminClient,
    cluster_alias: str,
    counts: Mapping[str, int],
    timeout: float = ADMIN_TIMEOUT,
) -> dict[str, TopicAdminError]:
    """Raise topics' partition counts in one CreatePartitions request: failures by topic."""
    if not counts:
        return {}
    futures = admin.create_partitions(
        [NewPartitions(name, n) for name, n in counts.items()], request_timeout=timeout
    )
    failed: dict[str, TopicAdminError] = {}
    for name, future in futures.items():
        try:
            admin_result(future, timeout)
        except KafkaException as exc:
            failed[name] = TopicAdminError(
                f"cannot add partitions to topic {name!r} on cluster {cluster_alias} "
                f"(to {counts[name]}): {exc.args[0].str()}"
            )
            continue
        log.info("grew topic %s on cluster %s to %d partitions", name, cluster_alias, counts[name])
    return failed


def grow_topic(
    admin: AdminClient,
    cluster_alias: str,
    name: str,
    partitions: int,
    timeout: float = ADMIN_TIMEOUT,
) -> None:
    """Raise a topic's partition count to `partitions`."""
    failed = grow_topics(admin, cluster_alias, {name: partitions}, timeout)
    if name in failed:
        raise failed[name]


def ensure_internal_topic(
    admin: AdminClient,
    cluster_alias: str,
    name: str,
    partitions: int,
    replication_factor: int,
    extra_config: Mapping[str, str] | None = None,
    timeout: float = ADMIN_TIMEOUT,
) -> None:
    """Create one of MM2's compacted internal topics if it is missing."""
    create_topic(
        admin,
        cluster_alias,
        name,
        partitions,
        replication_factor,
        {"cleanup.policy": "compact", **(extra_config or {})},
        timeout,
    )
