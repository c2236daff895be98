"""Every Prometheus metric mm2py exports, defined in one place.

The copy loop must not pay prometheus_client's per-call locking for every
record, so the source part counts into plain Python structures
(`PartitionStats`) and a custom collector turns them into metric families at
scrape time. Control-plane metrics (errors, heartbeats, checkpoints) use
ordinary prometheus_client objects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client import Histogram as PrometheusHistogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mm2py.replication.stats import LATENCY_BUCKETS, PartitionStats, ReplicationStats

# mm2py_records_skipped_total's reason for records the source deleted before the copy.
SKIPPED_DELETED = "deleted_before_copy"


class ReplicationCollector(Collector):
    """Renders every registered flow's `ReplicationStats` as metric families: a series
    per remote topic, or per partition for a flow that asks for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._flows: list[ReplicationStats] = []

    def add(self, stats: ReplicationStats) -> None:
        with self._lock:
            self._flows.append(stats)

    def remove(self, stats: ReplicationStats) -> None:
        with self._lock:
            if stats in self._flows:
                self._flows.remove(stats)

    def collect(self) -> Iterator[Metric]:
        # A flow with ``metrics.partition.labels = false`` (the default) passes three label
        # values: add_metric zips them with these names, so its series have no partition
        # label and `sum by (topic)` reads the same either way.
        labels = ["source", "target", "topic", "partition"]
        records = CounterMetricFamily(
            "mm2py_records", "Records copied to the target (acknowledged).", labels=labels
        )
        size = CounterMetricFamily(
            "mm2py_bytes", "Bytes of key+value copied to the target.", labels=labels
        )
        lag = GaugeMetricFamily(
            "mm2py_replication_lag_records",
            "Source end offset minus the next offset to copy.",
            labels=labels,
        )
        age = HistogramMetricFamily(
            "mm2py_record_age_seconds",
            "Age of a record (now minus its timestamp) when the replicator read it.",
            labels=labels,
        )
        latency = HistogramMetricFamily(
            "mm2py_replication_latency_seconds",
            "Record timestamp to target acknowledgement.",
            labels=labels,
        )
        skipped = CounterMetricFamily(
            "mm2py_records_skipped",
            "Records not copied, by reason: deleted_before_copy = deleted on the source"
            " (retention, truncation, delete_records) before they were copied.",
            labels=["source", "target", "topic", "reason"],
        )
        with self._lock:
            flows = list(self._flows)
        for flow in flows:
            # Per topic: one series for each, at 0 until records are skipped.
            by_topic: dict[str, int] = {}
            for (topic, _partition), stats in list(flow.partitions.items()):
                by_topic[topic] = by_topic.get(topic, 0) + stats.skipped
            for topic, count in by_topic.items():
                skipped.add_metric([flow.source, flow.target, topic, SKIPPED_DELETED], count)
        for flow in flows:
            rows: list[tuple[list[str], PartitionStats]]
            if flow.partition_labels:
                rows = [
                    ([flow.source, flow.target, topic, str(partition)], stats)
                    for (topic, partition), stats in list(flow.partitions.items())
                ]
            else:
                # Summed at scrape time, the copy loop counting per partition as always.
                rows = [
                    ([flow.source, flow.target, topic], stats)
                    for topic, stats in flow.by_topic().items()
                ]
            for values, stats in rows:
                records.add_metric(values, stats.records)
                size.add_metric(values, stats.bytes)
                lag.add_metric(values, stats.lag)
                age.add_metric(values, stats.record_age.buckets(), stats.record_age.total)
                latency.add_metric(values, stats.latency.buckets(), stats.latency.total)
        yield from (records, size, lag, age, latency, skipped)


@dataclass
class Metrics:
    """The registry of one daemon with all its metric objects."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    replication: ReplicationCollector = field(default_factory=ReplicationCollector)

    def __post_init__(self) -> None:
        self.registry.register(self.replication)
        self.errors = Counter(
            "mm2py_errors",
            "Errors by part (source, checkpoint, heartbeat, sync).",
            ["source", "target", "part"],
            registry=self.registry,
        )
        # Always 1: joins `flow` ("A->B") onto series labelled source/target, for
        # dashboards (`* on (source, target) group_left (flow) mm2py_flow_info`).
        self.flow_info = Gauge(
            "mm2py_flow_info",
            "One series per flow the daemon runs, labelled with its name A->B.",
            ["flow", "source", "target"],
            registry=self.registry,
        )
        self.heartbeat_age = Gauge(
            "mm2py_heartbeat_age_seconds",
            "Now minus the newest heartbeat that reached `target` from `source` over `hops`"
            " replication hops (hops=0: heartbeats emitted into `target` itself).",
            ["source", "target", "hops"],
            registry=self.registry,
        )
        # Labelled by group, not partition: one histogram per group and partition would
        # multiply series by every partition a group reads.
        self.checkpoint_latency = PrometheusHistogram(
            "mm2py_checkpoint_latency_seconds",
            "From the checkpoint part first reading a group's committed offset on `source`"
            " to `target` acknowledging a checkpoint that translates it exactly: how far"
            " behind the group a failover to `target` would resume.",
            ["source", "target", "group"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
