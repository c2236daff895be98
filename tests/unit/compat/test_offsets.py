"""Exact translation from offset syncs (mm2py.compat.offsets)."""

from __future__ import annotations

from mm2py.compat.formats import OffsetSync
from mm2py.compat.offsets import OffsetSyncStore, PartitionSyncs, Translation, UpstreamPosition


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
    syncs = _syncs((0, 0), (21, 10), (30, 19))
    assert syncs.translate(9) == 9
    assert [syncs.translate(n) for n in (10, 15, 20, 21)] == [10, 10, 10, 10]
    assert syncs.translate(25) == 14
    assert syncs.translate(31) == 20  # one past the newest sync: the next record copied


def test_past_the_newest_sync_is_clamped_to_the_next_record_copied() -> None:
    # The replicator copied up to source 21 (target 10); 22..29 may not be copied yet,
    # or copied after a gap whose sync has not arrived: never skip them.
    syncs = _syncs((0, 0), (21, 10))
    assert syncs.translation(22) == Translation(11, exact=True)
    assert syncs.translation(25) == Translation(11, exact=False)
    assert syncs.translation(10**9) == Translation(11, exact=False)
    # Once the replicator's next sync covers the offset, it is exact again.
    syncs.add(29, 18)
    assert syncs.translation(25) == Translation(14, exact=True)


def test_group_at_the_head_of_an_idle_partition_is_exact() -> None:
    # The latest copied record is synced; a group that read everything is one past it.
    syncs = _syncs((0, 0), (41, 30))
    assert syncs.translation(42) == Translation(31, exact=True)


def test_before_the_first_sync_is_untranslatable() -> None:
    assert _syncs((100, 5)).translate(99) is None
    assert PartitionSyncs().translate(0) is None
    assert PartitionSyncs().first_upstream is None
    assert _syncs((100, 5), (200, 105)).first_upstream == 100


def test_a_recopy_after_a_crash_supersedes_the_first_copy() -> None:
    # First run copied 0..99 to 0..99 (tip sync at 99); a crash lost progress after 49,
    # so the second run copies 50.. again, to 100..
    syncs = _syncs((0, 0), (99, 99), (50, 100))
    assert syncs.translate(49) == 49
    assert syncs.translate(50) == 100
    assert syncs.translate(99) == 101  # not proven yet: the second copy may not be there
    syncs.add(99, 149)  # the second run's tip sync
    assert syncs.translate(99) == 149
    assert syncs.translate(100) == 150


def test_syncs_in_line_with_their_neighbours_are_not_kept() -> None:
    # A tip sync every second for a steady partition: only the ends matter.
    syncs = _syncs(*((n * 100, n * 100) for n in range(1000)))
    assert syncs.upstream == [0, 99_900]
    # A discontinuity starts a new line; its tip syncs collapse again.
    for u, d in ((100_010, 99_901), (100_020, 99_911), (100_030, 99_921)):
        syncs.add(u, d)
    assert list(zip(syncs.upstream, syncs.downstream, strict=True)) == [
        (0, 0),
        (99_900, 99_900),
        (100_010, 99_901),
        (100_030, 99_921),
    ]
    assert [syncs.translate(n) for n in (99_900, 99_950, 100_010, 100_025)] == [
        99_900,
        99_901,
        99_901,
        99_916,
    ]


def test_dropping_in_line_syncs_never_changes_a_translation() -> None:
    pairs = [(0, 0), (5, 5), (9, 9), (20, 10), (25, 15), (30, 20), (31, 21), (40, 22)]
    full = PartitionSyncs(upstream=[u for u, _ in pairs], downstream=[d for _, d in pairs])
    compact = _syncs(*pairs)
    assert len(compact.upstream) < len(pairs)
    assert [compact.translation(n) for n in range(45)] == [full.translation(n) for n in range(45)]


def test_store_keeps_partitions_apart() -> None:
    store = OffsetSyncStore()
    store.add_all([OffsetSync("t", 0, 0, 0), OffsetSync("t", 0, 9, 9), OffsetSync("t", 1, 5, 0)])
    assert store.translate("t", 0, 7) == 7
    assert store.translate("t", 1, 5) == 0
    assert store.translate("t", 1, 7) == 1
    assert store.translation("t", 1, 7) == Translation(1, exact=False)
    assert store.translate("u", 0, 7) is None


def test_where_compaction_removed_syncs_only_one_past_the_earlier_sync_is_proven() -> None:
    # Syncs of partition 0 at log offsets 0 and 5 (1..4, some of them its own, were
    # compacted away): between them the records may have had gaps.
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0), log_offset=0)
    store.add(OffsetSync("t", 0, 50, 30), log_offset=5)
    store.add(OffsetSync("t", 0, 60, 40), log_offset=6)
    assert store.translation("t", 0, 0) == Translation(0, exact=True)
    assert store.translation("t", 0, 20) == Translation(1, exact=False)
    assert store.translation("t", 0, 50) == Translation(30, exact=True)
    assert store.translation("t", 0, 55) == Translation(35, exact=True)
    # A partition whose syncs are dense in the log is not affected by gaps elsewhere.
    store.add(OffsetSync("u", 0, 0, 0), log_offset=7)
    store.add(OffsetSync("u", 0, 9, 9), log_offset=8)
    assert store.translation("u", 0, 5) == Translation(5, exact=True)


def test_a_gapped_sync_is_never_merged_into_a_line() -> None:
    syncs = _syncs((0, 0), (10, 10))
    syncs.add(20, 20, after_gap=True)
    syncs.add(30, 30)
    assert syncs.upstream == [0, 10, 20, 30]
    assert syncs.translation(15) == Translation(11, exact=False)
    assert syncs.translation(25) == Translation(25, exact=True)


def test_between_syncs_not_both_marked_by_mm2py_only_one_past_the_earlier_is_proven() -> None:
    # MM2 replicated offsets 0..99 of a transactional topic (markers at 40 and 80: the
    # target has 98 records) and wrote sparse syncs; mm2py took over at 100.
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0), contiguous=False)
    store.add(OffsetSync("t", 0, 99, 97), contiguous=False)
    store.add(OffsetSync("t", 0, 100, 98), contiguous=True)
    store.add(OffsetSync("t", 0, 150, 148), contiguous=True)
    # 0 + 60 would be past the record at source offset 60 (target 59): not claimed.
    assert store.translation("t", 0, 60) == Translation(1, exact=False)
    assert store.translation("t", 0, 99) == Translation(97, exact=True)
    assert store.translation("t", 0, 100) == Translation(98, exact=True)
    assert store.translation("t", 0, 120) == Translation(118, exact=True)  # both marked


def test_marked_syncs_after_unmarked_ones_are_not_merged_away() -> None:
    store = OffsetSyncStore()
    for upstream in (0, 10, 20):
        store.add(OffsetSync("t", 0, upstream, upstream), contiguous=False)
    assert store.partitions[("t", 0)].upstream == [0, 10, 20]
    assert store.translation("t", 0, 15) == Translation(11, exact=False)


def test_the_first_sync_after_a_start_proves_nothing_about_the_span_before_it() -> None:
    # A writer synced (0, 0), then copied 1..49 with a source gap at 20..21 (markers:
    # 22 landed at 20) and died before it sent that sync; the next writer started at 50.
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0))
    store.add(OffsetSync("t", 0, 50, 48), after_start=True)
    # 0 + 30 would be past the record at source offset 30 (target 28): not claimed.
    assert store.translation("t", 0, 30) == Translation(1, exact=False)
    assert store.translation("t", 0, 50) == Translation(48, exact=True)
    # Without the mark the two syncs would vouch for the records between them.
    trusting = OffsetSyncStore()
    trusting.add(OffsetSync("t", 0, 0, 0))
    trusting.add(OffsetSync("t", 0, 50, 48))
    assert trusting.translation("t", 0, 30) == Translation(30, exact=True)


def test_a_position_sync_proves_a_group_at_the_end_past_markers_and_nothing_beyond() -> None:
    # Records 0..249 copied to 0..249, then a commit marker at 250: a group that read
    # everything sits at 251. The writer syncs that position: (251, 250).
    syncs = _syncs((0, 0), (249, 249))
    assert syncs.translation(251) == Translation(250, exact=False)  # issue 24: not proven
    syncs.add(251, 250, position=True)
    assert syncs.translation(251) == Translation(250, exact=True)
    assert syncs.translation(250) == Translation(250, exact=True)  # the marker's offset
    assert syncs.translation(249) == Translation(249, exact=True)
    # No record is known at 251: 252 may be past it, or not (251 aborted, say).
    assert syncs.translation(252) == Translation(250, exact=False)
    assert syncs.translation(300) == Translation(250, exact=False)
    # 251 was a record, copied to 250: synced as a record, 252 is exact again.
    syncs.add(251, 250)
    assert syncs.position == [False, False, False]
    assert syncs.translation(252) == Translation(251, exact=True)


def test_a_position_sync_continues_into_the_records_copied_after_it() -> None:
    # Position (251, 250); then aborted records 251..260 and their marker 261: the next
    # record, 262, lands at 250 (a sync there: the distance changed), 263.. after it.
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0))
    store.add(OffsetSync("t", 0, 249, 249))
    store.add(OffsetSync("t", 0, 251, 250), position=True)
    store.add(OffsetSync("t", 0, 262, 250))
    store.add(OffsetSync("t", 0, 270, 258))
    assert [store.translation("t", 0, n) for n in (251, 252, 261, 262, 265)] == [
        Translation(250, exact=True),
        Translation(250, exact=True),
        Translation(250, exact=True),
        Translation(250, exact=True),
        Translation(253, exact=True),
    ]
    # Where compaction removed syncs after a position's, only the position is proven.
    gapped = PartitionSyncs()
    gapped.add(0, 0)
    gapped.add(251, 250, position=True)
    gapped.add(300, 280, after_gap=True)
    assert gapped.translation(260) == Translation(250, exact=False)


# ------------------------------------------------ back from the target (failback)


def test_a_target_position_translates_back_exactly_between_proving_syncs() -> None:
    # Records 0..9 copied to 0..9; 10..20 not copied (aborted, a marker); 21..29 to 10..18.
    syncs = _syncs((0, 0), (21, 10), (30, 19))
    back = [syncs.upstream_position(d) for d in (0, 5, 10, 15, 19, 20)]
    assert back == [
        UpstreamPosition(0, exact=True),
        UpstreamPosition(5, exact=True),
        UpstreamPosition(21, exact=True),  # read 0..9: 10..20 hold no record to read
        UpstreamPosition(26, exact=True),
        UpstreamPosition(30, exact=True),
        UpstreamPosition(31, exact=True),  # read the last record copied, 30
    ]
    # Each exact position is where the forward translation sends it again.
    for d in (0, 5, 10, 15, 19, 20):
        found = syncs.upstream_position(d)
        assert found is not None and syncs.translate(found.upstream) == d


def test_a_target_gap_translates_back_to_the_next_record() -> None:
    # Transactions on the target: records 0..4 at 0..4, a commit marker at 5, 5.. at 6...
    syncs = _syncs((0, 0), (5, 6), (9, 10))
    assert syncs.upstream_position(5) == UpstreamPosition(5, exact=True)  # the marker
    assert syncs.upstream_position(8) == UpstreamPosition(7, exact=True)


def test_back_past_the_newest_sync_only_the_next_record_is_proven() -> None:
    syncs = _syncs((0, 0), (21, 10))
    assert syncs.upstream_position(11) == UpstreamPosition(22, exact=True)
    # 11.. may be copies of records after a gap whose sync has not come: read again.
    assert syncs.upstream_position(12) == UpstreamPosition(22, exact=False)
    assert syncs.upstream_position(40) == UpstreamPosition(22, exact=False)


def test_back_across_syncs_that_do_not_prove_contiguity_is_not_exact() -> None:
    gapped = _syncs((0, 0))
    gapped.add(50, 48, after_gap=True)
    assert gapped.upstream_position(30) == UpstreamPosition(1, exact=False)
    assert gapped.upstream_position(48) == UpstreamPosition(50, exact=True)
    store = OffsetSyncStore()
    store.add(OffsetSync("t", 0, 0, 0), contiguous=False)
    store.add(OffsetSync("t", 0, 99, 97), contiguous=False)
    assert store.upstream_position("t", 0, 60) == UpstreamPosition(1, exact=False)
    assert store.upstream_position("u", 0, 60) is None


def test_back_before_the_first_sync_or_over_a_target_made_anew_is_unknown() -> None:
    syncs = _syncs((100, 50), (200, 150))
    assert syncs.upstream_position(49) is None
    # The target topic was made anew: the newest sync goes back on the target.
    syncs.add(300, 0)
    assert syncs.upstream_position(120) is None


def test_back_from_a_position_sync() -> None:
    syncs = _syncs((0, 0), (249, 249))
    syncs.add(251, 250, position=True)
    assert syncs.upstream_position(250) == UpstreamPosition(251, exact=True)
    # A record was copied at 250 after the position, which one is not known.
    assert syncs.upstream_position(251) == UpstreamPosition(251, exact=False)
