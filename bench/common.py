"""Shared pieces of the benchmarks: workloads, Kafka's perf tools, topics, the
replicator processes under test and the copy they make, their CPU time and peak
memory, JSON lines.

Benchmarks run against the local clusters (`mm2py local up`): A is the source, B the
target. Throughputs are in records/s and MiB/s (bytes / 2**20, as Kafka's tools
count "MB"), counting record values only (the workloads have no keys).
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic

from mm2py.dev.jars import cache_root, java_command
from mm2py.dev.launcher import LocalCluster, LocalKafka
from mm2py.kafka import clients

log = logging.getLogger(__name__)

MIB: Final = 1 << 20
PRODUCER_PERFORMANCE: Final = "org.apache.kafka.tools.ProducerPerformance"
CONSUMER_PERFORMANCE: Final = "org.apache.kafka.tools.ConsumerPerformance"

# Fast bulk producing on one node: acks=1 and big, briefly lingering batches (1 MiB and
# 20 ms beat 256 KiB and 10 ms by 10-30% for both standard workloads here).
FAST_PRODUCER_PROPS: Final[Mapping[str, str]] = {
    "acks": "1",
    "linger.ms": "20",
    "batch.size": "1048576",
    "compression.type": "none",
}
# How often the copy watcher reads B's end offsets: the resolution of the copy time.
SAMPLE_INTERVAL: Final = 0.05
# A transactional copy is over once its end offsets stood still this long (10 commit
# intervals of mm2py's default).
TRANSACTIONAL_SETTLE_S: Final = 1.0


@dataclass(frozen=True)
class Workload:
    """A topic of `partitions` partitions holding `records` records of `record_bytes` bytes."""

    partitions: int
    records: int
    record_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.records * self.record_bytes

    @property
    def label(self) -> str:
        """Short name for logs and topic names, e.g. ``8p-1000000x1024B``."""
        return f"{self.partitions}p-{self.records}x{self.record_bytes}B"


# The two workloads every system is measured on: large records and small records.
STANDARD_WORKLOADS: Final = (
    Workload(partitions=8, records=1_000_000, record_bytes=1024),
    Workload(partitions=8, records=2_000_000, record_bytes=100),
)


@dataclass(frozen=True)
class Throughput:
    """What one tool run achieved (`cpu_s`: the tool's user+sys CPU-seconds over its
    whole run, JVM start-up included; None when not measured)."""

    records: int
    records_per_s: float
    mb_per_s: float
    cpu_s: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "records": self.records,
            "records_per_s": round(self.records_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 2),
            "cpu_s_per_m_records": cpu_per_million(self.cpu_s, self.records),
        }


def cpu_per_million(cpu_s: float | None, records: int) -> float | None:
    """CPU-seconds per million records (None if unknown)."""
    if cpu_s is None or records <= 0:
        return None
    return round(cpu_s / records * 1e6, 2)


class ToolError(RuntimeError):
    """A Kafka tool failed or printed something we could not read."""


class ReplicatorError(RuntimeError):
    """A replicator under test exited or did not copy what it should."""


def emit(line: dict[str, Any]) -> None:
    """Print one result as a JSON line on stdout."""
    print(json.dumps(line), flush=True)


# -- clusters and topics ---------------------------------------------------------


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


# -- Kafka's perf tools ----------------------------------------------------------


def logs_dir() -> Path:
    """Where the perf tools' JVMs log."""
    path = cache_root() / "bench-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def run_kafka_tool(main_class: str, *args: str, heap: str = "1g") -> str:
    """Run one of Kafka's command-line tools to completion; return its stdout."""
    return run_kafka_tool_timed(main_class, *args, heap=heap)[0]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_kafka_tool_timed(main_class: str, *args: str, heap: str = "1g") -> tuple[str, float]:
    """`run_kafka_tool`, and the user+sys CPU-seconds the tool's JVM used.

    The CPU time is the growth of this process's finished children's CPU time over
    the run, so tools run at the same time share it out (see `producer_performance`).
    """
    cmd = java_command(main_class, *args, heap=heap, logs_dir=logs_dir())
    cpu_before = _children_cpu()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    cpu = _children_cpu() - cpu_before
    if done.returncode != 0:
        raise ToolError(
            f"{main_class.rsplit('.', 1)[-1]} exited with {done.returncode}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    return done.stdout, cpu


_PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\)"
)


def parse_producer_performance(stdout: str) -> Throughput:
    """The final summary line of ProducerPerformance (its rates exclude JVM start-up)."""
    matches = list(_PRODUCER_SUMMARY.finditer(stdout))
    if not matches:
        raise ToolError(f"no summary line in ProducerPerformance output:\n{stdout[-2000:]}")
    last = matches[-1]
    return Throughput(int(last["records"]), float(last["rps"]), float(last["mbps"]))


def parse_consumer_performance(stdout: str) -> Throughput:
    """ConsumerPerformance's CSV line, using the fetch.* rates (group join excluded)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    for i, line in enumerate(lines[:-1]):
        if line.startswith("start.time"):
            header = [h.strip() for h in line.split(",")]
            row = dict(zip(header, (v.strip() for v in lines[i + 1].split(",")), strict=False))
            try:
                return Throughput(
                    int(row["data.consumed.in.nMsg"]),
                    float(row["fetch.nMsg.sec"]),
                    float(row["fetch.MB.sec"]),
                )
            except (KeyError, ValueError) as e:
                raise ToolError(f"unexpected ConsumerPerformance output ({e}):\n{stdout}") from e
    raise ToolError(f"no stats in ConsumerPerformance output:\n{stdout[-2000:]}")


def producer_performance(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    props: Mapping[str, str] = FAST_PRODUCER_PROPS,
    throughput: int = -1,
    processes: int = 1,
) -> Throughput:
    """Produce the workload's records (random values, no keys) into an existing topic.

    `throughput` caps the rate in records/s (-1: as fast as possible). With
    `processes` > 1, that many ProducerPerformance JVMs each produce an equal share at
    the same time; their rate is all records over the longest one's sending time
    (each tool's own time, JVM start-up excluded), their CPU time the sum of theirs.
    """
    # Plain local clusters only: the Java tools would need JAAS settings for SCRAM.
    producer_props = {"bootstrap.servers": cluster.bootstrap_servers, **props}
    shares = [workload.records // processes] * processes
    shares[0] += workload.records - sum(shares)

    def run(records: int) -> tuple[Throughput, float]:
        stdout, cpu = run_kafka_tool_timed(
            PRODUCER_PERFORMANCE,
            "--topic",
            topic,
            "--num-records",
            str(records),
            "--record-size",
            str(workload.record_bytes),
            "--throughput",
            str(throughput),
            "--producer-props",
            *(f"{k}={v}" for k, v in producer_props.items()),
        )
        return parse_producer_performance(stdout), cpu

    if processes == 1:
        result, cpu = run(workload.records)
        return Throughput(result.records, result.records_per_s, result.mb_per_s, cpu)
    cpu_before = _children_cpu()
    with ThreadPoolExecutor(processes) as pool:
        results = [r for r, _ in pool.map(run, shares)]
    cpu = _children_cpu() - cpu_before
    seconds = max(r.records / r.records_per_s for r in results)
    records = sum(r.records for r in results)
    rate = records / seconds
    return Throughput(records, rate, rate * workload.record_bytes / MIB, cpu)


def _rdkafka_perf(runs: Sequence[Sequence[str]]) -> tuple[list[dict[str, Any]], float]:
    """Run bench.rdkafka_perf once per argument list, all at once; their JSON results and
    the CPU-seconds they used together."""
    cpu_before = _children_cpu()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.rdkafka_perf", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args in runs
    ]
    outputs = [proc.communicate() for proc in procs]
    cpu = _children_cpu() - cpu_before
    results = []
    for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
        if proc.returncode != 0:
            raise ToolError(f"bench.rdkafka_perf exited with {proc.returncode}:\n{stderr[-2000:]}")
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    return results, cpu


def rdkafka_producer_performance(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    props: Mapping[str, str],
    processes: int = 1,
) -> Throughput:
    """Produce the workload into an existing topic with librdkafka alone (bench.rdkafka_perf),
    in `processes` Python processes at once, each an equal share; the rate is all records
    over the longest one's producing time, the CPU time theirs (interpreter start-up
    included)."""
    shares = [workload.records // processes] * processes
    shares[0] += workload.records - sum(shares)
    settings = [f"{k}={v}" for k, v in props.items()]
    results, cpu = _rdkafka_perf(
        [
            [
                "produce",
                cluster.bootstrap_servers,
                topic,
                str(n),
                str(workload.record_bytes),
                *settings,
            ]
            for n in shares
        ]
    )
    have = sum(end_offsets(cluster, topic).values())
    if have != workload.records:
        raise ToolError(f"bench.rdkafka_perf left {have} of {workload.records} records in {topic}")
    rate = workload.records / max(r["seconds"] for r in results)
    return Throughput(workload.records, rate, rate * workload.record_bytes / MIB, cpu)


def rdkafka_consumer_performance(
    cluster: LocalCluster, topic: str, workload: Workload, props: Mapping[str, str]
) -> Throughput:
    """Read the workload from `topic` with librdkafka alone (bench.rdkafka_perf); the rate is
    from its first record to its last, the CPU time includes interpreter start-up."""
    settings = [f"{k}={v}" for k, v in props.items()]
    results, cpu = _rdkafka_perf(
        [["consume", cluster.bootstrap_servers, topic, str(workload.records), *settings]]
    )
    seconds = results[0]["seconds"]
    if results[0]["records"] < workload.records or seconds <= 0:
        raise ToolError(f"bench.rdkafka_perf read {results[0]['records']} records of {topic}")
    rate = workload.records / seconds
    return Throughput(workload.records, rate, rate * workload.record_bytes / MIB, cpu)


def consumer_performance(
    cluster: LocalCluster,
    topic: str,
    records: int,
    props: Mapping[str, str] | None = None,
    fetch_size: int | None = None,
) -> Throughput:
    """Consume `records` records of `topic` from the beginning with a fresh group.

    `props` go into a --consumer.config file, `fetch_size` is --fetch-size (the
    consumer's max.partition.fetch.bytes).
    """
    args = [
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--topic",
        topic,
        "--messages",
        str(records),
        "--group",
        f"bench-consumer-{uuid.uuid4().hex[:8]}",
        "--timeout",
        "30000",
    ]
    if fetch_size is not None:
        args += ["--fetch-size", str(fetch_size)]
    config: Path | None = None
    if props:
        config = logs_dir() / f"consumer-{uuid.uuid4().hex[:8]}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
        args += ["--consumer.config", str(config)]
    try:
        stdout, cpu = run_kafka_tool_timed(CONSUMER_PERFORMANCE, *args)
    finally:
        if config is not None:
            config.unlink(missing_ok=True)
    result = parse_consumer_performance(stdout)
    if result.records < records:
        raise ToolError(f"ConsumerPerformance read {result.records} of {records} from {topic}")
    return Throughput(result.records, result.records_per_s, result.mb_per_s, cpu)


def prefill(cluster: LocalCluster, topic: str, workload: Workload) -> Throughput:
    """Create `topic` on `cluster` and fill it with the workload, as fast as Kafka can."""
    create_topic(cluster, topic, workload.partitions)
    result = producer_performance(cluster, topic, workload)
    have = sum(end_offsets(cluster, topic).values())
    if have != workload.records:
        raise ToolError(f"prefill of {topic} left {have} records, expected {workload.records}")
    return result


# -- the replicators under test ---------------------------------------------------


@dataclass(frozen=True)
class Running:
    """A replicator process while it runs."""

    system: str
    pid: int
    is_running: Callable[[], bool]
    log_file: Path


def check_alive(running: Running) -> None:
    """Raise ReplicatorError if `running` has exited."""
    if not running.is_running():
        raise ReplicatorError(f"{running.system} exited early; see {running.log_file}")


@contextmanager
def running_command(
    system: str, cmd: Sequence[str], log_file: Path
) -> Iterator[tuple[Running, subprocess.Popen[bytes]]]:
    """Run `cmd` as `system`, its output in `log_file`; on leaving, stop it if it still runs.

    Stopping is SIGTERM, then a kill if it has not exited 20 s later. A non-zero exit
    code is logged as a warning.
    """
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.info("started %s (pid %d), log %s", system, proc.pid, log_file)
    try:
        yield Running(system, proc.pid, lambda: proc.poll() is None, log_file), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for 20 s; killing it", system, proc.pid)
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            log.warning("%s exited with %s; see %s", system, proc.returncode, log_file)


@dataclass(frozen=True)
class Copy:
    """How a system copied a pre-filled topic, as seen from B's end offsets."""

    startup_s: float  # launch -> first copied record visible on B
    copy_s: float  # first sample with records on B -> sample with all of them
    copied_in_window: int  # records that arrived during copy_s
    cpu_s: float | None = None  # user+sys CPU-seconds of the replicator during copy_s
    end_offsets: int = 0  # sum of the remote topic's end offsets at the end (markers too)

    @property
    def cpu_s_per_m_records(self) -> float | None:
        """CPU-seconds per million records copied in the window."""
        return cpu_per_million(self.cpu_s, self.copied_in_window)


def _remote_count(consumer: Any, topic: str, partitions: int) -> int:
    """Records in `topic` on B now (0 while it or a partition leader does not exist yet)."""
    total = 0
    for p in range(partitions):
        try:
            total += consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
        except KafkaException:
            return 0  # not created yet
    return total


def watch_copy(
    target: LocalCluster,
    remote_topic: str,
    workload: Workload,
    running: Running,
    timeout: float,
    isolation: str = "read_committed",
    transactional: bool = False,
) -> Copy:
    """Follow B's end offsets until `remote_topic` holds the whole workload.

    Start-up (JVM, Connect worker, task assignment; Python imports, group join) is
    excluded by timing from the first sample that sees copied records: the rate is
    (records - records seen at that sample) / (time from that sample to the first
    sample seeing all), so its resolution is SAMPLE_INTERVAL plus one offsets query.

    The replicator's CPU time over the same window is the growth of its process
    tree's user+sys time (`ProcessCpu`) between those two samples.

    `isolation` is the isolation.level of the offsets queries. The backfill is watched
    with "read_uncommitted", on high watermarks: its records count when written, not
    when their transaction commits (up to 10 s later), as the daemon's do. Commit
    markers add one offset per transaction (a few per copy).

    `transactional`: the replicator commits transactions often (mm2py exactly-once,
    every 100 ms), so the markers, one offset per partition and commit, count too:
    the end offsets reach the workload's record count before its last records are
    committed. Sampling then goes on until the end offsets have not moved for
    TRANSACTIONAL_SETTLE_S, and the copy ends at the first sample that saw their final
    value (its last commit). Markers below the first sample (a commit or two) are
    counted as records in the window: at most 8 offsets per commit, negligible.
    """
    launched = time.monotonic()
    deadline = launched + timeout
    consumer = clients.consumer(target.client_properties(), {"isolation.level": isolation})
    first: tuple[float, int, float] | None = None
    # The first sample that saw the current count, once it reached the workload's.
    last: tuple[float, int, float] | None = None
    cpu = ProcessCpu(running.pid)
    try:
        while True:
            before = time.monotonic()
            have = _remote_count(consumer, remote_topic, workload.partitions)
            now = (before + time.monotonic()) / 2  # when the queries saw the counts
            cpu_now = cpu.sample()
            if have and first is None:
                first = (now, have, cpu_now)
            if have >= workload.records:
                assert first is not None
                if last is None or have != last[1]:
                    last = (now, have, cpu_now)
                if not transactional or now - last[0] >= TRANSACTIONAL_SETTLE_S:
                    return Copy(
                        first[0] - launched,
                        last[0] - first[0],
                        workload.records - first[1],
                        last[2] - first[2],
                        last[1],
                    )
            check_alive(running)
            if now > deadline:
                raise ReplicatorError(
                    f"{running.system}: {remote_topic} on {target.alias} has {have} of "
                    f"{workload.records} records after {timeout:.0f} s"
                )
            time.sleep(SAMPLE_INTERVAL)
    finally:
        consumer.close()


# -- CPU time and memory ------------------------------------------------------------

CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return 0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "?"


def process_cpu_seconds(pid: int) -> float | None:
    """User+sys CPU-seconds `pid` used so far, all its threads (None if it is gone).

    Its waited-for children are not included (`ProcessCpu` follows them itself).
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Fields after the command name, which is in parentheses and may hold spaces:
    # state is field 3, utime 14, stime 15.
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids.extend(int(k) for k in f.read().split())
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return kids


def process_tree(pid: int) -> list[int]:
    """`pid` and all its descendants alive now."""
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(_children(current))
    return tree


class ProcessCpu:
    """User+sys CPU time of a process and its descendants (e.g. task processes).

    Each `sample()` reads /proc/<pid>/stat of every process in the tree and returns
    the sum over every process ever seen, each at its last reading: a child that
    exited still counts, up to the sample before it exited.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, float] = {}

    def sample(self) -> float:
        for pid in process_tree(self.pid):
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                self.seen[pid] = seconds
        return sum(self.seen.values())


class PeakRss:
    """Samples the resident memory of a process and its descendants until stopped.

    ``peak_bytes`` is the larger of the highest sampled sum of VmRSS over the tree
    and the root's VmHWM (the kernel's own high-water mark, which catches peaks
    between samples). ``per_process`` is each process's own peak (its VmHWM), by
    ``<comm>-<pid>``. Use as ``with PeakRss(pid) as rss: ...; rss.peak_bytes``.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.per_process_kib: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peak-rss-{pid}", daemon=True)

    @property
    def peak_bytes(self) -> int:
        return self.peak_kib * 1024

    def per_process_mib(self) -> dict[str, float]:
        """Each process's peak resident memory in MiB (not the launcher a process was
        until it exec'd, seen with nothing resident)."""
        return {name: round(kib / 1024, 1) for name, kib in self.per_process_kib.items() if kib > 0}

    def sample(self) -> None:
        """Take one sample now (also called by the background thread)."""
        total = 0
        for pid in process_tree(self.pid):
            rss = _status_kib(pid, "VmRSS")
            if rss is None:
                continue  # exited meanwhile
            hwm = _status_kib(pid, "VmHWM") or 0
            total += rss
            name = f"{_comm(pid)}-{pid}"
            self.per_process_kib[name] = max(self.per_process_kib.get(name, 0), rss, hwm)
        hwm = _status_kib(self.pid, "VmHWM") or 0
        self.peak_kib = max(self.peak_kib, total, hwm)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> PeakRss:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling (take a last sample if the process still runs); return peak bytes."""
        self.sample()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak_bytes

    def __enter__(self) -> PeakRss:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a daemon's --listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def load_averages() -> list[float]:
    """The 1, 5 and 15 minute load averages, for the JSON lines."""
    return [round(x, 2) for x in os.getloadavg()]
