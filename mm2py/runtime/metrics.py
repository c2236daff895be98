"""Every Prometheus metric mm2py exports, defined in one place.

The copy loop must not pay prometheus_client's per-call locking for every
record, so the source part counts into plain Python structures
(`PartitionStats`) and a custom collector turns them into metric families at
scrape time. Control-plane metrics (errors, heartbeats, checkpoints) use
ordinary prometheus_client objects.

`exposition` is the text of /metrics: the same bytes as prometheus_client's
`generate_latest`, the replication families written directly from the statistics.
prometheus_client renders ~7 us a sample; 500 topics make ~23,000 samples, which
would hold the interpreter lock (and the copy loops) for ~150 ms a scrape.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import Histogram as PrometheusHistogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from mm2py.replication.stats import (
    LATENCY_BUCKETS,
    Extremes,
    Histogram,
    MirrorStats,
    PartitionStats,
    ReplicationStats,
    Sensor,
)

# mm2py_records_skipped_total's reason for records the source deleted before the copy.
SKIPPED_DELETED = "deleted_before_copy"

# The replication families: name, type and help, in the order they are exposed.
RECORDS = ("mm2py_records", "counter", "Records copied to the target (acknowledged).")
BYTES = ("mm2py_bytes", "counter", "Bytes of key+value copied to the target.")
LAG = (
    "mm2py_replication_lag_records",
    "gauge",
    "Source end offset minus the next offset to copy.",
)
AGE = (
    "mm2py_record_age_seconds",
    "histogram",
    "Age of a record (now minus its timestamp) when the replicator read it.",
)
LATENCY = (
    "mm2py_replication_latency_seconds",
    "histogram",
    "Record timestamp to target acknowledgement.",
)
SKIPPED = (
    "mm2py_records_skipped",
    "counter",
    "Records not copied, by reason: deleted_before_copy = deleted on the source"
    " (retention, truncation, delete_records) before they were copied.",
)
BATCHES = (
    "mm2py_batches",
    "counter",
    "Source record batches read by batch pass-through, by reason: whole = produced as they"
    " are; control, aborted = dropped as read_committed readers drop them; the others"
    " (offset_gaps, starts_before_position, delete_horizon, log_append_time, legacy_magic)"
    " = copied record by record.",
)

# Schema registry replication (``schema.registry.sync.enabled``), per flow: family, and
# the SchemaStats field it shows.
SCHEMA_FAMILIES = (
    (
        (
            "mm2py_schemas_copied",
            "counter",
            "Schema versions registered in the target's registry (new, or found there).",
        ),
        "schemas_copied",
    ),
    (
        (
            "mm2py_schema_ids_translated",
            "counter",
            "Framed keys and values copied with the target registry's schema id.",
        ),
        "ids_translated",
    ),
    (
        ("mm2py_schema_registry_lookups", "counter", "Requests to the two schema registries."),
        "lookups",
    ),
    (
        (
            "mm2py_schema_failures",
            "counter",
            "Schema ids that could not be resolved (their partition stops, or with "
            "schema.registry.unresolved.ids = copy their records are copied as they are).",
        ),
        "failures",
    ),
)


# MM2's metrics as the Prometheus JMX exporter renders its MBeans with Strimzi's rules
# (kafka.connect.mirror:type=MirrorSourceConnector,... -> lower case, - to _, gauges),
# with MM2's descriptions (MirrorSourceMetrics, MirrorCheckpointMetrics).
MIRROR_SOURCE = "kafka_connect_mirror_mirrorsourceconnector_"
MIRROR_CHECKPOINT = "kafka_connect_mirror_mirrorcheckpointconnector_"
_SENSORS = (  # a Value/Min/Max/Avg sensor: suffix and how MM2 describes it
    ("", "Time"),
    ("_max", "Max time"),
    ("_min", "Min time"),
    ("_avg", "Average time"),
)
MIRROR_SOURCE_FAMILIES: tuple[tuple[str, str], ...] = (
    ("record_count", "Number of source records replicated to the target cluster."),
    (
        "record_rate",
        "Average number of source records replicated to the target cluster per second.",
    ),
    ("record_age_ms", "The age of incoming source records when replicated to the target cluster."),
    (
        "record_age_ms_max",
        "The max age of incoming source records when replicated to the target cluster.",
    ),
    (
        "record_age_ms_min",
        "The min age of incoming source records when replicated to the target cluster.",
    ),
    (
        "record_age_ms_avg",
        "The average age of incoming source records when replicated to the target cluster.",
    ),
    ("byte_count", "Number of bytes replicated to the target cluster."),
    ("byte_rate", "Average number of bytes replicated per second."),
    *(
        (
            f"replication_latency_ms{suffix}",
            f"{what} it takes records to replicate from source to target cluster.",
        )
        for suffix, what in _SENSORS
    ),
)
MIRROR_CHECKPOINT_FAMILIES: tuple[tuple[str, str], ...] = tuple(
    (
        f"checkpoint_latency_ms{suffix}",
        f"{what} it takes consumer group offsets to replicate from source to target cluster.",
    )
    for suffix, what in _SENSORS
)
# (labels, value) of one family's series, labels in the order they are named.
_Series = list[tuple[tuple[tuple[str, str], ...], float]]


def _sensor_values(stats: MirrorStats) -> tuple[float, float, float, float]:
    """Value, Max, Min, Avg (the families' order) in milliseconds."""
    return (stats.value * 1000, stats.max * 1000, stats.min * 1000, stats.avg * 1000)


class ReplicationCollector(Collector):
    """Renders every registered flow's `ReplicationStats` as metric families: a series
    per remote topic, or per partition for a flow that asks for it; and MM2's metrics
    of the flows and checkpoint parts with ``metrics.mm2.names.enabled``."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.Lock()
        self._flows: list[ReplicationStats] = []
        # Checkpoint parts' MM2 checkpoint latency: (source, target, sensors by
        # (group, remote topic, partition)).
        self._checkpoints: list[tuple[str, str, dict[tuple[str, str, int], Sensor]]] = []
        self.clock = clock  # when MM2's windows and rates are read (wall clock)
        # Set on a thread while `exposition` writes these families itself.
        self._apart = threading.local()

    def add(self, stats: ReplicationStats) -> None:
        with self._lock:
            self._flows.append(stats)

    def remove(self, stats: ReplicationStats) -> None:
        with self._lock:
            if stats in self._flows:
                self._flows.remove(stats)

    def add_checkpoints(
        self, source: str, target: str, sensors: dict[tuple[str, str, int], Sensor]
    ) -> None:
        """Show a checkpoint part's MM2 checkpoint latency (its own dict, filled as it goes)."""
        with self._lock:
            self._checkpoints.append((source, target, sensors))

    def remove_checkpoints(self, sensors: dict[tuple[str, str, int], Sensor]) -> None:
        with self._lock:
            self._checkpoints = [c for c in self._checkpoints if c[2] is not sensors]

    def mirror_families(self) -> list[tuple[str, str, _Series]]:
        """MM2's metric families (name, help, series) of the flows that enabled them;
        none when no flow did."""
        with self._lock:
            flows = [f for f in self._flows if f.mm2_names]
            checkpoints = list(self._checkpoints)
        if not flows and not checkpoints:
            return []
        now = self.clock()
        source: list[_Series] = [[] for _ in MIRROR_SOURCE_FAMILIES]
        for flow in flows:
            for (topic, partition), stats in list(flow.partitions.items()):
                labels: tuple[tuple[str, str], ...] = (
                    ("source", flow.source),
                    ("target", flow.target),
                    ("topic", topic),
                    ("partition", str(partition)),
                )
                age, latency, meters = stats.record_age, stats.latency, stats.meters
                if not isinstance(age, Extremes) or not isinstance(latency, Extremes):
                    continue
                if meters is None:
                    continue
                record_rate, byte_rate = meters.rates(stats.records, stats.bytes, now)
                ages = _sensor_values(age.measure(now))
                latencies = _sensor_values(latency.measure(now))
                values = (
                    stats.records,
                    record_rate,
                    ages[0],
                    ages[1],
                    ages[2],
                    ages[3],
                    stats.bytes,
                    byte_rate,
                    *latencies,
                )
                for series, value in zip(source, values, strict=True):
                    series.append((labels, value))
        checkpoint: list[_Series] = [[] for _ in MIRROR_CHECKPOINT_FAMILIES]
        for cp_source, cp_target, sensors in checkpoints:
            for (group, topic, partition), sensor in list(sensors.items()):
                labels = (
                    ("source", cp_source),
                    ("target", cp_target),
                    ("group", group),
                    ("topic", topic),
                    ("partition", str(partition)),
                )
                for series, value in zip(
                    checkpoint, _sensor_values(sensor.measure(now)), strict=True
                ):
                    series.append((labels, value))
        out = [
            (MIRROR_SOURCE + name, doc, series)
            for (name, doc), series in zip(MIRROR_SOURCE_FAMILIES, source, strict=True)
        ]
        if checkpoints:
            out += [
                (MIRROR_CHECKPOINT + name, doc, series)
                for (name, doc), series in zip(MIRROR_CHECKPOINT_FAMILIES, checkpoint, strict=True)
            ]
        return out

    def collect(self) -> Iterator[Metric]:
        if getattr(self._apart, "on", False):
            return
        # A flow with ``metrics.partition.labels = false`` (the default) passes three label
        # values: add_metric zips them with these names, so its series have no partition
        # label and `sum by (topic)` reads the same either way.
        labels = ["source", "target", "topic", "partition"]
        records = CounterMetricFamily(RECORDS[0], RECORDS[2], labels=labels)
        size = CounterMetricFamily(BYTES[0], BYTES[2], labels=labels)
        lag = GaugeMetricFamily(LAG[0], LAG[2], labels=labels)
        age = HistogramMetricFamily(AGE[0], AGE[2], labels=labels)
        latency = HistogramMetricFamily(LATENCY[0], LATENCY[2], labels=labels)
        skipped = CounterMetricFamily(
            SKIPPED[0], SKIPPED[2], labels=["source", "target", "topic", "reason"]
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
        passing = [(flow, flow.batches) for flow in flows if flow.batches is not None]
        if passing:
            batches = CounterMetricFamily(
                BATCHES[0], BATCHES[2], labels=["source", "target", "reason"]
            )
            for flow, by_reason in passing:
                for reason, count in list(by_reason.items()):
                    batches.add_metric([flow.source, flow.target, reason], count)
            yield batches
        with_schemas = [(flow, flow.schemas) for flow in flows if flow.schemas is not None]
        if with_schemas:
            for (name, _kind, documentation), attr in SCHEMA_FAMILIES:
                counter = CounterMetricFamily(name, documentation, labels=["source", "target"])
                for flow, counts in with_schemas:
                    counter.add_metric([flow.source, flow.target], getattr(counts, attr))
                yield counter
        for name, documentation, mirror in self.mirror_families():
            family = GaugeMetricFamily(
                name, documentation, labels=[k for k, _v in mirror[0][0]] if mirror else []
            )
            for named, value in mirror:
                family.add_metric([v for _k, v in named], value)
            yield family

    def text(self) -> str:
        """The families `collect` yields, as `generate_latest` writes them."""
        with self._lock:
            flows = list(self._flows)
        # (labels as written, sorted by name as prometheus_client does; statistics)
        series: list[tuple[str, PartitionStats]] = []
        skipped: list[tuple[str, int]] = []
        for flow in flows:
            where = f'source="{_escape(flow.source)}",target="{_escape(flow.target)}",topic="'
            partitions = list(flow.partitions.items())
            by_topic: dict[str, int] = {}
            for (topic, _partition), stats in partitions:
                by_topic[topic] = by_topic.get(topic, 0) + stats.skipped
            skipped += [
                (f'reason="{SKIPPED_DELETED}",{where}{_escape(topic)}"', count)
                for topic, count in by_topic.items()
            ]
            if flow.partition_labels:
                series += [
                    (f'partition="{partition}",{where}{_escape(topic)}"', stats)
                    for (topic, partition), stats in partitions
                ]
            else:
                series += [
                    (f'{where}{_escape(topic)}"', stats) for topic, stats in flow.by_topic().items()
                ]
        out: list[str] = []
        for family, attr in ((RECORDS, "records"), (BYTES, "bytes"), (LAG, "lag")):
            name = _header(out, family)
            out += [f"{name}{{{labels}}} {_value(getattr(s, attr))}\n" for labels, s in series]
        for family, attr in ((AGE, "record_age"), (LATENCY, "latency")):
            name = _header(out, family)
            for labels, stats in series:
                h: Histogram = getattr(stats, attr)
                buckets = h.buckets()
                out += [
                    f'{name}_bucket{{le="{le}",{labels}}} {_value(count)}\n'
                    for le, count in buckets
                ]
                out.append(f"{name}_count{{{labels}}} {_value(buckets[-1][1])}\n")
                out.append(f"{name}_sum{{{labels}}} {_value(h.total)}\n")
        name = _header(out, SKIPPED)
        out += [f"{name}{{{labels}}} {_value(count)}\n" for labels, count in skipped]
        passing = [(flow, flow.batches) for flow in flows if flow.batches is not None]
        if passing:
            name = _header(out, BATCHES)
            out += [
                f'{name}{{reason="{reason}",source="{_escape(flow.source)}",'
                f'target="{_escape(flow.target)}"}} {_value(count)}\n'
                for flow, by_reason in passing
                for reason, count in list(by_reason.items())
            ]
        with_schemas = [(flow, flow.schemas) for flow in flows if flow.schemas is not None]
        if with_schemas:
            for family, attr in SCHEMA_FAMILIES:
                name = _header(out, family)
                out += [
                    f'{name}{{source="{_escape(flow.source)}",target="{_escape(flow.target)}"}} '
                    f"{_value(getattr(counts, attr))}\n"
                    for flow, counts in with_schemas
                ]
        for name, documentation, mirror in self.mirror_families():
            _header(out, (name, "gauge", documentation))
            out += [
                name
                + "{"
                + ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(named))
                + f"}} {_value(value)}\n"
                for named, value in mirror
            ]
        return "".join(out)


def _escape(value: str) -> str:
    """A label value as the text format writes it."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _value(number: float) -> str:
    return str(floatToGoString(number))  # type: ignore[no-untyped-call]


def _header(out: list[str], family: tuple[str, str, str]) -> str:
    """Append a family's HELP and TYPE lines; its samples' name (counters end in _total)."""
    name, kind, documentation = family
    if kind == "counter":
        name += "_total"
    documentation = documentation.replace("\\", r"\\").replace("\n", r"\n")
    out.append(f"# HELP {name} {documentation}\n# TYPE {name} {kind}\n")
    return name


class Registry(CollectorRegistry):
    """The daemon's registry; `exposition` renders it fast (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.replication: ReplicationCollector | None = None

    def exposition(self) -> bytes:
        fast = self.replication
        if fast is None:
            return generate_latest(self)
        fast._apart.on = True
        try:
            others = generate_latest(self)
        finally:
            fast._apart.on = False
        # The collector is registered first, so generate_latest would write it first too.
        return fast.text().encode() + others


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition of `registry` (/metrics)."""
    if isinstance(registry, Registry):
        return registry.exposition()
    return generate_latest(registry)


@dataclass
class Metrics:
    """The registry of one daemon with all its metric objects."""

    registry: CollectorRegistry = field(default_factory=Registry)
    replication: ReplicationCollector = field(default_factory=ReplicationCollector)

    def __post_init__(self) -> None:
        # First, before any other metric: `Registry.exposition` relies on it.
        self.registry.register(self.replication)
        if isinstance(self.registry, Registry):
            self.registry.replication = self.replication
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
