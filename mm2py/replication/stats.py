"""What the copy loop counts, in plain Python structures (no locks, one writer thread).

The copy loop must not pay prometheus_client's per-call locking for every record;
the daemon's metrics turn these into metric families at scrape time.
"""

from __future__ import annotations

import operator
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


# PartitionStats' histograms, and its counters and gauges (numbers): what `summed` adds.
_HISTOGRAMS = tuple(k for k, v in vars(PartitionStats()).items() if isinstance(v, Histogram))
_NUMBERS = tuple(k for k in vars(PartitionStats()) if k not in _HISTOGRAMS)


def summed(partitions: Iterable[PartitionStats]) -> PartitionStats:
    """One `PartitionStats` adding up the counters, gauges and histograms of several."""
    out = PartitionStats()
    for stats in partitions:
        for name in _NUMBERS:
            setattr(out, name, getattr(out, name) + getattr(stats, name))
        for name in _HISTOGRAMS:
            getattr(out, name).add(getattr(stats, name))
    return out


class ReplicationStats:
    """Per-flow statistics of the source part, keyed by (remote topic, partition).

    `partition_labels`: whether the metrics show each partition or only topics
    (``metrics.partition.labels``).
    """

    def __init__(self, source: str, target: str, partition_labels: bool = False) -> None:
        self.source = source
        self.target = target
        self.partition_labels = partition_labels
        self.partitions: dict[tuple[str, int], PartitionStats] = {}

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
            stats = self.partitions[key] = PartitionStats()
        return stats
