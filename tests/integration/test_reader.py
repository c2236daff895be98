"""The internal-topic reader against a real broker: a topic created a moment ago, logs
ending in transaction markers, following after the end, a bounded read, a missing topic."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.reader import TopicReader
from tests.kafka_helpers import produce, wait_until

pytestmark = pytest.mark.integration


def _values(msgs: list[Any]) -> list[tuple[int, bytes]]:
    return [(m.partition(), m.value()) for m in msgs]


def _committed_transaction(cluster: LocalCluster, topic: str, unique: str) -> None:
    """Two records in a committed transaction on partition 1: its log ends in a marker."""
    producer: Producer = clients.producer(
        cluster.client_properties(), {"transactional.id": f"tx-{unique}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(2):
        producer.produce(topic, f"tx-{i}".encode(), partition=1)
    producer.commit_transaction(30)


def test_reads_a_new_topic_to_its_end_then_follows_it(cluster_a: LocalCluster, unique: str) -> None:
    props = cluster_a.client_properties()
    admin = clients.admin_client(props)
    admin.create_topics([NewTopic(unique, 2, 1)])[unique].result(30)
    with TopicReader(props, "A", {"isolation.level": "read_committed"}) as reader:
        # Right after creation: the leader may still be pending; the topic reads as empty.
        wait_until(lambda: reader.partition_count(unique) == 2, what="the new topic's metadata")
        assert reader.add_topic(unique)
        got: list[Any] = []
        reader.read_to_end(got.append, timeout=30)
        assert got == []
        assert reader.at_end

        produce(cluster_a, unique, [(0, None, b"a0"), (1, None, b"b0"), (0, None, b"a1")])
        _committed_transaction(cluster_a, unique, unique)

        def followed() -> bool:
            reader.read(got.append, 0.5)
            return len(got) >= 5

        wait_until(followed, what="the records written after the end")
        assert sorted(_values(got)) == [
            (0, b"a0"),
            (0, b"a1"),
            (1, b"b0"),
            (1, b"tx-0"),
            (1, b"tx-1"),
        ]

    # A second reader reads the same to its end: the last offset of partition 1 is the
    # transaction's marker, which no record stands for.
    with TopicReader(props, "A", {"isolation.level": "read_committed"}) as reader:
        again: list[Any] = []
        assert reader.add_topic(unique)
        reader.read_to_end(again.append, timeout=30)
        assert sorted(_values(again)) == sorted(_values(got))
        assert reader.positions()[(unique, 1)] == 3  # marker at 3, end offset 4


def test_a_bounded_read_stops_at_the_end_it_was_given(cluster_a: LocalCluster, unique: str) -> None:
    props = cluster_a.client_properties()
    admin = clients.admin_client(props)
    admin.create_topics([NewTopic(unique, 1, 1)])[unique].result(30)
    produce(cluster_a, unique, [(0, None, f"v{i}".encode()) for i in range(10)])
    with TopicReader(props, "A", stop_at_end=True) as reader:
        reader.add({(unique, 0): 3}, {(unique, 0): 7})
        got: list[Any] = []
        reader.read_to_end(got.append, timeout=30)
        assert [m.offset() for m in got] == [3, 4, 5, 6]
        reader.read(got.append, 0.5)
        assert len(got) == 4


def test_a_missing_topic_is_told_apart(cluster_a: LocalCluster, unique: str) -> None:
    with TopicReader(cluster_a.client_properties(), "A") as reader:
        assert reader.partition_count(unique) is None
        assert not reader.add_topic(unique)
        assert reader.at_end
