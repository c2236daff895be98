"""Kafka's perf tools (ProducerPerformance, ConsumerPerformance) and librdkafka alone
(bench.rdkafka_perf): the baselines the replicators are measured against.

Every tool run is a process whose measured window is known in wall-clock time
(`Window`), so runs started together (bench.pipe_limit's both halves at once) can be
put on one time line: librdkafka prints its window's epoch start and end;
ConsumerPerformance prints its start and end times (read with a date format that has
milliseconds and the zone) and how long its group join took; ProducerPerformance prints
its summary the moment its own timing ends, so its window ends when that line arrives
and began its own elapsed time earlier.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

from bench.report import logs_dir
from bench.topics import create_topic, end_offsets
from bench.workload import (
    COMPRESSED_PRODUCER_PROPS,
    MIB,
    Throughput,
    Workload,
    json_like_values,
)
from mm2py.dev.jars import java_command
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients

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


class ToolError(RuntimeError):
    """A Kafka tool failed or printed something we could not read."""


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
    epoch time they begin at once connected (None: at once). A compressed workload's
    records are JSON-like documents (``--json-values``), as its prefill's."""
    settings = [f"{k}={v}" for k, v in props.items()]
    values = [] if workload.compression == "none" else ["--json-values"]
    return [
        _rdkafka_perf(
            [
                *values,
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
    """Create `topic` on `cluster` and fill it with the workload, as fast as Kafka can; a
    compressed workload's JSON-like documents as COMPRESSED_PRODUCER_PROPS says."""
    if workload.compression != "none":
        values = json_like_values(workload.records, workload.record_bytes)
        props = {**COMPRESSED_PRODUCER_PROPS, "compression.type": workload.compression}
        return prefill_values(cluster, topic, workload, values, props)
    create_topic(cluster, topic, workload.partitions)
    result = producer_performance(cluster, topic, workload)
    check_produced(cluster, topic, workload, f"prefill of {topic}")
    return result


def prefill_values(
    cluster: LocalCluster,
    topic: str,
    workload: Workload,
    values: Iterable[bytes],
    producer_props: Mapping[str, Any],
) -> Throughput:
    """Create `topic` and produce `values` into it, round robin over its partitions;
    raises unless it then holds `workload.records` records. Its rate and this process's
    CPU (the producer is librdkafka in it)."""
    create_topic(cluster, topic, workload.partitions)
    producer = clients.producer(cluster.client_properties(), producer_props)
    started, cpu = time.monotonic(), time.process_time()
    for i, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, None, i % workload.partitions)
                break
            except BufferError:
                producer.poll(0.05)
    producer.flush(120)
    seconds = max(time.monotonic() - started, 1e-9)
    check_produced(cluster, topic, workload, f"prefill of {topic}")
    rate = workload.records / seconds
    return Throughput(
        workload.records, rate, rate * workload.record_bytes / MIB, time.process_time() - cpu
    )
