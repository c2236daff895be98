"""Backfill planning (pure): time bounds, offset ranges, their order, progress lines.

Per source partition a backfill copies the offsets from a start to an end fixed when it
begins: start, the latest of the log start, the offset of `--from` and one past the
recorded progress; end (exclusive), the last stable offset then, or the offset of
`--until` if that comes first.

Invariants:
- a backfill never waits for open transactions (its end is a last stable offset);
- a partition with more than `max_range_records` offsets is split into equal ranges, and
  the ranges of one partition are copied one after the other, never at once (two writers
  on one remote partition would interleave, and the offset syncs could not say where
  each record landed);
- `RangeScheduler` hands out the next range of the partition with the most work left.
Design: docs/design/backfill.md.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import pairwise

from mm2py.errors import UsageError

SourcePartition = tuple[str, int]

DEFAULT_RANGE_RECORDS = 1_000_000


class TimeBoundError(UsageError, ValueError):
    """A --from/--until value that is not a keyword, an ISO-8601 time or epoch milliseconds."""


def parse_time_bound(text: str, keyword: str) -> int | None:
    """`keyword` (earliest/now) as None, else the time in epoch milliseconds.

    Accepts epoch milliseconds (``1700000000000``) or ISO-8601
    (``2024-05-01``, ``2024-05-01T12:00:00+02:00``, ``...Z``); a time without a
    zone is UTC.
    """
    value = text.strip()
    if value.lower() == keyword:
        return None
    if value.isdigit():
        return int(value)
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise TimeBoundError(
            f"{text!r} is not {keyword!r}, an ISO-8601 time (2024-05-01T12:00:00Z) "
            "or epoch milliseconds"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return int(when.timestamp() * 1000)


@dataclass(frozen=True)
class PartitionBounds:
    """What the clusters say about one source partition when the backfill starts."""

    topic: str
    partition: int
    earliest: int  # log start offset
    end: int  # exclusive: last stable offset, or --until's offset if smaller
    from_offset: int | None = None  # --from's offset; None: from the earliest
    last_copied: int | None = None  # progress in mm2-offsets.<source>.internal

    @property
    def start(self) -> int:
        """The first offset to copy (may be >= end: nothing to copy)."""
        start = self.earliest
        if self.from_offset is not None:
            start = max(start, self.from_offset)
        if self.last_copied is not None:
            start = max(start, self.last_copied + 1)
        return start


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Source offsets [start, end) of one partition, the unit a Spark task copies."""

    topic: str
    partition: int
    start: int
    end: int
    index: int = 0  # position among the ranges of its partition
    count: int = 1  # ranges of its partition

    @property
    def offsets(self) -> int:
        return self.end - self.start

    @property
    def source_partition(self) -> SourcePartition:
        return (self.topic, self.partition)

    def __str__(self) -> str:
        return (
            f"{self.topic}-{self.partition} [{self.start}, {self.end}) "
            f"(range {self.index + 1}/{self.count})"
        )


def split_offsets(start: int, end: int, max_records: int) -> list[tuple[int, int]]:
    """[start, end) as the fewest near-equal ranges of at most `max_records` offsets."""
    if max_records < 1:
        raise ValueError(f"max_records must be at least 1, not {max_records}")
    total = end - start
    if total <= 0:
        return []
    parts = math.ceil(total / max_records)
    bounds = [start + total * i // parts for i in range(parts + 1)]
    return list(pairwise(bounds))


@dataclass(frozen=True)
class BackfillPlan:
    """Every range to copy, and the progress to record where there is nothing to copy."""

    ranges: tuple[OffsetRange, ...]
    # Partitions with nothing to copy whose progress must still move to end - 1 so the
    # daemon continues there (e.g. --from later than every record, or only aborted data).
    progress_only: Mapping[SourcePartition, int] = field(default_factory=dict)
    # Partitions already copied up to their end (by the daemon or an earlier run).
    already_copied: frozenset[SourcePartition] = frozenset()

    @property
    def offsets(self) -> int:
        return sum(r.offsets for r in self.ranges)

    @property
    def partitions(self) -> set[SourcePartition]:
        return {r.source_partition for r in self.ranges}


def plan_backfill(bounds: Iterable[PartitionBounds], max_range_records: int) -> BackfillPlan:
    """Ranges for every partition, split so none holds more than `max_range_records` offsets."""
    ranges: list[OffsetRange] = []
    progress_only: dict[SourcePartition, int] = {}
    already: set[SourcePartition] = set()
    for b in sorted(bounds, key=lambda b: (b.topic, b.partition)):
        key = (b.topic, b.partition)
        start = b.start
        if start >= b.end:
            if b.last_copied is not None and b.last_copied >= b.end - 1:
                already.add(key)
            elif b.end > 0:
                progress_only[key] = b.end - 1
            continue
        parts = split_offsets(start, b.end, max_range_records)
        for i, (lo, hi) in enumerate(parts):
            ranges.append(OffsetRange(b.topic, b.partition, lo, hi, i, len(parts)))
    return BackfillPlan(tuple(ranges), progress_only, frozenset(already))


class RangeScheduler:
    """Hands out ranges so that a partition's ranges run one at a time, in order.

    `next_range()` gives a range of a partition that has none running, choosing
    the partition with the most offsets left (longest chains first balances the
    slots); `finished()` makes the partition's next range available.
    """

    def __init__(self, ranges: Iterable[OffsetRange]) -> None:
        self._pending: dict[SourcePartition, deque[OffsetRange]] = {}
        for r in sorted(ranges):
            self._pending.setdefault(r.source_partition, deque()).append(r)
        self._running: set[SourcePartition] = set()

    def next_range(self) -> OffsetRange | None:
        """The next range to start, or None while every partition with work has one running."""
        best: SourcePartition | None = None
        best_left = -1
        for key, queue in self._pending.items():
            if key in self._running or not queue:
                continue
            left = sum(r.offsets for r in queue)
            if left > best_left:
                best, best_left = key, left
        if best is None:
            return None
        self._running.add(best)
        return self._pending[best][0]

    def finished(self, done: OffsetRange) -> None:
        """`done` was copied completely."""
        queue = self._pending[done.source_partition]
        if not queue or queue[0] != done:
            raise ValueError(f"{done} is not the running range of its partition")
        queue.popleft()
        self._running.discard(done.source_partition)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def done(self) -> bool:
        return not self._running and not any(self._pending.values())


# -- progress lines ---------------------------------------------------------------

MIB = 1 << 20


@dataclass(frozen=True)
class RangeResult:
    """What the copy of one range did (returned by the Spark task)."""

    range: OffsetRange
    records: int  # copied (committed) records
    bytes: int  # key + value bytes of those records
    seconds: float
    syncs: int  # offset syncs written
    first_downstream: int | None = None  # target offset of the first copied record
    last_downstream: int | None = None
    # Target offsets other writers took during the copy, as the delivery reports show them:
    # at least (those between two runs of records are not seen).
    interleaved: int = 0


@dataclass
class BackfillProgress:
    """Counts for the terminal line and the summary."""

    ranges_total: int
    offsets_total: int
    ranges_done: int = 0
    offsets_done: int = 0
    records: int = 0
    bytes: int = 0
    syncs: int = 0
    interleaved: int = 0
    copy_seconds: float = 0.0  # summed over ranges (busy time of the slots)
    per_topic: dict[str, list[int]] = field(default_factory=dict)  # topic -> [records, bytes]

    def add(self, result: RangeResult) -> None:
        self.ranges_done += 1
        self.offsets_done += result.range.offsets
        self.records += result.records
        self.bytes += result.bytes
        self.syncs += result.syncs
        self.interleaved += result.interleaved
        self.copy_seconds += result.seconds
        topic = self.per_topic.setdefault(result.range.topic, [0, 0])
        topic[0] += result.records
        topic[1] += result.bytes

    def line(self, elapsed: float, in_flight: int = 0, record_bytes: float | None = None) -> str:
        """``12/24 ranges, 1,000,000 records, 976.6 MiB, 95.3 MiB/s, 48%, about 9 s left``.

        `in_flight` records written by running ranges count as copied, with
        `record_bytes` each (the average of the finished ranges when there are some).
        """
        if self.records:
            record_bytes = self.bytes / self.records
        records = self.records + in_flight
        nbytes = self.bytes + in_flight * (record_bytes or 0.0)
        done = min(self.offsets_done + in_flight, self.offsets_total)
        share = done / self.offsets_total if self.offsets_total else 1.0
        rate = nbytes / MIB / elapsed if elapsed > 0 else 0.0
        eta = ""
        if 0 < share < 1 and elapsed > 0:
            eta = f", about {elapsed / share - elapsed:.0f} s left"
        return (
            f"{self.ranges_done}/{self.ranges_total} ranges, {records:,} records, "
            f"{nbytes / MIB:.1f} MiB, {rate:.1f} MiB/s, {share:.0%}{eta}"
        )
