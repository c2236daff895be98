"""What a benchmark moves and how fast: `Workload` (a topic of `partitions`
partitions holding `records` records of `record_bytes` bytes, produced with
`compression`), the two standard ones, the compressed one (issue 29: zstd, realistic
JSON-like records from `json_like_values`), and `Throughput` in records/s and MiB/s
(bytes / 2**20, as Kafka's tools count "MB"), counting record values only (the
workloads have no keys).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

MIB: Final = 1 << 20


@dataclass(frozen=True)
class Workload:
    """A topic of `partitions` partitions holding `records` records of `record_bytes` bytes."""

    partitions: int
    records: int
    record_bytes: int
    # The source producer's compression.type; "none": the perf tools' random bytes,
    # otherwise `json_like_values` (random bytes would not compress).
    compression: str = "none"

    @property
    def total_bytes(self) -> int:
        return self.records * self.record_bytes

    @property
    def label(self) -> str:
        """Short name for logs and topic names, e.g. ``8p-1000000x1024B``,
        ``8p-1000000x1024B-zstd``."""
        label = f"{self.partitions}p-{self.records}x{self.record_bytes}B"
        return label if self.compression == "none" else f"{label}-{self.compression}"


# The two workloads every system is measured on: large records and small records.
STANDARD_WORKLOADS: Final = (
    Workload(partitions=8, records=1_000_000, record_bytes=1024),
    Workload(partitions=8, records=2_000_000, record_bytes=100),
)

# Issue 29's compressed workload: 1 KiB JSON-like records, produced zstd-compressed
# (bench.replication's ``--workloads compressed``).
COMPRESSED_WORKLOAD: Final = Workload(
    partitions=8, records=1_000_000, record_bytes=1024, compression="zstd"
)
# The compressed workload's producer into A (bench.perf_tools.prefill): zstd, batches of about
# COMPRESSED_BATCH_BYTES on the log. librdkafka's batch.size bounds a batch's records
# before compression, so it is that times the ratio (5.5 measured on this workload: see
# docs/benchmarks.md);
# the linger lets every batch fill.
COMPRESSED_BATCH_BYTES: Final = 64 << 10
COMPRESSED_PRODUCER_PROPS: Final = {
    "acks": "1",
    "compression.type": "zstd",
    "batch.size": str(COMPRESSED_BATCH_BYTES * 11 // 2),
    "linger.ms": "100",
}

_WORDS: Final = [
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
    "kilo",
    "lima",
    "mike",
    "november",
    "oscar",
    "papa",
    "quebec",
    "romeo",
    "sierra",
    "tango",
    "uniform",
    "victor",
    "whiskey",
    "xray",
    "yankee",
    "zulu",
    "order",
    "invoice",
    "payment",
    "refund",
    "shipment",
    "customer",
    "account",
    "session",
    "checkout",
    "cart",
    "pending",
    "settled",
    "failed",
    "retry",
    "warehouse",
    "berlin",
    "paris",
    "lisbon",
    "tokyo",
    "denver",
    "austin",
    "premium",
    "standard",
    "basic",
    "mobile",
    "desktop",
    "tablet",
    "android",
    "ios",
    "web",
    "api",
    "batch",
    "stream",
]
_FIRST: Final = [
    "Ada",
    "Alan",
    "Grace",
    "Linus",
    "Barbara",
    "Ken",
    "Dennis",
    "Margaret",
    "Edsger",
    "Donald",
    "Frances",
    "Radia",
]
_LAST: Final = [
    "Lovelace",
    "Turing",
    "Hopper",
    "Torvalds",
    "Liskov",
    "Thompson",
    "Ritchie",
    "Hamilton",
    "Dijkstra",
    "Knuth",
]


# json_like_values: distinct documents formatted, and the bytes of a document's id field.
TEMPLATES: Final = 20_000
ID_BYTES: Final = len('{"id":"evt-000000000",')


def json_like_values(count: int, size: int, seed: int = 29) -> Iterator[bytes]:
    """`count` different JSON documents of exactly `size` bytes (ASCII), deterministic from
    `seed`: an event with a sequential id, a user (name, e-mail, address), a timestamp,
    nested items and tags from small vocabularies, and a free-text note padding it to
    `size` - compressible as real event logs are, never one record repeated. The rest of
    each document after its id comes from TEMPLATES of them (formatting each one takes
    ~0.1 ms here; a million would add minutes to every prefill)."""
    rng = random.Random(seed)
    base_ms = 1_790_000_000_000
    # The notes are slices of one long text of vocabulary words, at random offsets.
    text = " ".join(rng.choice(_WORDS) for _ in range(20_000))
    cities, statuses = _WORDS[42:48], ("pending", "settled", "failed")
    kinds = ("order.created", "order.paid", "cart.updated", "user.login")
    rest: list[bytes] = []
    for i in range(min(count, TEMPLATES)):
        first, last = rng.choice(_FIRST), rng.choice(_LAST)
        items = ",".join(
            f'{{"sku":"SKU-{rng.randrange(100000):05d}","qty":{rng.randrange(1, 5)},'
            f'"price":{rng.randrange(100, 50000) / 100}}}'
            for _ in range(rng.randrange(1, 5))
        )
        head = (
            f'"type":"{rng.choice(kinds)}",'
            f'"ts":{base_ms + i * 7 + rng.randrange(1000)},"user":{{"id":{rng.randrange(10**6)},'
            f'"name":"{first} {last}","email":"{first.lower()}.{last.lower()}'
            f'{rng.randrange(100)}@example.com","address":{{"city":"{rng.choice(cities)}",'
            f'"zip":"{rng.randrange(100000):05d}","street":"{rng.randrange(1, 300)} '
            f'{rng.choice(_WORDS).title()} Street"}}}},"items":[{items}],'
            f'"tags":{json.dumps(rng.sample(_WORDS, 3))},"status":"{rng.choice(statuses)}",'
            f'"note":"'
        )
        room = size - len(head) - 2 - ID_BYTES
        start = rng.randrange(len(text) - room)
        rest.append(f'{head}{text[start : start + room]}"}}'.encode())
    for i in range(count):
        # Consecutive records take templates far apart (7919 is prime).
        yield b'{"id":"evt-%09d",' % i + rest[i * 7919 % len(rest)]


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
