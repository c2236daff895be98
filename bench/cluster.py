"""Cluster benchmark: mm2py's copy by task count and node count, and a kill -9's timeline.

    .venv/bin/python -m bench.cluster            # everything (~7 min)
    .venv/bin/python -m bench.cluster --quick    # smoke run: 10x fewer records
    .venv/bin/python -m bench.cluster --workloads large --no-kill \
        --layouts "1 node x 1 task" "1 node x 4 tasks" --set B.producer.linger.ms=5

Throughput, per workload (8 partitions: 2,000,000 x 100 B "small", 500,000 x 1 KiB
"large") and per layout of the flow's tasks (mm2py.cluster): one node with
tasks.max = 1, 2 and 4, and two nodes with tasks.max = 4 (2 tasks each). Each layout
copies its own pre-filled topic from A to B. The nodes start with the flow paused
(PUT /flows/A->B/pause as soon as each answers) and are resumed once every task is
there, spread evenly over the nodes, and has had 3 seconds to start, so
start-up and the first tasks' moves between nodes are left out (records a task
copied before its pause are counted before the window). The window runs from the
first look at B's end offsets that sees the copy going again to the first that sees
every record. CPU: the user+sys CPU-seconds of the node processes and their task
processes (from /proc/<pid>/stat, bench.processes.ProcessCpu) over the same window, per
million records copied in it (``node_processes_cpu_s_per_m_records``: the node
processes' own share, without their tasks), and what the paused cluster used a second
before (``idle_cpu_s_per_s``: the clients' threads, the once-per-flow parts; paid
whatever is copied). The REST API is not called during the window.

The machine is shared (2 cores, the brokers on them too): every line has the load
averages and how many cores were idle before the run (``free_cores_before``, from
/proc/stat over 2 s) and during its window (``free_cores_during``; the whole machine,
mm2py included): a layout can only gain from more tasks while cores are free.

Kill -9: two nodes, tasks.max = 4, 8 partitions, a producer writing 2,000 records/s
of 100 B; the node that does not run task 0 is killed with SIGKILL, and the timeline
says, in seconds from the kill: its task processes gone (they die with their node),
the group giving its tasks to the other node (that node's log line), every task
RUNNING there (REST status), and the first record copied by the new owner into each
of the moved partitions (B's end offsets growing again; first and last partition).

Clusters as bench.replication: fresh A and B when their ports are free, otherwise the
running ones (MM2PY_LOCAL_PORT_OFFSET moves the ports). Prints one JSON line per
measurement on stdout, then a table; progress goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import logging
import os
import re
import signal
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from confluent_kafka import KafkaException, TopicPartition

from bench.perf_tools import ToolError, prefill
from bench.processes import ProcessCpu
from bench.replication import bench_clusters, topic_properties
from bench.replicators import ReplicatorError, Running, check_alive, free_port, running_command
from bench.report import add_set_option, emit, load_averages, logs_dir
from bench.topics import bench_topic, create_topic, delete_topics
from bench.workload import MIB, Workload, cpu_per_million
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import render_properties
from mm2py.dev.processes import process_tree
from mm2py.kafka import clients
from mm2py.runtime.assignment import task_of

log = logging.getLogger("bench.cluster")

FLOW: Final = "A->B"
PARTITIONS: Final = 8
WORKLOADS: Final = {
    "small": Workload(partitions=PARTITIONS, records=2_000_000, record_bytes=100),
    "large": Workload(partitions=PARTITIONS, records=500_000, record_bytes=1024),
}


@dataclass(frozen=True)
class Layout:
    """`nodes` nodes sharing a flow of `tasks` tasks."""

    nodes: int
    tasks: int

    @property
    def label(self) -> str:
        per_node = self.tasks // self.nodes
        return f"{self.nodes} node{'s' if self.nodes > 1 else ''} x {per_node} task" + (
            "s" if per_node > 1 else ""
        )


LAYOUTS: Final = (Layout(1, 1), Layout(1, 2), Layout(1, 4), Layout(2, 4))
# How often B's end offsets (and the nodes' CPU time) are read during a copy.
SAMPLE_INTERVAL: Final = 0.25
START_TIMEOUT: Final = 120.0
# After the paused cluster has settled: time for its task processes to finish starting,
# then the seconds its idle CPU use is measured over.
PAUSE_SETTLE: Final = 1.0
IDLE_SECONDS: Final = 2.0
# Kill -9 timeline: a steady stream into 8 partitions.
KILL_RATE: Final = 2000
KILL_RECORD_BYTES: Final = 100
KILL_TASKS: Final = 4
KILL_TIMEOUT: Final = 60.0
_ASSIGNED = re.compile(
    r"^(?P<at>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ mm2py\.cluster\.member "
    r"flow \S+: tasks (?P<tasks>[\d, ]+) assigned",
    re.MULTILINE,
)


# -- the machine ------------------------------------------------------------------------


def _cpu_times() -> tuple[int, int]:
    """(idle + iowait, total) jiffies of the whole machine so far."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:9]]
    return fields[3] + fields[4], sum(fields)


def _free_cores(since: tuple[int, int], until: tuple[int, int]) -> float:
    """Cores idle on average between two `_cpu_times()` readings."""
    idle, total = until[0] - since[0], until[1] - since[1]
    return round(idle / total * (os.cpu_count() or 1), 2) if total > 0 else 0.0


def free_cores_now(seconds: float = 2.0) -> float:
    """Cores idle on average over the next `seconds`."""
    before = _cpu_times()
    time.sleep(seconds)
    return _free_cores(before, _cpu_times())


# -- the nodes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Node:
    running: Running
    listen: str

    def status(self) -> dict[str, Any] | None:
        """The flow's REST status, or None while the node does not answer."""
        url = f"http://{self.listen}/flows/{urllib.parse.quote(FLOW)}/status"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                parsed: dict[str, Any] = json.loads(resp.read())
                return parsed
        except (OSError, ValueError):
            return None

    def put(self, action: str) -> bool:
        """PUT /flows/A->B/<action> (pause, resume); whether the node took it."""
        url = f"http://{self.listen}/flows/{urllib.parse.quote(FLOW)}/{action}"
        try:
            with urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=10):
                return True
        except OSError:
            return False


def _config(
    run_dir: Path,
    source: LocalCluster,
    target: LocalCluster,
    topic: str,
    tasks: int,
    extra: Mapping[str, str],
) -> Path:
    props = topic_properties(source, target, topic)
    props["tasks.max"] = str(tasks)
    props.update(extra)
    config = run_dir / f"{topic}.properties"
    config.write_text(render_properties(props), encoding="latin-1")
    return config


@contextmanager
def cluster(config: Path, nodes: int) -> Iterator[list[Node]]:
    """`nodes` x `mm2py run CONFIG`, started together; SIGTERM (then kill) on leaving."""
    with ExitStack() as stack:
        out = []
        for i in range(nodes):
            listen = f"127.0.0.1:{free_port()}"
            cmd = [sys.executable, "-m", "mm2py.cli", "run", str(config), "--listen", listen]
            log_file = config.with_suffix(f".node{i}.log")
            running, _ = stack.enter_context(running_command(f"mm2py node {i}", cmd, log_file))
            out.append(Node(running, listen))
        yield out


def running_tasks(
    nodes: Sequence[Node], states: Sequence[str] = ("RUNNING",)
) -> dict[int, tuple[int, int]] | None:
    """task id -> (index of the node running it, partitions it reports) of the tasks in
    one of `states`, if every live node answers."""
    out: dict[int, tuple[int, int]] = {}
    for i, node in enumerate(nodes):
        if not node.running.is_running():
            continue
        status = node.status()
        if status is None:
            return None
        for part in status["parts"]:
            if part["part"] == "source" and part["state"] in states:
                out[part["task"]] = (i, len(part["partitions"]))
    return out


def settled(
    nodes: Sequence[Node], tasks: int, partitions: int, states: Sequence[str] = ("RUNNING",)
) -> bool:
    """Every task RUNNING, the live nodes' counts within one of each other, and the
    tasks' copy loops reporting `partitions` partitions in all (a task shows RUNNING
    from its process's start, while it is still importing mm2py)."""
    running = running_tasks(nodes, states)
    if running is None or set(running) != set(range(tasks)):
        return False
    live = [i for i, n in enumerate(nodes) if n.running.is_running()]
    counts = [sum(1 for owner, _ in running.values() if owner == i) for i in live]
    reported = sum(n for _, n in running.values())
    return max(counts) - min(counts) <= 1 and reported >= partitions


def _settle_paused(nodes: Sequence[Node], tasks: int, deadline: float) -> None:
    """Pause the flow on every node as soon as it answers, then wait until its tasks are
    all there (PAUSED or RUNNING), spread evenly, and PAUSE_SETTLE seconds more: their
    processes have started, their clients are connected, the remote topics made."""
    paused: set[int] = set()
    while True:
        for i, node in enumerate(nodes):
            if i not in paused and node.put("pause"):
                paused.add(i)
        if len(paused) == len(nodes) and settled(nodes, tasks, 0, ("PAUSED", "RUNNING")):
            break
        for node in nodes:
            check_alive(node.running)
        if time.monotonic() > deadline:
            raise ReplicatorError(f"{len(nodes)} nodes did not settle on {tasks} tasks")
        time.sleep(0.2)
    time.sleep(PAUSE_SETTLE)


class Offsets:
    """End offsets of a topic's partitions on one cluster, through one open consumer."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.consumer = clients.consumer(cluster.client_properties())

    def __call__(self, topic: str, partitions: int) -> dict[int, int]:
        out = {}
        for p in range(partitions):
            try:
                out[p] = self.consumer.get_watermark_offsets(TopicPartition(topic, p), 5)[1]
            except KafkaException:
                out[p] = 0  # not created yet, or no leader this moment
        return out

    def close(self) -> None:
        self.consumer.close()


# -- throughput -------------------------------------------------------------------------


def throughput(
    layout: Layout,
    workload: Workload,
    name: str,
    clusters: dict[str, LocalCluster],
    run_dir: Path,
    extra: Mapping[str, str],
) -> dict[str, Any]:
    """`layout` copying its own pre-filled copy of `workload` from A to B."""
    source, target = clusters["A"], clusters["B"]
    topic = bench_topic(workload, f"bench-cluster-{layout.nodes}n{layout.tasks}t")
    remote = f"{source.alias}.{topic}"
    offsets = Offsets(target)
    try:
        log.info("%s, %s: pre-filling %s", layout.label, workload.label, topic)
        prefill(source, topic, workload)
        load = load_averages()
        free_before = free_cores_now()
        config = _config(run_dir, source, target, topic, layout.tasks, extra)
        timeout = START_TIMEOUT + workload.total_bytes / (2 * MIB)
        with cluster(config, layout.nodes) as nodes:
            launched = time.monotonic()
            _settle_paused(nodes, layout.tasks, launched + timeout)
            settled_after = time.monotonic() - launched
            # What the paused cluster costs a second (clients' threads, the flow's
            # once-per-flow parts): paid whatever is copied.
            cpus = [ProcessCpu(n.running.pid) for n in nodes]
            idle_from = sum(c.sample() for c in cpus)
            time.sleep(IDLE_SECONDS)
            idle_cpu = (sum(c.sample() for c in cpus) - idle_from) / IDLE_SECONDS
            before = sum(offsets(remote, workload.partitions).values())
            if before >= workload.records:
                raise ReplicatorError(f"{layout.label}: the copy ended before the pause")
            for node in nodes:
                node.put("resume")
            start: tuple[float, int, float, tuple[int, int]] | None = None
            nodes_cpu_start = 0.0
            while True:
                have = sum(offsets(remote, workload.partitions).values())
                now = time.monotonic()
                cpu = sum(c.sample() for c in cpus)
                if start is None and have > before:
                    start = (now, have, cpu, _cpu_times())
                    nodes_cpu_start = sum(c.seen.get(c.pid, 0.0) for c in cpus)
                if have >= workload.records:
                    break
                for node in nodes:
                    check_alive(node.running)
                if now - launched > timeout:
                    raise ReplicatorError(
                        f"{layout.label}: {remote} has {have} of {workload.records} records "
                        f"after {timeout:.0f} s"
                    )
                time.sleep(SAMPLE_INTERVAL)
            assert start is not None
            free_during = _free_cores(start[3], _cpu_times())
            copied = workload.records - start[1]
            seconds = now - start[0]
            cpu_s = cpu - start[2]
            # The node processes' own share (REST, reports from the tasks, statistics).
            nodes_cpu_s = sum(c.seen.get(c.pid, 0.0) for c in cpus) - nodes_cpu_start
    finally:
        offsets.close()
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    rate = copied / seconds
    return {
        "measure": "throughput",
        "workload": name,
        "records": workload.records,
        "record_bytes": workload.record_bytes,
        "layout": layout.label,
        "nodes": layout.nodes,
        "tasks_max": layout.tasks,
        "records_per_s": round(rate, 1),
        "mb_per_s": round(rate * workload.record_bytes / MIB, 2),
        "cpu_s_per_m_records": cpu_per_million(cpu_s, copied),
        "node_processes_cpu_s_per_m_records": cpu_per_million(nodes_cpu_s, copied),
        "window_s": round(seconds, 2),
        "records_in_window": copied,
        "records_before_window": start[1],
        "idle_cpu_s_per_s": round(idle_cpu, 3),
        "settled_after_s": round(settled_after, 2),
        "load_avg_before": load,
        "free_cores_before": free_before,
        "free_cores_during": free_during,
    }


# -- kill -9 ----------------------------------------------------------------------------


class SteadyProducer:
    """`rate` records a second of `size` bytes, round the partitions, until stopped."""

    def __init__(self, cluster: LocalCluster, topic: str, partitions: int, rate: int, size: int):
        self.producer = clients.producer(cluster.client_properties(), {"linger.ms": 5})
        self.topic, self.partitions, self.rate, self.size = topic, partitions, rate, size
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="steady-producer", daemon=True)

    def _run(self) -> None:
        value = b"x" * self.size
        batch = max(1, self.rate // 100)  # 100 rounds a second
        n = 0
        next_round = time.monotonic()
        while not self.stop.is_set():
            for _ in range(batch):
                try:
                    self.producer.produce(self.topic, value, partition=n % self.partitions)
                except BufferError:
                    self.producer.poll(0.1)
                n += 1
            self.producer.poll(0)
            next_round += batch / self.rate
            self.stop.wait(max(next_round - time.monotonic(), 0.0))
        self.producer.flush(30)

    def __enter__(self) -> SteadyProducer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop.set()
        self.thread.join(60)


def _assigned_at(log_file: Path, tasks: set[int], after: float) -> float | None:
    """When (epoch s) the node's log first says it was given any of `tasks`, after `after`."""
    text = log_file.read_text(errors="replace")
    for m in _ASSIGNED.finditer(text):
        at = datetime.strptime(m["at"], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if at >= after and {int(t) for t in m["tasks"].split(",")} & tasks:
            return at
    return None


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_timeline(
    clusters: dict[str, LocalCluster], run_dir: Path, extra: Mapping[str, str]
) -> dict[str, Any]:
    """Seconds from a node's kill -9 to each step of its tasks resuming on the other node."""
    source, target = clusters["A"], clusters["B"]
    topic = f"bench-cluster-kill-{uuid.uuid4().hex[:8]}"
    remote = f"{source.alias}.{topic}"
    offsets = Offsets(target)
    try:
        create_topic(source, topic, PARTITIONS)
        load = load_averages()
        free_before = free_cores_now()
        config = _config(run_dir, source, target, topic, KILL_TASKS, extra)
        with (
            SteadyProducer(source, topic, PARTITIONS, KILL_RATE, KILL_RECORD_BYTES),
            cluster(config, 2) as nodes,
        ):
            deadline = time.monotonic() + START_TIMEOUT
            while not settled(nodes, KILL_TASKS, PARTITIONS) or not any(
                offsets(remote, PARTITIONS).values()
            ):
                for node in nodes:
                    check_alive(node.running)
                if time.monotonic() > deadline:
                    raise ReplicatorError("the two nodes did not settle on 4 tasks, 2 each")
                time.sleep(0.5)
            time.sleep(3)  # a few seconds of steady copying on both nodes
            running = running_tasks(nodes) or {}
            victim = next(i for i in range(2) if running.get(0, (-1, 0))[0] != i)
            survivor = nodes[1 - victim]
            orphans = {t for t, (owner, _) in running.items() if owner == victim}
            moved = [p for p in range(PARTITIONS) if task_of(topic, p, KILL_TASKS) in orphans]
            victim_pid = nodes[victim].running.pid
            children = [p for p in process_tree(victim_pid) if p != victim_pid]
            log.info("kill -9 of node %d (tasks %s, partitions %s)", victim, orphans, moved)

            killed_wall = time.time()
            os.kill(nodes[victim].running.pid, signal.SIGKILL)
            killed = time.monotonic()
            gone: float | None = None
            all_running: float | None = None
            at_death: dict[int, int] | None = None
            resumed: dict[int, float] = {}
            while time.monotonic() - killed < KILL_TIMEOUT:
                now = time.monotonic() - killed
                if gone is None and not any(_alive(pid) for pid in children):
                    gone = now
                    time.sleep(0.2)  # requests the dead tasks had sent are served by now
                    at_death = offsets(remote, PARTITIONS)
                    continue
                if at_death is not None:
                    ends = offsets(remote, PARTITIONS)
                    for p in moved:
                        if p not in resumed and ends[p] > at_death[p]:
                            resumed[p] = now
                if all_running is None and set(running_tasks([survivor]) or {}) == set(
                    range(KILL_TASKS)
                ):
                    all_running = time.monotonic() - killed
                if len(resumed) == len(moved) and all_running is not None:
                    break
                time.sleep(0.05)
            assigned = _assigned_at(survivor.running.log_file, orphans, killed_wall)
    finally:
        offsets.close()
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    if len(resumed) < len(moved):
        raise ReplicatorError(
            f"partitions {sorted(set(moved) - set(resumed))} not copied again "
            f"{KILL_TIMEOUT:.0f} s after the kill"
        )
    return {
        "measure": "kill -9",
        "layout": "2 nodes x 2 tasks",
        "stream": f"{KILL_RATE} records/s x {KILL_RECORD_BYTES} B, {PARTITIONS} partitions",
        "moved_tasks": sorted(orphans),
        "task_processes_gone_s": None if gone is None else round(gone, 2),
        "tasks_assigned_s": None if assigned is None else round(assigned - killed_wall, 2),
        "all_tasks_running_s": None if all_running is None else round(all_running, 2),
        "first_copy_by_new_owner_s": round(min(resumed.values()), 2),
        "every_moved_partition_copying_s": round(max(resumed.values()), 2),
        "load_avg_before": load,
        "free_cores_before": free_before,
    }


# -- the table --------------------------------------------------------------------------


def table(lines: Sequence[dict[str, Any]]) -> str:
    """The run's figures as a Markdown table, with the ratios the issue's targets name."""
    rows = [
        "| workload | layout | records/s | MiB/s | CPU s / M records | CPU vs 1 task "
        "| idle CPU s/s | free cores before / during | load 1m before |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    one_task = {
        line["workload"]: line["cpu_s_per_m_records"]
        for line in lines
        if line.get("measure") == "throughput" and line["layout"] == "1 node x 1 task"
    }
    for line in lines:
        if line.get("measure") != "throughput":
            continue
        base = one_task.get(line["workload"])
        cpu = line["cpu_s_per_m_records"]
        ratio = f"{cpu / base:.2f}" if base and cpu is not None else "-"
        rows.append(
            f"| {line['workload']} ({line['records']:,} x {line['record_bytes']} B) "
            f"| {line['layout']} | {line['records_per_s']:,.0f} | {line['mb_per_s']} | {cpu} "
            f"| {ratio} | {line['idle_cpu_s_per_s']} "
            f"| {line['free_cores_before']} / {line['free_cores_during']} "
            f"| {line['load_avg_before'][0]} |"
        )
    for line in lines:
        if line.get("measure") == "kill -9":
            rows.append("")
            rows.append(
                f"kill -9 ({line['layout']}, {line['stream']}; free cores before "
                f"{line['free_cores_before']}, load {line['load_avg_before']}), seconds "
                f"from the kill: task processes gone {line['task_processes_gone_s']}, tasks "
                f"{line['moved_tasks']} assigned to the other node "
                f"{line['tasks_assigned_s']}, all tasks RUNNING {line['all_tasks_running_s']}, "
                f"first record copied by the new owner {line['first_copy_by_new_owner_s']} "
                f"(every moved partition {line['every_moved_partition_copying_s']})"
            )
    return "\n".join(rows)


# -- main -------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.cluster", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument("--quick", action="store_true", help="10x fewer records (smoke run)")
    parser.add_argument(
        "--workloads", nargs="+", choices=sorted(WORKLOADS), default=["small", "large"]
    )
    parser.add_argument("--no-kill", action="store_true", help="skip the kill -9 timeline")
    parser.add_argument(
        "--layouts",
        nargs="+",
        choices=[layout.label for layout in LAYOUTS],
        default=[layout.label for layout in LAYOUTS],
        metavar="LAYOUT",
        help='a subset of the layouts, e.g. "1 node x 1 task" "1 node x 4 tasks"',
    )
    add_set_option(parser)
    args = parser.parse_args(argv)
    extra = dict(args.set)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    scale = 10 if args.quick else 1
    run_dir = logs_dir() / f"cluster-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("logs and configs of this run: %s", run_dir)
    clusters, started = bench_clusters()
    load_start = load_averages()
    lines: list[dict[str, Any]] = []
    failures = 0

    def measure(what: str, run: Any) -> None:
        nonlocal failures
        try:
            line = run()
        except (ReplicatorError, ToolError, TimeoutError, KafkaException) as e:
            failures += 1
            log.error("%s failed: %s", what, e)
            emit({"measure": what, "error": str(e)})
            return
        lines.append(line)
        emit(line)

    try:
        for name in args.workloads:
            w = WORKLOADS[name]
            workload = Workload(w.partitions, w.records // scale, w.record_bytes)
            for layout in (lay for lay in LAYOUTS if lay.label in args.layouts):
                measure(
                    f"{layout.label}, {workload.label}",
                    lambda: throughput(layout, workload, name, clusters, run_dir, extra),  # noqa: B023
                )
        if not args.no_kill:
            measure("kill -9", lambda: kill_timeline(clusters, run_dir, extra))
    finally:
        if started is not None:
            started.down(["A", "B"])
    load_end = load_averages()
    emit({"measure": "load", "load_avg_start": load_start, "load_avg_end": load_end})
    print(
        f"\n{table(lines)}\n\nload averages: start {load_start}, end {load_end}; "
        f"{os.cpu_count()} cores"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
