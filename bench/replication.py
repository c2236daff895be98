"""Replication benchmark: Kafka's pipe limit, the real MirrorMaker 2 and mm2py in one run.

    .venv/bin/python -m bench.replication                    # everything (~20 min)
    .venv/bin/python bench/replication.py --quick            # smoke run: 10x fewer records
    .venv/bin/python -m bench.replication --workloads large --systems mm2py mirrormaker2
    .venv/bin/python -m bench.replication --workloads compressed --systems mirrormaker2 \
        mm2py mm2py-record --copies 1 --latency-seconds 0   # issue 29's zstd workload
    make bench                                               # = python bench/replication.py

Throughput, per workload (8 partitions: 1,000,000 x 1 KiB "large", 2,000,000 x 100 B
"small"): the pipe limit (bench.pipe_limit: producing into B and consuming from A both
at once, as a replicator does on the same cores as both brokers, each half with the
fastest of Kafka's perf tools and librdkafka, tuned, as found alone; how it is
measured is in its docstring), then MM2 and then mm2py, each copying its own
pre-filled topic from A to B, COPIES times (``--copies``): a replicator's line is its
fastest copy, as the pipe limit is its fastest run, with every copy's records/s and
CPU in ``copies`` and their medians (the summary's ``mm2py_vs_mm2_median``). No
replicator that copies records (RECORD_PIPES) may beat the pipe limit; the summary says
so if one does (``beyond_pipe_limit``). Batch pass-through is not a record pipe and
may. The slower half alone (``alone_records_per_s``, the summary's
``mm2py_vs_pipe_limit_alone``) is kept as a looser bound: alone, a half has both
cores and one busy broker. Then mm2py again exactly-once (``mm2py-exactly-once``:
``B.exactly.once.source.support = enabled``, ``exactly.once.support = required``, the
commit interval mm2py's default unless ``--transaction-interval-ms``; in the default
mode, which passes batches through in mm2py's own transactions), and
``mm2py-exactly-once-record`` (the same with ``replication.copy.mode = record``:
records in librdkafka's transactions; the summary gives the former against it): each
copy ends when a read_committed reader can see every record, and its records on B are
counted by reading them so. ``--workloads avro``
(alone): 2,000,000 x 100 B records in Confluent's framing (a registered Avro schema's
id, then its payload), copied by mm2py without (``mm2py``) and with schema id
translation (``mm2py-schemas``: ``schema.registry.sync.enabled``, a registry beside
each cluster, started here), alternately, COPIES times each; the summary line gives
translation's extra CPU per record (``schemas_extra_cpu_per_record``). ``--workloads
compressed`` (issue 29): 1,000,000 x 1 KiB JSON-like records (bench.workload's
``json_like_values``: distinct documents, deterministic from a seed, about 5.5x
compressible), produced into A zstd-compressed in batches of about 64 KiB on the log
(``COMPRESSED_PRODUCER_PROPS``), its label ending ``-zstd``; every system gets
``B.producer.compression.type = zstd`` except mm2py in its default mode (and
``mm2py-exactly-once``), whose batch pass-through keeps the source's zstd
batches (the key would make ``auto`` copy records, to compress as asked), and each line
has ``source_batches`` (partition 0's batches as stored, fetched raw: their count,
sizes, records per batch and the compression ratio).
Its pipe limit reads that topic and writes the same kind of documents into B compressed
as the replicators are told to (librdkafka's producer only: the JVM tool's records are
random bytes): a record pipe, which pass-through is not bound by. ``mm2py`` is mm2py's
default mode (``replication.copy.mode = auto``, which passes batches through);
``mm2py-record`` is the record copier (``replication.copy.mode = record``; one of the
default systems, so it copies the other workloads too). The summary gives, per
workload, mm2py-record / MM2 in records/s and CPU per record, and issue 29's targets
for mm2py's default mode (``mm2py_targets``): on the zstd workload at least 3x MM2's
records/s at no more than 0.1x its CPU per record; on ``small`` at least 0.90 of the
pipe limit at no more than 0.15x MM2's CPU per record; each with its value and whether
it was met in this run. Latency: MM2, mm2py
and mm2py exactly-once, each replicating its own fresh topic while a producer writes 1
KiB records into it at a steady 5,000/s, read on B read_committed (exactly-once
records become visible at their commit, so that wait is in its figure), from the
record's timestamp and, as replication latency, from when a reader on A received it;
the first STEADY_WARMUP_SECONDS of records are not counted (see
`replication_latency`). The producer is bench.steady_producer (librdkafka, a process of
its own), and before the measured records the same steady load runs until the JVMs of
the run (brokers A and B when this run started them, the replicator if it is one) have
stopped compiling (`_until_compiled`): on two cores a fresh broker's JIT took a core for
over a minute, and a measurement during it was of the compiler (2026-11-29: p50 102-196
ms, p99 0.9-2.9 s for mm2py alone on fresh brokers).

Every row has records/s and, steadier on a shared machine, CPU per record: the
user+sys CPU-seconds per million records of the replicator's processes (the process
and its descendants, from /proc/<pid>/stat) over the measured window only (start-up
excluded); the pipe limit's are its tools' over their whole run. Also peak resident
memory, of the process tree and of each process (``peak_rss_mib_per_process``), and
the load averages (1, 5, 15 min) before each measurement. The last line is a summary:
per workload, mm2py / MM2 and mm2py / pipe limit in records/s, and mm2py / MM2 in CPU
per record; exactly-once / at-least-once in records/s and CPU per record, and issue 12's
targets (``exactly_once_targets``, in one run: exactly-once records/s >= 85% of
at-least-once's on both workloads, p99 < 100 ms at 5,000 rec/s with the default
commit interval), each with its value and whether it was met.

Every system gets the same MM2 properties file (mm2py.dev.mirrormaker.mm2_properties,
only the topic differs, and exactly-once's keys): they share ``mm2-offsets.A.internal``
on B, so each must replicate topics the others never saw or it would resume from
another's progress.

Clusters: if the ports of A and B are free (``MM2PY_LOCAL_PORT_OFFSET`` moves them),
fresh clusters are started and removed at the end, their data in memory
(``/dev/shm/mm2py-bench``, ``-<offset>``) when it has 12 GiB free, else under
``<cache>/bench`` (``--state-dir`` chooses); otherwise the running A and B are reused
(a note says so on stderr). Producing 1M x 1 KiB into B alone (librdkafka, mm2py's
settings, four runs each) went 101k-143k records/s on this VM's disk, with 2 GiB dirty
pages awaiting writeback, and 155k-230k in memory; no replicator writes to the disk
itself. ``--set KEY=VALUE`` adds a property to every replicator's config (e.g.
``B.producer.linger.ms=5``, to try settings; the lines say which). Prints one JSON
line per system and workload on stdout; progress goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/replication.py` (as `make bench` runs it) puts bench/ on sys.path, not
# the repository root that `import bench.workload` needs.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from typing import Any, Final

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from bench.perf_tools import ToolError, prefill, prefill_values
from bench.pipe_limit import pipe_limit
from bench.processes import JitCpu, PeakRss, ProcessCpu
from bench.replicators import (
    Copy,
    ReplicatorError,
    Running,
    check_alive,
    free_port,
    running_command,
    watch_copy,
)
from bench.report import add_set_option, emit, load_averages, logs_dir
from bench.topics import (
    bench_topic,
    count_records,
    create_topic,
    delete_topics,
    end_offsets,
    local_clusters,
)
from bench.workload import (
    COMPRESSED_WORKLOAD,
    MIB,
    STANDARD_WORKLOADS,
    Workload,
    cpu_per_million,
)
from mm2py.cache import cache_root
from mm2py.config.models import DEFAULT_TRANSACTION_INTERVAL_MS
from mm2py.dev.launcher import PORT_OFFSET_VARIABLE, LocalCluster, LocalKafka, broker_port
from mm2py.dev.mirrormaker import (
    MirrorMakerError,
    RealMirrorMaker,
    mm2_properties,
    render_properties,
)
from mm2py.kafka import clients
from mm2py.kafka.raw_partition import RawFetcher
from mm2py.kafka.record_batches import split_batches

log = logging.getLogger("bench.replication")

PIPE_LIMIT: Final = "pipe-limit"
MIRRORMAKER2: Final = "mirrormaker2"
MM2PY: Final = "mm2py"
# Each replicator copies each throughput workload this many times; its line is the
# fastest copy (the pipe limit too is the fastest of several runs), ``copies`` has all.
COPIES: Final = 3
# Fresh clusters keep their data in memory when it has room (see the docstring).
MEMORY_DIR: Final = Path("/dev/shm")
MEMORY_NEEDED: Final = 12 << 30
# mm2py copying exactly-once: B.exactly.once.source.support = enabled (the default mode
# passes batches through, in mm2py's own transactions).
MM2PY_EOS: Final = "mm2py-exactly-once"
# mm2py copying record by record: replication.copy.mode = record (the default mode,
# auto, passes batches through where it keeps the flow's guarantees).
MM2PY_RECORD: Final = "mm2py-record"
# mm2py copying exactly-once record by record (replication.copy.mode = record: in
# librdkafka's transactions).
MM2PY_EOS_RECORD: Final = "mm2py-exactly-once-record"
EXACTLY_ONCE_SYSTEMS: Final = (MM2PY_EOS, MM2PY_EOS_RECORD)
# The systems that copy record by record (the pipe limit bounds these).
RECORD_PIPES: Final = (MIRRORMAKER2, MM2PY_RECORD, MM2PY_EOS_RECORD)
# mm2py with schema.registry.sync.enabled (the avro workload only).
MM2PY_SCHEMAS: Final = "mm2py-schemas"
# Framed Avro records: 5 bytes of framing, then an Avro record of one string field.
AVRO_WORKLOAD: Final = Workload(partitions=8, records=2_000_000, record_bytes=100)
AVRO_SCHEMA: Final = (
    '{"type": "record", "name": "BenchRecord", "namespace": "mm2py.bench",'
    ' "fields": [{"name": "data", "type": "string"}]}'
)
SYSTEMS: Final = (PIPE_LIMIT, MIRRORMAKER2, MM2PY, MM2PY_RECORD, MM2PY_EOS, MM2PY_EOS_RECORD)
REPLICATORS: Final = (MIRRORMAKER2, MM2PY, MM2PY_RECORD, MM2PY_EOS, MM2PY_EOS_RECORD)
WORKLOADS: Final = {
    "large": STANDARD_WORKLOADS[0],
    "small": STANDARD_WORKLOADS[1],
    "compressed": COMPRESSED_WORKLOAD,
}
# Issue 29's targets for mm2py's default mode, in one run: on the compressed workload at
# least this many times MM2's records/s, at no more than this fraction of its CPU per
# record; on `small` at least this fraction of the pipe limit, at no more than this
# fraction of MM2's CPU per record.
BATCH_SPEED_TARGET: Final = 3.0
BATCH_CPU_TARGET: Final = 0.1
SMALL_PIPE_TARGET: Final = 0.90
SMALL_CPU_TARGET: Final = 0.15

# connect-mirror-maker.sh starts MM2 with -Xmx2G; give the JVM what users get.
MM2_HEAP: Final = "2g"
# Latency test: a steady rate of 1 KiB records into 8 partitions for LATENCY_SECONDS.
LATENCY_RATE: Final = 5000
LATENCY_SECONDS: Final = 30
LATENCY_RECORD_BYTES: Final = 1024
LATENCY_PARTITIONS: Final = 8
# Records copied before the latency measurement starts, proving the pipeline is live
# (JVM, Connect worker and task start-up are not replication latency).
WARMUP_RECORDS: Final = 80
# The steady producer runs this much longer; records of its first seconds are not counted.
# Kept from when the producer was a fresh JVM (ProducerPerformance), whose latencies
# settled only ~20 s after it started; the JVMs now compile first (`_until_compiled`).
STEADY_WARMUP_SECONDS: Final = 20
# The source producer (bench.steady_producer) waits at most 1 ms to batch, so its
# batching adds little to the measured latency (the same small constant for every
# system) and nothing to the replication latency. With linger 0, librdkafka sent so many
# requests that broker A took 73-87% of a core for 5,000 records/s, against 23-37% for
# Kafka's ProducerPerformance (linger 0) once the broker had compiled, and 35% for linger
# 1 ms (2026-11-29, a broker alone, 25 s each).
STEADY_PRODUCER_PROPS: Final = {"acks": "1", "linger.ms": "1", "compression.type": "none"}
# Before the measured records, the steady load runs at least COMPILED_MIN_SECONDS and
# until the run's JVMs' compiler threads used under COMPILED_CPU_SHARE of a core over
# the last COMPILED_WINDOW_SECONDS, at most COMPILED_MAX_SECONDS (the line says which).
COMPILED_MIN_SECONDS: Final = 20.0
COMPILED_WINDOW_SECONDS: Final = 10.0
COMPILED_CPU_SHARE: Final = 0.05
COMPILED_MAX_SECONDS: Final = 240.0
# Python's thread switch interval while both measuring consumers run (default 5 ms).
SWITCH_INTERVAL_S: Final = 0.0005
# Issue 12's targets for exactly-once, each in one run: its records/s at least this
# fraction of at-least-once's, per throughput workload; its p99 latency at LATENCY_RATE
# below this, with the default commit interval.
EOS_THROUGHPUT_TARGET: Final = 0.85
EOS_P99_TARGET_MS: Final = 100.0


# -- results ---------------------------------------------------------------------


def result_line(
    system: str,
    workload: str,
    records: int,
    record_bytes: int,
    records_per_s: float | None,
    mb_per_s: float | None,
    p50_ms: float | None = None,
    p99_ms: float | None = None,
    peak_rss_bytes: int | None = None,
    cpu_s_per_m_records: float | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One JSON line: the common fields first, anything system-specific after."""
    return {
        "system": system,
        "workload": workload,
        "records": records,
        "record_bytes": record_bytes,
        "records_per_s": None if records_per_s is None else round(records_per_s, 1),
        "mb_per_s": None if mb_per_s is None else round(mb_per_s, 2),
        "cpu_s_per_m_records": cpu_s_per_m_records,
        "p50_ms": p50_ms,
        "p99_ms": p99_ms,
        "peak_rss_mib": None if peak_rss_bytes is None else round(peak_rss_bytes / MIB, 1),
        **extra,
    }


def copy_line(
    system: str, workload: Workload, copy: Copy, copied: int, **extra: Any
) -> dict[str, Any]:
    """The line of `system` copying `workload` (watch_copy's `copy`, `copied` records on B)."""
    rate = copy.copied_in_window / copy.copy_s if copy.copy_s > 0 else None
    return result_line(
        system,
        workload.label,
        workload.records,
        workload.record_bytes,
        rate,
        None if rate is None else rate * workload.record_bytes / MIB,
        cpu_s_per_m_records=copy.cpu_s_per_m_records,
        startup_s=round(copy.startup_s, 2),
        copy_s=round(copy.copy_s, 2),
        records_on_b=copied,
        **extra,
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile `q` (0..1) of an ascending, non-empty sequence."""
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


# -- clusters ----------------------------------------------------------------------


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def default_state_dir() -> Path:
    """Where fresh clusters keep their data: in memory (MEMORY_DIR, a tmpfs) when it has
    MEMORY_NEEDED free, else under the cache. ``MM2PY_LOCAL_PORT_OFFSET`` gives each
    offset its own folder."""
    offset = os.environ.get(PORT_OFFSET_VARIABLE, "0")
    name = "bench" if offset in ("", "0") else f"bench-{offset}"
    try:
        free = shutil.disk_usage(MEMORY_DIR).free
    except OSError:
        free = 0
    return MEMORY_DIR / f"mm2py-{name}" if free >= MEMORY_NEEDED else cache_root() / name


def bench_clusters(
    state_dir: Path | None = None,
) -> tuple[dict[str, LocalCluster], LocalKafka | None]:
    """Clusters A and B, and the LocalKafka to tear down afterwards if we started them
    (in `state_dir`, default `mm2py local`'s folder)."""
    state_dir = state_dir or default_state_dir()
    ports = [broker_port(a) + k for a in ("A", "B") for k in (0, 1)]  # broker, controller
    taken = [p for p in ports if _port_open(p)]
    if taken:
        # The fixed ports are shared with everyone's tests: we cannot start our own.
        print(
            f"note: ports {taken} are in use; reusing the running local clusters A and B "
            "(shared, not fresh: other work on them makes the numbers noisier)",
            file=sys.stderr,
        )
        return local_clusters(["A", "B"]), None
    # bench.topics.local_clusters (used by bench.pipe_limit) must find these clusters.
    os.environ["MM2PY_LOCAL_DIR"] = str(state_dir)
    kafka = LocalKafka(state_dir)
    print(f"note: starting fresh clusters A and B under {state_dir}", file=sys.stderr)
    return {c.alias: c for c in kafka.up(["A", "B"])}, kafka


# -- the replicators under test ------------------------------------------------------


def topic_properties(source: LocalCluster, target: LocalCluster, topic: str) -> dict[str, str]:
    """The MM2 properties every system gets here: replicate only `topic`, source->target."""
    # The topic regex is anchored by MM2's matches().
    return mm2_properties(
        source.alias,
        source.bootstrap_servers,
        target.alias,
        target.bootstrap_servers,
        re.escape(topic),
    )


def exactly_once_properties(target: LocalCluster, interval_ms: int | None) -> dict[str, str]:
    """What mm2py-exactly-once adds to `topic_properties`: MM2's switch for flows into
    `target`, `required` so that a run that could not copy exactly-once fails instead of
    measuring at-least-once, and the commit interval unless mm2py's default."""
    props = {
        f"{target.alias}.exactly.once.source.support": "enabled",
        "exactly.once.support": "required",
    }
    if interval_ms is not None:
        props["transaction.boundary.interval.ms"] = str(interval_ms)
    return props


@contextmanager
def replicating(
    system: str,
    topic: str,
    source: LocalCluster,
    target: LocalCluster,
    run_dir: Path,
    interval_ms: int | None = None,
    settings: Mapping[str, str] | None = None,
) -> Iterator[Running]:
    """Run `system` (MM2, mm2py or mm2py exactly-once, committing every `interval_ms`)
    replicating only `topic` source->target, with the `settings` properties; stop it after."""
    props = topic_properties(source, target, topic)  # the same config for every system
    props.update(settings or {})
    if system in EXACTLY_ONCE_SYSTEMS:
        props.update(exactly_once_properties(target, interval_ms))
    if system in (MM2PY_RECORD, MM2PY_EOS_RECORD):
        props["replication.copy.mode"] = "record"
    if system == MIRRORMAKER2:
        mm2 = RealMirrorMaker(props, run_dir / f"mm2-{topic}", heap=MM2_HEAP)
        with mm2:
            assert mm2.pid is not None
            yield Running(system, mm2.pid, mm2.is_running, mm2.log_file)
        return
    config = run_dir / f"mm2py-{topic}.properties"
    config.write_text(render_properties(props), encoding="latin-1")
    cmd = [sys.executable, "-m", "mm2py.cli", "run", str(config)]
    cmd += ["--listen", f"127.0.0.1:{free_port()}"]
    with running_command(system, cmd, config.with_suffix(".log")) as (running, _):
        yield running


def _end_offsets(cluster: LocalCluster, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """bench.topics.end_offsets, retried while a partition has no leader.

    The local clusters may be shared: another user's test may restart one mid-run.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return end_offsets(cluster, topic)
        except KafkaException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


# -- throughput ---------------------------------------------------------------------


def replication_throughput(
    system: str,
    workload: Workload,
    clusters: dict[str, LocalCluster],
    run_dir: Path,
    interval_ms: int | None = None,
    settings: Mapping[str, str] | None = None,
    fill: Callable[[LocalCluster, str, Workload], object] = prefill,
) -> dict[str, Any]:
    """`system` copying its own pre-filled copy of `workload` from A to B.

    Exactly-once, the copy ends when a read_committed reader can see every record (see
    watch_copy's `transactional`), and the records on B are counted by reading them
    read_committed (their end offsets count the commit markers too, in `end_offsets`).
    """
    transactional = system in EXACTLY_ONCE_SYSTEMS
    source, target = clusters["A"], clusters["B"]
    if workload.compression != "none":
        # Compressed workloads: every system writes B compressed alike (MM2 would
        # otherwise write it uncompressed), but mm2py's default mode, whose batches keep
        # the source's codec as they are (the key would make it copy records).
        if system not in (MM2PY, MM2PY_EOS):
            settings = {
                f"{target.alias}.producer.compression.type": workload.compression,
                **(settings or {}),
            }
        fill = compressed_prefill
    topic = bench_topic(workload, f"bench-{system}")
    remote = f"{source.alias}.{topic}"
    try:
        log.info("%s: pre-filling %s on A with %s", system, topic, workload.label)
        filled = fill(source, topic, workload)
        load = load_averages()
        # A slow machine still finishes: allow 2 MiB/s plus start-up.
        timeout = 180 + workload.total_bytes / (2 * MIB)
        # RSS is sampled from launch, so the peak covers start-up as well as the copy.
        with (
            replicating(system, topic, source, target, run_dir, interval_ms, settings) as running,
            PeakRss(running.pid) as rss,
        ):
            copy = watch_copy(
                target, remote, workload, running, timeout, transactional=transactional
            )
        if transactional:
            copied = count_records(target, remote)
        else:
            copied = sum(_end_offsets(target, remote).values())
    finally:
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    if copied != workload.records:
        log.warning(
            "%s: %s holds %d records, expected %d", system, remote, copied, workload.records
        )
    extra: dict[str, Any] = {"settings": dict(settings)} if settings else {}
    if isinstance(filled, dict):
        extra["source_batches"] = filled
    if transactional:
        # Markers prove it committed transactions (one per partition and commit).
        extra["transaction_interval_ms"] = _interval(interval_ms)
        extra["end_offsets_on_b"] = copy.end_offsets
    return copy_line(
        system,
        workload,
        copy,
        copied,
        peak_rss_bytes=rss.peak_bytes,
        peak_rss_mib_per_process=rss.per_process_mib(),
        load_1m_before=load[0],
        load_avg_before=load,
        **extra,
    )


def compressed_prefill(cluster: LocalCluster, topic: str, workload: Workload) -> dict[str, Any]:
    """Create `topic` and fill it with `workload.records` JSON-like records
    (bench.workload.json_like_values) produced `workload.compression`-compressed in batches
    of about COMPRESSED_BATCH_BYTES on the log; what its batches hold, from partition 0."""
    prefill(cluster, topic, workload)
    return source_batches(cluster, topic, workload.record_bytes)


def source_batches(cluster: LocalCluster, topic: str, record_bytes: int) -> dict[str, Any]:
    """The record batches of `topic`'s partition 0 as stored (fetched raw): how many, their
    sizes on the log, records per batch, and the compression ratio (record values' bytes
    over the batches' bytes)."""
    sizes: list[int] = []
    records = 0
    fetcher = RawFetcher(cluster.client_properties(), topic, 0)
    fetcher.open()
    try:
        position = 0
        while True:
            fetched = fetcher.fetch(position)
            batches = split_batches(fetched.records).batches
            if not batches:
                break
            for batch in batches:
                sizes.append(batch.header.size)
                records += batch.header.record_count
                position = batch.header.last_offset + 1
            if position >= fetched.high_watermark:
                break
    finally:
        fetcher.close()
    if not sizes:
        return {}
    return {
        "partition": 0,
        "batches": len(sizes),
        "batch_kib_median": round(statistics.median(sizes) / 1024, 1),
        "batch_kib_min": round(min(sizes) / 1024, 1),
        "batch_kib_max": round(max(sizes) / 1024, 1),
        "records_per_batch_median": round(records / len(sizes), 1),
        "compression_ratio": round(records * record_bytes / sum(sizes), 2),
    }


def avro_prefill(schema_id: int, cluster: LocalCluster, topic: str, workload: Workload) -> None:
    """Create `topic` and fill it with `workload.records` framed Avro records of
    `workload.record_bytes` bytes each (schema `schema_id`: one string field)."""
    head = b"\x00" + schema_id.to_bytes(4, "big")
    # An Avro string: its length as a zigzag varint (2 bytes up to 8191), then the text.
    text_bytes = workload.record_bytes - len(head) - 2
    zigzag = text_bytes << 1
    length = bytes([(zigzag & 0x7F) | 0x80, zigzag >> 7])
    values = (
        head + length + f"{i:012d}".encode().ljust(text_bytes, b"x")
        for i in range(workload.records)
    )
    props = {"linger.ms": 20, "batch.size": 1000000, "acks": "1"}
    prefill_values(cluster, topic, workload, values, props)


@contextmanager
def bench_registries(state_dir: Path) -> Iterator[dict[str, str]]:
    """Schema registries beside A and B (started, and stopped after, unless running)."""
    from mm2py.dev.registry import LocalRegistries

    registries = LocalRegistries(state_dir)
    started = [alias for alias in ("A", "B") if registries.pid(alias) is None]
    try:
        yield {r.alias: r.url for r in registries.up(["A", "B"])}
    finally:
        registries.down(started)


def avro_translation(
    workload: Workload,
    clusters: dict[str, LocalCluster],
    run_dir: Path,
    settings: Mapping[str, str],
    copies: int,
    state_dir: Path,
) -> list[dict[str, Any]]:
    """mm2py copying framed Avro records without and with schema id translation,
    alternately, `copies` times each; the fastest copy of each."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    with bench_registries(state_dir) as urls:
        source_registry = SchemaRegistryClient({"url": urls["A"]})
        schema_id = source_registry.register_schema(
            f"bench-avro-{uuid.uuid4().hex[:8]}", Schema(AVRO_SCHEMA, "AVRO")
        )
        fill = partial(avro_prefill, schema_id)
        translating = {
            **settings,
            "schema.registry.sync.enabled": "true",
            "A.schema.registry.url": urls["A"],
            "B.schema.registry.url": urls["B"],
        }
        runs: dict[str, list[dict[str, Any]]] = {MM2PY: [], MM2PY_SCHEMAS: []}
        for _ in range(copies):
            for system, props in ((MM2PY, settings), (MM2PY_SCHEMAS, translating)):
                line = replication_throughput(MM2PY, workload, clusters, run_dir, None, props, fill)
                line["system"] = system
                line["workload"] = f"avro-{workload.label}"
                runs[system].append(line)
    return [best_of(runs[system]) for system in runs]


def fastest_copy(copy: Callable[[], dict[str, Any]], times: int) -> dict[str, Any]:
    """`copy` (a system copying a workload) `times` times: the fastest one's line, with
    every copy's records/s, CPU per record and load (``copies``) and their medians."""
    return best_of([copy() for _ in range(times)])


def best_of(copies: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of `copies` (lines of one system and workload), with every copy's
    records/s, CPU per record and load (``copies``) and their medians."""
    best = max(copies, key=lambda line: line.get("records_per_s") or 0.0)
    rates = [line["records_per_s"] for line in copies if line.get("records_per_s")]
    cpus = [line["cpu_s_per_m_records"] for line in copies if line.get("cpu_s_per_m_records")]
    return {
        **best,
        "copies": [
            {k: line.get(k) for k in ("records_per_s", "cpu_s_per_m_records", "load_1m_before")}
            for line in copies
        ],
        "median_records_per_s": round(statistics.median(rates), 1) if rates else None,
        "median_cpu_s_per_m_records": round(statistics.median(cpus), 2) if cpus else None,
    }


def _interval(interval_ms: int | None) -> int:
    """The commit interval an exactly-once run used."""
    return DEFAULT_TRANSACTION_INTERVAL_MS if interval_ms is None else interval_ms


def pipe_limit_line(workload: Workload) -> dict[str, Any]:
    """bench.pipe_limit's measurement in this script's line format."""
    raw = pipe_limit(workload)
    return result_line(
        PIPE_LIMIT,
        workload.label,
        workload.records,
        workload.record_bytes,
        raw["records_per_s"],
        raw["mb_per_s"],
        # Both halves' tools at once, each over its whole run (start-up included).
        cpu_s_per_m_records=raw["at_once"]["cpu_s_per_m_records"],
        at_once=raw["at_once"],
        alone_records_per_s=raw["alone_records_per_s"],
        alone_mb_per_s=raw["alone_mb_per_s"],
        produce_into_b=raw["produce_into_b"],
        consume_from_a=raw["consume_from_a"],
        tried=raw["tried"],
        load_1m_before=raw["load_1m_before"],
        load_avg_before=raw["load_avg_before"],
    )


# -- latency ------------------------------------------------------------------------


def _warm_up(source: LocalCluster, target: LocalCluster, topic: str, running: Running) -> None:
    """Copy a few records end to end so the measurement starts on a live pipeline."""
    producer = clients.producer(source.client_properties())
    for i in range(WARMUP_RECORDS):
        producer.produce(topic, b"w" * LATENCY_RECORD_BYTES, partition=i % LATENCY_PARTITIONS)
    if producer.flush(30) != 0:
        raise ReplicatorError(f"could not produce warm-up records into {topic} on A")
    remote = f"{source.alias}.{topic}"
    deadline = time.monotonic() + 180
    # Counted by reading them read_committed, not from end offsets, which count the
    # commit markers of an exactly-once copy: the measurement then starts after every
    # warm-up record, none of which is measured.
    while True:
        try:
            if count_records(target, remote, timeout=60) >= WARMUP_RECORDS:
                return
        except KafkaException:
            pass  # the remote topic is being created
        check_alive(running)
        if time.monotonic() > deadline:
            raise ReplicatorError(f"{running.system} did not copy the warm-up records of {topic}")
        time.sleep(0.5)


def start_steady(cluster: LocalCluster, topic: str, records: int = 0) -> subprocess.Popen[str]:
    """bench.steady_producer at LATENCY_RATE into `topic`: `records`, or until SIGTERM."""
    settings = {**cluster.client_properties(), **STEADY_PRODUCER_PROPS}
    bootstrap = settings.pop("bootstrap.servers")
    command = [
        sys.executable,
        "-m",
        "bench.steady_producer",
        bootstrap,
        topic,
        "--rate",
        str(LATENCY_RATE),
        "--bytes",
        str(LATENCY_RECORD_BYTES),
        "--records",
        str(records),
        *(arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")),
    ]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parent.parent
    )


def _steady_result(producer: subprocess.Popen[str], topic: str, timeout: float) -> dict[str, Any]:
    """What the steady producer into `topic` reported once it exited; raises if a record
    was not acknowledged."""
    try:
        out, _ = producer.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        producer.kill()
        producer.communicate()
        raise ReplicatorError(
            f"the steady producer into {topic} ran past {timeout:.0f} s"
        ) from late
    lines = out.strip().splitlines()
    result: dict[str, Any] | None = json.loads(lines[-1]) if lines else None
    if producer.returncode != 0 or result is None or result["errors"]:
        raise ReplicatorError(
            f"the steady producer into {topic} failed (exit code {producer.returncode}): {result}"
        )
    return result


class _Reader(threading.Thread):
    """Reads a topic from its beginning, read_committed, counting records, until stopped."""

    def __init__(self, cluster: LocalCluster, topic: str) -> None:
        super().__init__(name=f"read-{cluster.alias}-{topic}", daemon=True)
        self.cluster = cluster
        self.topic = topic
        self.count = 0
        self.error: str | None = None
        self._stop_reading = threading.Event()

    def run(self) -> None:
        consumer = clients.consumer(
            self.cluster.client_properties(), {"isolation.level": "read_committed"}
        )
        try:
            consumer.assign(
                [TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in range(LATENCY_PARTITIONS)]
            )
            while not self._stop_reading.is_set():
                for msg in consumer.consume(1000, 0.2):
                    if msg.error():
                        self.error = f"reading {self.topic} on {self.cluster.alias}: {msg.error()}"
                        return
                    self.count += 1
        finally:
            consumer.close()

    def stop(self) -> None:
        self._stop_reading.set()
        self.join()


def _until_compiled(
    source: LocalCluster,
    target: LocalCluster,
    topic: str,
    running: Running,
    jvm_pids: Sequence[int],
) -> dict[str, Any]:
    """The steady load through the live pipeline, with readers on A and B, until the JIT
    compilers of `jvm_pids` (brokers) and of the replicator's process tree are quiet (see
    COMPILED_*), then until B has every record: the measurement then starts on warm
    JVMs with nothing left to copy. Returns the line's warm-up fields."""
    remote = f"{source.alias}.{topic}"
    roots = [*jvm_pids, running.pid]
    readers = [_Reader(source, topic), _Reader(target, remote)]
    for reader in readers:
        reader.start()
    try:
        return _load_until_compiled(source, topic, running, roots, readers)
    finally:
        for reader in readers:
            reader.stop()


def _load_until_compiled(
    source: LocalCluster,
    topic: str,
    running: Running,
    roots: Sequence[int],
    readers: Sequence[_Reader],
) -> dict[str, Any]:
    producer = start_steady(source, topic)
    start = time.monotonic()
    jit = JitCpu(roots)
    samples = [(start, jit.sample())]
    share = math.inf
    try:
        while True:
            time.sleep(1.0)
            check_alive(running)
            if producer.poll() is not None:
                break  # _steady_result says why
            now = time.monotonic()
            samples.append((now, jit.sample()))
            while len(samples) > 2 and samples[1][0] <= now - COMPILED_WINDOW_SECONDS:
                samples.pop(0)
            (t0, cpu0), (t1, cpu1) = samples[0], samples[-1]
            share = (cpu1 - cpu0) / (t1 - t0)
            elapsed = now - start
            settled = share < COMPILED_CPU_SHARE or elapsed >= COMPILED_MAX_SECONDS
            if elapsed >= COMPILED_MIN_SECONDS and t1 - t0 >= COMPILED_WINDOW_SECONDS and settled:
                break
    finally:
        producer.send_signal(signal.SIGTERM)
    elapsed = time.monotonic() - start
    produced = _steady_result(producer, topic, 120)
    wanted = WARMUP_RECORDS + produced["acked"]
    deadline = time.monotonic() + 180
    while readers[1].count < wanted:
        check_alive(running)
        for reader in readers:
            if reader.error is not None:
                raise ReplicatorError(reader.error)
        if time.monotonic() > deadline:
            raise ReplicatorError(
                f"{running.system} copied {readers[1].count} of {wanted} warm-up records of {topic}"
            )
        time.sleep(0.5)
    compiled = share < COMPILED_CPU_SHARE
    log.info(
        "%s: warm-up load for %.0f s; compiler threads at %.1f%% of a core over the last %.0f s%s",
        running.system,
        elapsed,
        share * 100,
        COMPILED_WINDOW_SECONDS,
        "" if compiled else f" (still compiling at the {COMPILED_MAX_SECONDS:.0f} s limit)",
    )
    return {"warmup_s": round(elapsed, 1), "warmup_jit_cpu_share": round(share, 3)}


def _receive(
    consumer: Any, records: int, deadline: float, running: Running
) -> list[tuple[int, int, float]]:
    """Consume up to `records` records; return (partition, timestamp, when received) of
    each, in ms (received: wall clock)."""
    received: list[tuple[int, int, float]] = []
    while len(received) < records and time.monotonic() < deadline:
        # consume(n, timeout) waits for n records or the timeout, which would add up to
        # the timeout to every measured latency: take what has arrived, else wait for one.
        batch: list[Any] = consumer.consume(1000, 0)
        if not batch:
            msg = consumer.poll(0.1)
            if msg is None:
                check_alive(running)
                continue
            batch = [msg]
        now_ms = time.time() * 1000  # the batch was all in the client by now
        for msg in batch:
            if msg.error():
                raise ReplicatorError(f"consuming {msg.topic()}: {msg.error()}")
            received.append((msg.partition(), msg.timestamp()[1], now_ms))
    return received


def replication_only(
    on_source: Sequence[tuple[int, int, float]], on_target: Sequence[tuple[int, int, float]]
) -> list[tuple[int, float]]:
    """(timestamp, ms from readable on the source to readable on the target) of each
    record both lists hold: a partition's records keep their order, so its k-th record
    read on the target is its k-th read on the source."""
    seen: dict[int, list[float]] = {}
    for partition, _, when in on_source:
        seen.setdefault(partition, []).append(when)
    index: dict[int, int] = {}
    pairs = []
    for partition, timestamp, when in on_target:
        k = index.get(partition, 0)
        index[partition] = k + 1
        source_times = seen.get(partition, [])
        if k < len(source_times):
            pairs.append((timestamp, when - source_times[k]))
    return pairs


def replication_latency(
    system: str,
    seconds: int,
    clusters: dict[str, LocalCluster],
    run_dir: Path,
    interval_ms: int | None = None,
    settings: Mapping[str, str] | None = None,
    jvm_pids: Sequence[int] = (),
) -> dict[str, Any]:
    """p50/p99 latency of `system` at LATENCY_RATE records/s over `seconds` seconds, once
    the JVMs of `jvm_pids` (the brokers) and of the replicator have compiled what the
    load runs (`_until_compiled`).

    Latency of a record = wall clock when the measuring consumer on B receives it -
    its timestamp, which the source producer sets at send time and every system copies.
    It therefore includes producing into A and fetching from B, the same for all.
    Replication latency (``replication_p50_ms``, ``replication_p99_ms``): from when a
    consumer on A receives the record to when the one on B does, both in this process
    (their own fetch delays alike); it leaves out the source producer and broker A,
    whose delays on a loaded machine (a fresh JVM producer, two brokers on two cores)
    reached 200 ms on A alone.

    The measuring consumer reads read_committed, as readers of an exactly-once copy
    must: mm2py-exactly-once's records reach it only once their transaction commits
    (every `interval_ms`), so its figure is source timestamp -> visible to such a
    reader, the commit wait included (not mm2py's own latency histogram). For the
    at-least-once systems read_committed changes nothing: they write no transactions.
    """
    source, target = clusters["A"], clusters["B"]
    produce_s = seconds + STEADY_WARMUP_SECONDS
    steady = Workload(LATENCY_PARTITIONS, LATENCY_RATE * produce_s, LATENCY_RECORD_BYTES)
    topic = f"bench-latency-{system}-{uuid.uuid4().hex[:8]}"
    remote = f"{source.alias}.{topic}"
    label = f"{steady.partitions}p-steady-{LATENCY_RATE}rps-{steady.record_bytes}B-{seconds}s"
    try:
        create_topic(source, topic, steady.partitions)
        load = load_averages()
        with (
            replicating(system, topic, source, target, run_dir, interval_ms, settings) as running,
            PeakRss(running.pid) as rss,
        ):
            _warm_up(source, target, topic, running)
            warm = _until_compiled(source, target, topic, running, jvm_pids)
            cpu = ProcessCpu(running.pid)
            cpu_start = cpu.sample()
            consumer = clients.consumer(
                target.client_properties(), {"isolation.level": "read_committed"}
            )
            source_consumer = clients.consumer(source.client_properties())
            # Start after the warm-up records: only steady-rate records are measured.
            consumer.assign(
                [TopicPartition(remote, p, o) for p, o in _end_offsets(target, remote).items()]
            )
            source_consumer.assign(
                [TopicPartition(topic, p, o) for p, o in _end_offsets(source, topic).items()]
            )
            log.info(
                "%s: producing %d records/s into %s for %d s",
                system,
                LATENCY_RATE,
                topic,
                produce_s,
            )
            # Both consumers' threads take the interpreter promptly after a fetch.
            switch_interval = sys.getswitchinterval()
            sys.setswitchinterval(SWITCH_INTERVAL_S)
            jit = JitCpu([*jvm_pids, running.pid])
            jit_start = jit.sample()
            producer = start_steady(source, topic, steady.records)
            with ThreadPoolExecutor(1) as pool:
                deadline = time.monotonic() + produce_s + 120
                on_source = pool.submit(
                    _receive, source_consumer, steady.records, deadline, running
                )
                try:
                    received = _receive(consumer, steady.records, deadline, running)
                    read_on_source = on_source.result()
                except BaseException:
                    producer.kill()  # nothing is measured: it need not finish
                    producer.communicate()
                    raise
                finally:
                    consumer.close()
                    source_consumer.close()
                    sys.setswitchinterval(switch_interval)
                cpu_s = cpu.sample() - cpu_start
                jit_s = jit.sample() - jit_start
                _steady_result(producer, topic, 120)
    finally:
        delete_topics(source, [topic])
        delete_topics(target, [remote])
    if len(received) < steady.records:
        raise ReplicatorError(
            f"{system}: received {len(received)} of {steady.records} records of {remote}"
        )
    # Only records sent after the first STEADY_WARMUP_SECONDS count: the new producer and
    # the first fetches are start-up, not the steady state (the JVMs compiled before).
    cut = min(ts for _, ts, _ in received) + STEADY_WARMUP_SECONDS * 1000
    latencies = sorted(when - ts for _, ts, when in received if ts >= cut)
    replication = sorted(
        latency for ts, latency in replication_only(read_on_source, received) if ts >= cut
    )
    span_s = (max(ts for _, ts, _ in received) - cut) / 1000
    rate = len(latencies) / span_s if span_s > 0 else None
    return result_line(
        system,
        label,
        len(latencies),
        steady.record_bytes,
        rate,
        None if rate is None else rate * steady.record_bytes / MIB,
        p50_ms=round(percentile(latencies, 0.50), 1),
        p99_ms=round(percentile(latencies, 0.99), 1),
        replication_p50_ms=round(percentile(replication, 0.50), 1) if replication else None,
        replication_p99_ms=round(percentile(replication, 0.99), 1) if replication else None,
        peak_rss_bytes=rss.peak_bytes,
        # Over all received records, the warm-up seconds' included.
        cpu_s_per_m_records=cpu_per_million(cpu_s, len(received)),
        peak_rss_mib_per_process=rss.per_process_mib(),
        max_ms=round(latencies[-1], 1),
        load_1m_before=load[0],
        load_avg_before=load,
        **warm,
        # The compiler threads' share of a core while the measured records were sent.
        jit_cpu_share=round(jit_s / produce_s, 3),
        **(
            {"transaction_interval_ms": _interval(interval_ms)}
            if system in EXACTLY_ONCE_SYSTEMS
            else {}
        ),
    )


# -- summary ------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else round(a / b, 2)


def exactly_once_targets(by: Mapping[tuple[str, str], dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 12's targets for the exactly-once lines of one run: per throughput workload,
    its records/s >= EOS_THROUGHPUT_TARGET x at-least-once's; on the latency workload, its
    p99 < EOS_P99_TARGET_MS (the default commit interval only; other intervals are
    reported, not judged)."""
    targets: list[dict[str, Any]] = []
    for (system, workload), line in by.items():
        if system != MM2PY_EOS:
            continue
        if line.get("p99_ms") is not None:
            default = line.get("transaction_interval_ms") == DEFAULT_TRANSACTION_INTERVAL_MS
            p99 = line["p99_ms"]
            targets.append(
                {
                    "workload": workload,
                    "target": f"p99_ms < {EOS_P99_TARGET_MS:g} (default commit interval)",
                    "value": p99,
                    "met": p99 < EOS_P99_TARGET_MS if default else None,
                }
            )
        else:
            ratio = _ratio(
                line.get("records_per_s"), by.get((MM2PY, workload), {}).get("records_per_s")
            )
            targets.append(
                {
                    "workload": workload,
                    "target": f"records/s >= {EOS_THROUGHPUT_TARGET:g} x at-least-once",
                    "value": ratio,
                    "met": None if ratio is None else ratio >= EOS_THROUGHPUT_TARGET,
                }
            )
    return targets


def mm2py_targets(workload: str, figures: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Issue 29's targets for mm2py's default mode on `workload` (a summary entry's
    figures), each with its value and whether it was met; None where it has none."""

    if workload.endswith("-zstd"):
        rows = [
            ("mm2py_vs_mm2", "records/s >=", BATCH_SPEED_TARGET, "MM2"),
            ("mm2py_cpu_vs_mm2", "CPU per record <=", BATCH_CPU_TARGET, "MM2"),
        ]
    elif workload == WORKLOADS["small"].label:
        rows = [
            ("mm2py_vs_pipe_limit", "records/s >=", SMALL_PIPE_TARGET, "the pipe limit"),
            ("mm2py_cpu_vs_mm2", "CPU per record <=", SMALL_CPU_TARGET, "MM2"),
        ]
    else:
        return None
    out = []
    for key, what, bound, of in rows:
        value = figures.get(key)
        met = None if value is None else value >= bound if ">=" in what else value <= bound
        out.append({"target": f"{what} {bound:g} x {of}", "value": value, "met": met})
    return out


def summary(
    lines: Sequence[dict[str, Any]], load_start: list[float], load_end: list[float]
) -> dict[str, Any]:
    """The ratios of one run, per workload, any replicator faster than the pipe limit, and
    exactly-once against at-least-once with issue 12's targets."""
    by = {(line["system"], line["workload"]): line for line in lines}
    workloads: dict[str, Any] = {}
    for (system, workload), line in by.items():
        if system != MM2PY:
            continue
        pipe = by.get((PIPE_LIMIT, workload), {})
        mm2 = by.get((MIRRORMAKER2, workload), {})
        rate, cpu = line.get("records_per_s"), line.get("cpu_s_per_m_records")
        workloads[workload] = {
            "mm2py_records_per_s": rate,
            "mm2py_vs_mm2": _ratio(rate, mm2.get("records_per_s")),
            "mm2py_vs_mm2_median": _ratio(
                line.get("median_records_per_s"), mm2.get("median_records_per_s")
            ),
            "mm2py_vs_pipe_limit": _ratio(rate, pipe.get("records_per_s")),
            "mm2py_vs_pipe_limit_alone": _ratio(rate, pipe.get("alone_records_per_s")),
            "mm2py_cpu_s_per_m_records": cpu,
            "mm2py_cpu_vs_mm2": _ratio(cpu, mm2.get("cpu_s_per_m_records")),
            "mm2py_p99_ms": line.get("p99_ms"),
            "mm2py_replication_p99_ms": line.get("replication_p99_ms"),
            "mm2py_peak_rss_mib_per_process": line.get("peak_rss_mib_per_process"),
        }
    for (system, workload), line in by.items():
        if system != MM2PY_EOS:
            continue
        alos = by.get((MM2PY, workload), {})
        rate, cpu = line.get("records_per_s"), line.get("cpu_s_per_m_records")
        workloads.setdefault(workload, {}).update(
            {
                "exactly_once_records_per_s": rate,
                "exactly_once_vs_at_least_once": _ratio(rate, alos.get("records_per_s")),
                "exactly_once_cpu_s_per_m_records": cpu,
                "exactly_once_cpu_vs_at_least_once": _ratio(cpu, alos.get("cpu_s_per_m_records")),
                "exactly_once_p50_ms": line.get("p50_ms"),
                "exactly_once_p99_ms": line.get("p99_ms"),
                "exactly_once_replication_p99_ms": line.get("replication_p99_ms"),
                "exactly_once_peak_rss_mib": line.get("peak_rss_mib"),
                "transaction_interval_ms": line.get("transaction_interval_ms"),
            }
        )
    for (system, workload), line in by.items():
        if system != MM2PY_EOS_RECORD:
            continue
        eos = by.get((MM2PY_EOS, workload), {})  # the default mode: batches
        rate, cpu = line.get("records_per_s"), line.get("cpu_s_per_m_records")
        workloads.setdefault(workload, {}).update(
            {
                "exactly_once_record_records_per_s": rate,
                "exactly_once_vs_record": _ratio(eos.get("records_per_s"), rate),
                "exactly_once_record_cpu_s_per_m_records": cpu,
                "exactly_once_cpu_vs_record": _ratio(eos.get("cpu_s_per_m_records"), cpu),
                "exactly_once_record_p50_ms": line.get("p50_ms"),
                "exactly_once_record_p99_ms": line.get("p99_ms"),
            }
        )
    for (system, workload), line in by.items():
        if system != MM2PY_RECORD:
            continue
        mm2 = by.get((MIRRORMAKER2, workload), {})
        rate, cpu = line.get("records_per_s"), line.get("cpu_s_per_m_records")
        workloads.setdefault(workload, {}).update(
            {
                "mm2py_record_records_per_s": rate,
                "mm2py_record_vs_mm2": _ratio(rate, mm2.get("records_per_s")),
                "mm2py_record_cpu_s_per_m_records": cpu,
                "mm2py_record_cpu_vs_mm2": _ratio(cpu, mm2.get("cpu_s_per_m_records")),
            }
        )
    for workload, figures in workloads.items():
        figures["mm2py_targets"] = mm2py_targets(workload, figures)
    # The pipe limit is a record pipe (a consumer and a producer of records): it bounds
    # the replicators that copy records, not batch pass-through (mm2py's default mode).
    beyond = [
        f"{system} on {workload}: {line['records_per_s']} > {limit['records_per_s']}"
        for (system, workload), line in by.items()
        if system in RECORD_PIPES
        and (limit := by.get((PIPE_LIMIT, workload))) is not None
        and (line.get("records_per_s") or 0) > (limit.get("records_per_s") or 0)
    ]
    for what in beyond:
        log.warning("faster than the pipe limit, so the limit is wrong: %s", what)
    return {
        "system": "summary",
        "workloads": workloads,
        "beyond_pipe_limit": beyond,
        "exactly_once_targets": exactly_once_targets(by),
        "load_avg_start": load_start,
        "load_avg_end": load_end,
    }


# -- main ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print one JSON line per system and workload."""
    parser = argparse.ArgumentParser(
        prog="bench.replication", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument(
        "--workloads",
        choices=["small", "large", "compressed", "all", "avro"],
        default="all",
        help="throughput workloads: large = 1,000,000 x 1 KiB, small = 2,000,000 x 100 B "
        "(all: both); compressed = 1,000,000 x 1 KiB JSON-like, zstd in ~64 KiB batches; "
        "avro (alone): 2,000,000 x 100 B framed Avro, mm2py without and with schema id "
        "translation",
    )
    parser.add_argument("--quick", action="store_true", help="10x fewer records (smoke run)")
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=SYSTEMS,
        default=list(SYSTEMS),
        metavar="SYSTEM",
        help=f"a subset of: {' '.join(SYSTEMS)} (default: all), run in the order given",
    )
    parser.add_argument(
        "--transaction-interval-ms",
        type=int,
        default=None,
        help=(
            f"{MM2PY_EOS}'s transaction.boundary.interval.ms "
            f"(default: mm2py's, {DEFAULT_TRANSACTION_INTERVAL_MS})"
        ),
    )
    parser.add_argument(
        "--latency-seconds",
        type=int,
        default=None,
        help=f"steady-rate run length (default {LATENCY_SECONDS}, --quick: a tenth; 0: skip)",
    )
    parser.add_argument(
        "--copies",
        type=int,
        default=None,
        help=f"copies of each throughput workload per replicator, the fastest reported "
        f"(default {COPIES}, --quick: 1)",
    )
    add_set_option(parser)
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help=(
            f"where fresh clusters keep their data (default: under {MEMORY_DIR} when it has "
            f"{MEMORY_NEEDED >> 30} GiB free, else the cache)"
        ),
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    scale = 10 if args.quick else 1
    if args.workloads == "avro":
        return avro_main(args, scale)
    names = ["large", "small"] if args.workloads == "all" else [args.workloads]
    workloads = [
        Workload(w.partitions, w.records // scale, w.record_bytes, w.compression)
        for w in (WORKLOADS[n] for n in names)
    ]
    seconds = args.latency_seconds
    interval_ms: int | None = args.transaction_interval_ms
    settings = dict(args.set)
    copies: int = args.copies if args.copies is not None else (1 if args.quick else COPIES)
    if seconds is None:
        seconds = LATENCY_SECONDS // scale
    run_dir = logs_dir() / f"replication-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("logs and configs of this run: %s", run_dir)

    clusters, started = bench_clusters(args.state_dir)
    failures = 0
    lines: list[dict[str, Any]] = []
    load_start = load_averages()
    log.info("load averages at the start: %s", load_start)

    def measure(system: str, what: str, run: Callable[[], dict[str, Any]]) -> None:
        # One failed measurement should not cost the rest of a long run (KafkaException
        # too: on shared clusters, another user's test may restart one).
        nonlocal failures
        try:
            line = run()
            lines.append(line)
            emit(line)
        except (ReplicatorError, MirrorMakerError, ToolError, TimeoutError, KafkaException) as e:
            failures += 1
            log.error("%s on %s failed: %s", system, what, e)
            emit({"system": system, "workload": what, "error": str(e)})

    try:
        for workload in workloads:
            for system in dict.fromkeys(args.systems):  # in the order asked, once each
                if system == PIPE_LIMIT:
                    measure(system, workload.label, partial(pipe_limit_line, workload))
                else:
                    run = partial(
                        replication_throughput,
                        system,
                        workload,
                        clusters,
                        run_dir,
                        interval_ms,
                        settings,
                    )
                    measure(system, workload.label, partial(fastest_copy, run, copies))
        if seconds > 0:
            # The brokers' JIT is waited for only where this run started them.
            pids = [] if started is None else [started.pid(alias) for alias in ("A", "B")]
            broker_pids = [pid for pid in pids if pid is not None]
            for system in (s for s in dict.fromkeys(args.systems) if s in REPLICATORS):
                run = partial(
                    replication_latency,
                    system,
                    seconds,
                    clusters,
                    run_dir,
                    interval_ms,
                    settings,
                    broker_pids,
                )
                measure(system, f"steady-{LATENCY_RATE}rps", run)
    finally:
        if started is not None:
            started.down(["A", "B"])
    emit(summary(lines, load_start, load_averages()))
    return 1 if failures else 0


def avro_main(args: argparse.Namespace, scale: int) -> int:
    """``--workloads avro``: mm2py without and with schema id translation, one line each,
    and a summary line with the extra CPU per record."""
    workload = Workload(AVRO_WORKLOAD.partitions, AVRO_WORKLOAD.records // scale, 100)
    copies: int = args.copies if args.copies is not None else (1 if args.quick else COPIES)
    run_dir = logs_dir() / f"replication-avro-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    state_dir = args.state_dir or default_state_dir()
    clusters, started = bench_clusters(state_dir)
    load_start = load_averages()
    try:
        lines = avro_translation(workload, clusters, run_dir, dict(args.set), copies, state_dir)
    finally:
        if started is not None:
            started.down(["A", "B"])
    for line in lines:
        emit(line)
    off, on = (line.get("median_cpu_s_per_m_records") for line in lines)
    emit(
        {
            "system": "summary",
            "workload": f"avro-{workload.label}",
            "load_avg_start": load_start,
            "load_avg_end": load_averages(),
            "records_per_s": {line["system"]: line.get("records_per_s") for line in lines},
            "median_cpu_s_per_m_records": {
                line["system"]: line.get("median_cpu_s_per_m_records") for line in lines
            },
            "schemas_extra_cpu_per_record": round(on / off - 1, 3) if on and off else None,
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
