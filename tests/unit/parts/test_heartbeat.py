"""Heartbeat paths (MM2's hop counting) and which heartbeat parts the daemon builds."""

from __future__ import annotations

from pathlib import Path

import pytest

from mm2py.compat.policy import DefaultReplicationPolicy, IdentityReplicationPolicy
from mm2py.config import MirrorConfig, load_config
from mm2py.daemon.supervisor import build_parts
from mm2py.parts.checkpoint import CheckpointPart
from mm2py.parts.heartbeat import HeartbeatPart, HeartbeatPath, heartbeat_path
from mm2py.runtime.metrics import Metrics

DEFAULT = DefaultReplicationPolicy()


@pytest.mark.parametrize(
    ("topic", "path"),
    [
        # The local topic: heartbeats emitted into C itself.
        ("heartbeats", HeartbeatPath("C", 0)),
        # Written into B, copied B->C: 1 hop from B.
        ("B.heartbeats", HeartbeatPath("B", 1)),
        # Written into A, copied A->B->C: 2 hops from A (MirrorClient.replicationHops).
        ("B.A.heartbeats", HeartbeatPath("A", 2)),
        ("D.B.A.heartbeats", HeartbeatPath("A", 3)),
        ("orders", None),
        ("B.orders", None),
        ("heartbeats.x", None),
        ("mm2-offset-syncs.C.internal", None),
    ],
)
def test_heartbeat_path(topic: str, path: HeartbeatPath | None) -> None:
    assert heartbeat_path(DEFAULT, topic, "C") == path


def test_heartbeat_path_with_other_policies() -> None:
    underscore = DefaultReplicationPolicy("_")
    assert heartbeat_path(underscore, "B_A_heartbeats", "C") == HeartbeatPath("A", 2)
    assert heartbeat_path(underscore, "B.A.heartbeats", "C") is None
    identity = IdentityReplicationPolicy(source_cluster_alias="B")
    # Identity keeps names but still prefixes heartbeats, so paths stay visible.
    assert heartbeat_path(identity, "heartbeats", "C") == HeartbeatPath("C", 0)
    assert heartbeat_path(identity, "B.A.heartbeats", "C") == HeartbeatPath("A", 2)
    assert heartbeat_path(identity, "orders", "C") is None


def _config(tmp_path: Path, extra: str) -> MirrorConfig:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B, C\n"
        "A.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "C.bootstrap.servers = c:9092\n" + extra
    )
    return load_config(path)


def _heartbeat_parts(config: MirrorConfig, clusters: list[str] | None) -> list[HeartbeatPart]:
    parts = build_parts(
        config,
        config.enabled_flows(clusters),
        Metrics(),
        config.heartbeat_flows(clusters),
    )
    return [p for p in parts if isinstance(p, HeartbeatPart)]


def test_every_pair_emits_heartbeats_and_each_target_has_one_watcher(tmp_path: Path) -> None:
    config = _config(tmp_path, "A->B.enabled = true\nB->C.enabled = true\n")
    parts = _heartbeat_parts(config, None)
    # MM2's clusterPairs: heartbeats for every ordered pair, replication enabled or not.
    assert sorted(p.flow.name for p in parts) == ["A->B", "A->C", "B->A", "B->C", "C->A", "C->B"]
    assert sorted(p.flow.target for p in parts if p.watch) == ["A", "B", "C"]


def test_clusters_option_limits_heartbeats_to_those_targets(tmp_path: Path) -> None:
    config = _config(tmp_path, "A->B.enabled = true\nB->C.enabled = true\n")
    parts = _heartbeat_parts(config, ["C"])
    assert sorted(p.flow.name for p in parts) == ["A->C", "B->C"]
    assert [p.flow.target for p in parts if p.watch] == ["C"]


def test_disabled_heartbeats_get_no_part(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        "A->B.enabled = true\n"
        "emit.heartbeats.enabled = false\n"
        "C->B.emit.heartbeats.enabled = true\n",
    )
    parts = _heartbeat_parts(config, None)
    assert [(p.flow.name, p.watch) for p in parts] == [("C->B", True)]


def test_heartbeat_part_uses_the_flow_interval(tmp_path: Path) -> None:
    config = _config(tmp_path, "A->B.enabled = true\nA->B.emit.heartbeats.interval.seconds = 7\n")
    part = HeartbeatPart(config.flow("A", "B"), config.cluster("B"), Metrics(), watch=False)
    assert part.interval == 7.0
    assert part.topic == "heartbeats"


def test_parts_wait_for_admin_calls_as_long_as_admin_timeout_ms_says(tmp_path: Path) -> None:
    config = _config(tmp_path, "A->B.enabled = true\nA->B.admin.timeout.ms = 5000\n")
    flow = config.flow("A", "B")
    heartbeat = HeartbeatPart(flow, config.cluster("B"), Metrics(), watch=False)
    checkpoint = CheckpointPart(flow, config.cluster("A"), config.cluster("B"), Metrics())
    assert heartbeat.admin_timeout == checkpoint.admin_timeout == 5.0
    other = config.flow("B", "A")  # MM2's default: 60 s
    assert HeartbeatPart(other, config.cluster("A"), Metrics(), watch=False).admin_timeout == 60.0
