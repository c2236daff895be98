"""The copier's offset-sync rules from the few acknowledged records of a transaction."""

from __future__ import annotations

from typing import Any

from mm2py.backfill.copier import RangeTask, _Marks
from mm2py.backfill.plan import OffsetRange


class _Msg:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def offset(self) -> int:
        return self._offset


def _marks() -> _Marks:
    task = RangeTask("A->B", "A", "B", OffsetRange("t", 0, 0, 1000), "A.t", "id", "p", 1, {}, {})
    return _Marks(task)


def _ack(marks: _Marks, upstream: int, index: int, downstream: int, err: Any = None) -> None:
    marks.ack(upstream, index, err, _Msg(downstream))


def test_contiguous_records_need_the_first_and_the_latest_sync() -> None:
    marks = _marks()
    _ack(marks, 100, 0, 0)  # first record of the transaction
    _ack(marks, 149, 49, 49)  # last of a consumed batch
    assert marks.committed(last_upstream=199, last_index=99) == [(100, 0), (199, 99)]
    assert marks.first_downstream == 0 and marks.last == (199, 99) and marks.interleaved == 0


def test_a_source_gap_is_a_sync_and_the_next_transaction_starts_after_its_marker() -> None:
    marks = _marks()
    _ack(marks, 0, 0, 0)
    _ack(marks, 20, 10, 10)  # offsets 10..19 were aborted or markers on the source
    assert marks.committed(29, 19) == [(0, 0), (20, 10), (29, 19)]
    # The commit marker takes target offset 20: the next record lands at 21.
    _ack(marks, 30, 20, 21)
    assert marks.committed(39, 29) == [(30, 21), (39, 30)]


def test_same_distance_across_a_commit_needs_no_new_sync() -> None:
    marks = _marks()
    _ack(marks, 0, 0, 0)
    assert marks.committed(9, 9) == [(0, 0), (9, 9)]
    # A source marker at 10 and our commit marker at 10 keep the distance.
    _ack(marks, 11, 10, 11)
    assert marks.committed(11, 10) == [(11, 11)]  # only the latest record


def test_records_of_another_producer_in_between_are_counted_and_synced_around() -> None:
    marks = _marks()
    _ack(marks, 0, 0, 0)
    _ack(marks, 99, 99, 104)  # 5 foreign records landed among ours
    assert marks.committed(99, 99) == [(0, 0), (99, 104)]
    assert marks.interleaved == 5


def test_a_rejected_record_stops_the_copy_without_an_offset() -> None:
    marks = _marks()
    _ack(marks, 0, 0, 0, err=object())
    assert marks.failed and marks.acks == []
