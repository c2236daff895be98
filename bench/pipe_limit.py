"""The pipe limit: the fastest any replicator could copy a workload from A to B here.

A replicator reads from A and writes to B, so it can go no faster than the slower of
the two halves done alone, each by the fastest tool with the best client settings
found:

- into B, with what mm2py's producer must use (``acks=all``,
  ``enable.idempotence=true``, no compression) and the partitions in turn:
  Kafka's ProducerPerformance with each of PRODUCER_SETTINGS (``batch.size`` and
  ``linger.ms``) in one JVM, then the best of them in PARALLEL_PRODUCERS JVMs at
  once (each an equal share of the records; their rate is all records over the
  longest one's sending time); then librdkafka alone (bench.rdkafka_perf: the client
  mm2py uses, big batches, no delivery callbacks) in one and in PARALLEL_PRODUCERS
  processes; then the fastest of these again, RUNS times in all. The fastest run is
  the producing half. The JVM tool needs more CPU a record than librdkafka (``tried``
  in the output has each run's CPU-seconds per million records), so on this 2-core
  machine, where producing is CPU-bound, it alone would bound only replicators
  slower than itself;
- from A, read_committed as mm2py reads: ConsumerPerformance with each of
  CONSUMER_SETTINGS (its fetch rate, group join excluded), and librdkafka alone
  (bench.rdkafka_perf: first record to last, connected to the leaders before) RUNS - 1
  times; the fastest run is the consuming half.

Each run is timed by the tool itself (JVM or interpreter start-up excluded) and goes
alone, so neither half shares the (two) cores with the other; a replicator doing both
at once, next to both brokers, lands below the limit. No replicator may beat it in the same
run: one that does shows the limit is wrong (bench.replication says so).

    .venv/bin/python -m bench.pipe_limit                      # the standard workloads
    .venv/bin/python -m bench.pipe_limit --records 100000 --record-bytes 512

Prints one JSON line per workload.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from bench.common import (
    STANDARD_WORKLOADS,
    Throughput,
    Workload,
    bench_topic,
    consumer_performance,
    create_topic,
    delete_topics,
    load_averages,
    local_clusters,
    prefill,
    producer_performance,
    rdkafka_consumer_performance,
    rdkafka_producer_performance,
)

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
RDKAFKA_SETTINGS: Final[Mapping[str, str]] = {
    "linger.ms": "5",
    "batch.size": "1000000",
    "queue.buffering.max.kbytes": "131072",
    "queue.buffering.max.messages": "1000000",
}
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
RUNS: Final = 3  # runs of the best producer setting, counting the first
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


def _attempt(name: str, result: Throughput, tried: list[dict[str, Any]], **how: Any) -> Throughput:
    tried.append({"how": name, **how, **result.as_dict()})
    log.info("%s: %.0f records/s (%s)", name, result.records_per_s, how)
    return result


def best_producing(target: Any, workload: Workload, tried: list[dict[str, Any]]) -> Throughput:
    """The fastest run producing into new topics on `target` (see above)."""

    def produce(tool: str, settings: Mapping[str, str], processes: int) -> Throughput:
        topic = bench_topic(workload, "pipe-dst")
        create_topic(target, topic, workload.partitions)
        try:
            if tool == PRODUCER_PERFORMANCE_TOOL:
                result = producer_performance(
                    target, topic, workload, {**PRODUCER_REQUIRED, **settings}, processes=processes
                )
            else:
                result = rdkafka_producer_performance(
                    target, topic, workload, {**RDKAFKA_REQUIRED, **settings}, processes
                )
        finally:
            # Each topic is only needed for its run; B's disk is shared.
            delete_topics(target, [topic])
        return _attempt(f"produce into B ({tool})", result, tried, processes=processes, **settings)

    java = [(produce(PRODUCER_PERFORMANCE_TOOL, s, 1), s) for s in PRODUCER_SETTINGS]
    _, java_settings = max(java, key=lambda r: r[0].records_per_s)
    runs = [(result, PRODUCER_PERFORMANCE_TOOL, s, 1) for result, s in java]
    runs.append(
        (
            produce(PRODUCER_PERFORMANCE_TOOL, java_settings, PARALLEL_PRODUCERS),
            PRODUCER_PERFORMANCE_TOOL,
            java_settings,
            PARALLEL_PRODUCERS,
        )
    )
    for processes in (1, PARALLEL_PRODUCERS):
        runs.append(
            (
                produce(RDKAFKA_TOOL, RDKAFKA_SETTINGS, processes),
                RDKAFKA_TOOL,
                RDKAFKA_SETTINGS,
                processes,
            )
        )
    best, tool, settings, processes = max(runs, key=lambda r: r[0].records_per_s)
    for _ in range(RUNS - 1):
        again = produce(tool, settings, processes)
        if again.records_per_s > best.records_per_s:
            best = again
    return best


def best_consuming(
    source: Any, topic: str, workload: Workload, tried: list[dict[str, Any]]
) -> Throughput:
    """The fastest run reading `topic` on `source` (see above)."""
    results = [
        _attempt(
            f"consume from A ({CONSUMER_PERFORMANCE_TOOL})",
            consumer_performance(source, topic, workload.records, props, fetch_size),
            tried,
            fetch_size=fetch_size,
            **props,
        )
        for props, fetch_size in CONSUMER_SETTINGS
    ]
    for _ in range(RUNS - 1):
        results.append(
            _attempt(
                f"consume from A ({RDKAFKA_TOOL})",
                rdkafka_consumer_performance(source, topic, workload, RDKAFKA_CONSUMER_SETTINGS),
                tried,
                **RDKAFKA_CONSUMER_SETTINGS,
            )
        )
    return max(results, key=lambda r: r.records_per_s)


def pipe_limit(workload: Workload, keep_topics: bool = False) -> dict[str, Any]:
    """Measure produce-into-B and consume-from-A for `workload`; the pipe limit is the min.

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
    finally:
        if not keep_topics:
            delete_topics(source, [source_topic])
    produced = best_producing(target, workload, tried)
    return {
        "system": "pipe-limit",
        "partitions": workload.partitions,
        "records": workload.records,
        "record_bytes": workload.record_bytes,
        "records_per_s": round(min(produced.records_per_s, consumed.records_per_s), 1),
        "mb_per_s": round(min(produced.mb_per_s, consumed.mb_per_s), 2),
        "produce_into_b": produced.as_dict(),
        "consume_from_a": consumed.as_dict(),
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
