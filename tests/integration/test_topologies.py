"""Multi-cluster topologies from one config: active/active, fan-in, chain, identity, --clusters."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import render_properties
from tests.conftest import Clusters
from tests.daemon_harness import running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    Rec,
    create_topic,
    produce,
    read_all,
    topic_names,
    wait_until,
)

pytestmark = pytest.mark.integration

IDENTITY = "org.apache.kafka.connect.mirror.IdentityReplicationPolicy"


def _config(
    tmp_path: Path, clusters: list[LocalCluster], flows: list[str], topics: str, **extra: str
) -> Path:
    """One mm2.properties for `clusters` with `flows` (``A->B``) enabled, single-node settings."""
    props = {
        "clusters": ", ".join(c.alias for c in clusters),
        **{f"{c.alias}.bootstrap.servers": c.bootstrap_servers for c in clusters},
        **{f"{flow}.enabled": "true" for flow in flows},
        "topics": topics,
        "replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "refresh.topics.interval.seconds": "1",
        "sync.topic.acls.enabled": "false",
        **extra,
    }
    path = tmp_path / "mm2.properties"
    path.write_text(render_properties(props))
    return path


def _records(cluster: LocalCluster, topic: str, tag: str, count: int = 20) -> list[Rec]:
    """Produce `count` records tagged `tag` to `topic` and return them as read back."""
    produce(
        cluster, topic, [(0, f"{tag}-{i}".encode(), f"{tag}:{i}".encode()) for i in range(count)]
    )
    return read_all(cluster, topic)


def _copied(cluster: LocalCluster, topic: str, count: int) -> list[Rec]:
    return wait_until(
        lambda: (
            recs
            if topic in topic_names(cluster) and len(recs := read_all(cluster, topic)) >= count
            else None
        ),
        timeout=60,
        what=f"{count} records in {topic} on {cluster.alias}",
    )


def _same(copied: list[Rec], original: list[Rec]) -> bool:
    return [r.content() for r in copied] == [r.content() for r in original]


def test_active_active_copies_each_side_once_and_never_back(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    create_topic(cluster_b, unique)
    on_a, on_b = _records(cluster_a, unique, "a"), _records(cluster_b, unique, "b")
    path = _config(tmp_path, [cluster_a, cluster_b], ["A->B", "B->A"], f".*{unique}.*")
    with running_daemon(path) as daemon:
        assert _same(_copied(cluster_b, f"A.{unique}", 20), on_a)
        assert _same(_copied(cluster_a, f"B.{unique}", 20), on_b)
        # Topics made now are found by refreshes that also saw A.<t> on B and B.<t>
        # on A: once these are copied, a loop would have been copied too.
        create_topic(cluster_a, f"{unique}-late")
        create_topic(cluster_b, f"{unique}-late")
        wait_until(lambda: f"A.{unique}-late" in topic_names(cluster_b), what="A.*-late on B")
        wait_until(lambda: f"B.{unique}-late" in topic_names(cluster_a), what="B.*-late on A")
        log = daemon.log()
    mine_a = {t for t in topic_names(cluster_a) if unique in t}
    mine_b = {t for t in topic_names(cluster_b) if unique in t}
    assert mine_a == {unique, f"{unique}-late", f"B.{unique}", f"B.{unique}-late"}
    assert mine_b == {unique, f"{unique}-late", f"A.{unique}", f"A.{unique}-late"}
    assert f"A.{unique}-0" not in log  # never assigned to B->A (a cycle)
    assert f"B.{unique}-0" not in log


def test_fan_in_aggregates_both_sources_on_one_target(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    a, b, c = clusters["A"], clusters["B"], clusters["C"]
    create_topic(a, unique)
    create_topic(b, unique)
    from_a, from_b = _records(a, unique, "a"), _records(b, unique, "b")
    path = _config(tmp_path, [a, b, c], ["A->C", "B->C"], unique)
    with running_daemon(path):
        assert _same(_copied(c, f"A.{unique}", 20), from_a)
        assert _same(_copied(c, f"B.{unique}", 20), from_b)
    assert {t for t in topic_names(c) if unique in t} == {f"A.{unique}", f"B.{unique}"}


def test_chain_delivers_two_hop_copies_intact(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    a, b, c = clusters["A"], clusters["B"], clusters["C"]
    create_topic(a, unique, partitions=2)
    sent = [
        (i % 2, f"k{i}".encode(), f"v{i}".encode(), [("h", f"{i}".encode())], RECENT_MS + i)
        for i in range(40)
    ]
    produce(a, unique, sent)
    original = read_all(a, unique)
    path = _config(tmp_path, [a, b, c], ["A->B", "B->C"], f".*{unique}")
    with running_daemon(path):
        one_hop = _copied(b, f"A.{unique}", 40)
        two_hops = _copied(c, f"B.A.{unique}", 40)
    key = lambda r: (r.partition, r.offset)  # noqa: E731
    assert _same(sorted(one_hop, key=key), sorted(original, key=key))
    assert _same(sorted(two_hops, key=key), sorted(original, key=key))
    assert {t for t in topic_names(b) if unique in t} == {f"A.{unique}"}


def test_identity_policy_keeps_topic_names(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    original = _records(cluster_a, unique, "id")
    path = _config(
        tmp_path,
        [cluster_a, cluster_b],
        ["A->B"],
        unique,
        **{"replication.policy.class": IDENTITY},
    )
    with running_daemon(path):
        assert _same(_copied(cluster_b, unique, 20), original)
    assert f"A.{unique}" not in topic_names(cluster_b)


def test_two_way_identity_with_overlapping_topics_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = 127.0.0.1:19092\n"
        "B.bootstrap.servers = 127.0.0.1:29092\nA->B.enabled = true\nB->A.enabled = true\n"
        f"replication.policy.class = {IDENTITY}\nA->B.topics = orders.*\nB->A.topics = .*\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "run", str(path), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"mm2py: {path}: A->B.topics: A->B and B->A are both enabled")
    assert "would copy topic 'orders'" in done.stderr


def test_clusters_option_splits_one_config_between_two_daemons(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    create_topic(cluster_b, unique)
    on_a, on_b = _records(cluster_a, unique, "a"), _records(cluster_b, unique, "b")
    path = _config(tmp_path, [cluster_a, cluster_b], ["A->B", "B->A"], f".*{unique}")
    with (
        running_daemon(path, "--clusters", "B") as into_b,
        running_daemon(path, "--clusters", "A") as into_a,
    ):
        assert _same(_copied(cluster_b, f"A.{unique}", 20), on_a)
        assert _same(_copied(cluster_a, f"B.{unique}", 20), on_b)
        log_b, log_a = into_b.log(), into_a.log()
    assert "flows: A->B\n" in log_b and "flow B->A" not in log_b
    assert "flows: B->A\n" in log_a and "flow A->B" not in log_a
