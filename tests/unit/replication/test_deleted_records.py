"""DeletedRecordWatch through its API: which jumps in a watched partition's offsets are
reported as possibly deleted records, and when a partition stops being watched."""

from __future__ import annotations

from typing import Any

from mm2py.replication.deleted_records import UNTIL_FOUND, DeletedRecordWatch


class Msg:
    def __init__(self, topic: str, partition: int, offset: int) -> None:
        self._where = (topic, partition, offset)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def error(self) -> Any:
        return None


def _watch() -> tuple[DeletedRecordWatch, list[tuple[tuple[str, int], int, int]]]:
    gaps: list[tuple[tuple[str, int], int, int]] = []
    return DeletedRecordWatch(lambda where, a, b: gaps.append((where, a, b))), gaps


def test_a_partition_starting_past_its_start_offset_reports_the_gap_once() -> None:
    watch, gaps = _watch()
    watch.start(("t", 0), 10)
    assert watch and ("t", 0) in watch
    watch.check([Msg("t", 0, 25), Msg("t", 0, 27)])
    assert gaps == [(("t", 0), 10, 25)]
    assert not watch  # the first record ended the watch: the jump to 27 is not looked at


def test_a_partition_starting_where_expected_reports_nothing() -> None:
    watch, gaps = _watch()
    watch.start(("t", 0), 10)
    watch.check([Msg("t", 0, 10)])
    assert gaps == [] and watch.watched == {}


def test_after_a_reset_records_fetched_before_it_are_passed_over() -> None:
    watch, gaps = _watch()
    watch.reset(("t", 1), 40)
    assert watch.watched == {("t", 1): (40, UNTIL_FOUND)}
    watch.check([Msg("t", 1, 38), Msg("t", 1, 39)])  # fetched before the reset
    assert gaps == [] and ("t", 1) in watch
    watch.check([Msg("t", 1, 55)])
    assert gaps == [(("t", 1), 40, 55)] and not watch


def test_a_reset_at_the_start_offset_keeps_the_start_watch() -> None:
    watch, _ = _watch()
    watch.start(("t", 0), 5)
    watch.reset(("t", 0), 5)
    assert watch.watched == {("t", 0): (5, 6)}


def test_behind_watches_until_the_log_start_and_ignores_markers_below_it() -> None:
    watch, gaps = _watch()
    watch.behind(("t", 0), low=50, high=80, last_read=9, stopped=False)
    assert watch.watched == {("t", 0): (10, 50)}
    watch.check([Msg("t", 0, 10), Msg("t", 0, 12)])  # a marker at 11: below the log start
    assert gaps == [] and watch.watched == {("t", 0): (13, 50)}
    watch.check([Msg("t", 0, 60)])
    assert gaps == [(("t", 0), 13, 60)] and not watch


def test_behind_leaves_a_stopped_partition_and_one_not_passed_alone() -> None:
    watch, _ = _watch()
    watch.behind(("t", 0), low=50, high=80, last_read=9, stopped=True)
    watch.behind(("t", 1), low=10, high=80, last_read=9, stopped=False)
    watch.behind(("t", 2), low=50, high=80, last_read=None, stopped=False)
    assert not watch


def test_a_start_with_nothing_to_read_stops_being_watched() -> None:
    watch, gaps = _watch()
    watch.start(("t", 0), 20)
    watch.behind(("t", 0), low=20, high=20, last_read=19, stopped=False)
    assert not watch and gaps == []


def test_a_partition_gone_back_is_no_longer_watched_and_forget_drops_one() -> None:
    watch, gaps = _watch()
    watch.start(("t", 0), 20)
    watch.check([Msg("t", 0, 3)])  # its topic was created anew
    assert not watch and gaps == []
    watch.start(("t", 1), 0)
    watch.forget(("t", 1))
    assert not watch
