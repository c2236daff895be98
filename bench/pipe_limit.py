"""The pipe limit: the fastest any replicator could copy a workload from A to B here.

A replicator reads from A and writes to B, so it can go no faster than the slower of
Kafka's own tools doing each half alone: ConsumerPerformance reading the workload from
A and ProducerPerformance writing it into B. The two runs go one after the other, so
neither shares the (two) cores with the other; a replicator doing both at once, next
to both brokers, will land below this bound.

    .venv/bin/python -m bench.pipe_limit                      # the standard workloads
    .venv/bin/python -m bench.pipe_limit --records 100000 --record-bytes 512

Prints one JSON line per workload.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from typing import Any

from bench.common import (
    STANDARD_WORKLOADS,
    Workload,
    bench_topic,
    consumer_performance,
    create_topic,
    delete_topics,
    local_clusters,
    prefill,
    producer_performance,
)

log = logging.getLogger(__name__)


def pipe_limit(workload: Workload, keep_topics: bool = False) -> dict[str, Any]:
    """Measure produce-into-B and consume-from-A for `workload`; the pipe limit is the min.

    Uses (and starts if needed) the local clusters A and B; the topics it creates are
    deleted afterwards unless `keep_topics`.
    """
    clusters = local_clusters(["A", "B"])
    # The machine is shared: a busy one explains a low number.
    load_before = os.getloadavg()[0]
    source, target = clusters["A"], clusters["B"]
    source_topic = bench_topic(workload, "pipe-src")
    target_topic = bench_topic(workload, "pipe-dst")
    try:
        log.info("pre-filling %s on A with %s", source_topic, workload.label)
        filled = prefill(source, source_topic, workload)
        log.info("consuming %s from A", source_topic)
        consumed = consumer_performance(source, source_topic, workload.records)
        create_topic(target, target_topic, workload.partitions)
        log.info("producing %s into B", target_topic)
        produced = producer_performance(target, target_topic, workload)
    finally:
        if not keep_topics:
            delete_topics(source, [source_topic])
            delete_topics(target, [target_topic])
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
        "load_1m_before": round(load_before, 2),
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
