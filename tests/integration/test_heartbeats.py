"""Heartbeats against real clusters: MM2's bytes, multi-hop ages, no loops in active/active.

The `heartbeats` topic is one per cluster and shared by every test (and by real MM2
runs), so each test looks only at heartbeats written after it started.
"""

from __future__ import annotations

import re
import struct
import time
import uuid
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import ConfigResource
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mm2py.compat.formats import Heartbeat
from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import render_properties
from mm2py.kafka import clients
from mm2py.parts.heartbeat import HeartbeatPart
from mm2py.runtime.metrics import Metrics
from tests.conftest import Clusters
from tests.daemon_harness import running_daemon
from tests.kafka_helpers import (
    READ_TO_END,
    create_topic,
    end_offsets,
    produce,
    topic_names,
    wait_until,
)

pytestmark = pytest.mark.integration

AGE = "mm2py_heartbeat_age_seconds"


def _config(
    tmp_path: Path, clusters: dict[str, LocalCluster], flows: list[str], topics: str, **extra: str
) -> Path:
    """An mm2.properties for `clusters` (alias -> cluster) with `flows` enabled."""
    props = {
        "clusters": ", ".join(clusters),
        **{f"{alias}.bootstrap.servers": c.bootstrap_servers for alias, c in clusters.items()},
        **{f"{flow}.enabled": "true" for flow in flows},
        "topics": topics,
        "replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "refresh.topics.interval.seconds": "1",
        "emit.heartbeats.interval.seconds": "1",
        "sync.topic.acls.enabled": "false",
        **extra,
    }
    path = tmp_path / "mm2.properties"
    path.write_text(render_properties(props))
    return path


def _heartbeats(
    cluster: LocalCluster, topic: str, since_ms: int, start: dict[int, int] | None = None
) -> list[tuple[Any, Heartbeat]]:
    """(record, decoded heartbeat) of `topic` with a heartbeat timestamp >= since_ms.

    Reads from `start` (partition -> offset; partitions not in it from 0) up to the end.
    """
    consumer = clients.consumer(cluster.client_properties(), READ_TO_END)
    try:
        meta = consumer.list_topics(timeout=10).topics.get(topic)
        if meta is None:
            return []
        parts = sorted(meta.partitions)
        offsets = start or {}
        consumer.assign([TopicPartition(topic, p, offsets.get(p, 0)) for p in parts])
        out: list[tuple[Any, Heartbeat]] = []
        eof: set[int] = set()
        deadline = time.monotonic() + 30
        while len(eof) < len(parts) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    eof.add(msg.partition())
                    continue
                raise KafkaException(msg.error())
            heartbeat = Heartbeat.decode(msg.key(), msg.value())
            if heartbeat.timestamp_ms >= since_ms:
                out.append((msg, heartbeat))
        return out
    finally:
        consumer.close()


def _ages(metrics_text: str) -> dict[tuple[str, str, str], float]:
    """mm2py_heartbeat_age_seconds by (source, target, hops)."""
    ages: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == AGE:
                labels = sample.labels
                ages[(labels["source"], labels["target"], labels["hops"])] = sample.value
    return ages


def _mm2_key(source: str, target: str) -> bytes:
    """Heartbeat.recordKey(): two Kafka protocol STRINGs (INT16 length + UTF-8)."""
    s, t = source.encode(), target.encode()
    return struct.pack(">h", len(s)) + s + struct.pack(">h", len(t)) + t


def test_heartbeats_reach_the_target_in_mm2_format_at_the_interval(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    # A source alias of its own, so no other writer of `heartbeats` on B is counted.
    source = f"hb{uuid.uuid4().hex[:8]}"
    path = _config(
        tmp_path,
        {source: cluster_a, "B": cluster_b},
        [f"{source}->B"],
        "none",
        **{"emit.heartbeats.interval.seconds": "2"},
    )
    config = load_config(path)
    metrics = Metrics()
    part = HeartbeatPart(config.flow(source, "B"), config.cluster("B"), metrics, watch=True)
    start = end_offsets(cluster_b, "heartbeats")
    since = int(time.time() * 1000)
    part.start()
    try:

        def ours() -> list[tuple[Any, Heartbeat]] | None:
            found = [
                (msg, hb)
                for msg, hb in _heartbeats(cluster_b, "heartbeats", since, start)
                if hb.source_cluster_alias == source
            ]
            return found if len(found) >= 5 else None

        found = wait_until(ours, timeout=60, what=f"5 heartbeats from {source} on B")
        ages = wait_until(
            lambda: (
                a
                if ("B", "B", "0") in (a := _ages(generate_latest(metrics.registry).decode()))
                else None
            ),
            what="the age of heartbeats emitted into B",
        )
    finally:
        part.stop()
    assert part.error is None
    for msg, hb in found:
        assert hb.target_cluster_alias == "B"
        assert msg.partition() == 0
        assert msg.timestamp()[1] == hb.timestamp_ms
        assert msg.key() == _mm2_key(source, "B")
        # Heartbeat.recordValue(): version INT16 0, timestamp INT64.
        assert msg.value() == struct.pack(">hq", 0, hb.timestamp_ms)
    stamps = [hb.timestamp_ms for _msg, hb in found]
    gaps = [b - a for a, b in pairwise(stamps)]
    assert all(1500 <= gap <= 2700 for gap in gaps), gaps
    # MM2's heartbeats topic: one partition, compacted.
    admin = clients.admin_client(cluster_b.client_properties())
    resource = ConfigResource(ConfigResource.Type.TOPIC, "heartbeats")
    topic_config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert topic_config["cleanup.policy"].value == "compact"
    assert end_offsets(cluster_b, "heartbeats").keys() == {0}
    # The watcher sees the local topic: 0 hops, emitted into B itself.
    assert 0 <= ages[("B", "B", "0")] < 30


def test_chain_carries_heartbeats_over_two_hops(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    a, b, c = clusters["A"], clusters["B"], clusters["C"]
    create_topic(a, unique)
    produce(a, unique, [(0, b"k", b"v")])
    since = int(time.time() * 1000)
    # `A.<unique>` on B must pass B->C's filter too.
    path = _config(tmp_path, {"A": a, "B": b, "C": c}, ["A->B", "B->C"], f"(A\\.)?{unique}")
    with running_daemon(path) as daemon:
        # Heartbeats written into A (by the pairs B->A and C->A, which emit heartbeats
        # although they do not replicate) travel A->B->C as B.A.heartbeats.
        found = wait_until(
            lambda: _heartbeats(c, "B.A.heartbeats", since),
            timeout=90,
            what="fresh heartbeats in B.A.heartbeats on C",
        )
        assert {hb.target_cluster_alias for _msg, hb in found} == {"A"}
        assert {hb.source_cluster_alias for _msg, hb in found} <= {"B", "C"}
        wait_until(
            lambda: _heartbeats(a, "heartbeats", since, _tail(a, "heartbeats")),
            what="fresh heartbeats on A",
        )

        def fresh_ages() -> dict[tuple[str, str, str], float] | None:
            ages = _ages(daemon.metrics())
            wanted = [("A", "C", "2"), ("B", "C", "1"), ("C", "C", "0"), ("A", "B", "1")]
            return ages if all(ages.get(k, 1e9) < 15 for k in wanted) else None

        ages = wait_until(fresh_ages, timeout=60, what="fresh heartbeat ages on B and C")
        assert ages[("A", "C", "2")] >= 0
        # The data took the same path.
        assert wait_until(lambda: f"B.A.{unique}" in topic_names(c), what=f"B.A.{unique} on C")


def _tail(cluster: LocalCluster, topic: str, records: int = 200) -> dict[int, int]:
    return {p: max(end - records, 0) for p, end in end_offsets(cluster, topic).items()}


def test_active_active_heartbeats_do_not_loop(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, f"{unique}-a")
    create_topic(cluster_b, f"{unique}-b")
    since = int(time.time() * 1000)
    path = _config(tmp_path, {"A": cluster_a, "B": cluster_b}, ["A->B", "B->A"], f"{unique}.*")
    with running_daemon(path) as daemon:
        on_a = wait_until(
            lambda: _heartbeats(cluster_a, "B.heartbeats", since, _tail(cluster_a, "B.heartbeats")),
            timeout=60,
            what="fresh heartbeats in B.heartbeats on A",
        )
        on_b = wait_until(
            lambda: _heartbeats(cluster_b, "A.heartbeats", since, _tail(cluster_b, "A.heartbeats")),
            timeout=60,
            what="fresh heartbeats in A.heartbeats on B",
        )
        assert {hb.target_cluster_alias for _msg, hb in on_a} == {"B"}
        assert {hb.target_cluster_alias for _msg, hb in on_b} == {"A"}
        # Topics made now are found by a refresh that also saw A.heartbeats on B and
        # B.heartbeats on A: once they are copied, a loop would have been copied too.
        create_topic(cluster_a, f"{unique}-late-a")
        create_topic(cluster_b, f"{unique}-late-b")
        wait_until(lambda: f"A.{unique}-late-a" in topic_names(cluster_b), what="A.*-late-a on B")
        wait_until(lambda: f"B.{unique}-late-b" in topic_names(cluster_a), what="B.*-late-b on A")
        ages = wait_until(
            lambda: (
                ages
                if (ages := _ages(daemon.metrics())).get(("A", "B", "1"), 1e9) < 15
                and ages.get(("B", "A", "1"), 1e9) < 15
                else None
            ),
            what="fresh 1-hop heartbeat ages on A and B",
        )
        log = daemon.log()
    for cluster in (cluster_a, cluster_b):
        names = topic_names(cluster)
        assert "A.B.heartbeats" not in names
        assert "B.A.heartbeats" not in names
    copied_by_b_to_a = [line for line in log.splitlines() if "flow B->A: now copying" in line]
    assert copied_by_b_to_a
    assert not any(re.search(r"[ ,]A\.heartbeats-\d", line) for line in copied_by_b_to_a)
    assert ages[("A", "B", "1")] >= 0 and ages[("B", "A", "1")] >= 0
