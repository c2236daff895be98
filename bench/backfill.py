"""Backfill benchmark: the Spark backfill (local[1], local[2], a standalone cluster of two
workers) and the daemon, in one run.

    .venv/bin/python -m bench.backfill                  # 2,000,000 x 1 KiB over 8 partitions
    .venv/bin/python -m bench.backfill --quick          # 10x fewer records (smoke run)
    .venv/bin/python -m bench.backfill --data-path      # also Spark's Kafka connector
    .venv/bin/python -m bench.backfill --systems backfill-local[2] --range-records 50000

Each system copies its own pre-filled topic from A to B: `mm2py backfill` with
`--master local[1]`, `local[2]` and a standalone master with two workers of one core
each (mm2py.dev.spark; its executors run the packed Python the backfill ships), and
`mm2py run` (the daemon) starting from the earliest offset. The copy rate is
measured as bench.replication measures it (bench.replicators.watch_copy), from B's high
watermarks: (records - records seen at the first sample that shows any) / (time
from that sample to the one showing all), so start-up (the JVM and Python workers
of Spark, the daemon's imports) is excluded from records/s and reported apart
(startup_s, and wall_s for the backfill's whole command).

--data-path adds the comparison behind the backfill's design: Spark's own Kafka
connector (spark-sql-kafka-0-10, fetched by Maven from bench/spark-kafka-pom.xml)
copying with a DataFrame read and write on local[2], timed around the write, and
what it preserves (partition, headers, timestamps) checked on the copies.

Clusters as in bench.replication (fresh ones if the ports are free, else the
running A and B). One JSON line per measurement on stdout; progress on stderr.
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
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from confluent_kafka import KafkaException, TopicPartition

from bench.perf_tools import ToolError, prefill
from bench.processes import ProcessCpu
from bench.replication import (
    MM2PY,
    bench_clusters,
    copy_line,
    replicating,
    result_line,
    topic_properties,
)
from bench.replicators import ReplicatorError, Running, running_command, watch_copy
from bench.report import emit, logs_dir
from bench.topics import bench_topic, create_topic, delete_topics, end_offsets
from bench.workload import MIB, Workload, cpu_per_million
from mm2py.backfill.environment import packed_environment
from mm2py.dev.jars import fetch_jars
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import render_properties
from mm2py.dev.spark import LocalSpark, LocalSparkError
from mm2py.kafka import clients

log = logging.getLogger("bench.backfill")

WORKLOAD: Final = Workload(partitions=8, records=2_000_000, record_bytes=1024)
DAEMON: Final = "daemon"
BACKFILL_1: Final = "backfill-local[1]"
BACKFILL_2: Final = "backfill-local[2]"
# A standalone master and two workers of one core each, each its own JVM and Python.
BACKFILL_CLUSTER: Final = "backfill-standalone-2x1"
CONNECTOR: Final = "spark-kafka-connector-local[2]"
SYSTEMS: Final = (DAEMON, BACKFILL_1, BACKFILL_2, BACKFILL_CLUSTER)
SPARK_KAFKA_POM: Final = Path(__file__).with_name("spark-kafka-pom.xml")
# The connector's own jars and the Kafka client it needs; the rest is in pyspark already.
CONNECTOR_JARS: Final = (
    "spark-sql-kafka",
    "spark-token-provider",
    "kafka-clients",
    "commons-pool2",
)
_SUMMARY = re.compile(r"copying: (?P<s>[\d.]+) s, (?P<rps>[\d,]+) records/s")


def _config(source: LocalCluster, target: LocalCluster, topic: str, run_dir: Path) -> Path:
    """The MM2 properties the daemon gets in bench.replication (topic_properties), as a file."""
    path = run_dir / f"backfill-{topic}.properties"
    path.write_text(render_properties(topic_properties(source, target, topic)), encoding="latin-1")
    return path


@contextmanager
def backfilling(
    master: str,
    topic: str,
    source: LocalCluster,
    target: LocalCluster,
    run_dir: Path,
    extra: list[str],
) -> Iterator[tuple[Running, subprocess.Popen[bytes]]]:
    """`mm2py backfill` of `topic` on `master`, as a subprocess; killed if still running."""
    config = _config(source, target, topic, run_dir)
    log_file = config.with_suffix("." + re.sub(r"\W", "", master) + ".log")
    cmd = [sys.executable, "-m", "mm2py.cli", "backfill", str(config)]
    cmd += ["--source", source.alias, "--target", target.alias, "--master", master, *extra]
    with running_command(f"backfill {master}", cmd, log_file) as started:
        yield started


def measure_backfill(
    master: str,
    workload: Workload,
    clusters: dict[str, LocalCluster],
    run_dir: Path,
    extra: list[str],
    label: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """`mm2py backfill --master <master>` copying its own pre-filled topic."""
    source, target = clusters["A"], clusters["B"]
    topic = bench_topic(workload, "bench-backfill")
    remote = f"{source.alias}.{topic}"
    try:
        log.info("backfill %s: pre-filling %s on A", master, topic)
        prefill(source, topic, workload)
        load = os.getloadavg()[0]
        started = time.monotonic()
        with backfilling(master, topic, source, target, run_dir, extra) as (running, proc):
            copy = watch_copy(target, remote, workload, running, 600, "read_uncommitted")
            code = proc.wait(120)
        wall = time.monotonic() - started
        if code != 0:
            raise ReplicatorError(f"mm2py backfill exited with {code}; see {running.log_file}")
        summary = _SUMMARY.search(running.log_file.read_text(errors="replace"))
        copied = _committed(target, remote)
    finally:
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    return copy_line(
        label or f"backfill-{master}",
        workload,
        copy,
        copied,
        wall_s=round(wall, 2),
        own_copy_s=float(summary["s"]) if summary else None,
        own_records_per_s=float(summary["rps"].replace(",", "")) if summary else None,
        load_1m_before=round(load, 2),
        **more,
    )


def measure_cluster_backfill(
    workload: Workload, clusters: dict[str, LocalCluster], run_dir: Path, extra: list[str]
) -> dict[str, Any]:
    """`mm2py backfill` on a local standalone cluster, nothing set: the packed Python
    ships with the job (packed first, timed apart as pack_s; 0 when cached)."""
    started = time.monotonic()
    packed_environment()
    pack = time.monotonic() - started
    spark = LocalSpark(run_dir / "spark", workers=2, cores=1, memory="1g")
    spark.start()
    try:
        # The executors are the workers' children, not the command's: their CPU is
        # counted apart, over the whole command (cpu_s_per_m_records is the driver's).
        workers = [ProcessCpu(spark.worker_pid(i)) for i in range(spark.workers)]
        before = sum(w.sample() for w in workers)
        line = measure_backfill(
            spark.master_url,
            workload,
            clusters,
            run_dir,
            extra,
            label=BACKFILL_CLUSTER,
            pack_s=round(pack, 2),
        )
        executors_cpu = sum(w.sample() for w in workers) - before
        line["executors_cpu_s_per_m_records"] = cpu_per_million(executors_cpu, workload.records)
        return line
    finally:
        spark.stop()


def measure_daemon(
    workload: Workload, clusters: dict[str, LocalCluster], run_dir: Path
) -> dict[str, Any]:
    """`mm2py run` from the earliest offset, copying its own pre-filled topic."""
    source, target = clusters["A"], clusters["B"]
    topic = bench_topic(workload, "bench-daemon")
    remote = f"{source.alias}.{topic}"
    try:
        log.info("daemon: pre-filling %s on A", topic)
        prefill(source, topic, workload)
        load = os.getloadavg()[0]
        with replicating(MM2PY, topic, source, target, run_dir) as running:
            copy = watch_copy(target, remote, workload, running, 600, "read_uncommitted")
        copied = _committed(target, remote)
    finally:
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    return copy_line(DAEMON, workload, copy, copied, load_1m_before=round(load, 2))


def _committed(cluster: LocalCluster, topic: str) -> int:
    """Records a read_committed consumer sees in `topic` (read and counted: the end
    offsets also count the backfill's commit markers)."""
    consumer = clients.consumer(
        cluster.client_properties(),
        {"isolation.level": "read_committed", "enable.partition.eof": True},
    )
    try:
        parts = end_offsets(cluster, topic)
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])
        left, count = set(parts), 0
        deadline = time.monotonic() + 300
        while left and time.monotonic() < deadline:
            for msg in consumer.consume(10000, 0.5):
                if msg.error():
                    if msg.error().code() == -191:  # partition EOF
                        left.discard(msg.partition())
                    continue
                count += 1
        return count
    finally:
        consumer.close()


# -- --data-path: Spark's own Kafka connector ---------------------------------------


def measure_connector(workload: Workload, clusters: dict[str, LocalCluster]) -> dict[str, Any]:
    """Spark's Kafka connector (DataFrame read + write) on local[2], and what it keeps."""
    from pyspark.sql import SparkSession

    source, target = clusters["A"], clusters["B"]
    topic = bench_topic(workload, "bench-connector")
    remote = f"{source.alias}.{topic}"
    jars = sorted(fetch_jars(SPARK_KAFKA_POM).glob("*.jar"))
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench.backfill connector")
        .config("spark.jars", ",".join(str(j) for j in jars if j.name.startswith(CONNECTOR_JARS)))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        log.info("connector: pre-filling %s on A", topic)
        prefill(source, topic, workload)
        create_topic(target, remote, workload.partitions)
        ends = end_offsets(source, topic)
        load = os.getloadavg()[0]
        frame = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", source.bootstrap_servers)
            .option("assign", json.dumps({topic: sorted(ends)}))
            .option("startingOffsets", json.dumps({topic: {str(p): 0 for p in ends}}))
            .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
            .option("kafka.isolation.level", "read_committed")
            .option("includeHeaders", "true")
            .load()
            .selectExpr("key", "value", "headers", "partition", "timestamp")
        )
        started = time.monotonic()
        (
            frame.write.format("kafka")
            .option("kafka.bootstrap.servers", target.bootstrap_servers)
            .option("kafka.enable.idempotence", "true")
            .option("kafka.acks", "all")
            .option("kafka.linger.ms", "5")
            .option("kafka.batch.size", "1000000")
            .option("topic", remote)
            .option("includeHeaders", "true")
            .save()
        )
        seconds = time.monotonic() - started
        copied = sum(end_offsets(target, remote).values())
        kept = _what_is_kept(source, topic, target, remote)
    finally:
        spark.stop()
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    rate = workload.records / seconds
    return result_line(
        CONNECTOR,
        workload.label,
        workload.records,
        workload.record_bytes,
        rate,
        rate * workload.record_bytes / MIB,
        copy_s=round(seconds, 2),
        records_on_b=copied,
        load_1m_before=round(load, 2),
        **kept,
    )


def _first_records(cluster: LocalCluster, topic: str, partition: int, count: int) -> list[Any]:
    consumer = clients.consumer(cluster.client_properties())
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])
        out: list[Any] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            out += [m for m in consumer.consume(count - len(out), 1.0) if not m.error()]
        return [(m.key(), m.value(), m.headers(), m.timestamp()[1]) for m in out]
    finally:
        consumer.close()


def _what_is_kept(
    source: LocalCluster, topic: str, target: LocalCluster, remote: str
) -> dict[str, bool]:
    """Compare the first records of partition 0 field by field."""
    try:
        ours = _first_records(source, topic, 0, 100)
        theirs = _first_records(target, remote, 0, 100)
    except KafkaException as exc:
        log.warning("could not compare the copies: %s", exc)
        return {}
    return {
        "same_partition_and_order": [r[1] for r in ours] == [r[1] for r in theirs],
        "timestamps_kept": [r[3] for r in ours] == [r[3] for r in theirs],
    }


# -- main ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line per measurement."""
    parser = argparse.ArgumentParser(
        prog="bench.backfill", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument("--quick", action="store_true", help="10x fewer records (smoke run)")
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=SYSTEMS,
        default=list(SYSTEMS),
        metavar="SYSTEM",
        help=f"a subset of: {' '.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument(
        "--data-path", action="store_true", help="also measure Spark's own Kafka connector"
    )
    parser.add_argument("--range-records", type=int, default=None, help="passed to mm2py backfill")
    parser.add_argument(
        "--record-bytes",
        type=int,
        default=WORKLOAD.record_bytes,
        help=f"record size (default {WORKLOAD.record_bytes}; 100 makes the copy CPU-bound here)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    scale = 10 if args.quick else 1
    workload = Workload(WORKLOAD.partitions, WORKLOAD.records // scale, args.record_bytes)
    extra = ["--range-records", str(args.range_records)] if args.range_records else []
    run_dir = logs_dir() / f"backfill-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("logs and configs of this run: %s", run_dir)
    clusters, started = bench_clusters()
    failures = 0
    runs: dict[str, Any] = {
        DAEMON: lambda: measure_daemon(workload, clusters, run_dir),
        BACKFILL_1: lambda: measure_backfill("local[1]", workload, clusters, run_dir, extra),
        BACKFILL_2: lambda: measure_backfill("local[2]", workload, clusters, run_dir, extra),
        BACKFILL_CLUSTER: lambda: measure_cluster_backfill(workload, clusters, run_dir, extra),
    }
    try:
        for system in (s for s in SYSTEMS if s in args.systems):
            try:
                emit(runs[system]())
            except (ReplicatorError, ToolError, TimeoutError, KafkaException, LocalSparkError) as e:
                failures += 1
                log.error("%s failed: %s", system, e)
                emit({"system": system, "workload": workload.label, "error": str(e)})
        if args.data_path:
            emit(measure_connector(workload, clusters))
    finally:
        if started is not None:
            started.down(["A", "B"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
