"""Consumer-group administration on one cluster: list groups, read, describe and set offsets.

Used by the checkpoint part and by translate-offsets. Reading calls log a group they
cannot read and leave it out (one unreadable group must not stop the others);
`commit_group_offsets` raises, since its caller decides what a refused commit means.

No call here sends librdkafka's admin requests to a group coordinator (ListConsumerGroup-
Offsets, DescribeConsumerGroups, AlterConsumerGroupOffsets): librdkafka aborts the process
in them when the coordinator answers NOT_COORDINATOR or its connection drops, as happens
while a broker restarts. Offsets are read and committed by a consumer of the group that
never joins it; groups are described over Kafka's protocol (mm2py.kafka.group_describe).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from mm2py.kafka import clients, group_describe
from mm2py.kafka.clients import ADMIN_TIMEOUT, admin_result

log = logging.getLogger(__name__)

# How many groups' committed offsets are read at once (a consumer, so a librdkafka
# instance, each).
READERS = 8


@dataclass(frozen=True, slots=True)
class CommittedOffset:
    """A group's committed position in one partition."""

    offset: int
    metadata: str = ""


GroupOffsets = Mapping[tuple[str, int], CommittedOffset]


@dataclass(frozen=True, slots=True)
class GroupActivity:
    """Whether a group has members on a cluster."""

    state: str
    members: int

    @property
    def idle(self) -> bool:
        return self.members == 0


def list_groups(admin: AdminClient, timeout: float = ADMIN_TIMEOUT) -> list[str]:
    """The ids of every consumer group of a cluster (raises KafkaException)."""
    listed = admin_result(admin.list_consumer_groups(request_timeout=timeout), timeout)
    return [g.group_id for g in listed.valid]


def read_committed(
    consumer_props: Mapping[str, str],
    wanted: Mapping[str, Iterable[tuple[str, int]]],
    cluster_alias: str,
    timeout: float = ADMIN_TIMEOUT,
) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
    """Each group's committed offsets in the partitions asked for it (group -> partitions).

    Read through a consumer of the group that never joins it (librdkafka's committed()),
    not the admin API: librdkafka's ListConsumerGroupOffsets crashes the process (up to
    2.16 at least, librdkafka issue 5040) when the coordinator answers NOT_COORDINATOR,
    as a broker does for a moment after a pause or on a cluster just started: it asks
    the admin client's consumer group, which it has none of, to find the coordinator.

    Up to READERS groups are read at once, all within `timeout` seconds. A group that
    cannot be read in time is logged and left out; so are partitions it never committed.
    """
    groups = {group: sorted(set(parts)) for group, parts in wanted.items()}
    if not groups:
        return {}
    deadline = time.monotonic() + timeout

    def read(group: str) -> dict[tuple[str, int], CommittedOffset]:
        asked = [TopicPartition(t, p) for t, p in groups[group]]
        if not asked:
            return {}
        left = deadline - time.monotonic()
        if left <= 0:
            late = KafkaError(KafkaError._TIMED_OUT, f"not read within {timeout:.0f} s")
            raise KafkaException(late)
        consumer = clients.consumer(consumer_props, {"group.id": group})
        try:
            answered = consumer.committed(asked, timeout=left)
        finally:
            consumer.close()
        return {
            (tp.topic, tp.partition): CommittedOffset(tp.offset, tp.metadata or "")
            for tp in answered
            if tp.error is None and tp.offset >= 0
        }

    out: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
    with ThreadPoolExecutor(min(READERS, len(groups)), "group-offsets") as pool:
        futures = {group: pool.submit(read, group) for group in groups}
        for group, future in futures.items():
            try:
                out[group] = future.result()
            except KafkaException as exc:
                log.error(
                    "reading offsets of group %s on cluster %s: %s",
                    group,
                    cluster_alias,
                    clients.error_text(exc),
                )
    return out


def describe_groups(
    props: Mapping[str, str],
    groups: Iterable[str],
    cluster_alias: str,
    timeout: float = ADMIN_TIMEOUT,
) -> dict[str, GroupActivity]:
    """State and member count of each group; groups that cannot be described are logged
    and left out. Described over Kafka's protocol (mm2py.kafka.group_describe), as
    librdkafka's DescribeConsumerGroups can abort the process.

    A group that is rebalancing counts as having members.
    """
    described = group_describe.describe_groups(props, list(groups), timeout)
    for group, why in sorted(described.failures.items()):
        log.error("describing group %s on cluster %s: %s", group, cluster_alias, why)
    out: dict[str, GroupActivity] = {}
    for group, desc in described.groups.items():
        members = len(desc.members)
        if not desc.idle:
            members = max(members, 1)  # rebalancing: treat as active
        out[group] = GroupActivity(desc.state, members)
    return out


def commit_group_offsets(
    consumer_props: Mapping[str, str],
    group: str,
    offsets: Mapping[tuple[str, int], CommittedOffset],
    timeout: float = ADMIN_TIMEOUT,
) -> None:
    """Set `group`'s offsets of these partitions (raises KafkaException).

    Committed by a consumer of the group that never joins it: the OffsetCommit the admin
    API's AlterConsumerGroupOffsets sends (no generation, no member, so the broker takes
    it only while the group has no members), without librdkafka's admin request to the
    coordinator, which can abort the process (mm2py.kafka.group_describe).
    """
    partitions = [_topic_partition(t, p, c) for (t, p), c in sorted(offsets.items())]
    if not partitions:
        return
    answers: list[tuple[KafkaError | None, list[TopicPartition]]] = []
    consumer = clients.consumer(
        consumer_props,
        {"group.id": group, "on_commit": lambda err, parts: answers.append((err, parts))},
    )
    try:
        consumer.commit(offsets=partitions, asynchronous=True)
        deadline = time.monotonic() + timeout
        while not answers and time.monotonic() < deadline:
            consumer.poll(0.1)  # serves the commit's callback
    finally:
        consumer.close()
    if not answers:
        late = KafkaError(KafkaError._TIMED_OUT, f"commit not answered within {timeout:.0f} s")
        raise KafkaException(late)
    error, done = answers[0]
    if error is not None:
        raise KafkaException(error)
    failed = [tp for tp in done if tp.error is not None]
    if failed:
        raise KafkaException(failed[0].error)


def _topic_partition(topic: str, partition: int, committed: CommittedOffset) -> TopicPartition:
    # TopicPartition takes no None for metadata: leave it out when there is none.
    if committed.metadata:
        return TopicPartition(topic, partition, committed.offset, committed.metadata)
    return TopicPartition(topic, partition, committed.offset)
