"""The local clusters (`mm2py local up`: A is the source, B the target) and the benchmark
topics on them: create, delete, end offsets, count what a read_committed reader sees, wait
until a copy is complete.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic

from bench.workload import MIB, Workload
from mm2py.dev.launcher import LocalCluster, LocalKafka
from mm2py.kafka import clients

log = logging.getLogger(__name__)


def local_clusters(aliases: Iterable[str] = ("A", "B")) -> dict[str, LocalCluster]:
    """The local clusters by alias, started if they do not run yet (they stay up)."""
    return {c.alias: c for c in LocalKafka().up(list(aliases))}


def bench_topic(workload: Workload, prefix: str = "bench") -> str:
    """A topic name no earlier run used."""
    return f"{prefix}-{workload.label}-{uuid.uuid4().hex[:8]}"


def create_topic(cluster: LocalCluster, topic: str, partitions: int) -> None:
    """Create `topic` with replication factor 1."""
    admin = clients.admin_client(cluster.client_properties())
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1)]
    )
    futures[topic].result(timeout=30)


def delete_topics(cluster: LocalCluster, topics: Iterable[str]) -> None:
    """Delete `topics` (benchmark topics are large; the clusters are shared)."""
    names = list(topics)
    if not names:
        return
    admin = clients.admin_client(cluster.client_properties())
    for name, future in admin.delete_topics(names, operation_timeout=30).items():
        try:
            future.result(timeout=60)
        except Exception as e:  # cleanup is best effort; a leftover topic only costs disk
            log.warning("could not delete topic %s on %s: %s", name, cluster.alias, e)


def end_offsets(cluster: LocalCluster, topic: str) -> dict[int, int]:
    """The high watermark of every partition of `topic` (empty if it does not exist)."""
    consumer = clients.consumer(cluster.client_properties())
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in meta.partitions
        }
    finally:
        consumer.close()


def count_records(cluster: LocalCluster, topic: str, timeout: float = 300.0) -> int:
    """The records of `topic` a read_committed reader sees, counted by reading them all.

    Unlike its end offsets, this leaves out transaction markers and aborted records.
    Raises TimeoutError when the end of some partition is not reached in `timeout`.
    """
    consumer = clients.consumer(
        cluster.client_properties(),
        {
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "fetch.max.bytes": 64 * MIB,
            "max.partition.fetch.bytes": 8 * MIB,
        },
    )
    try:
        meta = consumer.list_topics(topic, timeout=10).topics.get(topic)
        if meta is None or meta.error is not None:
            return 0
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in meta.partitions])
        pending, count = set(meta.partitions), 0
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {topic} on {cluster.alias}: partitions {sorted(pending)} "
                    f"not read to their end after {timeout:.0f} s ({count} records so far)"
                )
            for msg in consumer.consume(10_000, 1.0):
                err = msg.error()
                if err is None:
                    count += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    pending.discard(msg.partition())
                else:
                    raise KafkaException(err)
        return count
    finally:
        consumer.close()


def wait_copied(
    cluster: LocalCluster, topic: str, records: int, timeout: float, interval: float = 0.5
) -> float:
    """Wait until `topic` on `cluster` holds `records` records; return the seconds waited."""
    start = time.monotonic()
    deadline = start + timeout
    while True:
        have = sum(end_offsets(cluster, topic).values())
        if have >= records:
            return time.monotonic() - start
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic} on {cluster.alias} has {have} of {records} records")
        time.sleep(interval)
