"""Shared pieces of the benchmarks: workloads, Kafka's perf tools, topics, the
replicator processes under test and the copy they make, their CPU time and peak
memory, JSON lines.

Benchmarks run against the local clusters (`mm2py local up`): A is the source, B the
target. Throughputs are in records/s and MiB/s (bytes / 2**20, as Kafka's tools
count "MB"), counting record values only (the workloads have no keys).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition
from confluent_kafka.cimpl import NewTopic

from mm2py.cache import cache_root
from mm2py.dev.jars import java_command
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


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE`` (repeatable): a property for every replicator's config, to try
    settings; the parsed value is a list of (key, value), ``dict(args.set)``."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        type=_property_setting,
        metavar="KEY=VALUE",
        help="a property for every replicator's config, e.g. B.producer.linger.ms=5",
    )


def _property_setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE (e.g. B.producer.linger.ms=5)")
    return key.strip(), value


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


# -- Kafka's perf tools and librdkafka alone -------------------------------------
#
# Every tool run is a process whose measured window is known in wall-clock time
# (`Window`), so runs started together (bench.pipe_limit's both halves at once) can be
# put on one time line: librdkafka (bench.rdkafka_perf) prints its window's epoch
# start and end; ConsumerPerformance prints its start and end times (read with a
# date format that has milliseconds and the zone) and how long its group join took;
# ProducerPerformance prints its summary the moment its own timing ends, so its
# window ends when that line arrives and began its own elapsed time earlier.


def logs_dir() -> Path:
    """Where the perf tools' JVMs log."""
    path = cache_root() / "bench-logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class Window:
    """What one tool process moved and when: its measured window (`start`, `end`, Unix
    epoch seconds; start-up and connecting excluded, as the tool times itself),
    `launched` (epoch seconds when it was started) and `cpu_s` (its user+sys
    CPU-seconds over its whole run, start-up included)."""

    records: int
    start: float
    end: float
    launched: float
    cpu_s: float

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def startup_s(self) -> float:
        """From launch to the start of its measured window."""
        return self.start - self.launched


# A tool's stdout, each line with the time.time() it arrived, -> (records, start, end).
WindowReader = Callable[[Sequence[tuple[float, str]]], tuple[int, float, float]]


@dataclass(frozen=True)
class ToolRun:
    """One tool process to run: its name (for errors), command line, how its timed
    stdout gives its window, and files to remove once it exited."""

    name: str
    argv: Sequence[str]
    read_window: WindowReader
    files: tuple[Path, ...] = ()


def run_tools(runs: Sequence[ToolRun]) -> list[Window]:
    """Start every run at once, wait for all; their windows, in order.

    Each stdout line is stamped with the wall-clock time it arrives (the tools flush
    every line). Each process's CPU time is its own (os.wait4), so runs at the same
    time, here or in other threads, do not share it out.
    """
    procs: list[tuple[subprocess.Popen[str], float]] = []
    stamped: list[list[tuple[float, str]]] = [[] for _ in runs]
    errors = [""] * len(runs)

    def read_stdout(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            stamped[i].append((time.time(), line))

    def read_stderr(i: int, proc: subprocess.Popen[str]) -> None:
        assert proc.stderr is not None
        errors[i] = proc.stderr.read()

    usages: list[tuple[int, float]] = []
    try:
        for run in runs:
            launched = time.time()
            popen = subprocess.Popen(
                list(run.argv),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
            )
            procs.append((popen, launched))
        readers = [
            threading.Thread(target=reader, args=(i, proc), daemon=True)
            for i, (proc, _) in enumerate(procs)
            for reader in (read_stdout, read_stderr)
        ]
        for thread in readers:
            thread.start()
        for thread in readers:
            thread.join()
        for proc, _ in procs:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            usages.append((proc.returncode, usage.ru_utime + usage.ru_stime))
    finally:
        for proc, _ in procs:
            if proc.returncode is None:  # an error above: leave no tool behind
                proc.kill()
                proc.wait()
            for pipe in (proc.stdout, proc.stderr):
                if pipe is not None:
                    pipe.close()
        for run in runs:
            for path in run.files:
                path.unlink(missing_ok=True)
    windows = []
    for run, (_, launched), (code, cpu), lines, err in zip(
        runs, procs, usages, stamped, errors, strict=True
    ):
        stdout = "".join(line for _, line in lines)
        if code != 0:
            raise ToolError(f"{run.name} exited with {code}:\n{stdout[-2000:]}{err[-2000:]}")
        try:
            records, start, end = run.read_window(lines)
        except (KeyError, ValueError, IndexError) as e:
            raise ToolError(f"unexpected {run.name} output ({e!r}):\n{stdout[-2000:]}") from e
        windows.append(Window(records, start, end, launched, cpu))
    return windows


def span(windows: Sequence[Window]) -> float:
    """Seconds from the earliest window's start to the latest one's end."""
    return max(w.end for w in windows) - min(w.start for w in windows)


def throughput_over(windows: Sequence[Window], record_bytes: int, seconds: float) -> Throughput:
    """All the windows' records over `seconds`, and all their CPU time."""
    records = sum(w.records for w in windows)
    rate = records / seconds
    return Throughput(records, rate, rate * record_bytes / MIB, sum(w.cpu_s for w in windows))


def _shares(records: int, processes: int) -> list[int]:
    shares = [records // processes] * processes
    shares[0] += records - sum(shares)
    return shares


_PRODUCER_SUMMARY = re.compile(
    r"(?P<records>\d+) records sent, (?P<rps>[\d.]+) records/sec \((?P<mbps>[\d.]+) MB/sec\)"
)


def _producer_performance_window(lines: Sequence[tuple[float, str]]) -> tuple[int, float, float]:
    """ProducerPerformance's final summary: it prints it as its own timing ends (JVM
    start-up and producer creation excluded), so its window ends when the line came
    and began its elapsed time (records / rate) earlier."""
    for arrived, line in reversed(lines):
        if (match := _PRODUCER_SUMMARY.search(line)) is not None:
            records = int(match["records"])
            return records, arrived - records / float(match["rps"]), arrived
    raise ValueError("no summary line")


def producer_performance_runs(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    props: Mapping[str, str] = FAST_PRODUCER_PROPS,
    throughput: int = -1,
    processes: int = 1,
) -> list[ToolRun]:
    """ProducerPerformance producing the workload (random values, no keys) into an
    existing topic, in `processes` JVMs of an equal share each; `throughput` caps each
    one's rate in records/s (-1: as fast as possible)."""
    # Plain local clusters only: the Java tools would need JAAS settings for SCRAM.
    producer_props = {"bootstrap.servers": cluster.bootstrap_servers, **props}
    return [
        ToolRun(
            "ProducerPerformance",
            java_command(
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
                heap="1g",
                logs_dir=logs_dir(),
            ),
            _producer_performance_window,
        )
        for records in _shares(workload.records, processes)
    ]


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
    windows = run_tools(
        producer_performance_runs(cluster, topic, workload, props, throughput, processes)
    )
    return alone_throughput(windows, workload.record_bytes)


def alone_throughput(windows: Sequence[Window], record_bytes: int) -> Throughput:
    """Processes sharing one half's work: all their records over the longest one's
    window (each one's start-up excluded, however long), all their CPU time."""
    return throughput_over(windows, record_bytes, max(w.seconds for w in windows))


# ConsumerPerformance's --date-format: milliseconds and the zone, so its start and end
# times are instants (read with CONSUMER_DATE_PARSE).
CONSUMER_DATE_FORMAT: Final = "yyyy-MM-dd'T'HH:mm:ss.SSSZ"
CONSUMER_DATE_PARSE: Final = "%Y-%m-%dT%H:%M:%S.%f%z"


def _consumer_performance_window(lines: Sequence[tuple[float, str]]) -> tuple[int, float, float]:
    """ConsumerPerformance's CSV line: its fetch window is from its start plus the group
    join to its end (the fetch.* rates' time)."""
    text = [line for _, line in lines if line.strip()]
    for i, line in enumerate(text[:-1]):
        if line.startswith("start.time"):
            header = [h.strip() for h in line.split(",")]
            row = dict(zip(header, (v.strip() for v in text[i + 1].split(",")), strict=False))
            start = datetime.strptime(row["start.time"], CONSUMER_DATE_PARSE).timestamp()
            end = datetime.strptime(row["end.time"], CONSUMER_DATE_PARSE).timestamp()
            joined = int(row["rebalance.time.ms"]) / 1000
            return int(row["data.consumed.in.nMsg"]), start + joined, end
    raise ValueError("no stats line")


def consumer_performance_run(
    cluster: LocalCluster,
    topic: str,
    records: int,
    props: Mapping[str, str] | None = None,
    fetch_size: int | None = None,
) -> ToolRun:
    """ConsumerPerformance reading `records` records of `topic` from the beginning with a
    fresh group. `props` go into a --consumer.config file (removed after the run),
    `fetch_size` is --fetch-size (the consumer's max.partition.fetch.bytes)."""
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
        "--date-format",
        CONSUMER_DATE_FORMAT,
    ]
    if fetch_size is not None:
        args += ["--fetch-size", str(fetch_size)]
    files: tuple[Path, ...] = ()
    if props:
        config = logs_dir() / f"consumer-{uuid.uuid4().hex[:8]}.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in props.items()), encoding="utf-8")
        args += ["--consumer.config", str(config)]
        files = (config,)
    return ToolRun(
        "ConsumerPerformance",
        java_command(CONSUMER_PERFORMANCE, *args, heap="1g", logs_dir=logs_dir()),
        _consumer_performance_window,
        files,
    )


def _rdkafka_window(lines: Sequence[tuple[float, str]]) -> tuple[int, float, float]:
    """bench.rdkafka_perf's JSON line (its window in epoch seconds)."""
    result = json.loads(lines[-1][1])
    return int(result["records"]), float(result["start"]), float(result["end"])


def _rdkafka_perf(args: Sequence[str], start_at: float | None) -> ToolRun:
    when = [] if start_at is None else ["--start-at", repr(start_at)]
    return ToolRun(
        "bench.rdkafka_perf",
        [sys.executable, "-m", "bench.rdkafka_perf", *when, *args],
        _rdkafka_window,
    )


def rdkafka_producer_runs(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    props: Mapping[str, str],
    processes: int = 1,
    start_at: float | None = None,
) -> list[ToolRun]:
    """librdkafka alone (bench.rdkafka_perf) producing the workload into an existing
    topic, in `processes` Python processes of an equal share each; `start_at`: the
    epoch time they begin at once connected (None: at once)."""
    settings = [f"{k}={v}" for k, v in props.items()]
    return [
        _rdkafka_perf(
            [
                "produce",
                cluster.bootstrap_servers,
                topic,
                str(n),
                str(workload.record_bytes),
                *settings,
            ],
            start_at,
        )
        for n in _shares(workload.records, processes)
    ]


def rdkafka_consumer_run(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    props: Mapping[str, str],
    start_at: float | None = None,
) -> ToolRun:
    """librdkafka alone (bench.rdkafka_perf) reading the workload from `topic`: its window
    is first record to last; `start_at` as in rdkafka_producer_runs."""
    settings = [f"{k}={v}" for k, v in props.items()]
    return _rdkafka_perf(
        ["consume", cluster.bootstrap_servers, topic, str(workload.records), *settings], start_at
    )


def check_produced(cluster: LocalCluster, topic: str, workload: Workload, tool: str) -> None:
    """Raise ToolError unless `topic` holds exactly the workload's records (librdkafka
    alone has no delivery reports: what it lost shows only here)."""
    have = sum(end_offsets(cluster, topic).values())
    if have != workload.records:
        raise ToolError(f"{tool} left {have} of {workload.records} records in {topic}")


def check_consumed(windows: Sequence[Window], topic: str, workload: Workload, tool: str) -> None:
    """Raise ToolError unless the windows read the whole workload of `topic`."""
    have = sum(w.records for w in windows)
    if have < workload.records or any(w.seconds <= 0 for w in windows):
        raise ToolError(f"{tool} read {have} of {workload.records} records of {topic}")


def prefill(cluster: LocalCluster, topic: str, workload: Workload) -> Throughput:
    """Create `topic` on `cluster` and fill it with the workload, as fast as Kafka can."""
    create_topic(cluster, topic, workload.partitions)
    result = producer_performance(cluster, topic, workload)
    check_produced(cluster, topic, workload, f"prefill of {topic}")
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
