"""Many-topics start-up benchmark: how soon mm2py copies when it starts on many new topics.

    .venv/bin/python -m bench.many_topics                       # 500 topics x 4 partitions
    .venv/bin/python -m bench.many_topics --topics 100 --runs 2
    .venv/bin/python -m bench.many_topics --intervals default --idle-seconds 60

Set-up (not timed): N fresh topics ``bench-many-<8 hex>-<i>`` of P partitions on A,
created in one CreateTopics call, each partition holding R records of 100 bytes
(acks=all; A's end offsets are then read back as the figures B must reach). Their
remote topics ``A.bench-many-...`` do not exist on B yet.

Timed: the daemon is spawned as ``python -m mm2py.cli run CONFIG --listen 127.0.0.1:<free
port>`` with mm2py.dev.mirrormaker.mm2_properties for A->B and ``topics = <prefix>-.*``
(the config bench.replication uses; only these topics match). Zero is the instant just
before the process is spawned, so interpreter start-up and imports count. Measured:

- ``first_record_s``: until B shows a record in any remote topic of the prefix;
- ``all_copied_s``: until every remote partition's end offset reaches its source's;
- ``remote_topics_created_s``: until all N remote topics exist on B, every partition
  with a leader;
- ``first_now_copying_s`` / ``last_now_copying_s``: to the daemon's first and last
  "now copying" log line, from the timestamps the daemon writes (millisecond wall
  clock, compared with the wall clock at spawn; no sampling involved);
- ``longest_log_line_bytes``: the longest line the daemon printed (stdout and stderr,
  start-up to exit), and ``now_copying_lines``, how many "now copying" lines it wrote;
- ``idle_cpu_share``: once everything is copied and nothing new arrives, the CPU the
  daemon's whole process tree (node, task and spare processes) uses over
  ``--idle-seconds`` (default 30), as a share of one core (0.05 = 5% of a core); the
  window starts IDLE_SETTLE seconds after the copy completed, so the copy's tail and
  its last progress writes are not counted.

``--intervals short`` (the default) runs the daemon with mm2_properties' 1-second
intervals, as tests do: the idle window then also holds a topic refresh, a config
sync of every topic (DescribeConfigs of N topics on A and on B) and a group refresh
every second, the work those intervals ask for. ``--intervals default`` leaves those
keys out (MM2's defaults: topics refreshed and configs synced every 600 s, groups
every 600 s, checkpoints every 60 s), so the idle window measures what the daemon
costs when nothing is due: its own periodic work, lag, reports, fetches.

How B is watched: one sample every SAMPLE_INTERVAL (0.1 s) is, until all remote topics
exist, one Metadata request (which remote partitions exist and have a leader), then
one ListOffsets request for the latest read_committed offsets (what a consumer of B
can read) of the existing remote partitions not yet complete; a complete partition is
not asked again. A figure is the midpoint of the first sample that saw it, so it is
late by at most SAMPLE_INTERVAL plus one sample (the longest is ``sample_s_max``).
The cost of a sample grows with the partitions asked, ~15 ms of CPU for 2,000, and
is reported as ``watcher_cpu_s`` (this process's CPU time while watching,
librdkafka's threads included): the machine is shared with the daemon measured.
Alternatives measured and rejected: a consumer assigned to the remote partitions as
they appear (it would see each record at once) costs ~0.25 s of CPU per second
when idle on 2,000 partitions; a regex subscription would also see new topics only
at its next metadata refresh and time that instead; AdminClient.list_offsets costs
twice the CPU of the consumer's offsets_for_times used here.

At the end the daemon is stopped with SIGTERM and the source topics and their remote
topics are deleted, so reruns are independent (its progress in mm2-offsets.A.internal
stays behind, under topic names no later run uses). The clusters are the local A and B
(`mm2py local up`): started fresh and stopped at the end, or, when their ports are
taken, the running ones, left running and shared with other work, so the load average
before and after each run is in its line, and ``clusters_restarted`` names a cluster
whose broker process changed during the run (another user's tests stopped and started
it: the run's figures are then void). Prints one JSON line per run on stdout; progress
goes to stderr. Daemon logs and configs are kept under ``<cache>/bench-logs/many-topics-<time>/``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import contextlib
import logging
import re
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.cimpl import NewTopic

import mm2py
from bench.processes import ProcessCpu
from bench.replication import bench_clusters
from bench.replicators import ReplicatorError, Running, check_alive, free_port, running_command
from bench.report import emit, load_averages, logs_dir
from bench.topics import delete_topics
from mm2py.dev.launcher import LocalCluster, LocalKafka
from mm2py.dev.mirrormaker import mm2_properties, render_properties
from mm2py.kafka import clients

log = logging.getLogger("bench.many_topics")

RECORD_BYTES: Final = 100
ADMIN_TIMEOUT: Final = 60.0
NOW_COPYING: Final = "now copying"
# The pause between two samples of B: with a sample's duration, the resolution of every
# figure. Smaller costs more CPU: a sample of 2,000 partitions costs ~15 ms of it.
SAMPLE_INTERVAL: Final = 0.1
# ListOffsets' "latest" as a timestamp (offsets_for_times passes it to the broker as is).
LATEST_TIMESTAMP: Final = -1
# Seconds between the copy's end and the idle window: the last progress and offset-sync
# writes and a report or two go by.
IDLE_SETTLE: Final = 5.0
# mm2_properties' short intervals that `--intervals default` leaves out (MM2's defaults
# then; the heartbeat's, 1 s, is MM2's default already).
SHORT_INTERVAL_KEYS: Final = (
    "refresh.topics.interval.seconds",
    "refresh.groups.interval.seconds",
    "emit.checkpoints.interval.seconds",
    "sync.group.offsets.interval.seconds",
    "sync.topic.configs.interval.seconds",
)
# The daemon's text log lines start with logging's asctime: 2026-11-21 14:28:04,123.
_LOG_TIME = re.compile(rb"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass(frozen=True)
class Source:
    """The pre-filled topics on A and the end offset of each of their partitions."""

    prefix: str
    topics: list[str]
    ends: dict[tuple[str, int], int]


def _admin(cluster: LocalCluster) -> AdminClient:
    admin: AdminClient = clients.admin_client(cluster.client_properties())
    return admin


def _latest(admin: AdminClient, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Read-committed end offsets in one ListOffsets call (unreadable partitions left out)."""
    if not partitions:
        return {}
    latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    futures = admin.list_offsets(
        {TopicPartition(t, p): latest for t, p in partitions},
        isolation_level=IsolationLevel.READ_COMMITTED,
        request_timeout=ADMIN_TIMEOUT,
    )
    out: dict[tuple[str, int], int] = {}
    for tp, future in futures.items():
        # No leader yet, or the topic is still being created: not readable this time.
        with contextlib.suppress(KafkaException):
            out[(tp.topic, tp.partition)] = int(future.result(timeout=ADMIN_TIMEOUT).offset)
    return out


def fill_source(cluster: LocalCluster, topics: int, partitions: int, records: int) -> Source:
    """Create `topics` fresh topics of `partitions` partitions on `cluster`, `records` each."""
    prefix = f"bench-many-{uuid.uuid4().hex[:8]}"
    names = [f"{prefix}-{i:04d}" for i in range(topics)]
    admin = _admin(cluster)
    new = [NewTopic(n, num_partitions=partitions, replication_factor=1) for n in names]
    for name, future in admin.create_topics(new, request_timeout=ADMIN_TIMEOUT).items():
        try:
            future.result(timeout=ADMIN_TIMEOUT)
        except KafkaException as e:
            raise ReplicatorError(f"creating {name} on {cluster.alias}: {e}") from e
    producer = clients.producer(cluster.client_properties(), {"acks": "all", "linger.ms": "20"})
    value = b"r" * RECORD_BYTES
    for name in names:
        for p in range(partitions):
            for _ in range(records):
                while True:
                    try:
                        producer.produce(name, value, partition=p)
                        break
                    except BufferError:
                        producer.poll(0.1)
    if producer.flush(120) != 0:
        raise ReplicatorError(f"could not produce into the {prefix}-* topics on {cluster.alias}")
    wanted = [(n, p) for n in names for p in range(partitions)]
    ends = _latest(admin, wanted)
    short = [f"{t}-{p}" for t, p in wanted if ends.get((t, p)) != records]
    if short:
        raise ReplicatorError(
            f"{len(short)} partitions on {cluster.alias} do not hold {records} records "
            f"(e.g. {short[0]})"
        )
    return Source(prefix, names, ends)


@dataclass
class Watch:
    """What the samples of B saw, in seconds since the daemon was spawned."""

    first_record_s: float | None = None
    remote_topics_created_s: float | None = None
    all_copied_s: float | None = None
    samples: int = 0
    sample_s_max: float = 0.0
    cpu_s: float = 0.0  # CPU time this process spent watching (all threads)
    done: set[tuple[str, int]] = field(default_factory=set)


def _led_partitions(admin: AdminClient, topics: set[str]) -> set[tuple[str, int]]:
    """The partitions of `topics` that exist on the cluster and have a leader."""
    meta = admin.list_topics(timeout=ADMIN_TIMEOUT)
    return {
        (name, p)
        for name, t in meta.topics.items()
        if name in topics and t.error is None
        for p, pm in t.partitions.items()
        if pm.leader >= 0 and pm.error is None
    }


def _ends_now(
    consumer: Any, admin: AdminClient, partitions: list[tuple[str, int]]
) -> dict[tuple[str, int], int]:
    """End offsets as a read_committed consumer sees them, in one ListOffsets request.

    The consumer's offsets_for_times (timestamp -1: the latest offset) is one call for
    all partitions, half the CPU of AdminClient.list_offsets, but fails as a whole if
    one partition errs (e.g. its leader moved): then the AdminClient asks again.
    """
    if not partitions:
        return {}
    try:
        got = consumer.offsets_for_times(
            [TopicPartition(t, p, LATEST_TIMESTAMP) for t, p in partitions], timeout=ADMIN_TIMEOUT
        )
    except KafkaException:
        return _latest(admin, partitions)
    return {(tp.topic, tp.partition): tp.offset for tp in got if tp.error is None}


def watch_remote(
    target: LocalCluster,
    source: Source,
    alias: str,
    spawned: float,
    running: Running,
    timeout: float,
) -> Watch:
    """Sample B until every remote partition holds what its source partition holds."""
    admin = _admin(target)
    consumer = clients.consumer(target.client_properties(), {"isolation.level": "read_committed"})
    want = {(f"{alias}.{t}", p): end for (t, p), end in source.ends.items()}
    remote_topics = {t for t, _ in want}
    existing: set[tuple[str, int]] = set()
    watch = Watch()
    cpu_start = time.process_time()
    try:
        while True:
            before = time.monotonic()
            if watch.remote_topics_created_s is None:
                existing = _led_partitions(admin, remote_topics)
            ends = _ends_now(consumer, admin, [tp for tp in existing if tp not in watch.done])
            after = time.monotonic()
            at = (before + after) / 2 - spawned
            watch.samples += 1
            watch.sample_s_max = max(watch.sample_s_max, after - before)
            if watch.remote_topics_created_s is None and len(existing) == len(want):
                watch.remote_topics_created_s = at
            if watch.first_record_s is None and any(end > 0 for end in ends.values()):
                watch.first_record_s = at
            watch.done.update(tp for tp, end in ends.items() if end >= want[tp])
            if len(watch.done) == len(want):
                watch.all_copied_s = at
                watch.cpu_s = time.process_time() - cpu_start
                return watch
            check_alive(running)
            if after - spawned > timeout:
                raise ReplicatorError(
                    f"after {timeout:.0f} s, {len(watch.done)} of {len(want)} remote "
                    f"partitions of {source.prefix}-* on {target.alias} are complete"
                )
            time.sleep(SAMPLE_INTERVAL)
    finally:
        consumer.close()


@dataclass(frozen=True)
class LogFacts:
    longest_line_bytes: int
    now_copying_lines: int
    first_now_copying: float | None  # wall clock (epoch seconds)
    last_now_copying: float | None


def read_log(path: Path) -> LogFacts:
    """The longest line and the "now copying" lines of a daemon's log."""
    longest, count = 0, 0
    first: float | None = None
    last: float | None = None
    with open(path, "rb") as f:
        for line in f:
            longest = max(longest, len(line.rstrip(b"\n")))
            if NOW_COPYING.encode() not in line:
                continue
            count += 1
            stamp = _LOG_TIME.match(line)
            if stamp is not None:
                # asctime is local time; datetime.timestamp() reads a naive value as local.
                when = datetime.strptime(stamp[1].decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                first = when if first is None else first
                last = when
    return LogFacts(longest, count, first, last)


def idle_cpu_share(pid: int, seconds: float, running: Running) -> float:
    """CPU of `pid`'s process tree over `seconds` (after IDLE_SETTLE), per second."""
    time.sleep(IDLE_SETTLE)
    check_alive(running)
    cpu = ProcessCpu(pid)
    start_cpu, start = cpu.sample(), time.monotonic()
    time.sleep(seconds)
    check_alive(running)
    return (cpu.sample() - start_cpu) / (time.monotonic() - start)


def _broker_pids() -> dict[str, int | None]:
    """The broker process of A and B: another user's tests may restart one mid-run."""
    kafka = LocalKafka()
    return {alias: kafka.pid(alias) for alias in ("A", "B")}


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def one_run(
    clusters: dict[str, LocalCluster],
    topics: int,
    partitions: int,
    records: int,
    timeout: float,
    run_dir: Path,
    idle_seconds: float,
    intervals: str = "short",
) -> dict[str, Any]:
    """Fill A, run the daemon until all is copied, stop it, clean up; the run's JSON line."""
    source_cluster, target = clusters["A"], clusters["B"]
    log.info("creating and filling %d topics x %d partitions on A", topics, partitions)
    source = fill_source(source_cluster, topics, partitions, records)
    remote_prefix = f"{source_cluster.alias}.{source.prefix}-"
    try:
        props = mm2_properties(
            source_cluster.alias,
            source_cluster.bootstrap_servers,
            target.alias,
            target.bootstrap_servers,
            re.escape(source.prefix) + "-.*",
            **({k: "" for k in SHORT_INTERVAL_KEYS} if intervals == "default" else {}),
        )
        config = run_dir / f"{source.prefix}.properties"
        config.write_text(render_properties(props), encoding="latin-1")
        cmd = [sys.executable, "-m", "mm2py.cli", "run", str(config)]
        cmd += ["--listen", f"127.0.0.1:{free_port()}"]
        log_file = config.with_suffix(".log")
        load_before = load_averages()
        brokers = _broker_pids()
        log.info("starting the daemon on %s-*", source.prefix)
        wall_spawned = time.time()
        spawned = time.monotonic()
        with running_command("mm2py", cmd, log_file) as (running, proc):
            watch = watch_remote(target, source, source_cluster.alias, spawned, running, timeout)
            load_after = load_averages()
            idle = idle_cpu_share(proc.pid, idle_seconds, running)
        restarted = [a for a, pid in _broker_pids().items() if pid != brokers[a]]
        facts = read_log(log_file)
    finally:
        log.info("deleting %s-* on A and %s* on B", source.prefix, remote_prefix)
        delete_topics(source_cluster, source.topics)
        remote = _admin(target).list_topics(timeout=ADMIN_TIMEOUT).topics
        delete_topics(target, [t for t in remote if t.startswith(remote_prefix)])

    def since_spawn(wall: float | None) -> float | None:
        return None if wall is None else round(wall - wall_spawned, 3)

    return {
        "system": "mm2py",
        "workload": f"{topics}t-{partitions}p-{records}x{RECORD_BYTES}B",
        "topics": topics,
        "partitions": topics * partitions,
        "records": topics * partitions * records,
        "first_record_s": _seconds(watch.first_record_s),
        "all_copied_s": _seconds(watch.all_copied_s),
        "remote_topics_created_s": _seconds(watch.remote_topics_created_s),
        "first_now_copying_s": since_spawn(facts.first_now_copying),
        "last_now_copying_s": since_spawn(facts.last_now_copying),
        "now_copying_lines": facts.now_copying_lines,
        "longest_log_line_bytes": facts.longest_line_bytes,
        "exit_code": proc.returncode,
        "samples": watch.samples,
        "sample_s_max": round(watch.sample_s_max, 3),
        "watcher_cpu_s": round(watch.cpu_s, 2),
        "intervals": intervals,
        "idle_seconds": idle_seconds,
        "idle_cpu_share": round(idle, 4),
        "clusters_restarted": restarted,
        "load_before": load_before,
        "load_after": load_after,
        "mm2py": str(Path(mm2py.__file__).parent),
        "log": str(log_file),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark `--runs` times; print one JSON line per run."""
    parser = argparse.ArgumentParser(
        prog="bench.many_topics", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument("--topics", type=int, default=500, help="new topics (default 500)")
    parser.add_argument(
        "--partitions", type=int, default=4, help="partitions per topic (default 4)"
    )
    parser.add_argument("--records", type=int, default=5, help="records per partition (default 5)")
    parser.add_argument("--runs", type=int, default=1, help="runs in a row (default 1)")
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=30.0,
        help="seconds of idle CPU measured once all is copied (default 30)",
    )
    parser.add_argument(
        "--intervals",
        choices=("short", "default"),
        default="short",
        help="short: mm2_properties' 1 s refresh, sync and emit intervals (default); "
        "default: MM2's default intervals",
    )
    parser.add_argument(
        "--timeout", type=float, default=300, help="seconds to wait for the copy (default 300)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    run_dir = logs_dir() / f"many-topics-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("logs and configs of this run: %s; mm2py from %s", run_dir, mm2py.__file__)
    # Fresh clusters, stopped at the end, unless A's and B's ports are taken: then the
    # running ones, left running.
    clusters, started = bench_clusters()
    failures = 0
    try:
        for _ in range(args.runs):
            try:
                emit(
                    one_run(
                        clusters,
                        args.topics,
                        args.partitions,
                        args.records,
                        args.timeout,
                        run_dir,
                        args.idle_seconds,
                        args.intervals,
                    )
                )
            except (ReplicatorError, KafkaException) as e:
                # On shared clusters another user's test may restart one mid-run.
                failures += 1
                log.error("run failed: %s", e)
                emit({"system": "mm2py", "error": str(e), "load": load_averages()})
    finally:
        if started is not None:
            started.down(["A", "B"])
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
