"""What any node of a 2-node mm2py cluster says about the whole cluster: GET /cluster,
`mm2py status`, Kafka Connect's connector status, and the node metrics."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import create_topic, wait_until

pytestmark = pytest.mark.integration


def _get(daemon: RunningDaemon, path: str) -> Any:
    with urllib.request.urlopen(f"http://{daemon.listen}{path}", timeout=15) as resp:
        return json.loads(resp.read())


def _flow_cluster(daemon: RunningDaemon, flow: str) -> dict[str, Any] | None:
    try:
        found = [c for c in _get(daemon, "/cluster") if c["flow"] == flow]
    except OSError:
        return None
    return found[0] if found else None


def _copied(cluster: dict[str, Any]) -> list[str]:
    """The partitions the tasks copy, but A.heartbeats' (copied whatever the filter,
    once the pair B->A has made the topic on A)."""
    found = [p for t in cluster["tasks"] for p in t["partitions"]]
    return sorted(p for p in found if not p.startswith("A.heartbeats-"))


def _settled(daemon: RunningDaemon, nodes: int, partitions: list[str]) -> dict[str, Any] | None:
    """The flow's cluster once it has `nodes` members, each running one of the tasks
    (the second node to join takes one over), every node ready, `partitions` copied."""
    cluster = _flow_cluster(daemon, "A->B")
    if cluster is None or len(cluster["members"]) != nodes:
        return None
    if {t["state"] for t in cluster["tasks"]} != {"RUNNING"}:
        return None
    if {m["health"] for m in cluster["members"]} != {"READY"}:  # e.g. still JOINING
        return None
    if len({t["node"] for t in cluster["tasks"]}) != nodes:  # a task still to move over
        return None
    return cluster if _copied(cluster) == partitions else None


def test_every_node_shows_the_whole_cluster(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=4)
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(cluster_a, cluster_b, unique, **{"tasks.max": "2"}))
    with ExitStack() as stack:
        first = stack.enter_context(running_daemon(config))
        second = stack.enter_context(running_daemon(config))
        partitions = sorted(f"A.{unique}-{p}" for p in range(4))
        seen = [
            wait_until(lambda d=d: _settled(d, 2, partitions), timeout=90, what="2 nodes")
            for d in (first, second)
        ]
        for daemon, cluster in zip((first, second), seen, strict=True):
            nodes = {m["node"] for m in cluster["members"]}
            assert nodes == {first.listen, second.listen}
            assert [m["this_node"] for m in cluster["members"] if m["node"] == daemon.listen] == [
                True
            ]
            # Two tasks, one on each node (the group spreads them evenly).
            owners = [t["node"] for t in cluster["tasks"]]
            assert sorted(owners) == sorted(nodes)
            assert cluster["once_per_flow_node"] == cluster["tasks"][0]["node"]

        leader = seen[0]["once_per_flow_node"]
        standby = second if leader == first.listen else first
        # Connect's view from the node that does not run the once-per-flow parts: the
        # source connector's two tasks on their two workers, the checkpoint connector's
        # task on the leader.
        name = urllib.parse.quote("A->B.MirrorSourceConnector", safe="")
        status = _get(standby, f"/connectors/{name}/status")
        assert sorted((t["id"], t["worker_id"]) for t in status["tasks"]) == sorted(
            (t["task"], t["node"]) for t in seen[0]["tasks"]
        )
        assert {t["state"] for t in status["tasks"]} == {"RUNNING"}
        name = urllib.parse.quote("A->B.MirrorCheckpointConnector", safe="")
        status = _get(standby, f"/connectors/{name}/status")
        assert [(t["worker_id"], t["state"]) for t in status["tasks"]] == [(leader, "RUNNING")]

        shown = subprocess.run(
            [sys.executable, "-m", "mm2py.cli", "status", "--url", f"http://{standby.listen}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert shown.returncode == 0, shown.stderr
        assert "A->B cluster: 2 node(s), 2 task(s)" in shown.stdout
        assert f"{standby.listen} *" in shown.stdout

        metrics = standby.metrics()
        assert f'mm2py_node_tasks{{node="{standby.listen}",source="A",target="B"}} 1.0' in metrics
