"""Offset translation from offset syncs (pure).

mm2py's source part writes a sync at the first record it copies after a start,
wherever source and target offsets stop advancing together, and for its latest
copied record every second. So between two consecutive syncs (u1, d1) and
(u2, d2) of a partition the copied records are contiguous on the target, and
the first record at or after source offset N is on the target at

    min(d1 + (N - u1), d2)      for the last sync with u1 <= N

(the `min` covers N inside a source gap: aborted records, transaction markers,
compacted-away records; the next copied record is the one synced at d2).

Past the newest sync (u, d) the syncs prove less. N = u + 1 translates to d + 1:
the next record copied lands there. For N > u + 1 the records u+1 .. N-1 may not
be copied yet, or copied with a gap whose sync is still on its way; counting on
them could point past a record the group never consumed. So N is clamped to
d + 1, a safe position: at most N - u - 1 records are read again, and none once
the replicator's next sync covers N (it writes its latest copied record every
second), which is why a checkpoint is re-emitted when its translation improves.
`Translation.exact` says which of the two a result is.

Syncs written by MM2 are sparser and carry no such guarantee; translating them
this way still never points past an unconsumed record when the topic has no
gaps, which is the case MM2's own translation covers.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

from mm2py.formats import OffsetSync


@dataclass(frozen=True, slots=True)
class Translation:
    """Where a source offset is on the target.

    `downstream` is the target offset of the first copied record at or after the
    source offset when `exact`; otherwise (the offset is past what the syncs
    cover) a position at or before it, never after an unconsumed record.
    """

    downstream: int
    exact: bool


@dataclass
class PartitionSyncs:
    """The offset syncs of one source partition, ordered by upstream offset."""

    upstream: list[int] = field(default_factory=list)
    downstream: list[int] = field(default_factory=list)

    def add(self, upstream: int, downstream: int) -> None:
        """Record a sync; a newer sync for an upstream offset already known replaces it.

        A restart of the replicator re-copies records and syncs them again with new
        downstream offsets: everything at or after the new sync is superseded.

        A sync in line with the one before and the one after it (same distance
        between source and target offset) translates nothing the two others do not,
        so it is dropped: the store keeps one sync per discontinuity, not one per
        second of replication.
        """
        i = bisect_right(self.upstream, upstream)
        if i and self.upstream[i - 1] == upstream:
            i -= 1
        if i < len(self.upstream) and self.downstream[i] != downstream + (
            self.upstream[i] - upstream
        ):
            # Later syncs describe an earlier copy of the same records: drop them.
            del self.upstream[i:], self.downstream[i:]
        if i < len(self.upstream) and self.upstream[i] == upstream:
            self.downstream[i] = downstream
            return
        if i == len(self.upstream) >= 2 and (
            self.upstream[-1] - self.downstream[-1]
            == self.upstream[-2] - self.downstream[-2]
            == upstream - downstream
        ):
            self.upstream[-1], self.downstream[-1] = upstream, downstream
            return
        self.upstream.insert(i, upstream)
        self.downstream.insert(i, downstream)

    def translation(self, offset: int) -> Translation | None:
        """Target position of source `offset` (see the module docstring).

        None when `offset` is before the first sync (the record was not copied, or
        its syncs are gone).
        """
        i = bisect_right(self.upstream, offset) - 1
        if i < 0:
            return None
        upstream, downstream = self.upstream[i], self.downstream[i]
        if i + 1 < len(self.upstream):
            return Translation(min(downstream + (offset - upstream), self.downstream[i + 1]), True)
        if offset <= upstream + 1:
            return Translation(downstream + (offset - upstream), True)
        return Translation(downstream + 1, False)

    def translate(self, offset: int) -> int | None:
        """Target offset of the first copied record at or after source `offset`, or None.

        Past the newest sync, clamped to one past it (see `translation`).
        """
        found = self.translation(offset)
        return found.downstream if found else None

    @property
    def first_upstream(self) -> int | None:
        """The oldest source offset a sync covers, or None without syncs."""
        return self.upstream[0] if self.upstream else None


class OffsetSyncStore:
    """Offset syncs of every source partition of one flow, as read from the sync topic."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], PartitionSyncs] = {}

    def add(self, sync: OffsetSync) -> None:
        key = (sync.topic, sync.partition)
        syncs = self.partitions.get(key)
        if syncs is None:
            syncs = self.partitions[key] = PartitionSyncs()
        syncs.add(sync.upstream_offset, sync.downstream_offset)

    def add_all(self, syncs: Iterable[OffsetSync]) -> None:
        for sync in syncs:
            self.add(sync)

    def translation(self, topic: str, partition: int, offset: int) -> Translation | None:
        """Target position of `offset` of `topic`-`partition` (see `PartitionSyncs.translation`)."""
        syncs = self.partitions.get((topic, partition))
        return syncs.translation(offset) if syncs else None

    def translate(self, topic: str, partition: int, offset: int) -> int | None:
        """Target offset of the first copied record at or after `offset` of `topic`-`partition`."""
        syncs = self.partitions.get((topic, partition))
        return syncs.translate(offset) if syncs else None
