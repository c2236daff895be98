"""Describing consumer groups over Kafka's protocol rather than librdkafka's admin API.

librdkafka's DescribeConsumerGroups, like each of its admin requests sent to a group
coordinator, aborts the whole process when the coordinator's connection drops while the
request is being sent: `rd_kafka_enq_once_del_source_return: Assertion eonce->refcnt > 0`
(librdkafka issue 4605, unfixed up to 2.16 at least). A node waiting to join its flow's
group died of it when the target's broker restarted. A replicator must outlive a broker
restart, so groups are described here with aiokafka's protocol layer:

- FindCoordinator for the group, then ConsumerGroupDescribe v0 to the coordinator (groups
  of Kafka's `consumer` protocol, KIP-848);
- a group the coordinator does not know as such (GROUP_ID_NOT_FOUND: a classic group, or
  no group) is asked with DescribeGroups, whose members' assignments are decoded from the
  classic consumer protocol's bytes. A broker without ConsumerGroupDescribe (before
  Kafka 4.0) is asked only DescribeGroups. An unknown group is `Dead` with no members.
- A coordinator that moved, is loading or cannot be reached is asked again, backing off
  as the raw clients do, until the deadline; then the group is a failure with the
  cluster's last answer. No attempt outlasts the deadline: `describe_groups` returns
  within its timeout (plus the connection's close).

A connection aiokafka cannot make (mm2py.config.copy_mode.raw_connection_problem: a
GSSAPI or OAUTHBEARER login, inline PEM or PKCS#12 TLS material) is described through
librdkafka's admin client instead, with the abort above still possible there.

`describe_groups` is the one entry: the description of each group it could describe, and
why each other one failed.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from io import BytesIO
from typing import Any, TypeAlias

from aiokafka import errors as aiokafka_errors
from aiokafka.client import AIOKafkaClient
from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
from aiokafka.protocol.abstract import AbstractType
from aiokafka.protocol.admin import DescribeGroupsRequest_v1, DescribeGroupsRequest_v2
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import (
    Boolean,
    CompactArray,
    CompactString,
    Int16,
    Int32,
    Schema,
    TaggedFields,
)
from confluent_kafka import KafkaException

from mm2py.kafka import clients
from mm2py.kafka.raw_clients import (
    CONNECTION_ERRORS,
    MAX_RETRY_BACKOFF,
    RETRY_BACKOFF,
    TP,
    RawLoop,
    client_settings,
    find_coordinator,
)

GROUP_COORDINATOR = 0  # FindCoordinator's key type for a group
GROUP_ID_NOT_FOUND = 69
IDLE_STATES = frozenset({"empty", "dead"})


@dataclass(frozen=True, slots=True)
class GroupMember:
    """One member of a group: its ids and the partitions it owns now."""

    member_id: str
    client_id: str
    assignment: tuple[TP, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group as its coordinator describes it (`state` as the broker spells it)."""

    group: str
    state: str
    members: tuple[GroupMember, ...] = ()

    @property
    def idle(self) -> bool:
        """No members: empty, or unknown to the cluster (a rebalancing group is not idle)."""
        return not self.members and self.state.lower() in IDLE_STATES


@dataclass(slots=True)
class Described:
    """The groups described, and why each other asked-for group was not."""

    groups: dict[str, GroupDescription] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)


def describe_groups(props: Mapping[str, str], groups: Sequence[str], timeout: float) -> Described:
    """Each of `groups` on the cluster of librdkafka properties `props`, within `timeout`."""
    wanted = sorted(set(groups))
    if not wanted:
        return Described()
    try:
        settings = client_settings(props)
    except ValueError:
        return _described_by_librdkafka(props, wanted, timeout)
    loop = RawLoop("group-describe")
    try:
        return loop.run(_describe_all(settings, wanted, timeout))
    finally:
        loop.stop()


# -- over the protocol ----------------------------------------------------------------


async def _describe_all(settings: dict[str, Any], groups: list[str], timeout: float) -> Described:
    deadline = time.monotonic() + timeout
    client = AIOKafkaClient(
        client_id="mm2py-admin", request_timeout_ms=max(int(timeout * 1000), 1000), **settings
    )
    out = Described()
    try:
        try:
            await asyncio.wait_for(client.bootstrap(), timeout)
        except (*CONNECTION_ERRORS, aiokafka_errors.KafkaError) as exc:
            out.failures = {g: f"cannot connect: {_text(exc)}" for g in groups}
            return out
        answers = await asyncio.gather(*(_describe_one(client, g, deadline) for g in groups))
    finally:
        await client.close()
    for group, answer in zip(groups, answers, strict=True):
        if isinstance(answer, GroupDescription):
            out.groups[group] = answer
        else:
            out.failures[group] = answer
    return out


async def _describe_one(client: Any, group: str, deadline: float) -> GroupDescription | str:
    """The group's description, or why there is none by `deadline`."""
    last = "no answer"
    backoff = RETRY_BACKOFF
    while True:
        try:
            answer = await asyncio.wait_for(
                _find_and_ask(client, group), max(deadline - time.monotonic(), 0.0)
            )
        # The deadline in the middle of an attempt raises TimeoutError, one of the
        # CONNECTION_ERRORS: the check below then ends the loop.
        except (*CONNECTION_ERRORS, aiokafka_errors.KafkaError) as exc:
            if not _retriable(exc):
                return _text(exc)
            if time.monotonic() < deadline:  # else cut by the deadline: keep what came before
                last = _text(exc)
        else:
            if isinstance(answer, GroupDescription):
                return answer
            code, text = answer
            if not _retriable(aiokafka_errors.for_code(code)()):
                return text
            last = text
        if time.monotonic() + backoff >= deadline:
            return f"no description in time; last: {last}"
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, MAX_RETRY_BACKOFF)


async def _find_and_ask(client: Any, group: str) -> GroupDescription | tuple[int, str]:
    node = await find_coordinator(client, GROUP_COORDINATOR, group)
    return await _ask_coordinator(client, node, group)


async def _ask_coordinator(
    client: Any, node: int, group: str
) -> GroupDescription | tuple[int, str]:
    """The coordinator's description of `group`, or its error (code, text)."""
    try:
        response = await client.send(node, _ConsumerGroupDescribe([group]))
    except (aiokafka_errors.IncompatibleBrokerVersion, NotImplementedError):
        response = None  # no KIP-848 groups on this cluster
    if response is not None:
        (answer,) = response.groups
        if answer[0] == 0:
            return _consumer_group(answer)
        if answer[0] != GROUP_ID_NOT_FOUND:
            return answer[0], answer[1] or _error_name(answer[0])
    (classic,) = (await client.send(node, _DescribeClassicGroups([group]))).groups
    if classic[0] != 0:
        return classic[0], _error_name(classic[0])
    return _classic_group(classic)


def _consumer_group(answer: Any) -> GroupDescription:
    _code, _message, group, state, _epoch, _assignment_epoch, _assignor, members, *_ = answer
    return GroupDescription(group, state, tuple(_consumer_member(m) for m in members))


def _consumer_member(member: Any) -> GroupMember:
    member_id, _instance, _rack, _epoch, client_id, _host, _topics, _regex, assignment, *_ = member
    topics, _tags = assignment
    owned = tuple((name, p) for _id, name, partitions, _ in topics for p in partitions)
    return GroupMember(member_id, client_id, owned)


def _classic_group(answer: Any) -> GroupDescription:
    _error, group, state, protocol_type, _protocol, members = answer
    return GroupDescription(
        group,
        state,
        tuple(
            GroupMember(
                member_id,
                client_id,
                _classic_assignment(assignment) if protocol_type == "consumer" else (),
            )
            for member_id, client_id, _host, _metadata, assignment in members
        ),
    )


def _classic_assignment(data: bytes | None) -> tuple[TP, ...]:
    if not data:
        return ()
    decoded = ConsumerProtocolMemberAssignment.decode(BytesIO(data))
    return tuple((topic, p) for topic, partitions in decoded.assignment for p in partitions)


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, CONNECTION_ERRORS) or bool(getattr(exc, "retriable", False))


def _error_name(code: int) -> str:
    return str(aiokafka_errors.for_code(code).__name__)


def _text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


# -- the requests aiokafka does not have -----------------------------------------------


class _Uuid(AbstractType[uuid.UUID]):  # type: ignore[misc]  # aiokafka is untyped
    @classmethod
    def encode(cls, value: uuid.UUID) -> bytes:
        return value.bytes

    @classmethod
    def decode(cls, data: BytesIO) -> uuid.UUID:
        raw = data.read(16)
        if len(raw) != 16:
            raise ValueError("buffer underrun decoding a uuid")
        return uuid.UUID(bytes=raw)


_ASSIGNMENT = Schema(
    (
        "topic_partitions",
        CompactArray(
            ("topic_id", _Uuid),
            ("topic_name", CompactString("utf-8")),
            ("partitions", CompactArray(Int32)),
            ("tags", TaggedFields),
        ),
    ),
    ("tags", TaggedFields),
)


class _ConsumerGroupDescribeResponse_v0(Response):  # type: ignore[misc]  # aiokafka is untyped
    """ConsumerGroupDescribeResponse.json, version 0 (flexible)."""

    API_KEY = 69
    API_VERSION = 0
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        (
            "groups",
            CompactArray(
                ("error_code", Int16),
                ("error_message", CompactString("utf-8")),
                ("group_id", CompactString("utf-8")),
                ("group_state", CompactString("utf-8")),
                ("group_epoch", Int32),
                ("assignment_epoch", Int32),
                ("assignor_name", CompactString("utf-8")),
                (
                    "members",
                    CompactArray(
                        ("member_id", CompactString("utf-8")),
                        ("instance_id", CompactString("utf-8")),
                        ("rack_id", CompactString("utf-8")),
                        ("member_epoch", Int32),
                        ("client_id", CompactString("utf-8")),
                        ("client_host", CompactString("utf-8")),
                        ("subscribed_topic_names", CompactArray(CompactString("utf-8"))),
                        ("subscribed_topic_regex", CompactString("utf-8")),
                        ("assignment", _ASSIGNMENT),
                        ("target_assignment", _ASSIGNMENT),
                        ("tags", TaggedFields),
                    ),
                ),
                ("authorized_operations", Int32),
                ("tags", TaggedFields),
            ),
        ),
        ("tags", TaggedFields),
    )


class _ConsumerGroupDescribeRequest_v0(RequestStruct):  # type: ignore[misc]  # aiokafka is untyped
    FLEXIBLE_VERSION = True
    API_KEY = 69
    API_VERSION = 0
    RESPONSE_TYPE = _ConsumerGroupDescribeResponse_v0
    SCHEMA = Schema(
        ("group_ids", CompactArray(CompactString("utf-8"))),
        ("include_authorized_operations", Boolean),
        ("tags", TaggedFields),
    )


class _ConsumerGroupDescribe(Request[_ConsumerGroupDescribeRequest_v0]):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 69

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def build(
        self, request_struct_class: type[_ConsumerGroupDescribeRequest_v0]
    ) -> _ConsumerGroupDescribeRequest_v0:
        return request_struct_class(self._groups, False, {})


# aiokafka's DescribeGroups v3 reads its answer with v2's layout (without the
# authorized operations), which misreads every group after the first: v1 and v2 only.
_ClassicDescribeStruct: TypeAlias = DescribeGroupsRequest_v1 | DescribeGroupsRequest_v2


class _DescribeClassicGroups(Request[_ClassicDescribeStruct]):  # type: ignore[misc]  # aiokafka is untyped
    API_KEY = 15

    def __init__(self, groups: list[str]) -> None:
        self._groups = groups

    def build(self, request_struct_class: type[_ClassicDescribeStruct]) -> _ClassicDescribeStruct:
        return request_struct_class(self._groups)


# -- through librdkafka, where aiokafka cannot connect --------------------------------


def _described_by_librdkafka(
    props: Mapping[str, str], groups: list[str], timeout: float
) -> Described:
    admin = clients.admin_client(props)
    out = Described()
    futures = admin.describe_consumer_groups(groups, request_timeout=timeout)
    for group, future in futures.items():
        try:
            out.groups[group] = from_librdkafka(clients.admin_result(future, timeout))
        except KafkaException as exc:
            out.failures[group] = clients.error_text(exc)
    return out


# librdkafka's group states as the broker spells them
_LIBRDKAFKA_STATES = {
    "PREPARING_REBALANCING": "PreparingRebalance",
    "COMPLETING_REBALANCING": "CompletingRebalance",
}


def from_librdkafka(desc: Any) -> GroupDescription:
    """A librdkafka ConsumerGroupDescription as a GroupDescription."""
    name = desc.state.name
    return GroupDescription(
        desc.group_id,
        _LIBRDKAFKA_STATES.get(name, name.title()),
        tuple(
            GroupMember(
                m.member_id,
                m.client_id or "",
                tuple(
                    (tp.topic, tp.partition)
                    for tp in (m.assignment.topic_partitions if m.assignment else None) or []
                ),
            )
            for m in desc.members or []
        ),
    )
