"""mm2py clusters against real brokers: several `mm2py run` processes share a flow's tasks.

Every test runs real `mm2py run` processes on one config (so they form one cluster
through the flow's group on B) while a producer writes numbered records into A, then
reads the remote topics back and compares them with the source, partition by partition:

- a node killed with -9: its tasks resume on the others within 15 s, nothing is lost,
  and records are repeated only in its partitions, as a replay of what it copied after
  its last recorded progress (in flight);
- a node joining, one leaving with SIGTERM, a rolling restart of every node: nothing
  lost, nothing repeated;
- a new topic: no partition changes task and no task restarts;
- the node running the flow's once-per-flow work (task 0) killed with -9:
  checkpoints, heartbeats and config sync go on from another node;
- hand-over between real MM2 and a 2-node mm2py cluster, both ways.

The kill and the join/leave tests run under both group protocols (KIP-848's
`consumer`, which `auto` picks on these Kafka 4 brokers, and `classic`).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry  # type: ignore[attr-defined]
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from mm2py.compat.formats import (
    Checkpoint,
    Heartbeat,
)
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import RealMirrorMaker
from mm2py.kafka import clients
from mm2py.kafka.internal_topics import read_offset_syncs
from mm2py.runtime.assignment import task_of
from tests.conftest import Clusters
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.integration.test_mm2_handover import (
    HALF,
    PARTITIONS,
    _assert_exact_copy,
    _batch,
    _count,
)
from tests.kafka_helpers import (
    RECENT_MS,
    SYNCS_TOPIC,
    LiveProducer,
    Rec,
    commit_offsets,
    create_topic,
    produce,
    read_all,
    recorded_progress,
    wait_until,
)

pytestmark = pytest.mark.integration

FLOW = "A->B"
# The bound on a dead node's tasks moving (MM2: up to 5 minutes).
FAILOVER_S = 15.0
# Starting a node on a busy 2-core machine: interpreter, imports, group join, a task
# process each (spawned and importing mm2py), remote topics.
START_TIMEOUT = 60.0
ONCE_PER_FLOW = ("checkpoint", "sync", "source-ends", "heartbeat")
# "flow A->B: tasks 0, 3 assigned to this node" (mm2py.cluster.member), with its time.
_MOVE_LINE = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ mm2py\.cluster\.member "
    r"flow \S+: tasks (?P<tasks>[\d, ]+) (?P<what>assigned|move|lost)",
    re.MULTILINE,
)
# The group protocols a cluster can use: `auto` is `classic` with cooperative-sticky and a
# 10 s session on brokers with Kafka 4's defaults (whose KIP-848 sessions last 45 s);
# `consumer` is KIP-848's.
PROTOCOLS = ("auto", "consumer")


def protocol_key(protocol: str) -> dict[str, str]:
    return {"cluster.group.protocol": protocol}


def _config(
    tmp_path: Path, a: LocalCluster, b: LocalCluster, topics: str, tasks: int, **extra: str
) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(a, b, topics, **{"tasks.max": str(tasks), **extra}))
    return path


# -- the cluster as its nodes' REST APIs show it -----------------------------------------


class Cluster:
    """The nodes of one mm2py cluster, all `mm2py run` on one config.

    On leaving, every live node gets SIGTERM at once (so they leave the flow's group
    together rather than hand their tasks round one by one) and is killed if it still
    runs 15 s later.
    """

    def __init__(self, config: Path) -> None:
        self.config = config
        self.nodes: list[RunningDaemon] = []
        self._stack = ExitStack()

    def start(self) -> RunningDaemon:
        node = self._stack.enter_context(running_daemon(self.config))
        self.nodes.append(node)
        return node

    def __enter__(self) -> Cluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        live = [n for n in self.nodes if _alive(n)]
        if exc is not None:  # how the cluster looked (running_daemon prints the logs)
            for node in live:
                try:
                    print(f"--- status on {node.listen}: {node.status(FLOW)}")
                except OSError as error:
                    print(f"--- no status on {node.listen}: {error}")
        for node in live:
            node.proc.send_signal(signal.SIGTERM)
        for node in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(15)
        return self._stack.__exit__(exc_type, exc, tb)


def _alive(node: RunningDaemon) -> bool:
    return node.proc.poll() is None


def _running_tasks(nodes: Sequence[RunningDaemon]) -> dict[int, tuple[RunningDaemon, Any]]:
    """task id -> (node, its part status) of every task RUNNING on a live node now.

    The partitions of `A.heartbeats` are left out of each task's: MM2's rules copy the
    heartbeats topic whatever the filter, and it appears on A when the pair B->A starts
    emitting, at a moment of its own.
    """
    out: dict[int, tuple[RunningDaemon, Any]] = {}
    for node in nodes:
        if not _alive(node):
            continue
        try:
            parts = node.status_json(FLOW)["parts"]
        except (OSError, ValueError, KeyError):
            continue  # not serving yet, or stopping
        for part in parts:
            if part["part"] == "source" and part["state"] == "RUNNING":
                own = [p for p in part["partitions"] if not p.startswith("A.heartbeats-")]
                out[part["task"]] = (node, {**part, "partitions": own})
    return out


def _wait_tasks(
    nodes: Sequence[RunningDaemon], tasks: int, partitions: int = 0, timeout: float = START_TIMEOUT
) -> dict[int, tuple[RunningDaemon, Any]]:
    """Until the live `nodes` run every one of the flow's `tasks`, spread evenly (each
    node's count within one of the others'), and the tasks report `partitions`
    partitions in all (their copy loops have them)."""
    live = [n for n in nodes if _alive(n)]

    def probe() -> dict[int, tuple[RunningDaemon, Any]] | None:
        running = _running_tasks(live)
        counts = [sum(1 for n, _ in running.values() if n is node) for node in live]
        reported = sum(len(part["partitions"]) for _n, part in running.values())
        balanced = max(counts) - min(counts) <= 1
        if set(running) == set(range(tasks)) and balanced and reported >= partitions:
            return running
        return None

    return wait_until(
        probe,
        timeout=timeout,
        interval=0.5,
        what=f"{tasks} tasks running, spread over {len(live)} nodes",
    )


def _tasks_of(running: dict[int, tuple[RunningDaemon, Any]], node: RunningDaemon) -> set[int]:
    return {task for task, (n, _part) in running.items() if n is node}


def _moves(node: RunningDaemon) -> list[tuple[float, str, set[int]]]:
    """(epoch seconds, assigned/move/lost, task ids) of each task move in the node's log."""
    out = []
    for m in _MOVE_LINE.finditer(node.log()):
        at = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        out.append((at, m["what"], {int(t) for t in m["tasks"].split(",")}))
    return out


def _once_per_flow_states(node: RunningDaemon) -> dict[str, str]:
    try:
        parts = node.status_json(FLOW)["parts"]
    except (OSError, ValueError, KeyError):
        return {}
    return {p["part"]: p["state"] for p in parts if p["part"] in ONCE_PER_FLOW}


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# -- what was copied -------------------------------------------------------------------


class _Watermarks:
    """End offsets of a topic's partitions, through one consumer kept open."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.consumer = clients.consumer(cluster.client_properties())

    def __call__(self, topic: str, partitions: Iterable[int]) -> dict[int, int]:
        out = {}
        for p in partitions:
            try:
                out[p] = self.consumer.get_watermark_offsets(TopicPartition(topic, p), 5)[1]
            except KafkaException:
                out[p] = 0  # not created yet
        return out

    def close(self) -> None:
        self.consumer.close()


def _by_partition(records: list[Rec]) -> dict[int, list[tuple[Any, ...]]]:
    out: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[rec.partition].append(rec.content())
    return dict(out)


@dataclass(frozen=True)
class Replays:
    """How a partition's copy repeated records."""

    repeated: int  # copies beyond one per source record
    starts: tuple[int, ...]  # where each replay began: the position of its first record


def _replayed(source: list[tuple[Any, ...]], target: list[tuple[Any, ...]], where: str) -> Replays:
    """Assert that `target` is `source` copied in order with nothing lost, where a record
    is repeated only as a replay (the copy went back to an earlier record and went on
    from there, as after a dead node's in-flight records); say how it repeated."""
    index = {content: i for i, content in enumerate(source)}
    assert len(index) == len(source), f"{where}: the source repeats records"
    previous = -1
    starts = []
    for i, content in enumerate(target):
        position = index.get(content)
        assert position is not None, f"{where}: copy {i} is no source record: {content}"
        # A copy is the record after the one before it, or goes back (a replay): one
        # further on means the records in between were lost (or came out of order).
        assert position <= previous + 1, (
            f"{where}: copy {i} is source record {position} right after record {previous}: "
            f"records {previous + 1}..{position - 1} missing there"
        )
        if position <= previous:
            starts.append(position)
        previous = position
    copied = {index[c] for c in target}
    assert len(copied) == len(source), (
        f"{where}: {len(source) - len(copied)} of {len(source)} records never copied, "
        f"from record {min(set(range(len(source))) - copied)}"
    )
    return Replays(len(target) - len(source), tuple(starts))


def _assert_copied(
    a: LocalCluster, b: LocalCluster, topic: str, timeout: float = 60.0
) -> dict[int, Replays]:
    """Wait until B's copy of `topic` holds every record A has; assert each partition's
    copy is the source's in order, nothing lost, repeats only as replays; return the
    replays of each partition that has any."""
    remote = f"A.{topic}"
    source = _by_partition(read_all(a, topic))
    assert source, f"nothing to compare: {topic} on A is empty"

    def probe() -> dict[int, list[tuple[Any, ...]]] | None:
        try:
            target = _by_partition(read_all(b, remote))
        except KafkaException:
            return None  # not created yet
        have = {p: set(target.get(p, ())) for p in source}
        return target if all(set(records) <= have[p] for p, records in source.items()) else None

    try:
        target = wait_until(probe, timeout=timeout, interval=1.0, what=f"all of {topic} on B")
    except AssertionError:
        target = _by_partition(read_all(b, remote))  # compare anyway: say what is missing
    repeats = {
        p: _replayed(records, target.get(p, []), f"{remote} partition {p}")
        for p, records in sorted(source.items())
    }
    extra = set(target) - set(source)
    assert not extra, f"{remote}: partitions {extra} hold records that {topic} has not"
    return {p: replays for p, replays in repeats.items() if replays.repeated}


# -- tests ------------------------------------------------------------------------------


@pytest.mark.serial  # its 15 s bound is a time: alone in a parallel run (docs/tests.md)
@pytest.mark.parametrize(("protocol", "chosen"), [("auto", "classic"), ("consumer", "consumer")])
def test_a_dead_nodes_tasks_resume_elsewhere_within_15_s_losing_nothing(
    clusters: Clusters,
    cluster_a: LocalCluster,
    unique: str,
    tmp_path: Path,
    protocol: str,
    chosen: str,
) -> None:
    # `auto` on B, whose brokers have Kafka's defaults, must choose classic. Under
    # `consumer` the brokers set the session: 45 s on default brokers, so that case
    # replicates to G, whose brokers give 10 s (conftest.SHORT_CONSUMER_SESSIONS), named
    # "B" in the config.
    cluster_b = clusters["B"] if protocol == "auto" else replace(clusters["G"], alias="B")
    partitions, tasks = 12, 6
    remote = f"A.{unique}"
    create_topic(cluster_a, unique, partitions)
    config = _config(tmp_path, cluster_a, cluster_b, unique, tasks, **protocol_key(protocol))
    with (
        contextlib.closing(_Watermarks(cluster_b)) as ends,
        LiveProducer(cluster_a, {unique: partitions}) as producer,
        Cluster(config) as cluster,
    ):
        nodes = [cluster.start() for _ in range(3)]
        running = _wait_tasks(nodes, tasks, partitions=partitions)
        assert all(f", {chosen} protocol, " in node.log() for node in nodes)
        # Each task copies the partitions assignment.task_of gives it, and says so.
        for task, (_node, part) in running.items():
            mine = [p for p in range(partitions) if task_of(unique, p, tasks) == task]
            assert sorted(part["partitions"]) == sorted(f"{remote}-{p}" for p in mine)

        victim = next(n for n in nodes if 0 not in _tasks_of(running, n))
        survivors = [n for n in nodes if n is not victim]
        orphans = _tasks_of(running, victim)
        moved = {p for p in range(partitions) if task_of(unique, p, tasks) in orphans}
        children = victim.task_pids()
        assert len(children) == len(orphans) == 2, (children, orphans)
        # Killed while copying steadily: once it has recorded progress of its own, which
        # the next owner must start after (a task may need seconds to start here).
        earlier = recorded_progress(cluster_b, "A", unique)

        def progress() -> dict[int, int] | None:
            found = recorded_progress(cluster_b, "A", unique)
            ahead = all(found.get(p, -1) > earlier.get(p, -1) for p in moved)
            return found if ahead else None

        recorded = wait_until(progress, what=f"progress of partitions {sorted(moved)} recorded")

        killed_wall = time.time()
        victim.stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(
            lambda: not any(_pid_alive(pid) for pid in children),
            timeout=5,
            what=f"the dead node's task processes {children} to die with it",
        )
        time.sleep(0.5)  # requests the dead tasks had sent are served by now
        at_death = ends(remote, moved)
        resumed: dict[int, float] = {}
        all_running: float | None = None
        while time.monotonic() < killed + 2 * FAILOVER_S:
            now = ends(remote, moved)
            for p in moved:
                if p not in resumed and now[p] > at_death[p]:
                    resumed[p] = time.monotonic() - killed
            if all_running is None and set(_running_tasks(survivors)) == set(range(tasks)):
                all_running = time.monotonic() - killed
            if len(resumed) == len(moved) and all_running is not None:
                break
            time.sleep(0.1)
        assigned = [
            at - killed_wall
            for node in survivors
            for at, what, ids in _moves(node)
            if what == "assigned" and at >= killed_wall and ids & orphans
        ]
        print(
            f"kill -9 of a node with tasks {sorted(orphans)}: the group gave them to the others "
            f"after {', '.join(f'{s:.1f}' for s in assigned) or '-'} s, every task RUNNING "
            f"after {all_running} s, first copies of each moved partition after "
            f"{ {p: round(s, 1) for p, s in sorted(resumed.items())} } s"
        )
        assert set(resumed) == moved, f"partitions {moved - set(resumed)} not copied again"
        assert max(resumed.values()) <= FAILOVER_S
        _wait_tasks(survivors, tasks)  # three tasks each
        time.sleep(2)  # the stream goes on on the new owners
        producer.stop()
        replays = _assert_copied(cluster_a, cluster_b, unique)
        print(f"progress recorded before the kill: {recorded}; replays: {replays}")
        # Only the dead node's partitions are replayed (no other task moved), each once,
        # from after progress it had recorded (records are at offsets 0, 1, ... here).
        assert set(replays) <= moved
        for p, replay in replays.items():
            assert len(replay.starts) == 1, f"partition {p} replayed more than once: {replay}"
            assert replay.starts[0] > recorded[p], (
                f"partition {p} replayed from offset {replay.starts[0]}, before the progress "
                f"{recorded[p]} recorded before the kill"
            )


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_node_joining_and_one_leaving_lose_and_repeat_nothing(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path, protocol: str
) -> None:
    partitions, tasks = 8, 4
    create_topic(cluster_a, unique, partitions)
    config = _config(tmp_path, cluster_a, cluster_b, unique, tasks, **protocol_key(protocol))
    with LiveProducer(cluster_a, {unique: partitions}) as producer, Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(2)]
        _wait_tasks(nodes, tasks, partitions=partitions)
        nodes.append(cluster.start())
        running = _wait_tasks(nodes, tasks)  # the new node took its share
        assert _tasks_of(running, nodes[2])
        code, took = nodes[0].stop()
        assert code == 0 and took < 10, f"SIGTERM: exit {code} after {took:.1f} s"
        _wait_tasks(nodes, tasks)
        time.sleep(2)
        producer.stop()
        assert _assert_copied(cluster_a, cluster_b, unique) == {}


def test_a_rolling_restart_of_every_node_loses_and_repeats_nothing(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    partitions, tasks = 6, 3
    create_topic(cluster_a, unique, partitions)
    config = _config(tmp_path, cluster_a, cluster_b, unique, tasks)
    with LiveProducer(cluster_a, {unique: partitions}) as producer, Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(3)]
        _wait_tasks(nodes, tasks, partitions=partitions)
        for i in range(len(nodes)):
            code, took = nodes[i].stop()
            assert code == 0 and took < 10, f"SIGTERM of node {i}: exit {code} after {took:.1f} s"
            nodes[i] = cluster.start()
            running = _wait_tasks(nodes, tasks)  # one task each: the new node has its own
            assert _tasks_of(running, nodes[i])
        time.sleep(2)
        producer.stop()
        assert _assert_copied(cluster_a, cluster_b, unique) == {}


def test_a_new_topic_moves_no_partition_and_restarts_no_task(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    tasks = 4
    first, second = f"{unique}-1", f"{unique}-2"
    create_topic(cluster_a, first, 6)
    config = _config(tmp_path, cluster_a, cluster_b, f"{unique}-.*", tasks)
    with LiveProducer(cluster_a, {first: 6}) as producer, Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(2)]
        before = _wait_tasks(nodes, tasks, partitions=6)
        pids = {node.proc.pid: node.task_pids() for node in nodes}
        moves = {node.proc.pid: _moves(node) for node in nodes}
        assert all(len(p) == 2 for p in pids.values()), pids

        create_topic(cluster_a, second, 4)
        producer.add(second, 4)
        _wait_tasks(nodes, tasks, partitions=10)  # the new topic's partitions are copied
        time.sleep(2)  # records of both topics flow for a while
        producer.stop()
        assert _assert_copied(cluster_a, cluster_b, first) == {}
        assert _assert_copied(cluster_a, cluster_b, second) == {}
        after = _wait_tasks(nodes, tasks, partitions=10)

        for task, (node, part) in before.items():
            now_node, now = after[task]
            assert now_node is node, f"task {task} moved to another node"
            assert set(part["partitions"]) <= set(now["partitions"]), f"task {task} lost some"
            added = set(now["partitions"]) - set(part["partitions"])
            assert added == {
                f"A.{second}-{p}" for p in range(4) if task_of(second, p, tasks) == task
            }, f"task {task} took partitions {added} of the new topic"
            assert now["restarts"] == part["restarts"] == 0
        assert {node.proc.pid: node.task_pids() for node in nodes} == pids, "a task restarted"
        assert {node.proc.pid: _moves(node) for node in nodes} == moves, "tasks moved"


def _checkpointed(b: LocalCluster, group: str) -> dict[tuple[str, int], int]:
    """The latest upstream offset checkpointed on B for each partition of `group`."""
    out: dict[tuple[str, int], int] = {}
    for rec in read_all(b, "A.checkpoints.internal"):
        cp = Checkpoint.decode(rec.key, rec.value)
        if cp.consumer_group_id == group:
            out[(cp.topic, cp.partition)] = cp.upstream_offset
    return out


def _synced_through(a: LocalCluster, topic: str, last: dict[int, int]) -> bool:
    """Whether A's offset syncs translate each partition's `last` offset exactly."""
    store = read_offset_syncs(a.client_properties(), "A", SYNCS_TOPIC)
    if store is None:
        return False
    found = {p: store.translation(topic, p, offset) for p, offset in last.items()}
    return all(t is not None and t.exact for t in found.values())


def _heartbeats_since(b: LocalCluster, since_ms: int) -> int:
    """How many A->B heartbeats on B were emitted at or after `since_ms`."""
    count = 0
    for rec in read_all(b, "heartbeats"):
        beat = Heartbeat.decode(rec.key, rec.value)
        if (beat.source_cluster_alias, beat.target_cluster_alias) == ("A", "B"):
            count += beat.timestamp_ms >= since_ms
    return count


def _retention(cluster: LocalCluster, topic: str) -> str | None:
    admin = clients.admin_client(cluster.client_properties())
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    entry = configs.get("retention.ms")
    return None if entry is None else str(entry.value)


def _set_retention(cluster: LocalCluster, topic: str, value: str) -> None:
    entry = ConfigEntry("retention.ms", value, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry])
    admin = clients.admin_client(cluster.client_properties())
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def test_once_per_flow_work_goes_on_from_another_node_when_its_node_dies(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    tasks, remote, group = 2, f"A.{unique}", f"{unique}-group"
    # Days, not less: the records are stamped an hour ago.
    create_topic(cluster_a, unique, 2, config={"retention.ms": "86400000"})
    produce(
        cluster_a,
        unique,
        [(i % 2, f"k{i}".encode(), f"v{i}".encode(), [], RECENT_MS + i) for i in range(200)],
    )
    config = _config(tmp_path, cluster_a, cluster_b, unique, tasks, groups=f"{unique}-.*")
    with Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(2)]
        running = _wait_tasks(nodes, tasks, partitions=2)
        leader = running[0][0]
        other = next(n for n in nodes if n is not leader)
        assert _once_per_flow_states(leader) == dict.fromkeys(ONCE_PER_FLOW, "RUNNING")
        assert _once_per_flow_states(other) == dict.fromkeys(ONCE_PER_FLOW, "STANDBY")
        _assert_copied(cluster_a, cluster_b, unique)
        commit_offsets(cluster_a, group, {(unique, 0): 40, (unique, 1): 40})
        wait_until(
            lambda: _checkpointed(cluster_b, group) == {(remote, 0): 40, (remote, 1): 40},
            what=f"checkpoints of {group} at 40",
        )
        # Killed once the offset syncs reach the last records: the source part syncs its
        # latest copy within a second, and a node killed before that leaves the tail
        # unsynced, so that 90 would translate no further than 40 did and, a checkpoint
        # never moving back, no new one would come (docs/design/offset-translation.md).
        wait_until(
            lambda: _synced_through(cluster_a, unique, {0: 99, 1: 99}),
            what=f"offset syncs of {unique} through its last records",
        )

        killed_ms = int(time.time() * 1000)
        leader.stop(signal.SIGKILL)
        killed = time.monotonic()
        wait_until(
            lambda: _once_per_flow_states(other) == dict.fromkeys(ONCE_PER_FLOW, "RUNNING"),
            timeout=2 * FAILOVER_S,
            interval=0.1,
            what="checkpoint, sync and heartbeat parts RUNNING on the other node",
        )
        took = time.monotonic() - killed
        assert took <= FAILOVER_S
        commit_offsets(cluster_a, group, {(unique, 0): 90, (unique, 1): 90})
        _set_retention(cluster_a, unique, "172800000")
        wait_until(
            lambda: _heartbeats_since(cluster_b, killed_ms) > 0, what="a heartbeat after the kill"
        )
        heartbeat = time.monotonic() - killed
        wait_until(
            lambda: _checkpointed(cluster_b, group) == {(remote, 0): 90, (remote, 1): 90},
            what=f"checkpoints of {group} at 90 after the kill",
        )
        checkpoint = time.monotonic() - killed
        wait_until(
            lambda: _retention(cluster_b, remote) == "172800000",
            what=f"retention.ms of {unique} synced to {remote} after the kill",
        )
        synced = time.monotonic() - killed
        print(
            f"after the kill -9 of task 0's node: once-per-flow parts RUNNING on the other "
            f"node in {took:.1f} s; first heartbeat {heartbeat:.1f} s, new checkpoints "
            f"{checkpoint:.1f} s, config synced {synced:.1f} s after the kill"
        )
        # Task 0 moved too: its partition goes on being copied.
        produce(
            cluster_a,
            unique,
            [
                (i % 2, f"k{i}".encode(), f"v{i}".encode(), [], RECENT_MS + i)
                for i in range(200, 300)
            ],
        )
        _assert_copied(cluster_a, cluster_b, unique)


def _handover_config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topic: str) -> Path:
    """test_mm2_handover's file, split into two tasks (MM2 runs two tasks too)."""
    return _config(tmp_path, a, b, topic, 2)


def test_a_two_node_cluster_continues_where_mirrormaker2_stopped(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    produce(cluster_a, unique, _batch(0))
    config = _handover_config(tmp_path, cluster_a, cluster_b, unique)
    with RealMirrorMaker(config, tmp_path / "mm2") as mm2:
        wait_until(lambda: _count(cluster_b, f"A.{unique}") >= HALF, timeout=120, what="MM2 copy")
        mm2.stop()
    with Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(2)]
        _wait_tasks(nodes, 2)  # one task on each node, from MM2's progress
        produce(cluster_a, unique, _batch(HALF))
        _assert_exact_copy(cluster_a, cluster_b, unique)
        for node in nodes:
            assert node.stop()[0] == 0


def test_mirrormaker2_continues_where_a_two_node_cluster_stopped(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    config = _handover_config(tmp_path, cluster_a, cluster_b, unique)
    with Cluster(config) as cluster:
        nodes = [cluster.start() for _ in range(2)]
        _wait_tasks(nodes, 2)  # one task on each node, both copying what comes
        produce(cluster_a, unique, _batch(0))
        wait_until(
            lambda: _count(cluster_b, f"A.{unique}") >= HALF, what="the 2-node cluster's copy"
        )
        for node in nodes:
            assert node.stop()[0] == 0
    produce(cluster_a, unique, _batch(HALF))
    with RealMirrorMaker(config, tmp_path / "mm2"):
        _assert_exact_copy(cluster_a, cluster_b, unique)
