"""How a flow's partitions map to tasks, and which group protocol a cluster uses (pure)."""

from __future__ import annotations

from collections import Counter

import pytest

from mm2py.cluster.member import NodeId
from mm2py.config.rules import group_id
from mm2py.runtime.assignment import (
    BrokerGroupSettings,
    TaskSlot,
    choose_protocol,
    task_counts,
    task_of,
    tasks_topic,
)


def test_every_partition_has_exactly_one_task_in_range() -> None:
    for tasks in (1, 2, 3, 6):
        owners = [
            [slot for slot in range(tasks) if TaskSlot(slot, tasks).owns("orders", p)]
            for p in range(20)
        ]
        assert all(len(o) == 1 for o in owners)
        assert all(0 <= task_of("orders", p, tasks) < tasks for p in range(20))


def test_a_topics_partitions_spread_evenly_over_the_tasks() -> None:
    for partitions, tasks in ((8, 6), (12, 4), (5, 3)):
        load = Counter(task_of("payments", p, tasks) for p in range(partitions))
        assert max(load.values()) - min(load.get(t, 0) for t in range(tasks)) <= 1


def test_new_topics_and_partitions_never_move_partitions_already_placed() -> None:
    before = {(t, p): task_of(t, p, 4) for t in ("a", "b") for p in range(6)}
    # A new topic, and topic a grown from 6 to 10 partitions: same answers for the old ones.
    after = {(t, p): task_of(t, p, 4) for t in ("a", "b", "c") for p in range(10)}
    assert all(after[key] == task for key, task in before.items())


def test_the_mapping_is_the_same_in_every_process() -> None:
    # crc32, not hash(): PYTHONHASHSEED differs between processes.
    assert [task_of("orders", p, 3) for p in range(4)] == [2, 0, 1, 2]


def test_task_0_alone_creates_remote_topics() -> None:
    assert TaskSlot(0, 3).creates_topics
    assert not TaskSlot(1, 3).creates_topics


def test_the_tasks_topic_is_per_source_and_task_count() -> None:
    assert tasks_topic("A", 6) == "mm2py-tasks.A.6.internal"
    assert tasks_topic("A", 6) != tasks_topic("A", 4)


@pytest.mark.parametrize(
    ("wanted", "offered", "session_ms", "chosen"),
    [
        # Kafka 4's defaults: `consumer` offered, with a 45 s session: classic's 10 s.
        ("auto", "classic,consumer,streams", 45000, "classic"),
        ("auto", "classic,consumer,streams", 10000, "consumer"),
        ("auto", "classic,consumer", 6000, "consumer"),
        ("auto", "classic,consumer", None, "classic"),
        ("auto", "classic", 6000, "classic"),
        ("auto", None, None, "classic"),
        ("classic", "classic,consumer", 6000, "classic"),
        ("consumer", None, None, "consumer"),
        ("consumer", "classic,consumer", 45000, "consumer"),
    ],
)
def test_the_group_protocol(
    wanted: str, offered: str | None, session_ms: int | None, chosen: str
) -> None:
    assert choose_protocol(wanted, BrokerGroupSettings(offered, session_ms)) == chosen


def test_a_nodes_client_id_says_who_it_is() -> None:
    node = NodeId("host-1.example", 4242, 1_700_000_000_000, "host-1.example:8083")
    assert NodeId.parse(node.client_id()) == node
    assert NodeId.parse("rdkafka") is None
    assert NodeId.parse("mm2py/h/notapid/1/x:1") is None


def test_the_group_is_named_by_prefix_and_flow() -> None:
    assert group_id("mm2py", "A", "B") == "mm2py-A->B"
    assert group_id("staging", "A", "B") != group_id("mm2py", "A", "B")


def test_task_counts_are_read_back_from_the_tasks_topics_of_one_source() -> None:
    topics = [
        tasks_topic("A", 4),
        tasks_topic("A", 2),
        tasks_topic("A.x", 3),  # another source whose alias starts like A's
        "mm2py-tasks.A.two.internal",
        "orders",
    ]
    assert task_counts(topics, "A") == {2, 4}
    assert task_counts(topics, "A.x") == {3}
