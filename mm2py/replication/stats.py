"""What the copy loop counts, in plain Python structures (no locks, one writer thread).

The copy loop must not pay prometheus_client's per-call locking for every record;
the daemon's metrics turn these into metric families at scrape time.
"""

from __future__ import annotations

from bisect import bisect_left
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


class ReplicationStats:
    """Per-flow statistics of the source part, keyed by (remote topic, partition)."""

    def __init__(self, source: str, target: str) -> None:
        self.source = source
        self.target = target
        self.partitions: dict[tuple[str, int], PartitionStats] = {}

    def partition(self, topic: str, partition: int) -> PartitionStats:
        key = (topic, partition)
        stats = self.partitions.get(key)
        if stats is None:
            stats = self.partitions[key] = PartitionStats()
        return stats
