"""Exact translation from offset syncs (mm2py.offsets)."""

from __future__ import annotations

from mm2py.formats import OffsetSync
from mm2py.offsets import OffsetSyncStore, PartitionSyncs


def _syncs(*pairs: tuple[int, int]) -> PartitionSyncs:
    syncs = PartitionSyncs()
    for upstream, downstream in pairs:
        syncs.add(upstream, downstream)
    return syncs


def test_contiguous_run_translates_exactly_from_one_sync() -> None:
    syncs = _syncs((0, 0), (99_999, 99_999))
    assert [syncs.translate(n) for n in (0, 10, 50_000, 99_999, 100_000)] == [
        0,
        10,
        50_000,
        99_999,
        100_000,
    ]


def test_offsets_inside_a_source_gap_go_to_the_next_copied_record() -> None:
    # Records 0..9 copied to 0..9; 10..19 aborted, 20 a marker; 21.. copied from 10.
    syncs = _syncs((0, 0), (21, 10))
    assert syncs.translate(9) == 9
    assert [syncs.translate(n) for n in (10, 15, 20, 21)] == [10, 10, 10, 10]
    assert syncs.translate(25) == 14


def test_before_the_first_sync_is_untranslatable() -> None:
    assert _syncs((100, 5)).translate(99) is None
    assert PartitionSyncs().translate(0) is None


def test_a_recopy_after_a_crash_supersedes_the_first_copy() -> None:
    # First run copied 0..99 to 0..99 (tip sync at 99); a crash lost progress after 49,
    # so the second run copies 50.. again, to 100..
    syncs = _syncs((0, 0), (99, 99), (50, 100))
    assert syncs.translate(49) == 49
    assert syncs.translate(50) == 100
    assert syncs.translate(99) == 149


def test_store_keeps_partitions_apart() -> None:
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 1, 5, 0)])
    assert store.translate("t", 0, 7) == 7
    assert store.translate("t", 1, 7) == 2
    assert store.translate("u", 0, 7) is None
