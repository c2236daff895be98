"""The internal-topic reader's end tracking, against a scripted consumer (no broker)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException

from mm2py.kafka.reader import ReaderError, ReaderTimeout, TopicReader


class FakeMessage:
    def __init__(
        self, topic: str | None, partition: int | None, offset: int, err: KafkaError | None = None
    ) -> None:
        self._topic, self._partition, self._offset, self._err = topic, partition, offset, err

    def error(self) -> KafkaError | None:
        return self._err

    def topic(self) -> str | None:
        return self._topic

    def partition(self) -> int | None:
        return self._partition

    def offset(self) -> int:
        return self._offset


def rec(topic: str, partition: int, offset: int) -> FakeMessage:
    return FakeMessage(topic, partition, offset)


def eof(topic: str, partition: int, offset: int) -> FakeMessage:
    return FakeMessage(topic, partition, offset, KafkaError(KafkaError._PARTITION_EOF))


class FakeConsumer:
    """Hands out scripted batches, one per consume() call that finds something queued."""

    def __init__(
        self,
        batches: Iterable[list[FakeMessage]] = (),
        watermarks: dict[tuple[str, int], Any] | None = None,
    ) -> None:
        self.batches = list(batches)
        self.watermarks = watermarks or {}
        self.assigned: list[tuple[str, int, int]] = []
        self.unassigned = 0
        self.watermark_calls = 0

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        return self.batches.pop(0) if self.batches else []

    def poll(self, timeout: float) -> FakeMessage | None:
        return None

    def incremental_assign(self, tps: list[Any]) -> None:
        self.assigned += [(tp.topic, tp.partition, tp.offset) for tp in tps]

    def unassign(self) -> None:
        self.unassigned += 1

    def get_watermark_offsets(self, tp: Any, timeout: float, cached: bool) -> tuple[int, int]:
        self.watermark_calls += 1
        answers = self.watermarks[(tp.topic, tp.partition)]
        answer = answers.pop(0) if isinstance(answers, list) else answers
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return answer  # type: ignore[no-any-return]

    def close(self) -> None:
        pass


def reader(consumer: FakeConsumer, stop_at_end: bool = False) -> TopicReader:
    return TopicReader({}, "A", consumer=consumer, stop_at_end=stop_at_end)


def offsets(msgs: list[Any]) -> list[tuple[str, int, int]]:
    return [(m.topic(), m.partition(), m.offset()) for m in msgs]


def test_reads_every_partition_to_the_end_it_had_when_added() -> None:
    consumer = FakeConsumer(
        [[rec("t", 0, 0), rec("t", 1, 5)], [rec("t", 0, 1), rec("t", 0, 2)], [rec("t", 1, 6)]],
        {("t", 0): (0, 2), ("t", 1): (5, 7), ("t", 2): (3, 3)},
    )
    r = reader(consumer)
    got: list[Any] = []
    assert r.add_topic("t", partitions=3)
    assert consumer.assigned == [("t", p, OFFSET_BEGINNING) for p in range(3)]
    r.read_to_end(got.append, timeout=5)
    # t-0 ends at 2 (offset 1 is its last record); what came with it in the batch is
    # handed over too (a following reader must not lose it); t-2 is empty.
    assert offsets(got) == [("t", 0, 0), ("t", 1, 5), ("t", 0, 1), ("t", 0, 2), ("t", 1, 6)]
    assert r.at_end
    assert r.positions() == {("t", 0): 3, ("t", 1): 7}


def test_the_end_of_partition_event_ends_a_log_whose_last_offsets_hold_no_record() -> None:
    # Offsets 3 and 4 are transaction markers: no record is ever read at 4.
    consumer = FakeConsumer([[rec("t", 0, 2)], [eof("t", 0, 5)]], {("t", 0): (0, 5)})
    r = reader(consumer)
    got: list[Any] = []
    r.add_topic("t", partitions=1)
    r.read_to_end(got.append, timeout=5)
    assert offsets(got) == [("t", 0, 2)]
    assert r.at_end


def test_stop_at_end_hands_over_nothing_past_the_end() -> None:
    consumer = FakeConsumer([[rec("t", 0, 8), rec("t", 0, 9), rec("t", 0, 10)]])
    r = reader(consumer, stop_at_end=True)
    got: list[Any] = []
    r.add({("t", 0): 8}, {("t", 0): 10})
    assert r.read(got.append) == 2
    assert offsets(got) == [("t", 0, 8), ("t", 0, 9)]
    assert r.at_end


def test_a_start_at_or_past_the_end_is_at_the_end_already() -> None:
    r = reader(FakeConsumer())
    r.add({("t", 0): 10, ("t", 1): OFFSET_BEGINNING}, {("t", 0): 10})
    assert r.at_end  # t-1 has no end: it is only followed


def test_records_of_partitions_read_before_clear_are_dropped() -> None:
    consumer = FakeConsumer([[rec("old", 0, 4), rec("new", 0, 0)]])
    r = reader(consumer)
    r.add({("old", 0): 0})
    r.clear()
    r.add({("new", 0): 0}, {("new", 0): 1})
    got: list[Any] = []
    r.read(got.append)
    assert offsets(got) == [("new", 0, 0)]
    assert consumer.unassigned == 1
    assert r.at_end


def test_a_partition_error_raises_naming_partition_and_cluster_unless_handled() -> None:
    failure = FakeMessage("t", 0, -1, KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    r = reader(FakeConsumer([[failure], [failure]]))
    r.add({("t", 0): 0})
    with pytest.raises(ReaderError, match="t-0 on cluster A"):
        r.read(lambda _m: None)
    seen: list[KafkaError] = []
    r.read(lambda _m: None, on_error=seen.append)
    assert [e.code() for e in seen] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]


def test_a_client_error_is_retried_by_librdkafka_and_named_when_time_runs_out() -> None:
    down = FakeMessage(None, None, -1, KafkaError(KafkaError._ALL_BROKERS_DOWN))
    r = reader(FakeConsumer([[down]]))
    r.add({("t", 0): 0}, {("t", 0): 3})
    with pytest.raises(
        ReaderTimeout, match=r"t-0 is at offset 0, its end is 3; last error: .*broker"
    ) as info:
        r.read_to_end(lambda _m: None, timeout=0.3)
    assert isinstance(info.value, TimeoutError)


def test_read_to_end_returns_when_stopping() -> None:
    r = reader(FakeConsumer())
    r.add({("t", 0): 0}, {("t", 0): 3})
    r.read_to_end(lambda _m: None, timeout=0.1, stopping=lambda: True)
    assert not r.at_end


def test_watermarks_are_asked_again_while_a_new_topics_leader_is_pending() -> None:
    pending = KafkaError(KafkaError.LEADER_NOT_AVAILABLE)
    consumer = FakeConsumer(watermarks={("t", 0): [pending, pending, (0, 4)]})
    assert reader(consumer).watermarks("t", 0, timeout=5) == (0, 4)
    assert consumer.watermark_calls == 3


def test_watermarks_fail_at_once_on_an_error_that_retrying_cannot_fix() -> None:
    denied = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    consumer = FakeConsumer(watermarks={("t", 0): [denied, (0, 4)]})
    with pytest.raises(ReaderError, match="t-0 on cluster A"):
        reader(consumer).watermarks("t", 0, timeout=5)
    assert consumer.watermark_calls == 1
