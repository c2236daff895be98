"""`mm2py plan` against real clusters: it writes nothing, and `mm2py run` then creates
exactly the topics it listed (issue 25)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from mm2py.dev import mirrormaker
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.topics import partition_counts
from tests.daemon_harness import running_daemon
from tests.kafka_helpers import create_topic, produce, read_all, wait_until

pytestmark = pytest.mark.integration


def _plan(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "plan", str(config), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _topics(cluster: LocalCluster) -> dict[str, int]:
    return partition_counts(clients.admin_client(cluster.client_properties()))


def _commit(cluster: LocalCluster, group: str, topic: str, offset: int) -> None:
    consumer = Consumer(dict(cluster.client_properties(), **{"group.id": group}))
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        consumer.close()


def test_plan_writes_nothing_and_run_creates_exactly_what_it_listed(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    # Aliases of this test's own, so that every internal topic is new to the clusters.
    src, tgt = f"S{uuid.uuid4().hex[:6]}", f"T{uuid.uuid4().hex[:6]}"
    copied, excluded = f"{unique}-a", f"{unique}-x"
    create_topic(cluster_a, copied, partitions=3, config={"retention.ms": "86400000"})
    create_topic(cluster_a, excluded)
    produce(cluster_a, copied, [(i % 3, None, f"{i}".encode()) for i in range(90)])
    group = f"{unique}-group"
    _commit(cluster_a, group, copied, 10)
    config = tmp_path / "mm2.properties"
    props = mirrormaker.mm2_properties(
        src,
        cluster_a.bootstrap_servers,
        tgt,
        cluster_b.bootstrap_servers,
        f"{unique}-.*",
        **{"topics.exclude": excluded, "cluster.group.prefix": f"mm2py-test-{unique}"},
    )
    config.write_text(mirrormaker.render_properties(props))

    before = {"A": _topics(cluster_a), "B": _topics(cluster_b)}
    done = _plan(config, "--json")
    assert done.returncode == 0, done.stderr
    assert {"A": _topics(cluster_a), "B": _topics(cluster_b)} == before  # nothing written
    plan: dict[str, Any] = json.loads(done.stdout)

    (flow,) = plan["flows"]
    assert flow["flow"] == f"{src}->{tgt}"
    remote = f"{src}.{copied}"
    # Heartbeats topics on A flow too, by MM2's rule, whatever `topics` says.
    assert [c for c in flow["copied"] if c["rule"] == "topics"] == [
        {"topic": copied, "remote": remote, "rule": "topics", "partitions": 3}
    ]
    assert all(c["topic"].endswith("heartbeats") for c in flow["copied"] if c["topic"] != copied)
    assert {"topic": excluded, "reason": "topics.exclude"} in flow["left_out"]
    assert {"topic": "__consumer_offsets", "reason": "internal"} in flow["left_out"]
    creates = {r["remote"]: r for r in flow["remote_topics"]}
    assert {c["remote"] for c in flow["copied"]} == set(creates)
    create = creates[remote]
    assert (create["action"], create["partitions"]) == ("create", 3)
    assert create["configs"]["retention.ms"] == "86400000"
    assert flow["groups"] == [group]
    assert sum(b["records"] for b in flow["backlog"] if b["topic"] == copied) == 90
    assert flow["backlog_bytes_by_topic"][copied] == 10 + 80 * 2  # values "0".."89", all read
    planned = {(t["cluster"], t["topic"]) for t in plan["internal_topics"]}
    assert (tgt, f"mm2-offsets.{src}.internal") in planned
    assert (tgt, f"{src}.checkpoints.internal") in planned
    assert (src, f"mm2-offset-syncs.{tgt}.internal") in planned

    # The text form says the same in lines a person reads.
    text = _plan(config)
    assert text.returncode == 0, text.stderr
    assert f"{copied} -> {remote} (3 partitions; topics)" in text.stdout
    assert f"{excluded} (topics.exclude)" in text.stdout

    alias_of = {src: "A", tgt: "B"}
    wanted = {(alias_of[c], t) for c, t in planned} | {("B", r) for r in creates}
    clusters = {"A": cluster_a, "B": cluster_b}

    def created() -> set[tuple[str, str]]:
        return {
            (alias, topic)
            for alias, cluster in clusters.items()
            for topic in _topics(cluster)
            # Not other tests' topics, nor the broker's own (__consumer_offsets appears
            # on a fresh cluster when a group first commits).
            if topic not in before[alias] and not topic.startswith(("test-", "__"))
        }

    with running_daemon(config):
        wait_until(lambda: len(read_all(cluster_b, remote)) == 90, what="the copy")
        wait_until(lambda: created() >= wanted, what="every planned topic created")
    # Exactly what the plan listed: nothing more (other tests' topics are named test-...).
    assert created() == wanted
    assert _topics(cluster_b)[remote] == 3


def test_a_cluster_that_cannot_be_read_is_named_with_exit_1(tmp_path: Path) -> None:
    config = tmp_path / "mm2.properties"
    props = mirrormaker.mm2_properties("A", "127.0.0.1:1", "B", "127.0.0.1:1", "t")
    props["A.request.timeout.ms"] = "2000"
    # What is tested is the message and the exit code; MM2's default admin.timeout.ms
    # (60 s) would only make the test wait a minute for the same answer.
    props["admin.timeout.ms"] = "3000"
    config.write_text(mirrormaker.render_properties(props))
    done = _plan(config)
    assert done.returncode == 1
    assert "cluster A" in done.stderr or "cluster B" in done.stderr


def test_a_bad_config_is_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "mm2.properties"
    config.write_text("clusters = A\nA.bootstrap.servers = 127.0.0.1:1\nA->B.enabled = true\n")
    done = _plan(config)
    assert done.returncode == 2
    assert done.stderr.startswith("mm2py plan: ")
