"""MM2's metric names (``metrics.mm2.names.enabled``): what the copy loop and the
checkpoint part keep, with MM2's (Kafka's) windows, and how /metrics renders them as
the Prometheus JMX exporter renders MM2's MBeans."""

from __future__ import annotations

import math
import pickle
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mm2py.config import load_config
from mm2py.replication.stats import (
    WINDOW,
    Extremes,
    Histogram,
    Meters,
    ReplicationStats,
    Sensor,
    summed,
)
from mm2py.runtime.metrics import (
    MIRROR_CHECKPOINT,
    MIRROR_SOURCE,
    Metrics,
    exposition,
)

T0 = 1_700_000_000.0


def test_a_sensor_shows_the_last_value_and_min_max_avg_of_two_windows() -> None:
    sensor = Sensor(T0)
    assert sensor.measure(T0).value == 0.0  # Kafka's Value before any record
    assert math.isnan(sensor.measure(T0).max)
    sensor.record(0.010, T0 + 1)
    sensor.record(0.030, T0 + 2)
    stats = sensor.measure(T0 + 3)
    assert (stats.value, stats.min, stats.max) == (0.030, 0.010, 0.030)
    assert math.isclose(stats.avg, 0.020)
    # The next window: the previous one still counts until it began 60 s ago.
    sensor.record(0.005, T0 + WINDOW + 1)
    stats = sensor.measure(T0 + WINDOW + 2)
    assert (stats.value, stats.min, stats.max) == (0.005, 0.005, 0.030)
    assert math.isclose(stats.avg, 0.015)
    stats = sensor.measure(T0 + 2 * WINDOW + 1)  # the first window expired
    assert (stats.min, stats.max, stats.avg) == (0.005, 0.005, 0.005)
    stats = sensor.measure(T0 + 3 * WINDOW + 2)  # both expired: NaN, the value stays
    assert stats.value == 0.005 and math.isnan(stats.min) and math.isnan(stats.avg)


def test_extremes_is_a_histogram_with_mm2s_windows_turned_by_its_writer() -> None:
    h = Extremes(T0)
    for seconds in (0.2, 0.1, 0.4):
        h.observe(seconds)
    plain = Histogram()
    for seconds in (0.2, 0.1, 0.4):
        plain.observe(seconds)
    assert (h.counts, h.total) == (plain.counts, plain.total)
    stats = h.measure(T0 + 5)
    assert (stats.value, stats.min, stats.max) == (0.4, 0.1, 0.4)
    assert math.isclose(stats.avg, 0.7 / 3)
    h.roll(T0 + WINDOW)
    h.observe(0.05)
    stats = h.measure(T0 + WINDOW + 1)
    assert (stats.value, stats.min, stats.max) == (0.05, 0.05, 0.4)
    assert math.isclose(stats.avg, 0.75 / 4)
    h.roll(T0 + 2 * WINDOW)
    stats = h.measure(T0 + 2 * WINDOW + 1)  # the window before: 0.05 alone
    assert (stats.min, stats.max) == (0.05, 0.05) and math.isclose(stats.avg, 0.05)


def test_meter_rates_are_kafkas_rate_over_the_samples() -> None:
    meters = Meters(T0)
    # 10 s into the first window: counted as 10 + 30 s (one full window at least).
    assert meters.rates(400, 4000, T0 + 10) == (10.0, 100.0)
    meters.prior = (meters.start, meters.records, meters.bytes)
    meters.start, meters.records, meters.bytes = T0 + WINDOW, 600, 6000
    # 45 s since the older sample began: 900 records over 45 s.
    assert meters.rates(900, 9000, T0 + 45) == (20.0, 200.0)
    # The older sample expired (60 s): from the newer one, 31 s + 0 windows added.
    assert meters.rates(910, 9100, T0 + 61) == (310 / 31, 3100 / 31)


def test_the_copy_loops_stats_roll_once_a_window_and_stay_picklable() -> None:
    stats = ReplicationStats("A", "B", mm2_names=True)
    p = stats.partition("A.t", 0)
    assert isinstance(p.latency, Extremes) and isinstance(p.record_age, Extremes)
    assert p.meters is not None
    start = p.meters.start
    p.records, p.bytes = 5, 50
    stats.roll(start + 1)
    assert p.meters.prior is None
    stats.roll(start + WINDOW + 0.5)  # looked at once a second: this one turns it
    assert p.meters.prior == (start, 0, 0) and p.meters.records == 5
    copy = pickle.loads(pickle.dumps(stats.partitions))
    assert copy[("A.t", 0)].meters.prior == (start, 0, 0)
    # Summing per topic (the default series) works on them as on plain ones.
    assert summed([p, p]).records == 10
    # Without the key: plain histograms and no windows.
    plain = ReplicationStats("A", "B").partition("A.t", 0)
    assert type(plain.latency) is Histogram and plain.meters is None


def _metrics() -> Metrics:
    metrics = Metrics()
    metrics.replication.clock = lambda: T0 + 10
    stats = ReplicationStats("A", "B", mm2_names=True)
    metrics.replication.add(stats)
    metrics.replication.add(ReplicationStats("C", "B"))  # not enabled: no MM2 series
    p = stats.partition('A.t "x"', 3)
    p.meters = Meters(T0)
    p.record_age, p.latency = Extremes(T0), Extremes(T0)
    for seconds in (0.010, 0.002):
        p.record_age.observe(seconds)
        p.latency.observe(seconds * 2)
    p.records, p.bytes = 400, 4000
    sensors: dict[tuple[str, str, int], Sensor] = {}
    metrics.replication.add_checkpoints("A", "B", sensors)
    sensors[("g", "A.t", 0)] = Sensor(T0)
    sensors[("g", "A.t", 0)].record(0.012, T0 + 1)
    return metrics


def test_the_families_are_the_jmx_exporters_names_with_mm2s_labels_and_meanings() -> None:
    text = exposition(_metrics().registry).decode()
    samples = {
        s.name: s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("kafka_connect_mirror")
    }
    source = {"source": "A", "target": "B", "topic": 'A.t "x"', "partition": "3"}
    expected = {
        "record_count": 400,
        "record_rate": 10.0,
        "byte_count": 4000,
        "byte_rate": 100.0,
        "record_age_ms": 2.0,
        "record_age_ms_min": 2.0,
        "record_age_ms_max": 10.0,
        "record_age_ms_avg": 6.0,
        "replication_latency_ms": 4.0,
        "replication_latency_ms_min": 4.0,
        "replication_latency_ms_max": 20.0,
        "replication_latency_ms_avg": 12.0,
    }
    for name, value in expected.items():
        sample = samples.pop(MIRROR_SOURCE + name)
        assert sample.labels == source, name
        assert math.isclose(sample.value, value), name
    group = {"source": "A", "target": "B", "group": "g", "topic": "A.t", "partition": "0"}
    for suffix in ("", "_min", "_max", "_avg"):
        sample = samples.pop(f"{MIRROR_CHECKPOINT}checkpoint_latency_ms{suffix}")
        assert sample.labels == group and math.isclose(sample.value, 12.0)
    assert samples == {}  # one series each: the flow without the key has none
    assert f"# TYPE {MIRROR_SOURCE}record_count gauge" in text


def test_exposition_writes_them_as_prometheus_client_would() -> None:
    metrics = _metrics()
    assert exposition(metrics.registry) == generate_latest(metrics.registry)


def test_without_the_key_nothing_is_added() -> None:
    metrics = Metrics()
    metrics.replication.add(ReplicationStats("A", "B"))
    assert b"kafka_connect_mirror" not in exposition(metrics.registry)


def test_the_key_is_read_globally_and_per_flow(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\nB->A.enabled = true\n"
        "metrics.mm2.names.enabled = true\nB->A.metrics.mm2.names.enabled = false\n"
    )
    config = load_config(path)
    assert config.flow("A", "B").settings.metrics_mm2_names_enabled is True
    assert config.flow("B", "A").settings.metrics_mm2_names_enabled is False
    path.write_text("clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n")
    assert load_config(path).flow("A", "B").settings.metrics_mm2_names_enabled is False
