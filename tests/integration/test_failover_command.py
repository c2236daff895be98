"""`mm2py failover --planned` against real clusters (issue 25): groups move from A to B at
exact positions, in both delivery modes; a dry run commits nothing; a group with members
on B refuses the command; after a disaster, groups fail back to A exactly and the records
A took in that B never got are listed.

The scenario helpers are test_failover's: numbered records, a group that reads part of
them on A and commits, and a reader on B that counts duplicates and gaps.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from mm2py.config import load_config
from mm2py.dev import mirrormaker
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.replication.progress import ProgressStore
from mm2py.tools.translate import gather
from tests.conftest import Clusters
from tests.daemon_harness import running_daemon
from tests.integration.test_failover import (
    EXACTLY_ONCE,
    MODES,
    Mode,
    consume_and_commit,
    mm2py_daemon,
    mode_config,
    numbered,
    read_rest_on_b,
    run_config,
    score,
)
from tests.kafka_helpers import commit_offsets, create_topic, produce, read_all, wait_until

pytestmark = pytest.mark.integration


def _failover(
    config: Path, prefix: str, *args: str, source: str = "A", target: str = "B"
) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mm2py.cli", "failover", str(config), "--source", source]
    command += ["--target", target, "--groups", f"{prefix}-.*", "--timeout", "120", "--json"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=300, check=False
    )


def _committed_on_b(b: LocalCluster, group: str, remote: str) -> list[int]:
    consumer = clients.consumer(b.client_properties(), {"group.id": group})
    try:
        found = consumer.committed([TopicPartition(remote, p) for p in (0, 1)], timeout=30)
        return [tp.offset for tp in found]
    finally:
        consumer.close()


def _committed(cluster: LocalCluster, group: str, topic: str, partition: int = 0) -> int:
    consumer = clients.consumer(cluster.client_properties(), {"group.id": group})
    try:
        (found,) = consumer.committed([TopicPartition(topic, partition)], timeout=30)
        return int(found.offset)
    finally:
        consumer.close()


def _member_on_b(b: LocalCluster, group: str, remote: str) -> object:
    """A consumer of `group` on B that has joined (holds a partition)."""
    consumer = clients.consumer(
        b.client_properties(), {"group.id": group, "auto.offset.reset": "earliest"}
    )
    consumer.subscribe([remote])
    deadline = time.monotonic() + 60
    while not consumer.assignment() and time.monotonic() < deadline:
        consumer.poll(0.2)
    assert consumer.assignment(), f"{group} did not join on B"
    return consumer


@pytest.mark.parametrize("mode", MODES)
def test_planned_failover_moves_every_group_exactly(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, mode: Mode
) -> None:
    prefix = f"fo-cmd-{uuid.uuid4().hex[:8]}"
    topic, remote = f"{prefix}-orders", f"A.{prefix}-orders"
    behind, done_reading = f"{prefix}-behind", f"{prefix}-done"
    create_topic(cluster_a, topic, partitions=2)
    produce(cluster_a, topic, numbered(0, 400, partitions=2))
    valid = {str(n).encode() for n in range(400)}
    config = mode_config(tmp_path, cluster_a, cluster_b, prefix, mode)

    with mm2py_daemon(config):
        consumed, positions = consume_and_commit(cluster_a, topic, behind, count=150)
        everything, _ = consume_and_commit(cluster_a, topic, done_reading, count=400)
        # The producers are stopped: what a planned failover starts from.

        dry = _failover(config, prefix, "--dry-run")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        shown = json.loads(dry.stdout)
        assert (shown["ok"], shown["dry_run"], shown["not_copied_yet"]) == (True, True, {})
        assert sorted(g["group"] for g in shown["groups"]) == [behind, done_reading]
        assert all(row["status"] == "ok" for g in shown["groups"] for row in g["rows"])
        assert _committed_on_b(cluster_b, behind, remote) == [-1001, -1001]  # nothing

        member = _member_on_b(cluster_b, behind, remote)
        try:
            refused = _failover(config, prefix)
        finally:
            member.close()  # type: ignore[attr-defined]
        assert refused.returncode == 2
        assert f"{behind} (1 members)" in refused.stderr
        assert _committed_on_b(cluster_b, behind, remote) == [-1001, -1001]

        moved = _failover(config, prefix)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        result = json.loads(moved.stdout)
        assert result["ok"] and not result["dry_run"]
        assert {g["group"]: g["applied"] for g in result["groups"]} == {
            behind: len(positions),  # the partitions it committed offsets for on A
            done_reading: 2,
        }

    rest = read_rest_on_b(cluster_b, remote, behind, valid - set(consumed))
    out = score("behind", consumed, valid, rest)
    assert (out.duplicates, out.gaps, out.read_on_b) == (0, 0, 250), out.line()
    # The group that had read everything on A reads nothing again on B.
    assert read_rest_on_b(cluster_b, remote, done_reading, set(), timeout=10) == []
    assert len(everything) == 400


def _recorded(b: LocalCluster) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """Progress and recorded source ends in mm2-offsets.A.internal on B."""
    store = ProgressStore(b.client_properties(), "B", "A", "mm2-offsets.A.internal", 1)
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        progress = store.load(source_ends=ends)
    finally:
        store.close()
    return progress, {tp: end for tp, (end, _seen) in ends.items()}


@pytest.mark.parametrize("mode", MODES)
def test_disaster_failover_with_the_source_frozen_lists_what_was_never_copied(
    clusters: Clusters, tmp_path: Path, mode: Mode
) -> None:
    a, b = clusters["A"], clusters["B"]
    prefix = f"fo-dis-{uuid.uuid4().hex[:8]}"
    topic, remote, group = f"{prefix}-orders", f"A.{prefix}-orders", f"{prefix}-g"
    create_topic(a, topic)
    produce(a, topic, numbered(0, 300))
    config = mode_config(tmp_path, a, b, prefix, mode)
    broker = clusters.kafka.pid("A")
    assert broker is not None
    with mm2py_daemon(config) as daemon:
        consumed, _ = consume_and_commit(a, topic, group, count=100)

        def settled() -> bool:
            progress, ends = _recorded(b)
            report = gather(load_config(config), load_config(config).flow("A", "B"), group)
            return (
                progress.get((topic, 0)) == 299
                and ends.get((topic, 0)) == 300
                and report.exact
                and len(report.rows) == 1
            )

        wait_until(settled, timeout=90, what="copy, progress, source end and checkpoint")
        # The copy stops (its task process frozen); the node still records A's ends.
        (task,) = daemon.task_pids()
        os.kill(task, signal.SIGSTOP)
        try:
            produce(a, topic, numbered(300, 120))
            wait_until(
                lambda: _recorded(b)[1].get((topic, 0)) == 420,
                timeout=60,
                what="A's new end recorded on B",
            )
            os.killpg(broker, signal.SIGSTOP)  # the disaster: A stops answering
            try:
                done = _failover(config, prefix, "--disaster")
            finally:
                os.killpg(broker, signal.SIGCONT)
        finally:
            os.kill(task, signal.SIGCONT)
        # A answers again and the copy goes on: the rest reaches B before the daemon
        # stops (stopped at once, it would record its progress and leave them for its
        # next start, and the group's read below would find them missing).
        wait_until(
            lambda: _recorded(b)[0].get((topic, 0)) == 419,
            timeout=60,
            what="the records A took in while frozen copied to B",
        )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    (lost,) = result["not_copied"]
    assert {
        k: lost[k] for k in ("topic", "partition", "records", "first_offset", "last_offset")
    } == {
        "topic": topic,
        "partition": 0,
        "records": 120,
        "first_offset": 300,
        "last_offset": 419,
    }
    assert [(g["group"], g["applied"]) for g in result["groups"]] == [(group, 1)]
    # The group resumes on B right after what it consumed on A.
    valid = {str(n).encode() for n in range(420)}
    rest = read_rest_on_b(b, remote, group, valid - set(consumed))
    out = score("disaster", consumed, valid, rest)
    assert (out.duplicates, out.gaps) == (0, 0), out.line()


def _failback_config(tmp: Path, a: LocalCluster, b: LocalCluster, prefix: str, mode: Mode) -> Path:
    """The same clusters with B->A running and A->B stopped: A is back after the disaster,
    and what it took in that B never got is not copied now (the runbook's failback)."""
    extra = {
        "A->B.enabled": "false",
        "B->A.enabled": "true",
        "B->A.emit.heartbeats.enabled": "",
        "groups": f"{prefix}-.*",
    }
    if mode == "exactly-once":
        extra |= EXACTLY_ONCE | {"A.exactly.once.source.support": "enabled"}
    props = mirrormaker.mm2_properties(
        a.alias, a.bootstrap_servers, b.alias, b.bootstrap_servers, f"{prefix}-.*", **extra
    )
    props["cluster.group.prefix"] = f"mm2py-test-{uuid.uuid4().hex[:12]}"
    path = tmp / f"{prefix}-back.properties"
    path.write_text(mirrormaker.render_properties(props))
    return path


@pytest.mark.parametrize("mode", MODES)
def test_failback_after_a_disaster_is_exact_and_lists_the_divergent_tail(
    clusters: Clusters, tmp_path: Path, mode: Mode
) -> None:
    a, b = clusters["A"], clusters["B"]
    prefix = f"fo-back-{uuid.uuid4().hex[:8]}"
    topic, remote, group = f"{prefix}-orders", f"A.{prefix}-orders", f"{prefix}-g"
    create_topic(a, topic)
    produce(a, topic, numbered(0, 300))
    config = mode_config(tmp_path, a, b, prefix, mode)
    broker = clusters.kafka.pid("A")
    assert broker is not None
    with running_daemon(config) as daemon:
        on_a, _ = consume_and_commit(a, topic, group, count=100)

        def settled() -> bool:
            progress, _ends = _recorded(b)
            report = gather(load_config(config), load_config(config).flow("A", "B"), group)
            return progress.get((topic, 0)) == 299 and report.exact and len(report.rows) == 1

        wait_until(settled, timeout=90, what="copy, progress and exact checkpoint")
        (task,) = daemon.task_pids()
        os.kill(task, signal.SIGSTOP)  # the copy stops ...
        produce(a, topic, numbered(300, 120))  # ... A takes in 120 records B never gets
        os.killpg(broker, signal.SIGSTOP)  # and A is lost
        try:
            disaster = _failover(config, prefix, "--disaster")
            # The replicator goes down with A: nothing more is copied when A is back.
            daemon.proc.kill()
            daemon.proc.wait(10)
            os.kill(task, signal.SIGKILL)
        finally:
            os.killpg(broker, signal.SIGCONT)
    assert disaster.returncode == 0, disaster.stdout + disaster.stderr
    assert [(g["group"], g["applied"]) for g in json.loads(disaster.stdout)["groups"]] == [
        (group, 1)
    ]
    # The group goes on on B, through A's records copied there.
    on_b, _ = consume_and_commit(b, remote, group, count=100)
    assert on_b == [str(n).encode() for n in range(100, 200)]
    # What B really got: A's records 0..299, so A's 300..419 are the divergent tail.
    assert sorted(int(r.value) for r in read_all(b, remote)) == list(range(300))
    # Producers wrote to B's own topic of the same name meanwhile; the group read part of it.
    create_topic(b, topic)
    produce(b, topic, numbered(0, 50))
    on_b_own, _ = consume_and_commit(b, topic, group, count=30)

    back = _failback_config(tmp_path, a, b, prefix, mode)
    listed = _failover(back, prefix, "--diverged", source="B", target="A")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert json.loads(listed.stdout)["diverged"] == [
        {"topic": topic, "partition": 0, "records": 120, "first_offset": 300, "last_offset": 419}
    ]
    # A group on B past the copy's end: the syncs cannot prove where it is on A.
    ahead = f"{prefix}-ahead"
    commit_offsets(b, ahead, {(remote, 0): 350})
    with mm2py_daemon(back):
        refused = _failover(
            back, prefix, "--groups", ahead, "--timeout", "5", source="B", target="A"
        )
        moved = _failover(back, prefix, "--groups", group, source="B", target="A")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    unproven = json.loads(refused.stdout)
    ((row,),) = [g["rows"] for g in unproven["groups"]]
    assert (row["topic"], row["status"], row["downstream_offset"]) == (
        topic,
        "not exact yet",
        300,  # one past the last record the syncs prove copied: at or before, not claimed
    )
    # (B->A may still be copying B's heartbeats: that can be missing too, in 5 s.)
    assert f"group(s) not proven exact yet: {ahead}" in unproven["missing"]
    assert _committed(a, ahead, topic) == -1001  # nothing committed on A
    assert moved.returncode == 0, moved.stdout + moved.stderr
    result = json.loads(moved.stdout)
    ((copied, home),) = [g["rows"] for g in result["groups"]]  # by topic: B.<topic> first
    # B's own topic goes to its copy on A by B->A's checkpoint; A's back to A's own topic.
    assert (copied["topic"], copied["source_topic"], copied["status"]) == (
        f"B.{topic}",
        topic,
        "ok",
    )
    assert copied["upstream_offset"] == 30
    assert (home["topic"], home["source_topic"], home["status"]) == (topic, remote, "ok")
    assert (home["upstream_offset"], home["downstream_offset"]) == (200, 200)
    assert [(g["group"], g["applied"]) for g in result["groups"]] == [(group, 2)]
    # On A again: the group reads what it read neither on A nor on B, the tail included.
    valid = {str(n).encode() for n in range(420)}
    rest = read_rest_on_b(a, topic, group, valid - set(on_a) - set(on_b))
    out = score("failback", on_a + on_b, valid, rest)
    assert (out.duplicates, out.gaps, out.read_on_b) == (0, 0, 220), out.line()
    valid = {str(n).encode() for n in range(50)}
    rest = read_rest_on_b(a, f"B.{topic}", group, valid - set(on_b_own))
    out = score("failback, B's own topic", on_b_own, valid, rest)
    assert (out.duplicates, out.gaps, out.read_on_b) == (0, 0, 20), out.line()


def test_disaster_failover_without_recorded_source_ends_says_it_does_not_know(
    clusters: Clusters, tmp_path: Path
) -> None:
    """What was never copied is not known where no source end is recorded (MM2 records
    none, nor does a replicator that never ran): the report says so, not "0 records",
    and a dry run creates nothing on B."""
    a, b = clusters["A"], clusters["B"]
    prefix = f"fo-unk-{uuid.uuid4().hex[:8]}"
    offsets = f"{prefix}-offsets"
    config = run_config(tmp_path, a, b, prefix, **{"offset.storage.topic": offsets})
    done = _failover(config, prefix, "--disaster", "--dry-run")
    result = json.loads(done.stdout)
    assert result["not_copied"] is None, result
    assert offsets in result["not_copied_unknown"], result
    assert result["ok"] is False and done.returncode != 0  # no group has checkpoints
    admin = clients.admin_client(b.client_properties())
    assert offsets not in admin.list_topics(timeout=30).topics
    command = [sys.executable, "-m", "mm2py.cli", "failover", str(config), "--source", "A"]
    command += ["--target", "B", "--groups", f"{prefix}-.*", "--disaster", "--dry-run"]
    text = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    shown = "never copied: not known: no source end offsets of A's topics are recorded in "
    assert shown + offsets in text.stdout, text.stdout + text.stderr
