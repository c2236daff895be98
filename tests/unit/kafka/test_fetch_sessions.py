"""KIP-227 incremental fetch sessions in the raw FetchSession: the plan of each Fetch
(session id, epoch, partitions named and forgotten), the request's bytes, and a
stand-in broker that keeps sessions as Kafka's does (FetchSession.scala: a partition is
answered when it has records, its high watermark moved, or it has an error)."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable, Coroutine
from io import BytesIO
from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from aiokafka.protocol.fetch import FetchRequest_v11

from mm2py.kafka.raw_clients import (
    FETCH_SESSION_ID_NOT_FOUND,
    INVALID_FETCH_SESSION_EPOCH,
    MAX_EPOCH,
    BrokerFetchSession,
    Fetched,
    FetchPlan,
    FetchSession,
    _SessionFetchRequest,
)
from tests.unit.kafka.test_raw_clients import Cluster

T = TypeVar("T")
TP = tuple[str, int]
NOT_LEADER = 6


# -- the plan, without a broker --------------------------------------------------------


def test_the_first_fetch_is_full_and_creates_a_session() -> None:
    session = BrokerFetchSession()
    plan = session.plan({("t", 0): 5, ("t", 1): 9})
    assert (plan.session_id, plan.epoch, plan.full) == (0, 0, True)
    assert plan.send == plan.answers_for == {("t", 0): 5, ("t", 1): 9}
    assert plan.forget == []
    session.answered(42)
    assert (session.session_id, session.epoch) == (42, 1)


def test_later_fetches_name_only_what_changed_and_forget_what_is_not_asked() -> None:
    session = BrokerFetchSession()
    session.plan({("t", 0): 5, ("t", 1): 9, ("t", 2): 0})
    session.answered(42)
    plan = session.plan({("t", 0): 5, ("t", 1): 12, ("u", 0): 3})
    assert (plan.session_id, plan.epoch, plan.full) == (42, 1, False)
    assert plan.send == {("t", 1): 12, ("u", 0): 3}
    assert plan.forget == [("t", 2)]
    # what the broker's session holds: each answer is for these positions
    assert plan.answers_for == {("t", 0): 5, ("t", 1): 12, ("u", 0): 3}
    session.answered(42)
    idle = session.plan({("t", 0): 5, ("t", 1): 12, ("u", 0): 3})
    assert (idle.epoch, idle.send, idle.forget) == (2, {}, [])
    assert idle.answers_for == {("t", 0): 5, ("t", 1): 12, ("u", 0): 3}


def test_the_epoch_wraps_to_one() -> None:
    session = BrokerFetchSession()
    session.plan({("t", 0): 0})
    session.answered(42)
    session.epoch = MAX_EPOCH - 1
    session.plan({("t", 0): 0})
    session.answered(42)
    assert session.epoch == MAX_EPOCH
    session.plan({("t", 0): 0})
    session.answered(42)
    assert session.epoch == 1


@pytest.mark.parametrize(
    ("code", "next_session_id"),
    [
        (FETCH_SESSION_ID_NOT_FOUND, 0),  # forgotten by the broker: a new one
        (INVALID_FETCH_SESSION_EPOCH, 42),  # out of step: closed and made again
        (0, 42),  # no answer, or a retriable partition error
    ],
)
def test_a_failed_fetch_makes_the_next_full(code: int, next_session_id: int) -> None:
    session = BrokerFetchSession()
    session.plan({("t", 0): 5, ("t", 1): 9})
    session.answered(42)
    session.plan({("t", 0): 6, ("t", 1): 9})
    session.failed(code)
    plan = session.plan({("t", 0): 6, ("t", 1): 9})
    assert (plan.session_id, plan.epoch, plan.full) == (next_session_id, 0, True)
    assert plan.send == {("t", 0): 6, ("t", 1): 9}


def test_no_session_made_or_one_closed_by_the_broker_means_full_fetches() -> None:
    session = BrokerFetchSession()
    session.plan({("t", 0): 5})
    session.answered(0)  # the broker's session cache is full
    assert session.plan({("t", 0): 5}).full
    session.answered(42)
    session.plan({("t", 0): 5})
    session.answered(0)  # closed by the broker
    assert (session.session_id, session.epoch) == (0, 0)


def test_without_sessions_every_fetch_is_full_and_sessionless() -> None:
    session = BrokerFetchSession(incremental=False)
    for _ in range(3):
        plan = session.plan({("t", 0): 5})
        assert (plan.session_id, plan.epoch, plan.send) == (0, -1, {("t", 0): 5})
        session.answered(42)


def test_the_v11_request_carries_the_session_and_forgotten_partitions() -> None:
    plan = FetchPlan(7, 3, {("t", 0): 5}, [("u", 2)], {("t", 0): 5})
    request = _SessionFetchRequest(
        plan, partition_max_bytes=100, max_wait_time=500, min_bytes=1, max_bytes=1000
    ).prepare({1: (0, 11)})
    assert isinstance(request, FetchRequest_v11)

    def string(s: str) -> bytes:
        return struct.pack(">h", len(s)) + s.encode()

    expected = (
        struct.pack(">iiiib", -1, 500, 1, 1000, 1)  # replica, wait, min, max, read_committed
        + struct.pack(">ii", 7, 3)  # session id, epoch
        + struct.pack(">i", 1)
        + string("t")
        + struct.pack(">i", 1)
        + struct.pack(">iiqqi", 0, -1, 5, -1, 100)  # partition, leader epoch, at, start, max
        + struct.pack(">i", 1)  # forgotten topics
        + string("u")
        + struct.pack(">ii", 1, 2)
        + string("")  # rack id
    )
    assert request.encode() == expected


# -- FetchSession against a broker that keeps sessions ---------------------------------


class Brokers(Cluster):
    def broker_metadata(self, _node: int) -> None:
        return None  # the connection check finds no address to ask


class SessionBroker:
    """Stand-in for AIOKafkaClient over brokers that keep KIP-227 sessions: each partition
    has a log end (`ends`, its high watermark); a Fetch from a position below it brings
    `b"t-0@5"` style records. `errors[tp]`: that partition's error code (once)."""

    def __init__(self, leaders: dict[TP, int], ends: dict[TP, int]) -> None:
        self.cluster = Brokers(leaders)
        self.ends = ends
        self.errors: dict[TP, int] = {}
        # node -> session id -> partition -> [fetch position, high watermark cached]
        self.sessions: dict[int, dict[int, dict[TP, list[int]]]] = {}
        self.epochs: dict[tuple[int, int], int] = {}
        self.next_id = 100
        self.fetches: list[tuple[int, Any]] = []  # (node, the v11 struct sent)
        self.closing_from: int | None = None  # the first Fetch of the FetchSession's close

    async def bootstrap(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def add_topic(self, _topic: str) -> None:
        pass

    def move(self, tp: TP, node: int) -> None:
        """`tp`'s leader is `node` now, as the next metadata update says."""
        self.cluster.leaders[tp] = node
        self.cluster.updated()

    def force_metadata_update(self) -> asyncio.Future[bool]:
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    async def send(self, node: int, request: Any) -> Any:
        # what a broker reads: the bytes sent, decoded by aiokafka's own v11 struct
        sent = FetchRequest_v11.decode(BytesIO(request.prepare({1: (0, 11)}).encode()))
        self.fetches.append((node, sent))
        named = {(t, p): at for t, ps in sent.topics for p, _epoch, at, _start, _max in ps}
        sessions = self.sessions.setdefault(node, {})
        if sent.session_epoch in (0, -1):
            sessions.pop(sent.session_id, None)
            held = {tp: [at, -1] for tp, at in named.items()}
            answer_id = 0
            if sent.session_epoch == 0:
                answer_id = self.next_id
                self.next_id += 1
                sessions[answer_id] = held
                self.epochs[(node, answer_id)] = 1
            return self._answer(held, answer_id, full=True)
        held_or_none = sessions.get(sent.session_id)
        if held_or_none is None:
            return self._error(FETCH_SESSION_ID_NOT_FOUND)
        if self.epochs[(node, sent.session_id)] != sent.session_epoch:
            return self._error(INVALID_FETCH_SESSION_EPOCH)
        self.epochs[(node, sent.session_id)] = sent.session_epoch + 1
        for tp, at in named.items():
            held_or_none.setdefault(tp, [at, -1])[0] = at
        for topic, partitions in sent.forgotten_topics_data:
            for partition in partitions:
                held_or_none.pop((topic, partition), None)
        return self._answer(held_or_none, sent.session_id, full=False)

    def _error(self, code: int) -> Any:
        return SimpleNamespace(API_VERSION=11, error_code=code, session_id=0, topics=[])

    def _answer(self, held: dict[TP, list[int]], session_id: int, full: bool) -> Any:
        by_topic: dict[str, list[Any]] = {}
        for tp, cached in held.items():
            at, end = cached[0], self.ends[tp]
            code = self.errors.pop(tp, 0)
            records = f"{tp[0]}-{tp[1]}@{at}".encode() if at < end and not code else b""
            if not (full or records or code or cached[1] != end):
                continue  # nothing new: left out of an incremental answer
            cached[1] = -1 if code else end
            by_topic.setdefault(tp[0], []).append((tp[1], code, end, end, 0, [], -1, records))
        return SimpleNamespace(
            API_VERSION=11, error_code=0, session_id=session_id, topics=list(by_topic.items())
        )

    def sent(
        self, node: int, closing: bool = False
    ) -> list[tuple[int, int, dict[TP, int], list[TP]]]:
        """(session id, epoch, partitions named with positions, forgotten) per Fetch, those
        before the FetchSession's close (`closing`: those of its close)."""
        cut = len(self.fetches) if self.closing_from is None else self.closing_from
        return [
            (
                s.session_id,
                s.session_epoch,
                {(t, p): at for t, ps in s.topics for p, _e, at, _s, _m in ps},
                [(t, p) for t, ps in s.forgotten_topics_data for p in ps],
            )
            for n, s in (self.fetches[cut:] if closing else self.fetches[:cut])
            if n == node
        ]


def run(
    broker: SessionBroker,
    steps: Callable[[FetchSession], Coroutine[Any, Any, T]],
    incremental: bool = True,
) -> T:
    async def go() -> T:
        session = FetchSession(
            {"bootstrap.servers": "fake:9092"},
            max_wait_ms=1,
            retry_timeout=5.0,
            client_factory=lambda: broker,
            incremental=incremental,
        )
        await session.open()
        try:
            return await steps(session)
        finally:
            broker.closing_from = len(broker.fetches)
            await session.close()

    return asyncio.run(go())


async def fetch_all(session: FetchSession, positions: dict[TP, int]) -> dict[TP, Any]:
    """Fetch until every leader has answered once (each answer for `positions`)."""
    got: dict[TP, Any] = {}
    await session.prefetch(positions)
    while session._out:
        got.update(await session.fetch(positions))
    return got


def test_an_idle_partition_is_answered_once_then_only_when_it_has_something() -> None:
    broker = SessionBroker(
        {("t", 0): 1, ("t", 1): 1, ("t", 2): 1}, {("t", 0): 5, ("t", 1): 3, ("t", 2): 0}
    )

    async def steps(session: FetchSession) -> list[dict[TP, Any]]:
        positions = {("t", 0): 5, ("t", 1): 0, ("t", 2): 0}
        rounds = [await fetch_all(session, positions)]
        positions[("t", 1)] = 3  # its records copied
        rounds.append(await fetch_all(session, positions))
        rounds.append(await fetch_all(session, positions))  # all idle
        broker.ends[("t", 2)] = 4  # records arrive after idle fetches
        rounds.append(await fetch_all(session, positions))
        return rounds

    first, moved, idle, arrived = run(broker, steps)
    assert sorted(first) == [("t", 0), ("t", 1), ("t", 2)]
    assert first[("t", 1)].records == b"t-1@0"
    assert isinstance(first[("t", 0)], Fetched) and first[("t", 0)].high_watermark == 5
    assert moved == {}  # t-1 at its end now, its high watermark as before
    assert idle == {}
    assert list(arrived) == [("t", 2)]
    assert (arrived[("t", 2)].records, arrived[("t", 2)].high_watermark) == (b"t-2@0", 4)
    assert broker.sent(1) == [
        (0, 0, {("t", 0): 5, ("t", 1): 0, ("t", 2): 0}, []),
        (100, 1, {("t", 1): 3}, []),
        (100, 2, {}, []),
        (100, 3, {}, []),
    ]


def test_a_partition_no_longer_asked_is_forgotten_and_a_new_one_added() -> None:
    broker = SessionBroker(
        {("t", 0): 1, ("t", 1): 1, ("u", 0): 1}, dict.fromkeys([("t", 0), ("t", 1), ("u", 0)], 0)
    )

    async def steps(session: FetchSession) -> tuple[dict[TP, Any], set[TP]]:
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0})
        second = await fetch_all(session, {("t", 0): 0, ("u", 0): 0})
        return second, set(broker.sessions[1][100])

    second, held = run(broker, steps)
    assert list(second) == [("u", 0)]  # new to the session: answered once
    assert broker.sent(1)[1] == (100, 1, {("u", 0): 0}, [("t", 1)])
    assert held == {("t", 0), ("u", 0)}


@pytest.mark.parametrize(
    ("trouble", "full_fetch_session_id"),
    [("evicted", 0), ("out of step", 100)],  # FETCH_SESSION_ID_NOT_FOUND, INVALID_..._EPOCH
)
def test_a_session_error_is_answered_with_a_full_fetch(
    trouble: str, full_fetch_session_id: int
) -> None:
    broker = SessionBroker({("t", 0): 1, ("t", 1): 1}, {("t", 0): 0, ("t", 1): 7})

    async def steps(session: FetchSession) -> list[dict[TP, Any]]:
        positions = {("t", 0): 0, ("t", 1): 7}
        await fetch_all(session, positions)
        if trouble == "evicted":
            del broker.sessions[1][100]
        else:
            broker.epochs[(1, 100)] += 5
        answers = [await fetch_all(session, positions), await fetch_all(session, positions)]
        assert list(broker.sessions[1]) == [101]
        return answers

    refused, again = run(broker, steps)
    assert refused == {}
    # the full Fetch answers every partition, with its high watermark
    assert {tp: f.high_watermark for tp, f in again.items()} == {("t", 0): 0, ("t", 1): 7}
    assert [(s, e) for s, e, _, _ in broker.sent(1)] == [
        (0, 0),
        (100, 1),
        (full_fetch_session_id, 0),
    ]
    assert broker.sent(1)[2][2] == {("t", 0): 0, ("t", 1): 7}


def test_a_leader_change_moves_the_partition_and_renews_the_session() -> None:
    broker = SessionBroker({("t", 0): 1, ("t", 1): 1}, {("t", 0): 0, ("t", 1): 2})

    async def steps(session: FetchSession) -> list[dict[TP, Any]]:
        positions = {("t", 0): 0, ("t", 1): 2}
        await fetch_all(session, positions)
        broker.errors[("t", 1)] = NOT_LEADER
        failing = await fetch_all(session, positions)
        broker.move(("t", 1), 2)
        return [failing, await fetch_all(session, positions), await fetch_all(session, positions)]

    failing, moved, idle = run(broker, steps)
    assert failing == {}
    assert sorted(moved) == [("t", 0), ("t", 1)]  # a full Fetch to each
    assert idle == {}
    assert broker.sent(1) == [
        (0, 0, {("t", 0): 0, ("t", 1): 2}, []),
        (100, 1, {}, []),  # answered NOT_LEADER for t-1: the next one is full
        (100, 0, {("t", 0): 0}, []),
        (101, 1, {}, []),
    ]
    assert broker.sent(2) == [(0, 0, {("t", 1): 2}, []), (102, 1, {}, [])]


def test_a_leader_that_leads_nothing_asked_loses_its_session() -> None:
    broker = SessionBroker({("t", 0): 1, ("t", 1): 2}, {("t", 0): 0, ("t", 1): 0})

    async def steps(session: FetchSession) -> None:
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0})
        broker.move(("t", 1), 1)
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0})
        broker.move(("t", 1), 2)  # back: node 2 holds nothing of ours now
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0})

    run(broker, steps)
    assert [(s, e, named) for s, e, named, _ in broker.sent(2)] == [
        (0, 0, {("t", 1): 0}),
        (0, 0, {("t", 1): 0}),
    ]
    assert broker.sent(1)[-1] == (100, 2, {}, [("t", 1)])


def test_closing_closes_each_leaders_session_on_its_broker() -> None:
    """As Kafka's consumer does: a Fetch at epoch -1 naming nothing, to each leader with a
    session, even with a Fetch still out (dropped first)."""
    broker = SessionBroker({("t", 0): 1, ("t", 1): 2}, {("t", 0): 3, ("t", 1): 0})

    async def steps(session: FetchSession) -> None:
        positions = {("t", 0): 0, ("t", 1): 0}
        await fetch_all(session, positions)
        await session.prefetch(positions)  # out when the session closes

    run(broker, steps)
    assert broker.sent(1, closing=True) == [(100, -1, {}, [])]
    assert broker.sent(2, closing=True) == [(101, -1, {}, [])]
    assert broker.sessions == {1: {}, 2: {}}


def test_a_session_the_broker_never_made_is_not_closed() -> None:
    broker = SessionBroker({("t", 0): 1}, {("t", 0): 3})

    async def steps(session: FetchSession) -> None:
        await fetch_all(session, {("t", 0): 0})

    run(broker, steps, incremental=False)
    assert [(s, e) for s, e, _, _ in broker.sent(1)] == [(0, -1)]
    assert broker.sent(1, closing=True) == []


def test_a_lost_fetch_or_a_pause_makes_the_next_full() -> None:
    broker = SessionBroker({("t", 0): 1}, {("t", 0): 0})
    lost = [False]
    send = broker.send

    async def maybe_lost(node: int, request: Any) -> Any:
        if lost[0]:
            lost[0] = False
            await send(node, request)  # handled by the broker, the answer lost
            raise ConnectionError("connection reset")
        return await send(node, request)

    broker.send = maybe_lost  # type: ignore[method-assign]

    async def steps(session: FetchSession) -> dict[TP, Any]:
        positions = {("t", 0): 0}
        await fetch_all(session, positions)
        lost[0] = True
        await fetch_all(session, positions)
        after_loss = await fetch_all(session, positions)
        await session.prefetch(positions)
        await asyncio.sleep(0)  # the Fetch is sent and answered, the answer not read
        await session.discard()  # paused
        return after_loss | await fetch_all(session, positions)

    answers = run(broker, steps)
    assert list(answers) == [("t", 0)]  # each full Fetch answers it again
    assert [(s, e) for s, e, _, _ in broker.sent(1)] == [
        (0, 0),
        (100, 1),  # lost
        (100, 0),
        (101, 1),  # dropped by the pause
        (101, 0),
    ]


def test_leaders_are_looked_up_again_only_after_a_metadata_update() -> None:
    broker = SessionBroker({("t", 0): 1, ("t", 1): 2}, {("t", 0): 0, ("t", 1): 0})
    lookups: list[TP] = []
    lookup = broker.cluster.leader_for_partition

    def counted(tp: Any) -> int | None:
        lookups.append((tp.topic, tp.partition))
        return lookup(tp)

    broker.cluster.leader_for_partition = counted  # type: ignore[method-assign]

    async def steps(session: FetchSession) -> list[int]:
        positions = {("t", 0): 0, ("t", 1): 0}
        counts = []
        for _ in range(3):
            await fetch_all(session, positions)
            counts.append(len(lookups))
        broker.move(("t", 1), 1)
        await fetch_all(session, positions)
        counts.append(len(lookups))
        return counts

    assert run(broker, steps) == [2, 2, 2, 4]
    assert broker.sent(1)[-1][2] == {("t", 1): 0}  # moved: new to node 1's session


def test_partitions_asked_anew_or_no_more_are_grouped_again_without_a_metadata_update() -> None:
    leaders = {("t", 0): 1, ("t", 1): 2, ("u", 0): 2}
    broker = SessionBroker(leaders, dict.fromkeys(leaders, 0))

    async def steps(session: FetchSession) -> None:
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0})
        await fetch_all(session, {("t", 0): 0, ("t", 1): 0, ("u", 0): 0})  # asked anew
        await fetch_all(session, {("t", 0): 0})  # node 2 leads none of these

    run(broker, steps)
    assert [named for _, _, named, _ in broker.sent(1)] == [{("t", 0): 0}, {}, {}]
    assert [named for _, _, named, _ in broker.sent(2)] == [{("t", 1): 0}, {("u", 0): 0}]
