"""What a group's description says (mm2py.kafka.group_describe), from librdkafka's answer
where aiokafka cannot connect, and that an attempt ends at the deadline; the protocol path
is tested on real clusters in tests/integration/test_group_describe.py."""

from __future__ import annotations

import asyncio
import time

from confluent_kafka import ConsumerGroupState, Node, TopicPartition
from confluent_kafka.admin import ConsumerGroupDescription, MemberAssignment, MemberDescription

from mm2py.kafka.group_describe import (
    GroupDescription,
    GroupMember,
    _describe_one,
    from_librdkafka,
)


def _described(state: ConsumerGroupState, members: list[MemberDescription]) -> GroupDescription:
    desc = ConsumerGroupDescription("g", False, members, "range", state, Node(1, "h", 9092))
    return from_librdkafka(desc)


def test_members_with_their_assignments_and_the_state_as_the_broker_spells_it() -> None:
    owned = MemberAssignment([TopicPartition("t", 0), TopicPartition("t", 2)])
    described = _described(
        ConsumerGroupState.PREPARING_REBALANCING,
        [MemberDescription("m1", "c1", "h", owned), MemberDescription("m2", "c2", "h", None)],
    )
    assert described == GroupDescription(
        "g",
        "PreparingRebalance",
        (GroupMember("m1", "c1", (("t", 0), ("t", 2))), GroupMember("m2", "c2", ())),
    )
    assert not described.idle


def test_empty_and_dead_groups_without_members_are_idle_others_are_not() -> None:
    assert _described(ConsumerGroupState.EMPTY, []).state == "Empty"
    assert _described(ConsumerGroupState.EMPTY, []).idle
    assert _described(ConsumerGroupState.DEAD, []).idle
    assert not _described(ConsumerGroupState.STABLE, []).idle  # rebalancing to none yet
    assert not GroupDescription("g", "Empty", (GroupMember("m", "c"),)).idle


class _SilentCoordinator:
    """A client whose coordinator lookup never answers (a broker paused mid-request)."""

    def get_random_node(self) -> int:
        return 1  # a broker is known: the lookup is sent

    async def coordinator_lookup(self, _key_type: int, _group: str) -> int:
        await asyncio.sleep(3600)
        return 0


def test_an_attempt_that_never_answers_ends_at_the_deadline() -> None:
    started = time.monotonic()
    answer = asyncio.run(_describe_one(_SilentCoordinator(), "g", started + 0.5))
    assert answer == "no description in time; last: no answer"
    assert time.monotonic() - started < 5  # not the hour the lookup would take
