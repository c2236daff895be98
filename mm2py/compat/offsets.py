"""Offset translation from offset syncs (pure): source offset -> target offset, and back.

Invariants the translation rests on (the writer, mm2py.replication.offset_syncs, keeps them):

- Between two consecutive syncs (u1, d1), (u2, d2) of a partition that are both mm2py's
  and not separated by compaction, the copied records are contiguous on the target: N
  translates to min(d1 + (N - u1), d2) for the last sync with u1 <= N, exactly.
- Past the newest sync (u, d): N = u + 1 -> d + 1 exactly; any further N is clamped to
  d + 1 (inexact, never past an unconsumed record). Past a position sync (P, d'), which
  marks the source consumer's position, every N > P -> d', inexact.
- Across syncs not both mm2py's (MM2's, or the first after a writer's start) or across a
  compaction gap, N translates to one past the earlier sync, inexact.
- Back (`PartitionSyncs.upstream_position`): D -> min(u1 + (D - d1), u2) on the same
  segments; anything unproven gives one past the earlier sync. Nothing is ever skipped.
- `Translation.exact` says whether a result is exact. Design: docs/design/offset-translation.md.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field

from mm2py.compat.formats import OffsetSync


@dataclass(frozen=True, slots=True)
class Translation:
    """Where a source offset is on the target.

    `downstream` is the target offset of the first copied record at or after the
    source offset when `exact`; otherwise (the offset is past what the syncs
    cover) a position at or before it, never after an unconsumed record. At a
    position sync's offset, before the next record's copy is synced, an exact
    `downstream` is one past the last copy: only another writer's records can lie
    between it and the next copy.
    """

    downstream: int
    exact: bool


@dataclass(frozen=True, slots=True)
class UpstreamPosition:
    """Where a group that read the target copy up to some position stands on the source.

    `upstream` is the source position (the next offset to read) when `exact`; otherwise a
    position at or before it: records may be read again, none is skipped.
    """

    upstream: int
    exact: bool


@dataclass
class PartitionSyncs:
    """The offset syncs of one source partition, ordered by upstream offset.

    `gapped[i]` is true when syncs between sync i-1 and sync i may be missing
    (compaction removed records of the syncs topic between them): the records
    in between are then not known to be contiguous. `position[i]` is true when sync i
    is of a source position, not of a copied record (see the module docstring).
    """

    upstream: list[int] = field(default_factory=list)
    downstream: list[int] = field(default_factory=list)
    gapped: list[bool] = field(default_factory=list)
    position: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.gapped) < len(self.upstream):
            self.gapped += [False] * (len(self.upstream) - len(self.gapped))
        if len(self.position) < len(self.upstream):
            self.position += [False] * (len(self.upstream) - len(self.position))

    def add(
        self, upstream: int, downstream: int, after_gap: bool = False, position: bool = False
    ) -> None:
        """Record a sync; a newer sync for an upstream offset already known replaces it.

        A restart of the replicator re-copies records and syncs them again with new
        downstream offsets: everything at or after the new sync is superseded.
        `after_gap` says syncs of this partition may have been lost just before it;
        `position`: it is of a source position, not of a copied record.

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
            del self.upstream[i:], self.downstream[i:], self.gapped[i:], self.position[i:]
        if i < len(self.upstream) and self.upstream[i] == upstream:
            self.downstream[i] = downstream
            self.gapped[i] = self.gapped[i] or after_gap
            # A copied record's sync says more than a position's at the same place.
            self.position[i] = self.position[i] and position
            return
        if (
            i == len(self.upstream) >= 2
            and not after_gap
            and not self.gapped[-1]
            and (
                self.upstream[-1] - self.downstream[-1]
                == self.upstream[-2] - self.downstream[-2]
                == upstream - downstream
            )
        ):
            self.upstream[-1], self.downstream[-1] = upstream, downstream
            self.position[-1] = position
            return
        self.upstream.insert(i, upstream)
        self.downstream.insert(i, downstream)
        self.gapped.insert(i, after_gap)
        self.position.insert(i, position)

    def translation(self, offset: int) -> Translation | None:
        """Target position of source `offset` (see the module docstring).

        None when `offset` is before the first sync (the record was not copied, or
        its syncs are gone).
        """
        i = bisect_right(self.upstream, offset) - 1
        if i < 0:
            return None
        upstream, downstream = self.upstream[i], self.downstream[i]
        if offset == upstream:
            return Translation(downstream, True)
        # Past a copied record's sync, the next record lands one further; past a
        # position's, the first record at or after it lands at the position's offset.
        step = 0 if self.position[i] else 1
        if i + 1 < len(self.upstream):
            following = self.downstream[i + 1]
            if self.gapped[i + 1]:
                # Syncs in between are gone: only "after the synced record" is proven.
                return Translation(min(downstream + step, following), False)
            return Translation(min(downstream + (offset - upstream), following), True)
        if offset == upstream + 1 and step:
            return Translation(downstream + 1, True)
        return Translation(downstream + step, False)

    def upstream_position(self, downstream: int) -> UpstreamPosition | None:
        """Source position of target position `downstream` (see the module docstring).

        None when `downstream` is before the first sync, or when the syncs go back on
        the target (a target topic truncated or made anew): then they prove nothing here.
        """
        if any(a > b for a, b in zip(self.downstream, self.downstream[1:], strict=False)):
            return None
        i = bisect_right(self.downstream, downstream) - 1
        if i < 0:
            return None
        upstream, synced = self.upstream[i], self.downstream[i]
        if downstream == synced:
            return UpstreamPosition(upstream, True)
        step = 0 if self.position[i] else 1  # the group read the record synced at i
        if i + 1 < len(self.upstream):
            following = self.upstream[i + 1]
            if self.gapped[i + 1]:
                return UpstreamPosition(min(upstream + step, following), False)
            return UpstreamPosition(min(upstream + (downstream - synced), following), True)
        if downstream == synced + 1 and step:
            return UpstreamPosition(upstream + 1, True)
        return UpstreamPosition(upstream + step, False)

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
    """Offset syncs of every source partition of one flow, as read from the sync topic.

    Pass each record's offset in the syncs topic (`log_offset`) when reading it in
    order: a jump means compaction removed syncs there, so the syncs that follow
    are not trusted to be contiguous with the ones before (see `PartitionSyncs`).
    """

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], PartitionSyncs] = {}
        self._next_log_offset: int | None = None
        self._log_gaps = 0
        self._gaps_at: dict[tuple[str, int], int] = {}
        self._contiguous: dict[tuple[str, int], bool] = {}

    def add(
        self,
        sync: OffsetSync,
        log_offset: int | None = None,
        contiguous: bool = True,
        after_start: bool = False,
        position: bool = False,
    ) -> None:
        """Add a sync read from the syncs topic.

        `contiguous` says its writer promises a sync wherever offsets stop advancing
        together (mm2py's mark, see `formats.CONTIGUOUS_SYNC_HEADER`): only between two
        such syncs are the records in between known to be contiguous. `after_start`:
        the first sync of its writer after a start (`formats.AFTER_START_SYNC_HEADER`),
        so syncs just before it may never have been written. `position`: a sync of a
        source position, not of a copied record (`formats.POSITION_SYNC_HEADER`).
        """
        key = (sync.topic, sync.partition)
        if log_offset is not None:
            if self._next_log_offset is not None and log_offset != self._next_log_offset:
                self._log_gaps += 1
            self._next_log_offset = log_offset + 1
        syncs = self.partitions.get(key)
        if syncs is None:
            syncs = self.partitions[key] = PartitionSyncs()
        after_gap = key in self._gaps_at and self._gaps_at[key] != self._log_gaps
        after_gap = after_gap or after_start or not (contiguous and self._contiguous.get(key, True))
        self._gaps_at[key] = self._log_gaps
        self._contiguous[key] = contiguous
        syncs.add(sync.upstream_offset, sync.downstream_offset, after_gap, position)

    def add_all(self, syncs: Iterable[OffsetSync]) -> None:
        for sync in syncs:
            self.add(sync)

    def translation(self, topic: str, partition: int, offset: int) -> Translation | None:
        """Target position of `offset` of `topic`-`partition` (see `PartitionSyncs.translation`)."""
        syncs = self.partitions.get((topic, partition))
        return syncs.translation(offset) if syncs else None

    def upstream_position(
        self, topic: str, partition: int, downstream: int
    ) -> UpstreamPosition | None:
        """Source position of target position `downstream` in the copy of source
        `topic`-`partition` (see `PartitionSyncs.upstream_position`)."""
        syncs = self.partitions.get((topic, partition))
        return syncs.upstream_position(downstream) if syncs else None

    def translate(self, topic: str, partition: int, offset: int) -> int | None:
        """Target offset of the first copied record at or after `offset` of `topic`-`partition`."""
        syncs = self.partitions.get((topic, partition))
        return syncs.translate(offset) if syncs else None
