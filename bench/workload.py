"""What a benchmark moves and how fast: `Workload` (a topic of `partitions`
partitions holding `records` records of `record_bytes` bytes), the two standard ones, and
`Throughput` in records/s and MiB/s (bytes / 2**20, as Kafka's tools count "MB"),
counting record values only (the workloads have no keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MIB: Final = 1 << 20


@dataclass(frozen=True)
class Workload:
    """A topic of `partitions` partitions holding `records` records of `record_bytes` bytes."""

    partitions: int
    records: int
    record_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.records * self.record_bytes

    @property
    def label(self) -> str:
        """Short name for logs and topic names, e.g. ``8p-1000000x1024B``."""
        return f"{self.partitions}p-{self.records}x{self.record_bytes}B"


# The two workloads every system is measured on: large records and small records.
STANDARD_WORKLOADS: Final = (
    Workload(partitions=8, records=1_000_000, record_bytes=1024),
    Workload(partitions=8, records=2_000_000, record_bytes=100),
)


@dataclass(frozen=True)
class Throughput:
    """What one tool run achieved (`cpu_s`: the tool's user+sys CPU-seconds over its
    whole run, JVM start-up included; None when not measured)."""

    records: int
    records_per_s: float
    mb_per_s: float
    cpu_s: float | None = None

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "records": self.records,
            "records_per_s": round(self.records_per_s, 1),
            "mb_per_s": round(self.mb_per_s, 2),
            "cpu_s_per_m_records": cpu_per_million(self.cpu_s, self.records),
        }


def cpu_per_million(cpu_s: float | None, records: int) -> float | None:
    """CPU-seconds per million records (None if unknown)."""
    if cpu_s is None or records <= 0:
        return None
    return round(cpu_s / records * 1e6, 2)
