"""Records the source deleted before they were copied: counted exactly, logged once per
partition and episode with their offsets, exported and shown in status; transaction
markers and aborted records (offsets read_committed jumps over) are never counted.

The fake consumer hands out the offsets a real one would after librdkafka's reset to
the log start offset, and reports that log start offset as its cached low watermark.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from prometheus_client import generate_latest

from mm2py.replication.copy_loop import CopyLoop, NewPartition, OffsetResetLog
from mm2py.replication.deleted_records import UNTIL_FOUND
from mm2py.replication.offset_syncs import OffsetSyncWriter
from mm2py.replication.stats import ReplicationStats
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.status import FlowStatus, PartStatus, TopicStatus, format_status
from tests.unit.replication.test_copy_loop import (
    FakeConsumer,
    FakeProducer,
    FakeProgress,
    Record,
)

LINE = "offsets {}..{} ({} records) were deleted on cluster A before they were copied"


class TruncatedConsumer(FakeConsumer):
    """A consumer whose partitions' log start offsets are `low` (default 0), their end
    offsets `high` (default 100)."""

    def __init__(self) -> None:
        super().__init__()
        self.low: dict[tuple[str, int], int] = {}
        self.high: dict[tuple[str, int], int] = {}
        self.uncached_lookups = 0

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> Any:
        if not cached:
            self.uncached_lookups += 1
        where = (tp.topic, tp.partition)
        return (self.low.get(where, 0), self.high.get(where, 100))


def _loop(stored: dict[tuple[str, int], int] | None = None) -> CopyLoop:
    return CopyLoop(
        "A->B",
        "B",
        TruncatedConsumer(),
        FakeProducer(),
        FakeProgress(),  # type: ignore[arg-type]
        OffsetSyncWriter(FakeProducer(), "mm2-offset-syncs.B.internal"),
        ReplicationStats("A", "B"),
        stored or {},
    )


def _copy(loop: CopyLoop, *offsets: int, topic: str = "t", partition: int = 0) -> None:
    loop.consumer.queued += [Record(topic, partition, o) for o in offsets]
    assert loop.copy_batch(lambda: False)


def _skipped(loop: CopyLoop, topic: str = "A.t", partition: int = 0) -> int:
    return loop.stats.partition(topic, partition).skipped


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "were deleted" in r.getMessage()]


def test_records_deleted_while_stopped_are_counted_and_named_exactly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # 20 copied (progress 19), stopped; 80 more produced, the first 60 deleted.
    loop = _loop(stored={("t", 0): 19})
    loop.consumer.low[("t", 0)] = 60
    loop.assign([NewPartition("t", 0, "A.t")], {})
    with caplog.at_level(logging.WARNING):
        _copy(loop, *range(60, 100))
        _copy(loop, *range(100, 110))  # later batches: nothing more
    assert _skipped(loop) == 40
    assert loop.stats.partition("A.t", 0).records == 50
    assert _lines(caplog) == [f"flow A->B: A t-0: {LINE.format(20, 59, 40)}"]
    assert loop.consumer.uncached_lookups == 0


def test_transaction_markers_and_aborted_records_are_not_skipped_records(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Progress 19; offset 20 is a commit marker, 23..30 an aborted transaction and its
    # marker: nothing was deleted (log start 0).
    loop = _loop(stored={("t", 0): 19})
    loop.assign([NewPartition("t", 0, "A.t")], {})
    with caplog.at_level(logging.WARNING):
        _copy(loop, 21, 22, 31, 32)
    assert _skipped(loop) == 0
    assert _lines(caplog) == []


def test_a_marker_at_the_new_log_start_is_not_counted() -> None:
    # Offsets 20..59 deleted; 60 is a transaction marker, 61 the first record.
    loop = _loop(stored={("t", 0): 19})
    loop.consumer.low[("t", 0)] = 60
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _copy(loop, 61, 62)
    assert _skipped(loop) == 40


def test_a_partition_is_checked_once_after_assignment_then_not_per_record() -> None:
    loop = _loop(stored={("t", 0): 19, ("t", 1): 4})
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    assert loop.deletions.watched == {("t", 0): (20, 21), ("t", 1): (5, 6)}
    _copy(loop, 20, 21)
    assert loop.deletions.watched == {("t", 1): (5, 6)}  # t-1 has had no record yet
    _copy(loop, 5, partition=1)
    assert loop.deletions.watched == {}


def test_a_new_partition_starting_at_its_log_start_is_watched_from_there() -> None:
    loop = _loop()
    loop.consumer.low[("t", 0)] = 30
    # The start offsets were looked up at 10; retention deleted up to 30 meanwhile.
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 10})
    _copy(loop, 30, 31)
    assert _skipped(loop) == 20


def test_records_deleted_while_the_loop_is_behind_are_counted_once_it_jumps(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    _copy(loop, *range(10))
    loop.update_lag()
    assert loop.deletions.watched == {}  # the log start (0) is behind what was read
    # Retention passes offset 50; the consumer had already fetched 10..12.
    loop.consumer.low[("t", 0)] = 50
    loop.update_lag()
    assert loop.deletions.watched == {("t", 0): (10, 50)}
    with caplog.at_level(logging.WARNING):
        _copy(loop, 10, 11, 12)
        assert _skipped(loop) == 0
        _copy(loop, 50, 51)
    assert _skipped(loop) == 37
    assert _lines(caplog) == [f"flow A->B: A t-0: {LINE.format(13, 49, 37)}"]
    assert loop.deletions.watched == {}


def test_offsets_going_back_are_not_skipped_records() -> None:
    # Its topic was deleted and created again: the consumer starts at the new earliest.
    loop = _loop(stored={("t", 0): 19})
    loop.assign([NewPartition("t", 0, "A.t")], {})
    _copy(loop, 0, 1)
    assert _skipped(loop) == 0


def test_skipped_records_are_exported_per_topic_and_shown_in_status() -> None:
    metrics = Metrics()
    stats = ReplicationStats("A", "B")
    metrics.replication.add(stats)
    stats.partition("A.t", 0).skipped = 30
    stats.partition("A.t", 1).skipped = 10
    stats.partition("A.u", 0)
    text = generate_latest(metrics.registry).decode()
    assert (
        'mm2py_records_skipped_total{reason="deleted_before_copy",source="A",target="B",'
        'topic="A.t"} 40.0' in text
    )
    assert (
        'mm2py_records_skipped_total{reason="deleted_before_copy",source="A",target="B",'
        'topic="A.u"} 0.0' in text
    )

    topics = [
        TopicStatus(topic="A.t", partitions=2, records=5, lag_records=0, skipped_records=40),
        TopicStatus(topic="A.u", partitions=1, records=5, lag_records=0),
    ]
    flow = FlowStatus(
        name="A->B",
        source="A",
        target="B",
        replicating=True,
        delivery="at-least-once",
        state="RUNNING",
        parts=[PartStatus(part="source", state="RUNNING", restarts=0)],
        topics=topics,
        lag_records=0,
    )
    text = format_status([FlowStatus.model_validate_json(flow.model_dump_json())])
    assert "  A.t: 40 records were deleted on A before they were copied" in text
    assert "A.u:" not in text


def test_an_idle_partition_is_no_longer_checked_per_batch_yet_a_later_deletion_counts() -> None:
    loop = _loop(stored={("t", 0): 19})
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {("t", 1): 0})
    loop.consumer.high.update({("t", 0): 20, ("t", 1): 0})  # nothing to read on either
    loop.update_lag()
    assert loop.deletions.watched == {}
    # 30 records are written to each and deleted before the consumer fetches them.
    loop.consumer.high.update({("t", 0): 50, ("t", 1): 30})
    loop.consumer.low.update({("t", 0): 50, ("t", 1): 30})
    loop.update_lag()
    assert loop.deletions.watched == {("t", 0): (20, 50), ("t", 1): (0, 30)}
    _copy(loop, 50)
    _copy(loop, 30, partition=1)
    assert _skipped(loop, partition=0) == 30
    assert _skipped(loop, partition=1) == 30


def test_a_partition_started_at_the_beginning_never_counts_what_went_before() -> None:
    # No start offset was known: the consumer starts at whatever its log start is.
    loop = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {})
    loop.consumer.low[("t", 0)] = 1000
    loop.update_lag()
    _copy(loop, 1000, 1001)
    assert _skipped(loop) == 0


RESET_LINE = (
    "[thrd:main]: t [0]: offset reset (at offset 13 (leader epoch -1), broker 1) to offset "
    "BEGINNING (leader epoch -1): fetch failed due to requested offset not available on "
    "the broker: Broker: Offset out of range"
)


class Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []

    def log(self, level: int, fmt: str, *args: Any) -> None:
        self.lines.append((level, fmt % args))


def test_librdkafka_reset_line_names_where_the_gap_starts_past_prefetched_markers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    _copy(loop, *range(8))
    inner = Lines()
    reset_log = OffsetResetLog(inner)
    reset_log.on_reset = loop.offset_reset
    # librdkafka had fetched up to 12 (11 a commit marker) when 13..49 were deleted.
    loop.consumer.low[("t", 0)] = 50
    reset_log.log(4, "%s [%s] %s", "OFFSET", "rdkafka#consumer-1", RESET_LINE)
    reset_log.log(7, "%s [%s] %s", "FETCH", "rdkafka#consumer-1", "t [0]: not a reset")
    assert [level for level, _line in inner.lines] == [4, 7]  # every line passed on
    assert inner.lines[0][1].endswith(RESET_LINE)
    assert loop.deletions.watched == {("t", 0): (13, UNTIL_FOUND)}
    with caplog.at_level(logging.WARNING):
        _copy(loop, 8, 9, 10, 12)
        assert _skipped(loop) == 0
        _copy(loop, 50, 51)
    assert _skipped(loop) == 37
    assert _lines(caplog) == [f"flow A->B: A t-0: {LINE.format(13, 49, 37)}"]
    assert loop.deletions.watched == {}


def test_a_marker_fetched_before_the_deletion_is_not_counted_when_watched_from_the_lag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _loop()
    loop.assign([NewPartition("t", 0, "A.t")], {("t", 0): 0})
    _copy(loop, *range(10))
    loop.consumer.low[("t", 0)] = 50
    loop.update_lag()
    assert loop.deletions.watched == {("t", 0): (10, 50)}
    _copy(loop, 10, 12)  # 11: a commit marker, fetched before 13..49 were deleted
    assert _skipped(loop) == 0
    _copy(loop, 50)
    assert _skipped(loop) == 37
    assert loop.deletions.watched == {}
