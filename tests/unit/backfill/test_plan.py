"""Backfill planning: time bounds, start/end offsets, splitting, scheduling, progress lines."""

from __future__ import annotations

from itertools import pairwise

import pytest

from mm2py.backfill.plan import (
    MIB,
    BackfillProgress,
    OffsetRange,
    PartitionBounds,
    RangeResult,
    RangeScheduler,
    TimeBoundError,
    parse_time_bound,
    plan_backfill,
    split_offsets,
)

# -- --from / --until --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", None),
        (" EARLIEST ", None),
        ("1700000000000", 1_700_000_000_000),
        ("0", 0),
        ("2024-05-01", 1_714_521_600_000),  # midnight UTC
        ("2024-05-01T12:00:00Z", 1_714_564_800_000),
        ("2024-05-01T14:00:00+02:00", 1_714_564_800_000),
        ("2024-05-01T12:00:00.250", 1_714_564_800_250),  # no zone: UTC
    ],
)
def test_from_bounds(text: str, expected: int | None) -> None:
    assert parse_time_bound(text, "earliest") == expected


def test_until_keyword_is_now() -> None:
    assert parse_time_bound("now", "now") is None
    with pytest.raises(TimeBoundError, match="'earliest' is not 'now'"):
        parse_time_bound("earliest", "now")


@pytest.mark.parametrize("text", ["yesterday", "-5", "2024-13-01", "1.5e12", ""])
def test_bad_time_bounds_say_what_is_accepted(text: str) -> None:
    with pytest.raises(TimeBoundError, match=r"ISO-8601 time .* or epoch milliseconds"):
        parse_time_bound(text, "earliest")


# -- start offsets -----------------------------------------------------------------


def test_start_is_the_log_start_without_from_or_progress() -> None:
    assert PartitionBounds("t", 0, earliest=40, end=100).start == 40


def test_start_follows_from_and_progress_whichever_is_later() -> None:
    assert PartitionBounds("t", 0, 40, 100, from_offset=60).start == 60
    assert PartitionBounds("t", 0, 40, 100, from_offset=10).start == 40  # deleted already
    assert PartitionBounds("t", 0, 40, 100, from_offset=60, last_copied=79).start == 80
    assert PartitionBounds("t", 0, 40, 100, from_offset=90, last_copied=79).start == 90
    assert PartitionBounds("t", 0, 40, 100, last_copied=20).start == 40


# -- splitting ---------------------------------------------------------------------


def test_split_into_fewest_near_equal_ranges() -> None:
    assert split_offsets(0, 10, 4) == [(0, 3), (3, 6), (6, 10)]
    assert split_offsets(100, 300, 100) == [(100, 200), (200, 300)]
    assert split_offsets(5, 6, 100) == [(5, 6)]
    assert split_offsets(5, 5, 100) == []
    assert split_offsets(7, 5, 100) == []


@pytest.mark.parametrize(("start", "end", "most"), [(0, 1_000_003, 7), (13, 250_000, 100_000)])
def test_split_ranges_cover_every_offset_once(start: int, end: int, most: int) -> None:
    parts = split_offsets(start, end, most)
    assert parts[0][0] == start and parts[-1][1] == end
    assert all(a[1] == b[0] for a, b in pairwise(parts))
    sizes = [hi - lo for lo, hi in parts]
    assert max(sizes) <= most and max(sizes) - min(sizes) <= 1


def test_split_rejects_a_zero_size() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        split_offsets(0, 10, 0)


# -- plans -------------------------------------------------------------------------


def test_plan_splits_large_partitions_and_keeps_small_ones_whole() -> None:
    plan = plan_backfill(
        [
            PartitionBounds("big", 0, 0, 250),
            PartitionBounds("small", 0, 0, 30),
            PartitionBounds("small", 1, 10, 10),  # empty partition (retention)
        ],
        max_range_records=100,
    )
    assert plan.ranges == (
        OffsetRange("big", 0, 0, 83, 0, 3),
        OffsetRange("big", 0, 83, 166, 1, 3),
        OffsetRange("big", 0, 166, 250, 2, 3),
        OffsetRange("small", 0, 0, 30, 0, 1),
    )
    assert plan.offsets == 280
    assert plan.partitions == {("big", 0), ("small", 0)}
    # Progress moves to end - 1 so the daemon continues at 10, not at the log start.
    assert plan.progress_only == {("small", 1): 9}


def test_plan_resumes_after_recorded_progress() -> None:
    plan = plan_backfill(
        [
            PartitionBounds("t", 0, 0, 300, last_copied=149),  # an earlier run got this far
            PartitionBounds("t", 1, 0, 300, last_copied=299),  # done
            PartitionBounds("t", 2, 0, 300, last_copied=450),  # the daemon went further
        ],
        max_range_records=100,
    )
    assert [(r.start, r.end) for r in plan.ranges] == [(150, 225), (225, 300)]
    assert plan.already_copied == {("t", 1), ("t", 2)}
    assert plan.progress_only == {}


def test_plan_with_from_after_every_record_only_moves_progress() -> None:
    plan = plan_backfill([PartitionBounds("t", 0, 0, 50, from_offset=50)], 100)
    assert plan.ranges == ()
    assert plan.progress_only == {("t", 0): 49}


def test_plan_of_an_empty_topic_is_empty() -> None:
    plan = plan_backfill([PartitionBounds("t", 0, 0, 0)], 100)
    assert plan.ranges == () and plan.progress_only == {} and plan.already_copied == set()


def test_range_text_names_partition_offsets_and_position() -> None:
    assert str(OffsetRange("t", 3, 100, 200, 1, 4)) == "t-3 [100, 200) (range 2/4)"


# -- scheduling: one range per partition at a time, in order -------------------------


def _ranges(**sizes: int) -> list[OffsetRange]:
    plan = plan_backfill([PartitionBounds(t, 0, 0, n) for t, n in sizes.items()], 100)
    return list(plan.ranges)


def test_scheduler_never_runs_two_ranges_of_a_partition_at_once() -> None:
    scheduler = RangeScheduler(_ranges(a=300, b=100))
    first = scheduler.next_range()
    second = scheduler.next_range()
    assert first == OffsetRange("a", 0, 0, 100, 0, 3)  # the longest chain first
    assert second == OffsetRange("b", 0, 0, 100, 0, 1)
    assert scheduler.next_range() is None  # a's next range waits for its first
    assert scheduler.running == 2
    scheduler.finished(first)
    assert scheduler.next_range() == OffsetRange("a", 0, 100, 200, 1, 3)
    assert scheduler.next_range() is None


def test_scheduler_hands_out_every_range_in_offset_order() -> None:
    ranges = _ranges(a=350, b=120, c=40)
    scheduler = RangeScheduler(reversed(ranges))
    seen: list[OffsetRange] = []
    while not scheduler.done:
        running = []
        while (r := scheduler.next_range()) is not None:
            running.append(r)
        assert len({r.source_partition for r in running}) == len(running)
        for r in running:
            scheduler.finished(r)
            seen.append(r)
    assert sorted(seen) == sorted(ranges)
    for topic in "abc":
        starts = [r.start for r in seen if r.topic == topic]
        assert starts == sorted(starts)


def test_scheduler_refuses_to_finish_a_range_that_is_not_running_first() -> None:
    ranges = _ranges(a=200)
    scheduler = RangeScheduler(ranges)
    scheduler.next_range()
    with pytest.raises(ValueError, match=r"a-0 \[100, 200\)"):
        scheduler.finished(ranges[1])


# -- progress --------------------------------------------------------------------


def test_progress_line_counts_ranges_records_and_rate() -> None:
    progress = BackfillProgress(ranges_total=4, offsets_total=400)
    progress.add(RangeResult(OffsetRange("t", 0, 0, 100), 98, 98 * 1024, 1.0, 3))
    progress.add(RangeResult(OffsetRange("t", 1, 0, 100), 100, 100 * 1024, 1.0, 2, interleaved=1))
    assert progress.line(elapsed=2.0) == (
        "2/4 ranges, 198 records, 0.2 MiB, 0.1 MiB/s, 50%, about 2 s left"
    )
    assert progress.syncs == 5 and progress.interleaved == 1
    assert progress.per_topic == {"t": [198, 198 * 1024]}


def test_progress_line_counts_records_of_running_ranges() -> None:
    progress = BackfillProgress(ranges_total=2, offsets_total=2048)
    # Nothing finished yet: the records written so far, at the sampled record size.
    assert progress.line(4.0, in_flight=1024, record_bytes=1024.0) == (
        "0/2 ranges, 1,024 records, 1.0 MiB, 0.2 MiB/s, 50%, about 4 s left"
    )
    assert progress.line(4.0) == "0/2 ranges, 0 records, 0.0 MiB, 0.0 MiB/s, 0%"
    # Once a range finished, its average record size counts.
    progress.add(RangeResult(OffsetRange("t", 0, 0, 1024), 1024, 2 * MIB, 2.0, 1))
    assert progress.line(4.0, in_flight=1024, record_bytes=1.0) == (
        "1/2 ranges, 2,048 records, 4.0 MiB, 1.0 MiB/s, 100%"
    )
