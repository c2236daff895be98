"""The pipe limit: the fastest any replicator could copy a workload from A to B here.

A replicator reads from A and writes to B at the same time, on the same cores as both
brokers. The pipe limit is therefore measured with both halves AT ONCE, each done by
the fastest tool and client settings found for it alone:

1. Producing into B alone, with what mm2py's producer must use (``acks=all``,
   ``enable.idempotence=true``, no compression; a compressed workload's codec, and
   librdkafka alone, producing its JSON-like documents) and the partitions in turn: Kafka's
   ProducerPerformance with each of PRODUCER_SETTINGS (``batch.size`` and
   ``linger.ms``) in one JVM, then the best of them in PARALLEL_PRODUCERS JVMs at once
   (each an equal share of the records); then librdkafka alone (bench.rdkafka_perf: the
   client mm2py uses, big batches, no delivery callbacks, runs of records to one
   partition at a time as a replicator writes what it read, timed once it has its
   producer id, as a running replicator's producer has) with each of RDKAFKA_SETTINGS
   (``linger.ms`` 5 with big queues, and mm2py's own PRODUCER_TUNING) in one and in
   PARALLEL_PRODUCERS processes; then the fastest of these again, RUNS times in all.
   The fastest run is the producing half alone (processes sharing it: all records
   over the longest one's window). ``tried`` has each run's CPU-seconds per million
   records: the JVM tool needs more CPU a record than librdkafka.
2. Consuming from A alone, read_committed as mm2py reads: ConsumerPerformance with
   each of CONSUMER_SETTINGS (its fetch window: group join excluded), and librdkafka
   alone (bench.rdkafka_perf: first record to last, connected to the leaders before)
   RUNS - 1 times; the fastest run is the consuming half alone.
3. Both at once, RUNS times (and RUNS more with the same producing in one process when
   the fastest alone took several): the producing half's tool, settings and processes write
   the workload into a fresh topic on B while the consuming half's read the pre-filled
   topic on A, started together. Every tool reports its measured window in wall-clock
   time (bench.perf_tools.Window: librdkafka prints its epoch start and end;
   ConsumerPerformance prints its start and end times and its group join;
   ProducerPerformance prints its summary as its own timing ends, so its window ends
   when that line arrives and starts its elapsed time earlier). The rate is the
   workload's records over the time from the earliest window's start to the latest
   one's end, so each tool's start-up is left out but neither half's time alone is.
   The JVM tools' windows are timed in wall clock, so the best tool of each half is
   used whichever it is. So that the windows begin together, librdkafka tools wait
   after connecting until a common start, ``lead_s`` after their launch: the chosen JVM
   tool's start-up (launch to window start) alone for the first run, in the previous
   at-once run after that (two tools starting at once start slower); AT_ONCE_LEAD_S
   when both halves are librdkafka. A librdkafka half starts ``early_s`` before it:
   the delay from its start to its window's in the previous run (the consumer's
   first fetch, ~0.05 s). JVM tools cannot be told when to begin: were both halves
   JVM tools, their windows would begin as their start-ups allow. ``start_gap_s``
   says how far apart the halves' windows began (producing minus consuming).

The fastest at-once run is the pipe limit (``records_per_s``, ``mb_per_s``), with its
halves' own rates (each over its own windows), CPU-seconds per million records and
start-up in ``at_once`` (its ``cpu_s_per_m_records``: both halves' tools, whole runs).
It is the limit a replicator has on a shared machine: it consumes and produces at
once, on the same cores as both brokers. Each half alone had both (two) cores and only
its own broker busy; the slower of them is kept as ``alone_records_per_s`` (the halves
as ``produce_into_b`` and ``consume_from_a``), a looser upper bound. No replicator may
beat the at-once limit in the same run: one that does shows the limit is wrong
(bench.replication says so).

    .venv/bin/python -m bench.pipe_limit                      # the standard workloads
    .venv/bin/python -m bench.pipe_limit --records 100000 --record-bytes 512

Prints one JSON line per workload.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from bench.perf_tools import (
    ToolRun,
    Window,
    alone_throughput,
    check_consumed,
    check_produced,
    consumer_performance_run,
    prefill,
    producer_performance_runs,
    rdkafka_consumer_run,
    rdkafka_producer_runs,
    run_tools,
    span,
    throughput_over,
)
from bench.report import load_averages
from bench.topics import bench_topic, create_topic, delete_topics, local_clusters
from bench.workload import MIB, STANDARD_WORKLOADS, Throughput, Workload
from mm2py.dev.launcher import LocalCluster
from mm2py.parts.source import PRODUCER_TUNING

log = logging.getLogger(__name__)

# What mm2py's copy producer must use (mm2py.replication.client_settings).
PRODUCER_REQUIRED: Final[Mapping[str, str]] = {
    "acks": "all",
    "enable.idempotence": "true",
    "max.in.flight.requests.per.connection": "5",
    "compression.type": "none",
    "buffer.memory": str(128 << 20),
}
# Batching tried for producing into B (big batches, some linger).
# Records without keys go to the partitions in turn, as a replicator writes them all at
# once (the default sticky partitioner fills one at a time: 1 KiB records then went into
# B at half the rate mm2py copied them).
ROUND_ROBIN: Final = "org.apache.kafka.clients.producer.RoundRobinPartitioner"
PRODUCER_SETTINGS: Final[tuple[Mapping[str, str], ...]] = (
    {"batch.size": str(1 << 20), "linger.ms": "20", "partitioner.class": ROUND_ROBIN},
    {"batch.size": str(256 << 10), "linger.ms": "10", "partitioner.class": ROUND_ROBIN},
)
PRODUCER_PERFORMANCE_TOOL: Final = "ProducerPerformance"
# librdkafka (bench.rdkafka_perf) with what mm2py's producer must use and big batches.
RDKAFKA_TOOL: Final = "librdkafka"
RDKAFKA_REQUIRED: Final[Mapping[str, str]] = {
    "acks": "all",
    "enable.idempotence": "true",
    "compression.type": "none",
}
RDKAFKA_SETTINGS: Final[tuple[Mapping[str, str], ...]] = (
    {
        "linger.ms": "5",
        "batch.size": "1000000",
        "queue.buffering.max.kbytes": "131072",
        "queue.buffering.max.messages": "1000000",
    },
    # mm2py's own: with the above alone, mm2py's producer went into B with 1 KiB records
    # faster than the limit.
    {k: str(v) for k, v in PRODUCER_TUNING.items()},
)
# Reading from A with librdkafka: mm2py's consumer settings, more prefetched.
RDKAFKA_CONSUMER_SETTINGS: Final[Mapping[str, str]] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": "false",
    "queued.max.messages.kbytes": "65536",
    "fetch.wait.max.ms": "100",
    # As mm2py's: librdkafka's default (1 s) held back a partition's fetches for a second
    # whenever the queue held queued.min.messages, a stall in one run of two.
    "fetch.queue.backoff.ms": "5",
}
CONSUMER_PERFORMANCE_TOOL: Final = "ConsumerPerformance"
PARALLEL_PRODUCERS: Final = 2
RUNS: Final = 3  # runs of the best producer setting (counting the first), at-once runs
# Both halves at once, both librdkafka: when they start after their launch (Python
# start-up and connecting take well under this, even on a busy machine).
AT_ONCE_LEAD_S: Final = 2.0
# Reading from A: read_committed, bigger fetches and polls than the defaults.
CONSUMER_SETTINGS: Final[tuple[tuple[Mapping[str, str], int | None], ...]] = (
    ({"isolation.level": "read_committed"}, None),
    (
        {
            "isolation.level": "read_committed",
            "max.poll.records": "5000",
            "fetch.max.bytes": str(64 << 20),
            "receive.buffer.bytes": str(4 << 20),
        },
        4 << 20,
    ),
)


@dataclass(frozen=True)
class Producing:
    """One way to produce the workload into B: a tool, its settings, its processes."""

    tool: str
    settings: Mapping[str, str]
    processes: int

    def runs(
        self, target: LocalCluster, topic: str, workload: Workload, start_at: float | None = None
    ) -> list[ToolRun]:
        """The tool processes (librdkafka's begin at `start_at`, the JVM's when ready),
        compressing as the workload's source was (every replicator but pass-through is
        given B.producer.compression.type so)."""
        codec = {"compression.type": workload.compression}
        if self.tool == PRODUCER_PERFORMANCE_TOOL:
            props = {**PRODUCER_REQUIRED, **self.settings, **codec}
            return producer_performance_runs(target, topic, workload, props, -1, self.processes)
        props = {**RDKAFKA_REQUIRED, **self.settings, **codec}
        return rdkafka_producer_runs(target, topic, workload, props, self.processes, start_at)

    def describe(self) -> dict[str, Any]:
        return {"tool": self.tool, "processes": self.processes, **self.settings}


@dataclass(frozen=True)
class Consuming:
    """One way to read the workload from A: a tool and its settings."""

    tool: str
    settings: Mapping[str, str]
    fetch_size: int | None = None

    def run(
        self, source: LocalCluster, topic: str, workload: Workload, start_at: float | None = None
    ) -> ToolRun:
        """The tool process (librdkafka's begins at `start_at`, the JVM's when ready)."""
        if self.tool == CONSUMER_PERFORMANCE_TOOL:
            return consumer_performance_run(
                source, topic, workload.records, self.settings, self.fetch_size
            )
        return rdkafka_consumer_run(source, topic, workload, self.settings, start_at)

    def describe(self) -> dict[str, Any]:
        size = {} if self.fetch_size is None else {"fetch_size": self.fetch_size}
        return {"tool": self.tool, **size, **self.settings}


@dataclass(frozen=True)
class Best:
    """A half's fastest run alone: its rate, how, and its slowest process's start-up."""

    result: Throughput
    how: Producing | Consuming
    startup_s: float


def _attempt(name: str, result: Throughput, tried: list[dict[str, Any]], **how: Any) -> Throughput:
    tried.append({"how": name, **how, **result.as_dict()})
    log.info("%s: %.0f records/s (%s)", name, result.records_per_s, how)
    return result


def _produce_alone(
    target: LocalCluster, workload: Workload, how: Producing, tried: list[dict[str, Any]]
) -> Best:
    topic = bench_topic(workload, "pipe-dst")
    create_topic(target, topic, workload.partitions)
    try:
        windows = run_tools(how.runs(target, topic, workload))
        check_produced(target, topic, workload, how.tool)
    finally:
        # Each topic is only needed for its run; B's disk is shared.
        delete_topics(target, [topic])
    result = alone_throughput(windows, workload.record_bytes)
    _attempt(f"produce into B ({how.tool})", result, tried, **how.describe())
    return Best(result, how, max(w.startup_s for w in windows))


def best_producing(target: LocalCluster, workload: Workload, tried: list[dict[str, Any]]) -> Best:
    """The fastest run producing into new topics on `target` alone (see above); for a
    compressed workload librdkafka's alone (ProducerPerformance's records are random
    bytes, which do not compress)."""
    compressed = workload.compression != "none"
    java = [
        _produce_alone(target, workload, Producing(PRODUCER_PERFORMANCE_TOOL, s, 1), tried)
        for s in ([] if compressed else PRODUCER_SETTINGS)
    ]
    java_best = [
        Producing(PRODUCER_PERFORMANCE_TOOL, b.how.settings, PARALLEL_PRODUCERS)
        for b in sorted(java, key=lambda b: b.result.records_per_s)[-1:]
    ]
    others = (
        *java_best,
        *(
            Producing(RDKAFKA_TOOL, settings, processes)
            for settings in RDKAFKA_SETTINGS
            for processes in (1, PARALLEL_PRODUCERS)
        ),
    )
    runs = java + [_produce_alone(target, workload, how, tried) for how in others]
    best = max(runs, key=lambda b: b.result.records_per_s)
    assert isinstance(best.how, Producing)
    for _ in range(RUNS - 1):
        again = _produce_alone(target, workload, best.how, tried)
        if again.result.records_per_s > best.result.records_per_s:
            best = again
    return best


def _consume_alone(
    source: LocalCluster,
    topic: str,
    workload: Workload,
    how: Consuming,
    tried: list[dict[str, Any]],
) -> Best:
    windows = run_tools([how.run(source, topic, workload)])
    check_consumed(windows, topic, workload, how.tool)
    result = alone_throughput(windows, workload.record_bytes)
    _attempt(f"consume from A ({how.tool})", result, tried, **how.describe())
    return Best(result, how, max(w.startup_s for w in windows))


def best_consuming(
    source: LocalCluster, topic: str, workload: Workload, tried: list[dict[str, Any]]
) -> Best:
    """The fastest run reading `topic` on `source` alone (see above)."""
    ways = [Consuming(CONSUMER_PERFORMANCE_TOOL, p, size) for p, size in CONSUMER_SETTINGS]
    ways += [Consuming(RDKAFKA_TOOL, RDKAFKA_CONSUMER_SETTINGS)] * (RUNS - 1)
    results = [_consume_alone(source, topic, workload, how, tried) for how in ways]
    return max(results, key=lambda b: b.result.records_per_s)


def _half(windows: list[Window], how: Producing | Consuming, workload: Workload) -> dict[str, Any]:
    """One half of an at-once run: its rate over its own windows, its CPU, how, and its
    slowest process's start-up (launch to window start)."""
    result = throughput_over(windows, workload.record_bytes, span(windows))
    startup = max(w.startup_s for w in windows)
    return {**how.describe(), **result.as_dict(), "startup_s": round(startup, 3)}


HALVES: Final = ("produce_into_b", "consume_from_a")


@dataclass(frozen=True)
class Start:
    """When an at-once run's librdkafka tools begin, after their launch: `lead_s`,
    less their half's `early_s` (by HALVES: how long after its start that half's
    window began last time, e.g. a consumer's first fetch), so that both windows
    begin at `lead_s`. JVM tools begin when ready."""

    lead_s: float
    early_s: Mapping[str, float]

    @staticmethod
    def first(producing: Best, consuming: Best) -> Start:
        """The first run's: the JVM tools' start-up alone (or AT_ONCE_LEAD_S without a JVM)."""
        jvm = [b.startup_s for b in (producing, consuming) if b.how.tool != RDKAFKA_TOOL]
        return Start(max(jvm, default=AT_ONCE_LEAD_S), dict.fromkeys(HALVES, 0.0))

    def next(self, run: Mapping[str, Any], producing: Best, consuming: Best) -> Start:
        """The next run's, from this one's start-ups: the JVM tools' (two tools starting
        at once take longer than one alone), and each librdkafka half's delay."""
        tools = dict(zip(HALVES, (producing.how.tool, consuming.how.tool), strict=True))
        startups = {h: float(run[h]["startup_s"]) for h in HALVES}
        jvm = [startups[h] for h in HALVES if tools[h] != RDKAFKA_TOOL]
        early = {
            h: max(0.0, startups[h] - (self.lead_s - self.early_s[h]))
            if tools[h] == RDKAFKA_TOOL
            else 0.0
            for h in HALVES
        }
        return Start(max(jvm, default=self.lead_s), early)


def both_at_once(
    source: LocalCluster,
    source_topic: str,
    target: LocalCluster,
    workload: Workload,
    producing: Best,
    consuming: Best,
    start: Start,
) -> dict[str, Any]:
    """One run of both halves at once (see above), begun as `start` says: the rate,
    each half's, how far apart the halves began."""
    assert isinstance(producing.how, Producing) and isinstance(consuming.how, Consuming)
    topic = bench_topic(workload, "pipe-dst")
    create_topic(target, topic, workload.partitions)
    at = {h: time.time() + start.lead_s - start.early_s[h] for h in HALVES}
    try:
        windows = run_tools(
            [
                *producing.how.runs(target, topic, workload, at["produce_into_b"]),
                consuming.how.run(source, source_topic, workload, at["consume_from_a"]),
            ]
        )
        check_produced(target, topic, workload, producing.how.tool)
    finally:
        delete_topics(target, [topic])
    produced, consumed = windows[:-1], windows[-1:]
    check_consumed(consumed, source_topic, workload, consuming.how.tool)
    seconds = span(windows)
    rate = workload.records / seconds
    both = Throughput(
        workload.records, rate, rate * workload.record_bytes / MIB, sum(w.cpu_s for w in windows)
    )
    return {
        **both.as_dict(),
        "seconds": round(seconds, 3),
        "lead_s": round(start.lead_s, 3),
        "early_s": {h: round(e, 3) for h, e in start.early_s.items()},
        "start_gap_s": round(min(w.start for w in produced) - min(w.start for w in consumed), 3),
        "produce_into_b": _half(produced, producing.how, workload),
        "consume_from_a": _half(consumed, consuming.how, workload),
    }


def _at_once_producing(produced: Best) -> list[Best]:
    """The producing half's ways tried at once: the fastest alone and, if that took
    several processes, the same in one (beside the consuming half and both brokers,
    two producing processes left too little CPU: 1 KiB records at once then went into B
    slower than mm2py copied them)."""
    assert isinstance(produced.how, Producing)
    if produced.how.processes == 1:
        return [produced]
    one = Producing(produced.how.tool, produced.how.settings, 1)
    return [produced, Best(produced.result, one, produced.startup_s)]


def pipe_limit(workload: Workload, keep_topics: bool = False) -> dict[str, Any]:
    """Measure each half alone, then both at once, for `workload` (see above).

    Uses (and starts if needed) the local clusters A and B; the topics it creates are
    deleted afterwards unless `keep_topics` (the source topic only: each producing
    run's topic goes at once).
    """
    clusters = local_clusters(["A", "B"])
    # The machine is shared: a busy one explains a low number.
    load_before = load_averages()
    source, target = clusters["A"], clusters["B"]
    source_topic = bench_topic(workload, "pipe-src")
    tried: list[dict[str, Any]] = []
    try:
        log.info("pre-filling %s on A with %s", source_topic, workload.label)
        filled = prefill(source, source_topic, workload)
        consumed = best_consuming(source, source_topic, workload, tried)
        produced = best_producing(target, workload, tried)
        at_once_runs = []
        for producing in _at_once_producing(produced):
            start = Start.first(producing, consumed)
            for _ in range(RUNS):
                run = both_at_once(
                    source, source_topic, target, workload, producing, consumed, start
                )
                start = start.next(run, producing, consumed)
                tried.append({"how": "both at once", **run})
                log.info(
                    "both at once: %.0f records/s (producing %.0f, consuming %.0f; gap %.2f s)",
                    run["records_per_s"],
                    run["produce_into_b"]["records_per_s"],
                    run["consume_from_a"]["records_per_s"],
                    run["start_gap_s"],
                )
                at_once_runs.append(run)
    finally:
        if not keep_topics:
            delete_topics(source, [source_topic])
    at_once = max(at_once_runs, key=lambda r: float(r["records_per_s"]))
    alone = min(produced.result, consumed.result, key=lambda r: r.records_per_s)
    return {
        "system": "pipe-limit",
        "partitions": workload.partitions,
        "records": workload.records,
        "record_bytes": workload.record_bytes,
        "records_per_s": at_once["records_per_s"],
        "mb_per_s": at_once["mb_per_s"],
        "at_once": at_once,
        "alone_records_per_s": round(alone.records_per_s, 1),
        "alone_mb_per_s": round(alone.mb_per_s, 2),
        "produce_into_b": {**produced.how.describe(), **produced.result.as_dict()},
        "consume_from_a": {**consumed.how.describe(), **consumed.result.as_dict()},
        "prefill_into_a": filled.as_dict(),
        "tried": tried,
        "load_1m_before": round(load_before[0], 2),
        "load_avg_before": load_before,
        "load_avg_after": load_averages(),
    }


def main(argv: list[str] | None = None) -> None:
    """Run the pipe-limit measurement and print one JSON line per workload."""
    parser = argparse.ArgumentParser(prog="bench.pipe_limit", description=__doc__.split("\n")[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--records", type=int, help="default: the standard workloads")
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--keep-topics", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    workloads = (
        [Workload(args.partitions, args.records, args.record_bytes)]
        if args.records
        else list(STANDARD_WORKLOADS)
    )
    for workload in workloads:
        print(json.dumps(pipe_limit(workload, args.keep_topics)), flush=True)


if __name__ == "__main__":
    main()
