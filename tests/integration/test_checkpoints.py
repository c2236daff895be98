"""The checkpoint part, group offset sync and `mm2py translate-offsets` on real clusters."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin._config import ConfigResource

from mm2py.compat.formats import Checkpoint, OffsetSync
from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import RealMirrorMaker
from mm2py.kafka import clients
from mm2py.kafka.groups import read_committed
from mm2py.kafka.topics import topic_partitions
from mm2py.tools.translate import gather
from tests.daemon_harness import mm2_properties, running_daemon
from tests.integration.test_failover import EXACTLY_ONCE, MODES, Mode, wait_copied
from tests.kafka_helpers import (
    SYNCS_TOPIC,
    commit_offsets,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

CHECKPOINTS = "A.checkpoints.internal"


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, prefix: str, **extra: str) -> Path:
    path = tmp_path / "mm2.properties"
    extra = {"groups": f"{prefix}-.*", **extra}
    path.write_text(mm2_properties(a, b, f"{prefix}-.*", **extra))
    return path


def _checkpoints(b: LocalCluster, group: str) -> list[Checkpoint]:
    """Every checkpoint record of `group` on B, oldest first."""
    out = []
    for rec in read_all(b, CHECKPOINTS):
        cp = Checkpoint.decode(rec.key, rec.value)
        if cp.consumer_group_id == group:
            out.append(cp)
    return out


def _synced(a: LocalCluster, topic: str, upstream: int) -> None:
    """Wait until the replicator's offset syncs reach `upstream` of `topic`-0."""

    def probe() -> bool:
        for rec in read_all(a, SYNCS_TOPIC):
            sync = OffsetSync.decode(rec.key, rec.value)
            if sync.topic == topic and sync.upstream_offset >= upstream:
                return True
        return False

    wait_until(probe, what=f"offset syncs of {topic} up to {upstream}")


def _latest(b: LocalCluster, group: str) -> dict[tuple[str, int], Checkpoint]:
    return {(cp.topic, cp.partition): cp for cp in _checkpoints(b, group)}


def _group_offsets(cluster: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets in every partition of the cluster."""
    props = cluster.client_properties()
    every = topic_partitions(clients.admin_client(props), timeout=30)
    read = read_committed(props, {group: every}, cluster.alias, timeout=30)
    return {key: committed.offset for key, committed in read[group].items()}


def _stays(probe: Any, seconds: float = 2.5) -> None:
    """Assert that `probe()` holds on every look for `seconds` (a bounded negative check)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert probe()
        time.sleep(0.2)


def _translate(config: Path, group: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mm2py.cli", "translate-offsets", str(config)]
    cmd += ["--source", "A", "--target", "B", "--group", group, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def _apply_until_exact(config: Path, b: LocalCluster, group: str) -> None:
    """`translate-offsets --apply` at once and every 2 s until it exits 0 (within 60 s),
    nothing committed on B before; prints each run's rows and when it came."""
    runs: list[tuple[float, int, str]] = []
    started = time.monotonic()
    while True:
        done = _translate(config, group, "--apply", "--json")
        runs.append((time.monotonic() - started, done.returncode, done.stdout))
        assert done.returncode in (0, 1), done.stderr
        if done.returncode == 0:
            break
        # Nothing is committed before every position is proven exact.
        assert _group_offsets(b, group) == {}, runs
        assert time.monotonic() - started < 60, runs
        time.sleep(2)
    for seconds, code, out in runs:
        rows = [
            (r["partition"], r["downstream_offset"], r["status"]) for r in json.loads(out)["rows"]
        ]
        print(f"{group}: {seconds:.1f}s after the first run: exit {code}: {rows}")


def _first_read(b: LocalCluster, group: str, topic: str, partitions: int) -> dict[int, Any]:
    """The value of the first record `group` reads from each partition of `topic` on B
    (read_committed, from its committed offsets; 60 s at most)."""
    first: dict[int, Any] = {}
    consumer = clients.consumer(
        b.client_properties(),
        {"group.id": group, "enable.auto.commit": False, "isolation.level": "read_committed"},
    )
    consumer.subscribe([topic])
    try:
        deadline = time.monotonic() + 60
        while len(first) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                first.setdefault(msg.partition() or 0, msg.value())
    finally:
        consumer.close()
    return first


@contextmanager
def _member(b: LocalCluster, group: str, topic: str) -> Iterator[Consumer]:
    """An active member of `group` on B (subscribed and polling)."""
    consumer = clients.consumer(
        b.client_properties(),
        {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False},
    )
    consumer.subscribe([topic])
    try:
        wait_until(lambda: consumer.poll(0.2) is not None or consumer.assignment(), what="join")
        yield consumer
    finally:
        consumer.close()


# ----------------------------------------------------------- the checkpoint part


def test_checkpoints_are_written_in_mm2_format_for_the_groups_that_pass_the_filters(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    prefix = f"cp-{uuid.uuid4().hex[:8]}"
    topic, unreplicated = f"{prefix}-t", f"other-{prefix}"
    create_topic(cluster_a, topic, partitions=2)
    create_topic(cluster_a, unreplicated)
    produce(cluster_a, topic, [(i % 2, None, b"x") for i in range(200)])
    good, excluded, elsewhere = f"{prefix}-good", f"{prefix}-excluded", f"{prefix}-elsewhere"
    commit_offsets(cluster_a, good, {(topic, 0): 30, (topic, 1): 70}, metadata="m1")
    commit_offsets(cluster_a, excluded, {(topic, 0): 10})
    commit_offsets(cluster_a, elsewhere, {(unreplicated, 0): 0})
    config = _config(
        tmp_path, cluster_a, cluster_b, prefix, **{"groups.exclude": f"{prefix}-excluded"}
    )
    with running_daemon(config) as daemon:
        want = {
            (f"A.{topic}", 0): Checkpoint(good, f"A.{topic}", 0, 30, 30, "m1"),
            (f"A.{topic}", 1): Checkpoint(good, f"A.{topic}", 1, 70, 70, "m1"),
        }
        wait_until(lambda: _latest(cluster_b, good) == want, what="checkpoints of the group")
        # A new commit is checkpointed at the next interval.
        commit_offsets(cluster_a, good, {(topic, 0): 100}, metadata="m2")
        wait_until(
            lambda: _latest(cluster_b, good)[(f"A.{topic}", 0)].downstream_offset == 100,
            what="the checkpoint of the new commit",
        )
        # By now several intervals passed: the other groups were never checkpointed.
        assert _checkpoints(cluster_b, excluded) == []
        assert _checkpoints(cluster_b, elsewhere) == []
        metrics = daemon.metrics()
        assert (
            f'mm2py_checkpoint_latency_seconds_count{{group="{good}",source="A",target="B"}}'
            in (metrics)
        )
        assert daemon.stop()[0] == 0
    admin = clients.admin_client(cluster_b.client_properties())
    meta = admin.list_topics(CHECKPOINTS, timeout=10).topics[CHECKPOINTS]
    assert len(meta.partitions) == 1
    resource = ConfigResource(ConfigResource.Type.TOPIC, CHECKPOINTS)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"


def test_checkpoints_never_move_backwards_across_restarts(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    prefix = f"cp-{uuid.uuid4().hex[:8]}"
    topic, group = f"{prefix}-t", f"{prefix}-g"
    remote = f"A.{topic}"
    create_topic(cluster_a, topic)
    produce(cluster_a, topic, [(0, None, b"x")] * 100)
    # An earlier run left a checkpoint further on the target than this one translates.
    earlier = Checkpoint(group, remote, 0, 50, 60)
    producer = clients.producer(cluster_b.client_properties())
    producer.produce(CHECKPOINTS, earlier.encode_value(), earlier.encode_key(), 0)
    assert producer.flush(30) == 0
    commit_offsets(cluster_a, group, {(topic, 0): 50})
    config = _config(tmp_path, cluster_a, cluster_b, prefix)
    with running_daemon(config) as daemon:
        _synced(cluster_a, topic, 99)  # so that every translation below is exact
        commit_offsets(cluster_a, group, {(topic, 0): 55})  # translates to 55: behind 60
        commit_offsets(cluster_a, group, {(topic, 0): 65})
        wait_until(lambda: _latest(cluster_b, group)[(remote, 0)].upstream_offset == 65)
        assert daemon.stop()[0] == 0
    assert [(c.upstream_offset, c.downstream_offset) for c in _checkpoints(cluster_b, group)] == [
        (50, 60),
        (65, 65),
    ]
    with running_daemon(config) as daemon:
        # A rewind on the source is followed, as MM2 does: the group asked for it.
        commit_offsets(cluster_a, group, {(topic, 0): 20})
        wait_until(lambda: _latest(cluster_b, group)[(remote, 0)].upstream_offset == 20)
        assert daemon.stop()[0] == 0
    history = [(c.upstream_offset, c.downstream_offset) for c in _checkpoints(cluster_b, group)]
    assert history == [(50, 60), (65, 65), (20, 20)]


# ------------------------------------------------------------- group offset sync


def test_group_offsets_are_synced_to_idle_groups_and_never_moved_back(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    prefix = f"cp-{uuid.uuid4().hex[:8]}"
    topic, group = f"{prefix}-t", f"{prefix}-g"
    remote = f"A.{topic}"
    create_topic(cluster_a, topic)
    produce(cluster_a, topic, [(0, None, b"x")] * 100)
    commit_offsets(cluster_a, group, {(topic, 0): 40})
    config = _config(
        tmp_path, cluster_a, cluster_b, prefix, **{"sync.group.offsets.enabled": "true"}
    )

    def on_b() -> int | None:
        return _group_offsets(cluster_b, group).get((remote, 0))

    with running_daemon(config):
        wait_until(lambda: on_b() == 40, what="the group's offset synced to B")
        with _member(cluster_b, group, remote) as member:
            commit_offsets(cluster_a, group, {(topic, 0): 60})
            wait_until(lambda: _latest(cluster_b, group)[(remote, 0)].downstream_offset == 60)
            # The group has a member on B: its position is left alone.
            _stays(lambda: (member.poll(0), on_b())[1] == 40)
            member.commit(offsets=[TopicPartition(remote, 0, 80)], asynchronous=False)
        # Idle again, but at 80 on B: the checkpoint (60) would move it back.
        _stays(lambda: on_b() == 80)
        commit_offsets(cluster_a, group, {(topic, 0): 90})
        wait_until(lambda: on_b() == 90, what="the group moved forward on B")


# -------------------------------------------------------------- translate-offsets


def test_translate_offsets_prints_applies_and_refuses(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    prefix = f"cp-{uuid.uuid4().hex[:8]}"
    topic, unreplicated, group = f"{prefix}-t", f"other-{prefix}", f"{prefix}-g"
    remote = f"A.{topic}"
    create_topic(cluster_a, topic, partitions=2)
    create_topic(cluster_a, unreplicated)
    produce(cluster_a, topic, [(i % 2, None, b"x") for i in range(100)])
    commit_offsets(cluster_a, group, {(topic, 0): 12, (topic, 1): 34})
    config = _config(tmp_path, cluster_a, cluster_b, prefix)
    with running_daemon(config):
        mirror = load_config(config)

        def confirmed() -> bool:
            report = gather(mirror, mirror.flow("A", "B"), group)
            return report.complete and all(row.status == "ok" for row in report.rows)

        wait_until(confirmed, what="checkpoints the syncs confirm for every partition")
        done = _translate(config, group, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        rows = [
            (r["topic"], r["partition"], r["upstream_offset"], r["downstream_offset"])
            for r in report["rows"]
        ]
        assert rows == [(remote, 0, 12, 12), (remote, 1, 34, 34)]
        assert all(r["status"] == "ok" and r["checkpoint_age_seconds"] >= 0 for r in report["rows"])

        text = _translate(config, group)
        assert text.returncode == 0, text.stderr
        lines = text.stdout.splitlines()
        assert lines[1].split() == [
            "TOPIC",
            "PARTITION",
            "UPSTREAM",
            "DOWNSTREAM",
            "AGE",
            "STATUS",
            "NOTE",
        ]
        assert lines[2].split()[:4] == [remote, "0", "12", "12"]
        assert lines[-1] == "2 of 2 partitions translated, 2 exact"

        applied = _translate(config, group, "--apply")
        assert applied.returncode == 0, applied.stderr
        assert _group_offsets(cluster_b, group) == {(remote, 0): 12, (remote, 1): 34}

        with _member(cluster_b, group, remote):
            refused = _translate(config, group, "--apply")
        assert refused.returncode == 2
        assert "active member" in refused.stderr and group in refused.stderr

        # A partition that cannot be translated is listed with the reason, exit 1.
        commit_offsets(cluster_a, group, {(unreplicated, 0): 0})
        partial = _translate(config, group)
        assert partial.returncode == 1
        assert f"{unreplicated} is not replicated by A->B" in partial.stdout

    unknown = _translate(config, f"{prefix}-nobody")
    assert unknown.returncode == 1
    assert "has no committed offsets on A and no checkpoints" in unknown.stdout
    bad = _translate(config, group, "--source", "Z")
    assert bad.returncode == 2 and "--source: unknown cluster 'Z'" in bad.stderr


def test_translate_offsets_reads_checkpoints_real_mm2_wrote(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    prefix = f"cp-mm2-{uuid.uuid4().hex[:8]}"
    topic, group = f"{prefix}-t", f"{prefix}-g"
    remote = f"A.{topic}"
    create_topic(cluster_a, topic)
    produce(cluster_a, topic, [(0, None, b"x")] * 50)
    # Committed before MM2 starts: its checkpoint connector finds the group at once.
    commit_offsets(cluster_a, group, {(topic, 0): 50})
    config = _config(tmp_path, cluster_a, cluster_b, prefix)
    with RealMirrorMaker(config, tmp_path / "mm2"):

        def checkpointed() -> dict[str, Any] | None:
            report: dict[str, Any] = json.loads(_translate(config, group, "--json").stdout)
            rows = [r for r in report["rows"] if r["upstream_offset"] == 50]
            return rows[0] if rows else None

        row = wait_until(
            checkpointed, timeout=90, what="MM2's checkpoint read by translate-offsets"
        )
    assert row["topic"] == remote and row["downstream_offset"] is not None
    # MM2 may have written a newer checkpoint after the one seen above: --apply must
    # commit exactly what translate-offsets reports now that MM2 has stopped. MM2's syncs
    # promise no exactness: its checkpoint is committed when asked for explicitly.
    final: dict[str, Any] = json.loads(_translate(config, group, "--json").stdout)
    (now,) = [r for r in final["rows"] if r["upstream_offset"] == 50]
    applied = _translate(config, group, "--apply", "--accept-inexact")
    assert applied.returncode in (0, 1), applied.stderr
    assert _group_offsets(cluster_b, group) == {(remote, 0): now["downstream_offset"]}


# ------------------------------------------------ failing over right after catch-up


@pytest.mark.parametrize("mode", MODES)
def test_apply_right_after_catch_up_commits_the_exact_position(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, mode: Mode
) -> None:
    """Issue 24's sequence: 200 plain records, a committed transaction of 50 (its marker
    leaves a gap on A), 200 plain records per partition; the group at record 300, already
    checkpointed (past what was copied) when the last 200 come. Once B holds every record,
    `--apply` is run at once and again every 2 s until it exits 0: no run before may commit
    anything, and the group then reads record 300 first on every partition."""
    prefix = f"cp-catch-up-{uuid.uuid4().hex[:8]}"
    topic, group = f"{prefix}-t", f"{prefix}-g"
    remote = f"A.{topic}"
    partitions = 3
    create_topic(cluster_a, topic, partitions=partitions)

    def records(start: int, count: int) -> list[tuple[int, bytes | None, bytes | None]]:
        return [
            (p, None, str(i).encode())
            for i in range(start, start + count)
            for p in range(partitions)
        ]

    produce(cluster_a, topic, records(0, 200))
    producer = Producer(dict(cluster_a.client_properties(), **{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for p, _key, value in records(200, 50):
        producer.produce(topic, value=value, partition=p)
    end_transaction(producer, commit=True)
    # Record 300 will be at offset 301: the commit marker takes offset 250.
    commit_offsets(cluster_a, group, {(topic, p): 301 for p in range(partitions)})
    extra = {
        "emit.checkpoints.interval.seconds": "2",
        **(EXACTLY_ONCE if mode == "exactly-once" else {}),
    }
    config = _config(tmp_path, cluster_a, cluster_b, prefix, **extra)
    with running_daemon(config):
        wait_until(
            lambda: len(_latest(cluster_b, group)) == partitions,
            timeout=60,
            what="checkpoints of the group ahead of the copy",
        )
        produce(cluster_a, topic, records(250, 200))
        at_300 = {r.partition: r.offset for r in read_all(cluster_a, topic) if r.value == b"300"}
        assert at_300 == dict.fromkeys(range(partitions), 301)
        wait_copied(
            cluster_b,
            remote,
            dict.fromkeys(range(partitions), 450),
            transactional=mode == "exactly-once",
        )
        _apply_until_exact(config, cluster_b, group)
    assert _first_read(cluster_b, group, remote, partitions) == dict.fromkeys(
        range(partitions), b"300"
    )


@pytest.mark.parametrize("mode", MODES)
def test_apply_at_a_partition_end_past_transaction_markers_commits_the_end(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, mode: Mode
) -> None:
    """Issue 24, part 1: partitions that end with a committed transaction (0 and 1) and
    with an aborted one (2). A group that read everything sits past the last record,
    behind markers and aborted records no record's sync covers: once B holds every
    record, `--apply` (at once, then every 2 s) exits 0 and puts the group at B's end.
    Then the daemon is killed and started again, and a second group, committed at the end
    meanwhile, is applied the same way (the syncs are read again). A record produced
    afterwards is the first either group reads on B."""
    prefix = f"cp-end-{uuid.uuid4().hex[:8]}"
    topic, group, later = f"{prefix}-t", f"{prefix}-g", f"{prefix}-g2"
    remote = f"A.{topic}"
    partitions = 3
    create_topic(cluster_a, topic, partitions=partitions)
    produce(cluster_a, topic, [(p, None, b"plain") for _ in range(100) for p in range(partitions)])
    producer = Producer(dict(cluster_a.client_properties(), **{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    producer.begin_transaction()
    for _ in range(20):
        for p in range(partitions):
            producer.produce(topic, value=b"committed", partition=p)
    end_transaction(producer, commit=True)
    producer.begin_transaction()
    for _ in range(10):
        producer.produce(topic, value=b"aborted", partition=2)
    end_transaction(producer, commit=False)
    ends = end_offsets(cluster_a, topic)
    # 120 records each; a commit marker (offset 120); on 2, 10 aborted and their marker.
    assert ends == {0: 121, 1: 121, 2: 132}
    commit_offsets(cluster_a, group, {(topic, p): end for p, end in ends.items()})
    transactional = mode == "exactly-once"
    extra = {
        "emit.checkpoints.interval.seconds": "2",
        **(EXACTLY_ONCE if transactional else {}),
    }
    config = _config(tmp_path, cluster_a, cluster_b, prefix, **extra)
    with running_daemon(config):
        wait_copied(
            cluster_b, remote, dict.fromkeys(range(partitions), 120), transactional=transactional
        )
        _apply_until_exact(config, cluster_b, group)
    # One past each partition's last record on B (exactly-once: its commit marker's offset).
    last = {r.partition: r.offset for r in read_all(cluster_b, remote)}
    at_end = {(remote, p): last[p] + 1 for p in range(partitions)}
    assert _group_offsets(cluster_b, group) == at_end
    commit_offsets(cluster_a, later, {(topic, p): end for p, end in ends.items()})
    with running_daemon(config):
        _apply_until_exact(config, cluster_b, later)
        assert _group_offsets(cluster_b, later) == at_end
        produce(cluster_a, topic, [(p, None, b"after") for p in range(partitions)])
        wait_copied(
            cluster_b, remote, dict.fromkeys(range(partitions), 121), transactional=transactional
        )
    for g in (group, later):
        assert _first_read(cluster_b, g, remote, partitions) == dict.fromkeys(
            range(partitions), b"after"
        )
