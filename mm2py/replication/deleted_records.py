"""Which source records were deleted before they were copied: the watch over offsets (pure).

A read_committed consumer's offsets jump over transaction markers and aborted records,
and over records the source deleted (retention, truncation, `delete_records`) when it
resets to the log start offset. The watch tells the two apart without a look at every
record: only a watched partition's records are compared with the offset expected next,
and a jump is reported (`on_gap`) only where deleted records may lie.

A partition is watched
- from its assignment: its first record is expected at its start offset (`start`);
- after librdkafka reset its fetch position (`reset`): the first record at or after the
  position it reset from tells where the gap ends;
- when its log start offset passed what was read (`behind`, from the lag pass): records
  below that log start, fetched before the deletion, still come in order, and only a
  jump at or past it can be a deletion.

`on_gap(where, expected, offset)` says that offsets `expected`..`offset - 1` were not
read; the caller asks the log start offset which of them were deleted (the others were
markers or aborted records). Everything runs on the copy loop's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

SourcePartition = tuple[str, int]

# The `until` of a partition watched after a reset: its first record at or after the
# position it reset from ends the watch.
UNTIL_FOUND = 2**62


class DeletedRecordWatch:
    """The partitions whose next records are compared with the offset expected next."""

    def __init__(self, on_gap: Callable[[SourcePartition, int, int], object]) -> None:
        self._on_gap = on_gap
        # (offset expected next, watch until a record at or after this offset was read).
        self._watched: dict[SourcePartition, tuple[int, int]] = {}

    def __bool__(self) -> bool:
        return bool(self._watched)

    def __contains__(self, where: SourcePartition) -> bool:
        return where in self._watched

    @property
    def watched(self) -> dict[SourcePartition, tuple[int, int]]:
        """What is watched now: partition -> (offset expected next, until)."""
        return dict(self._watched)

    def start(self, where: SourcePartition, offset: int) -> None:
        """The partition starts (is assigned) at `offset`: its first record must be there."""
        self._watched[where] = (offset, offset + 1)

    def forget(self, where: SourcePartition) -> None:
        """The partition is no longer copied."""
        self._watched.pop(where, None)

    def reset(self, where: SourcePartition, position: int) -> None:
        """librdkafka reset the partition's fetch position from `position` (out of range)."""
        watch = self._watched.get(where)
        if watch is not None and watch[1] == watch[0] + 1 and watch[0] == position:
            return  # at its start: the assignment's check is the same
        self._watched[where] = (position, UNTIL_FOUND)

    def check(self, msgs: Sequence[Any]) -> None:
        """Compare the records of watched partitions in a consumed batch with the offsets
        expected; `on_gap` for each jump that may hold deleted records."""
        watched = self._watched
        for msg in msgs:
            where = (msg.topic(), msg.partition())
            watch = watched.get(where)
            if watch is None or msg.error() is not None:
                continue
            expected, until = watch
            offset = msg.offset()
            if until == UNTIL_FOUND:
                if offset < expected:
                    continue  # fetched before the reset
                if offset > expected:
                    self._on_gap(where, expected, offset)
                del watched[where]
                continue
            if offset < expected:
                del watched[where]  # gone back: its topic was created anew
                continue
            # Below `until` (the log start when it was watched; its start offset + 1) a
            # record was fetched before the deletion: a jump there is a transaction marker.
            if offset > expected and offset >= until:
                self._on_gap(where, expected, offset)
            if offset + 1 >= until:
                del watched[where]
            else:
                watched[where] = (offset + 1, until)

    def behind(
        self, where: SourcePartition, low: int, high: int, last_read: int | None, stopped: bool
    ) -> None:
        """The partition's log start offset is `low`, its end `high`, the last offset read
        `last_read` (None: none, from the beginning). Watch it when its log start passed
        what was read (the consumer will reset to it unless it fetched them already);
        stop watching one whose start or reset found nothing to read, so nothing was lost
        (a later deletion is watched for anew). `stopped`: a partition the loop stopped."""
        watch = self._watched.get(where)
        if watch is not None:
            expected, until = watch
            fresh = until in (expected + 1, UNTIL_FOUND)
            if fresh and low <= expected and 0 <= high <= expected:
                del self._watched[where]
            return
        if stopped:
            return
        if last_read is not None and low > last_read + 1:
            self._watched[where] = (last_read + 1, low)
