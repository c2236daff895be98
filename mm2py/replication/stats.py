"""What the copy loop counts, in plain Python structures (no locks, one writer thread).

The copy loop must not pay prometheus_client's per-call locking for every record;
the daemon's metrics turn these into metric families at scrape time.
"""

from __future__ import annotations

import math
import operator
import time
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass, field

# Seconds; from sub-millisecond copies up to records that waited minutes.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)


class Histogram:
    """A lock-free histogram for one writer thread; read at scrape time."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def observe_span(self, first: float, last: float, count: int) -> None:
        """Count `count` observations from `first` to `last` (a run of records: its first
        and last record's values): those two as `observe`, the others as if evenly
        between them, in bucket counts, rounded so that they add up."""
        self.observe(first)
        if count < 2:
            return
        self.observe(last)
        rest = count - 2
        if rest <= 0:
            return
        low, high = (first, last) if first <= last else (last, first)
        self.total += rest * (low + high) / 2
        counts = self.counts
        lowest = bisect_left(LATENCY_BUCKETS, low)
        highest = bisect_left(LATENCY_BUCKETS, high)
        if lowest == highest:
            counts[lowest] += rest
            return
        placed = 0
        for i in range(lowest, highest):
            # Bucket i holds (LATENCY_BUCKETS[i - 1], LATENCY_BUCKETS[i]]; the share of
            # the span below its upper bound, rounded, minus what the lower ones got.
            below = round(rest * (LATENCY_BUCKETS[i] - low) / (high - low))
            counts[i] += below - placed
            placed = below
        counts[highest] += rest - placed

    def add(self, other: Histogram) -> None:
        """Count `other`'s observations in this one too."""
        self.counts = list(map(operator.add, self.counts, other.counts))
        self.total += other.total

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative (le, count) pairs as Prometheus expects them."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip(LATENCY_BUCKETS, self.counts, strict=False):
            running += count
            out.append((repr(bound), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out


@dataclass
class PartitionStats:
    """What the copy loop records for one remote topic partition."""

    records: int = 0
    bytes: int = 0
    lag: int = 0
    skipped: int = 0  # records deleted on the source before they were copied
    record_age: Histogram = field(default_factory=Histogram)
    latency: Histogram = field(default_factory=Histogram)
    # With ``metrics.mm2.names.enabled``: the counters at the windows' starts (MM2's rates);
    # record_age and latency are then `Extremes`.
    meters: Meters | None = None

    def signature(self) -> tuple[object, ...]:
        """Changes whenever anything shown of the partition may have changed: every
        observation comes with records, and MM2's windows turn with `meters.start`."""
        start = None if self.meters is None else self.meters.start
        return (self.records, self.bytes, self.lag, self.skipped, start)

    def roll(self, now: float) -> None:
        """Turn MM2's windows of this partition when the current one is WINDOW old."""
        meters = self.meters
        if meters is None or now - meters.start < WINDOW:
            return
        meters.prior = (meters.start, meters.records, meters.bytes)
        meters.start, meters.records, meters.bytes = now, self.records, self.bytes
        for histogram in (self.record_age, self.latency):
            if isinstance(histogram, Extremes):
                histogram.roll(now)


# PartitionStats' histograms, and its counters and gauges (numbers): what `summed` adds.
_HISTOGRAMS = tuple(k for k, v in vars(PartitionStats()).items() if isinstance(v, Histogram))
_NUMBERS = tuple(k for k, v in vars(PartitionStats()).items() if isinstance(v, int))


def summed(partitions: Iterable[PartitionStats]) -> PartitionStats:
    """One `PartitionStats` adding up the counters, gauges and histograms of several."""
    out = PartitionStats()
    for stats in partitions:
        for name in _NUMBERS:
            setattr(out, name, getattr(out, name) + getattr(stats, name))
        for name in _HISTOGRAMS:
            getattr(out, name).add(getattr(stats, name))
    return out


@dataclass
class SchemaStats:
    """What schema registry replication counted for a flow (mm2py.replication.schemas)."""

    schemas_copied: int = 0  # schema versions registered on the target (new or found there)
    ids_translated: int = 0  # framed keys and values given the target's id
    lookups: int = 0  # requests to either registry
    failures: int = 0  # ids that could not be resolved

    def add(self, other: SchemaStats) -> None:
        self.schemas_copied += other.schemas_copied
        self.ids_translated += other.ids_translated
        self.lookups += other.lookups
        self.failures += other.failures


class ReplicationStats:
    """Per-flow statistics of the source part, keyed by (remote topic, partition).

    `partition_labels`: whether the metrics show each partition or only topics
    (``metrics.partition.labels``).
    """

    def __init__(
        self, source: str, target: str, partition_labels: bool = False, mm2_names: bool = False
    ) -> None:
        """`mm2_names`: also keep what MM2's metrics show (``metrics.mm2.names.enabled``)."""
        self.source = source
        self.target = target
        self.partition_labels = partition_labels
        self.mm2_names = mm2_names
        self.partitions: dict[tuple[str, int], PartitionStats] = {}
        # Schema registry replication's counts, when the flow has it on.
        self.schemas: SchemaStats | None = None
        # Batch pass-through's source batches by reason (record_batches.Reason's values),
        # once the flow has a batch copier; kept across its restarts, as counters are.
        self.batches: dict[str, int] | None = None
        # When `roll` next looks at the partitions' windows (never without mm2_names).
        self._next_roll = 0.0 if mm2_names else math.inf

    def roll(self, now: float) -> None:
        """Turn MM2's windows that are WINDOW old (wall clock `now`). The copy loop calls it
        once a batch; it looks at the partitions once a second."""
        if now < self._next_roll:
            return
        self._next_roll = now + 1.0
        for stats in list(self.partitions.values()):
            stats.roll(now)

    def by_topic(self) -> dict[str, PartitionStats]:
        """The statistics of each remote topic, summed over its partitions (a snapshot;
        the copy loop may add partitions meanwhile)."""
        grouped: dict[str, list[PartitionStats]] = {}
        for (topic, _partition), stats in list(self.partitions.items()):
            grouped.setdefault(topic, []).append(stats)
        return {topic: summed(group) for topic, group in grouped.items()}

    def partition(self, topic: str, partition: int) -> PartitionStats:
        key = (topic, partition)
        stats = self.partitions.get(key)
        if stats is None:
            if self.mm2_names:
                now = time.time()
                stats = PartitionStats(
                    record_age=Extremes(now), latency=Extremes(now), meters=Meters(now)
                )
            else:
                stats = PartitionStats()
            self.partitions[key] = stats
        return stats


# -- MM2's metrics (metrics.mm2.names.enabled) ---------------------------------------
#
# MM2 records each in a Kafka sensor with Kafka's default sampling
# (metrics.sample.window.ms = 30 s, metrics.num.samples = 2): a Value stat is the last
# value recorded (0 before any); Min, Max and Avg cover the samples begun less than
# 2 x 30 s ago (NaN when they hold no record); a Meter's rate is those samples' total
# over the time since the oldest began (counted as at least 30 s), its count the total
# ever. A window here is turned by its writer (`roll`) once it is 30 s old.

WINDOW = 30.0
SAMPLES = 2

# A finished window: (start, records in it, their sum, smallest, largest).
Sample = tuple[float, int, float, float, float]


def measure(last: float, current: Sample, prior: Sample | None, now: float) -> MirrorStats:
    """Value, Min, Max and Avg as MM2's sensor shows them at `now` (seconds ago -> ms is
    the caller's)."""
    live = [s for s in (prior, current) if s is not None and now - s[0] < SAMPLES * WINDOW]
    count = sum(s[1] for s in live)
    if not count:
        return MirrorStats(last, math.nan, math.nan, math.nan)
    return MirrorStats(
        last,
        min(s[3] for s in live if s[1]),
        max(s[4] for s in live if s[1]),
        sum(s[2] for s in live) / count,
    )


@dataclass(frozen=True)
class MirrorStats:
    """What one of MM2's Value/Min/Max/Avg sensors shows."""

    value: float
    min: float
    max: float
    avg: float


class Extremes(Histogram):
    """A `Histogram` that also keeps what MM2's sensors show: the last value, and the
    smallest and largest of the current window (the count and sum come from the
    histogram's, marked at the window's start). Three more stores a record."""

    __slots__ = ("count_mark", "high", "last", "low", "prior", "start", "total_mark")

    def __init__(self, now: float) -> None:
        super().__init__()
        self.last = 0.0
        self.low = math.inf
        self.high = -math.inf
        self.start = now
        self.count_mark = 0
        self.total_mark = 0.0
        self.prior: Sample | None = None

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds
        self.last = seconds
        if seconds < self.low:
            self.low = seconds
        if seconds > self.high:
            self.high = seconds

    def current(self) -> Sample:
        count = sum(self.counts)
        return (
            self.start,
            count - self.count_mark,
            self.total - self.total_mark,
            self.low,
            self.high,
        )

    def roll(self, now: float) -> None:
        self.prior = self.current()
        self.start = now
        self.count_mark = sum(self.counts)
        self.total_mark = self.total
        self.low, self.high = math.inf, -math.inf

    def measure(self, now: float) -> MirrorStats:
        return measure(self.last, self.current(), self.prior, now)


class Sensor:
    """One of MM2's Value/Min/Max/Avg sensors for a value recorded now and then (the
    checkpoint latency): turns its own windows."""

    __slots__ = ("current", "last", "prior")

    def __init__(self, now: float) -> None:
        self.last = 0.0
        self.current: Sample = (now, 0, 0.0, math.inf, -math.inf)
        self.prior: Sample | None = None

    def record(self, value: float, now: float) -> None:
        start, count, total, low, high = self.current
        if now - start >= WINDOW:
            self.prior = self.current
            start, count, total, low, high = now, 0, 0.0, math.inf, -math.inf
        self.current = (start, count + 1, total + value, min(low, value), max(high, value))
        self.last = value

    def measure(self, now: float) -> MirrorStats:
        return measure(self.last, self.current, self.prior, now)


class Meters:
    """A partition's records and bytes copied when the current window began, and the
    previous window's (MM2's Meter rates)."""

    __slots__ = ("bytes", "prior", "records", "start")

    def __init__(self, now: float) -> None:
        self.start = now
        self.records = 0
        self.bytes = 0
        self.prior: tuple[float, int, int] | None = None

    def rates(self, records: int, size: int, now: float) -> tuple[float, float]:
        """Records and bytes a second at `now`, given the counters now, as Kafka's Rate."""
        prior = self.prior
        if prior is not None and now - prior[0] < SAMPLES * WINDOW:
            start, records_then, bytes_then = prior
        elif now - self.start < SAMPLES * WINDOW:
            start, records_then, bytes_then = self.start, self.records, self.bytes
        else:
            return 0.0, 0.0  # no window turned for a minute: nothing recent
        elapsed = now - start
        full = int(elapsed // WINDOW)
        if full < SAMPLES - 1:
            elapsed += (SAMPLES - 1 - full) * WINDOW
        return (records - records_then) / elapsed, (size - bytes_then) / elapsed
