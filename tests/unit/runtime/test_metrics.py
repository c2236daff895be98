"""The replication metrics' series: per topic by default (partitions summed at scrape
time), per partition with ``metrics.partition.labels``; and how promptly the copy
loop serves the delivery reports its latency is taken in."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from pytest import MonkeyPatch

from mm2py.config import load_config
from mm2py.replication.copy_loop import ACK_POLL_MAX, ACK_POLL_TIMEOUT, CopyLoop, NewPartition
from mm2py.replication.stats import LATENCY_BUCKETS, ReplicationStats, SchemaStats, summed
from mm2py.runtime.metrics import Metrics, exposition
from tests.unit.replication.test_copy_loop import FakeConsumer, FakeProducer, FakeProgress, Record

FAMILIES = (
    "mm2py_records",
    "mm2py_bytes",
    "mm2py_replication_lag_records",
    "mm2py_record_age_seconds",
    "mm2py_replication_latency_seconds",
)


def _stats(partition_labels: bool, source: str = "A") -> ReplicationStats:
    """Topic A.t with partitions 0 and 1, topic A.u with partition 0."""
    stats = ReplicationStats(source, "B", partition_labels)
    for (topic, partition), latencies in {
        ("A.t", 0): [0.002, 0.003, 0.2],
        ("A.t", 1): [0.004, 7.0],
        ("A.u", 0): [0.03],
    }.items():
        p = stats.partition(topic, partition)
        p.records = len(latencies)
        p.bytes = 100 * len(latencies)
        p.lag = partition + 5
        for seconds in latencies:
            p.latency.observe(seconds)
            p.record_age.observe(seconds / 2)
    return stats


def _samples(*flows: ReplicationStats) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> sorted labels -> value, parsed back from the exposition text."""
    metrics = Metrics()
    for flow in flows:
        metrics.replication.add(flow)
    text = generate_latest(metrics.registry).decode()
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def _labels(**labels: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_series_are_per_topic_by_default_with_partitions_summed() -> None:
    samples = _samples(_stats(partition_labels=False))
    t = {"source": "A", "target": "B", "topic": "A.t"}
    u = {"source": "A", "target": "B", "topic": "A.u"}
    assert samples["mm2py_records_total"] == {_labels(**t): 5, _labels(**u): 1}
    assert samples["mm2py_bytes_total"] == {_labels(**t): 500, _labels(**u): 100}
    assert samples["mm2py_replication_lag_records"] == {_labels(**t): 11, _labels(**u): 5}
    latency = "mm2py_replication_latency_seconds"
    assert samples[f"{latency}_count"] == {_labels(**t): 5, _labels(**u): 1}
    assert abs(samples[f"{latency}_sum"][_labels(**t)] - 7.209) < 1e-9
    buckets = {le: n for le, n in _buckets(samples, latency, t).items()}
    assert buckets["0.0025"] == 1  # 0.002
    assert buckets["0.005"] == 3  # 0.003 of partition 0, 0.004 of partition 1
    assert buckets["0.25"] == 4
    assert buckets["5.0"] == 4 and buckets["10.0"] == 5 and buckets["+Inf"] == 5
    assert _buckets(samples, "mm2py_record_age_seconds", t)["0.0025"] == 3
    # No series of any family carries a partition label.
    for family in FAMILIES:
        for name, series in samples.items():
            if name.startswith(family):
                assert all("partition" not in dict(labels) for labels in series)


def test_series_are_per_partition_when_asked() -> None:
    samples = _samples(_stats(partition_labels=True))
    p0 = {"source": "A", "target": "B", "topic": "A.t", "partition": "0"}
    p1 = {**p0, "partition": "1"}
    u0 = {"source": "A", "target": "B", "topic": "A.u", "partition": "0"}
    assert samples["mm2py_records_total"] == {_labels(**p0): 3, _labels(**p1): 2, _labels(**u0): 1}
    assert samples["mm2py_replication_lag_records"][_labels(**p1)] == 6
    assert _buckets(samples, "mm2py_replication_latency_seconds", p1) == {
        **{repr(b): (0 if b < 0.005 else 1 if b < 10 else 2) for b in LATENCY_BUCKETS},
        "+Inf": 2,
    }


def test_flows_choose_their_series_independently() -> None:
    samples = _samples(_stats(partition_labels=False), _stats(partition_labels=True, source="C"))
    records = samples["mm2py_records_total"]
    assert records[_labels(source="A", target="B", topic="A.t")] == 5
    assert records[_labels(source="C", target="B", topic="A.t", partition="0")] == 3
    assert len(records) == 2 + 3


def test_summed_adds_every_counter_and_histogram() -> None:
    stats = _stats(partition_labels=False)
    total = summed(stats.partitions.values())
    assert (total.records, total.bytes, total.lag) == (6, 600, 16)
    assert sum(total.latency.counts) == 6 and sum(total.record_age.counts) == 6
    assert total.latency.counts == [
        sum(p.latency.counts[i] for p in stats.partitions.values())
        for i in range(len(LATENCY_BUCKETS) + 1)
    ]
    # Summing leaves the copy loop's own histograms as they were.
    assert stats.partitions[("A.t", 0)].latency.buckets()[-1] == ("+Inf", 3)


def test_the_key_is_read_globally_and_per_flow(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\nB->A.enabled = true\n"
        "metrics.partition.labels = true\nB->A.metrics.partition.labels = false\n"
    )
    config = load_config(path)
    assert config.flow("A", "B").settings.metrics_partition_labels is True
    assert config.flow("B", "A").settings.metrics_partition_labels is False
    path.write_text("clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n")
    assert load_config(path).flow("A", "B").settings.metrics_partition_labels is False


def test_delivery_reports_are_served_within_a_millisecond_while_records_are_in_flight() -> None:
    """The latency is taken when a delivery report is served: the source is never waited
    on for longer than ACK_POLL_TIMEOUT (1 ms) while acknowledgements are due."""
    waits: list[float] = []

    class Consumer(FakeConsumer):
        def poll(self, timeout: float) -> Record | None:
            waits.append(timeout)
            return super().poll(timeout)

    producer = FakeProducer()
    producer.hold = True  # acknowledgements still to come
    loop = CopyLoop(
        "A->B",
        "B",
        Consumer(),
        producer,
        FakeProgress(),  # type: ignore[arg-type]
        None,
        ReplicationStats("A", "B"),
        {},
        poll_timeout=1.0,
    )
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    assert loop.copy_batch(lambda: False)  # nothing in flight: the poll timeout
    loop.consumer.queued.append(Record("t", 0, 0))
    assert loop.copy_batch(lambda: False)  # taken at once: no wait
    assert loop.copy_batch(lambda: False)  # it awaits its acknowledgement
    assert waits == [1.0, ACK_POLL_TIMEOUT] and ACK_POLL_TIMEOUT <= 0.001


def _buckets(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]],
    family: str,
    labels: dict[str, str],
) -> dict[str, float]:
    out = {}
    for key, value in samples[f"{family}_bucket"].items():
        d = dict(key)
        le = d.pop("le")
        if d == labels:
            out[le] = value
    return out


def test_exposition_writes_what_prometheus_client_writes() -> None:
    """/metrics writes the replication families itself, byte for byte as generate_latest."""
    metrics = Metrics()
    metrics.replication.add(_stats(partition_labels=False))
    metrics.replication.add(_stats(partition_labels=True, source='C "quoted"\\ and\nnewline'))
    empty = ReplicationStats("D", "B")  # a flow with no partitions yet
    metrics.replication.add(empty)
    skipping = _stats(partition_labels=False, source="E")
    skipping.partitions[("A.t", 1)].skipped = 40
    skipping.partitions[("A.t", 0)].lag = 12345678901
    skipping.partitions[("A.u", 0)].latency.observe(1e-7)
    skipping.schemas = SchemaStats(schemas_copied=3, ids_translated=120, lookups=9, failures=1)
    metrics.replication.add(skipping)
    passing = _stats(partition_labels=False, source="F")
    passing.batches = {"whole": 7, "aborted": 1, "offset_gaps": 0}
    metrics.replication.add(passing)
    metrics.errors.labels("A", "B", "source").inc()
    metrics.flow_info.labels("A->B", "A", "B").set(1)
    metrics.checkpoint_latency.labels("A", "B", "g").observe(0.3)
    expected = generate_latest(metrics.registry)
    assert "mm2py_records_total" in expected.decode() and "mm2py_errors_total" in expected.decode()
    assert 'mm2py_schema_ids_translated_total{source="E",target="B"} 120.0' in expected.decode()
    assert 'mm2py_batches_total{reason="whole",source="F",target="B"} 7.0' in expected.decode()
    assert exposition(metrics.registry) == expected
    assert exposition(metrics.registry) == expected  # the collector is back in the registry
    assert exposition(CollectorRegistry()) == b""


def test_the_wait_for_acknowledgements_grows_while_none_come(monkeypatch: MonkeyPatch) -> None:
    """A tenth of the time without an acknowledgement, from 1 ms up to ACK_POLL_MAX; back to
    1 ms once one comes, and when nothing is in flight the poll timeout."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    waits: list[float] = []

    class Consumer(FakeConsumer):
        def poll(self, timeout: float) -> Record | None:
            waits.append(timeout)
            return super().poll(timeout)

    producer = FakeProducer()
    producer.hold = True
    progress: Any = FakeProgress()
    loop = CopyLoop(
        "A->B", "B", Consumer(), producer, progress, None, ReplicationStats("A", "B"), {}
    )
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    loop.consumer.queued.append(Record("t", 0, 0))
    assert loop.copy_batch(lambda: False)  # produced; its acknowledgement is due
    for advance in (0.0, 0.05, 0.45, 5.0):
        clock[0] += advance
        assert loop.copy_batch(lambda: False)
    assert waits == pytest.approx([ACK_POLL_TIMEOUT, 0.005, 0.05, ACK_POLL_MAX])
    producer.hold = False
    producer.poll()  # the acknowledgement comes
    loop.consumer.queued.append(Record("t", 0, 1))
    producer.hold = True
    assert loop.copy_batch(lambda: False)
    assert loop.copy_batch(lambda: False)
    assert waits[-1] == ACK_POLL_TIMEOUT
    producer.hold = False
    producer.poll()
    assert loop.copy_batch(lambda: False)
    assert waits[-1] == 1.0  # nothing in flight: consumer.poll.timeout.ms
