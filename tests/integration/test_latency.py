"""mm2py_replication_latency_seconds against an independent measurement.

While records are produced to A at a steady rate, a consumer on B (the watcher, in
this process) takes each copy's arrival time minus its timestamp. Over the same
records, the metric's histogram (the difference of two scrapes) must agree with the
watcher's exact latencies at p10, p25, p50, p75 and p90 (within 5 ms) and p99 (within
20 ms): the bucket that holds the metric's quantile, widened by the tolerance, must
hold the watcher's (tests/latency_agreement.py). Two quantiles interpolated in the buckets are not
compared: the buckets are 2.5-5-10-25 ms wide at the low end, and latencies that crowd
near a bound move an interpolated quantile by up to a bucket's width for a 1 ms shift
(a fresh clone's run at 5 records/s: metric p50 8.91 ms, the watcher's binned 14.43 ms,
its exact 10.36 ms). The REST status's p50 (the last minute, from the same histograms)
must agree too.

The watcher sees a copy after the target acknowledged it and answered its fetch,
so it is late by its own fetch round trip (well under a millisecond on one host).
At 5,000 records/s on a machine whose CPUs are overloaded by other work, the whole
pipeline stalls for hundreds of milliseconds at a time and the watcher, one process
and one hop further, by more. Before the copy loop served delivery reports within
1 ms, the metric said p50 175 ms at 5 records/s where the watcher saw 4 ms.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import pytest
from confluent_kafka import OFFSET_END, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.replication.stats import LATENCY_BUCKETS
from mm2py.runtime.status import quantile
from tests.conftest import Clusters
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import create_topic, wait_until
from tests.latency_agreement import (
    LEVELS,
    bucket_of,
    disagreements,
    exact_quantile,
    quantile_bucket,
)

# Serial: its two observers must not wait for CPU that another test's brokers and
# daemons hold (a parallel run runs it alone, after the others: docs/tests.md).
pytestmark = [pytest.mark.integration, pytest.mark.serial]

PARTITIONS = 2
# Warming up goes in rounds of WARM_UP_ROUND_SECONDS at the highest measured rate until a
# round's copies have a median latency under WARM_P50_SECONDS, for at most
# WARM_UP_LIMIT_SECONDS: brokers started a moment ago run Kafka's code before the JIT has
# compiled it (a session that runs this module alone starts them fresh; measured here:
# p50 3.2 s, then 52 ms, then 24 ms in three 5,000/s runs one after the other on the same brokers).
WARM_UP_ROUND_SECONDS = 5.0
WARM_UP_LIMIT_SECONDS = 180.0
WARM_P50_SECONDS = 0.025
# The watcher's priority (see `Watcher`); raising it needs root, as CI has.
WATCHER_NICENESS = -10


def _latency_counts(daemon: RunningDaemon, topic: str) -> list[int]:
    """The topic's latency histogram as counts per bucket (summed over any partitions)."""
    cumulative = [0.0] * (len(LATENCY_BUCKETS) + 1)
    bounds = [repr(b) for b in LATENCY_BUCKETS] + ["+Inf"]
    for family in text_string_to_metric_families(daemon.metrics()):
        if family.name != "mm2py_replication_latency_seconds":
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") and s.labels.get("topic") == topic:
                cumulative[bounds.index(s.labels["le"])] += s.value
    return [int(c - p) for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]


def _observed(daemon: RunningDaemon, topic: str) -> int:
    """How many latencies the topic's histogram holds (0 while the API is not up yet)."""
    try:
        return sum(_latency_counts(daemon, topic))
    except OSError:
        return 0


def _counts(daemon: RunningDaemon, topic: str) -> list[int]:
    """`_latency_counts`, or none while the API is not up yet."""
    try:
        return _latency_counts(daemon, topic)
    except OSError:
        return [0] * (len(LATENCY_BUCKETS) + 1)


def _warm_up(
    daemon: RunningDaemon, source: LocalCluster, target: LocalCluster, topic: str, rate: int
) -> int:
    """Produce to `topic` at `rate` in rounds until its copies are quick (see
    WARM_P50_SECONDS) or WARM_UP_LIMIT_SECONDS have passed; the records produced.

    From the second round on, a consumer on B reads the copies as the measured watcher
    will: the brokers' fetch path is compiled by then too, not only the produce path.
    Without it a broker started a few minutes before (test_faults restarts B's, three
    minutes before this test in a full run) answered the watcher's fetches late while
    acknowledging the copies on time: in fresh clones' runs the watcher's p99 was 252 vs
    167 ms and 417 vs 393 ms, with B's JVM at 50% of a core compiling. Here, B restarted
    30 s before each run, watcher minus metric at p99 (p50): without this reader +182
    (+2.2), +4.0 (+1.9), +4.0 (+2.3) ms, the first failing; with it +1.1 (+0.9), +0.4
    (+0.3), +1.7 (+0.3) ms."""
    deadline = time.monotonic() + WARM_UP_LIMIT_SECONDS
    remote = f"A.{topic}"
    produced = 0
    reader: Watcher | None = None
    try:
        while True:
            before = _counts(daemon, remote)
            produced += _produce_steadily(source, topic, rate, WARM_UP_ROUND_SECONDS)
            wait_until(
                lambda n=produced: _observed(daemon, remote) >= n or None,  # type: ignore[misc]
                timeout=60,
                what=f"the warm-up records copied to {remote}",
            )
            after = _counts(daemon, remote)
            median = quantile([x - y for x, y in zip(after, before, strict=True)], 0.5) or 0.0
            if (reader is not None and median < WARM_P50_SECONDS) or time.monotonic() > deadline:
                p50_ms = median * 1000
                print(f"warmed up with {produced} records; the last round's p50 {p50_ms:.1f} ms")
                return produced
            if reader is None:  # the remote topic exists now
                reader = Watcher(target, remote)
                reader.start()
                wait_until(reader.is_ready, what="the warm-up's reader")
    finally:
        if reader is not None:
            reader.stop()


def _ms(seconds: float) -> float:
    return round(1000 * seconds, 2)


def _watch(
    props: dict[str, str], topic: str, ready: Any, count: Any, stop: Any, out: Connection
) -> None:
    """The watcher's process: arrival minus timestamp of every record of `topic` from
    its current end until `stop`, counted in `count` as they come, sent on `out`."""
    with contextlib.suppress(PermissionError):  # root only (CI is): see `Watcher`
        os.nice(WATCHER_NICENESS)
    consumer = clients.consumer(props, {"fetch.wait.max.ms": 100})
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(PARTITIONS)])
    ready.set()
    latencies: list[float] = []
    while not stop.is_set():
        msgs = consumer.consume(10_000, 0)
        if not msgs:
            first = consumer.poll(0.1)
            if first is None:
                continue
            msgs = [first, *consumer.consume(10_000, 0)]
        # One clock read per batch: the records of a batch arrived together.
        now = time.time()
        latencies.extend(now - m.timestamp()[1] / 1000 for m in msgs if m.error() is None)
        count.value = len(latencies)
    consumer.close()
    out.send(latencies)


class Watcher:
    """Reads the remote topic from its current end; arrival minus timestamp per record.

    In a process of its own, so that it never waits for the GIL behind the steady
    producer, which catches up after a stall (as a thread it was once 79 ms later
    than the metric at p99, after a 250 ms stall; that this wait was the cause is
    likely, not proven). And ahead of the other processes for the CPU
    (WATCHER_NICENESS): its own wait for a core is an error of the measure, not
    replication latency. At normal priority it saw the tail later than the metric in
    every failed run: p99 252 vs 167 ms and 298 vs 227 ms in two fresh clones' runs;
    with 3 CPU burners beside the test (load 12-22), 921 vs 838 and 903 vs 876 ms.
    Raised, in two runs under the same load: 492 vs 478 and 483 vs 481 ms. The p50
    stays a little later (68 vs 57 ms, 73 vs 70 ms there): a consumer sees a record
    only after broker B answers its fetch, which at that load waits for a CPU too."""

    def __init__(self, cluster: LocalCluster, topic: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready = context.Event()
        self._count = context.Value("i", 0)
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_watch,
            args=(
                cluster.client_properties(),
                topic,
                self._ready,
                self._count,
                self._stop,
                sender,
            ),
            daemon=True,
        )
        self.latencies: list[float] = []

    def start(self) -> None:
        self._process.start()

    @property
    def ready(self) -> bool:
        """Its process runs and has asked for the topic's partitions from their end."""
        return bool(self._ready.is_set())

    def is_ready(self) -> bool | None:
        """`ready`, as a `wait_until` probe."""
        return self.ready or None

    @property
    def seen(self) -> int:
        """How many records it has seen so far."""
        return int(self._count.value)

    def stop(self) -> None:
        self._stop.set()
        if self._results.poll(30):
            self.latencies = self._results.recv()
        self._process.join(10)


def _produce_steadily(cluster: LocalCluster, topic: str, rate: int, seconds: float) -> int:
    """`rate` records a second for `seconds` (in bursts every 2 ms at high rates), with
    the producer's default linger (5 ms), as applications produce. With linger.ms = 0
    each burst was a request of its own: ~1,000 requests a second kept broker A and
    the 2 cores busy, and the p50 of the copies was 24-51 ms rather than 7 ms."""
    producer = clients.producer(cluster.client_properties())
    interval = max(1.0 / rate, 0.002)
    per_burst = round(rate * interval)
    start = time.monotonic()
    sent = 0
    for burst in range(int(seconds / interval)):
        time.sleep(max(start + burst * interval - time.monotonic(), 0))
        for _ in range(per_burst):
            producer.produce(topic, b"x" * 100, partition=sent % PARTITIONS)
            sent += 1
        producer.poll(0)
    assert producer.flush(30) == 0
    return sent


# (records/s, seconds measured)
RATES = [(5, 30.0), (5000, 10.0)]


@dataclass(frozen=True)
class WarmNode:
    """The module's node, warmed up, and the topic each rate measures (on A)."""

    daemon: RunningDaemon
    topics: dict[int, str]


@pytest.fixture(scope="module")
def warm_node(clusters: Clusters, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WarmNode]:
    """One node copies both rates' topics: its start and the warm-up (10-15 s of the
    serial step) happen once. It warms up at the highest rate measured, on a topic of its
    own (the status's one-minute window of a measured topic holds only that topic's
    records): copying runs, and brokers started a moment ago (their JIT still cold: p50
    above a second at 5,000/s in the first minute) are up to speed before anything is
    measured."""
    a, b = clusters["A"], clusters["B"]
    name = f"latency-{uuid.uuid4().hex[:8]}"
    topics = {rate: f"{name}-{rate}" for rate, _seconds in RATES}
    warm = f"{name}-warm"
    for topic in [*topics.values(), warm]:
        create_topic(a, topic, partitions=PARTITIONS)
    config = tmp_path_factory.mktemp("latency") / "mm2.properties"
    config.write_text(mm2_properties(a, b, "|".join([*topics.values(), warm])))
    with running_daemon(config) as daemon:
        warmed = _warm_up(daemon, a, b, warm, max(topics))
        wait_until(
            lambda: _observed(daemon, f"A.{warm}") >= warmed or None,
            timeout=60,
            what=f"the warm-up records copied to A.{warm}",
        )
        yield WarmNode(daemon, topics)


@pytest.mark.parametrize(("rate", "seconds"), RATES)
def test_latency_metric_matches_arrival_on_target(
    warm_node: WarmNode,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    rate: int,
    seconds: float,
) -> None:
    daemon, topic = warm_node.daemon, warm_node.topics[rate]
    remote = f"A.{topic}"
    with daemon.reported():  # the shared node's status and log, if this test fails
        first = _produce_steadily(cluster_a, topic, 10, 1.0)
        wait_until(
            lambda: _observed(daemon, remote) >= first or None,
            timeout=60,
            what=f"the first records copied to {remote}",
        )
        before = _latency_counts(daemon, remote)
        watcher = Watcher(cluster_b, remote)
        watcher.start()
        wait_until(watcher.is_ready, what="the watcher's process")
        time.sleep(1)  # its consumer has looked up the partitions' ends
        sent = _produce_steadily(cluster_a, topic, rate, seconds)
        wait_until(
            lambda: _observed(daemon, remote) - sum(before) >= sent or None,
            timeout=60,
            what=f"{sent} latencies observed",
        )
        wait_until(lambda: watcher.seen >= sent or None, what="the watcher")
        watcher.stop()
        after = _latency_counts(daemon, remote)
        exposed = [line for line in daemon.metrics().splitlines() if f'topic="{remote}"' in line]
        # The REST status: quantiles of the last minute, from the same histograms.
        topics = json.loads(daemon.status("A->B"))["topics"]
        status_p50 = next(t["latency_p50_seconds"] for t in topics if t["topic"] == remote)
    metric = [a - b for a, b in zip(after, before, strict=True)]
    watched = watcher.latencies
    assert sum(metric) == sent and len(watched) == sent
    gaps = disagreements(metric, watched)
    watched_p50 = exact_quantile(watched, 0.5)
    status_bucket = bucket_of(status_p50)
    figures = {
        "rate": rate,
        "records": sent,
        # Per level: the bucket that holds the metric's quantile, the watcher's exact one.
        "levels_ms": {
            level: [*map(_ms, quantile_bucket(metric, q)), _ms(exact_quantile(watched, q))]
            for level, q in ((f"p{round(q * 100)}", q) for q, _tolerance in LEVELS)
        },
        "gaps_ms": {level: _ms(g) for level, g in gaps.items()},  # all 0 to pass
        "metric_p50_ms": _ms(quantile(metric, 0.5) or 0),  # interpolated, as Prometheus
        "metric_p99_ms": _ms(quantile(metric, 0.99) or 0),
        "status_p50_ms": _ms(status_p50),
    }
    print(json.dumps(figures))
    assert not any(gaps.values()), figures
    # Over the last minute (the measured records and the ten before them), within 5 ms.
    assert status_bucket[0] - 0.005 <= watched_p50 <= status_bucket[1] + 0.005, figures
    # By default one series per topic: no partition label on any of the topic's series.
    assert exposed and not [line for line in exposed if "partition=" in line]
