"""The batch copier's FetchSession in KIP-227 incremental fetch sessions against a real
broker: idle partitions are answered once and then left out, a partition that gets records
after many idle Fetches is answered with them, and after the broker restarts (its sessions
gone) fetching goes on from where it was, nothing skipped. A frozen broker (one that keeps
its connections and answers nothing) does not hold a fetch past its max wait and grace.
Closing a FetchSession closes its session on the broker. A prefetched answer that waited to
be read is caught up with the records that came after it."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from aiokafka.client import AIOKafkaClient

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.raw_clients import (
    ANSWER_GRACE,
    CATCH_UP_AFTER,
    FETCH_SESSION_ID_NOT_FOUND,
    NO_SESSION,
    Fetched,
    FetchPlan,
    FetchSession,
    _SessionFetchRequest,
)
from mm2py.kafka.record_batches import split_batches
from tests.conftest import Clusters
from tests.kafka_helpers import create_topic, end_offsets

pytestmark = pytest.mark.integration

PARTITIONS = 4
TP = tuple[str, int]


def _produce(cluster: LocalCluster, topic: str, partition: int, count: int) -> None:
    producer = clients.producer(cluster.client_properties(), {"linger.ms": 5})
    for n in range(count):
        producer.produce(topic, value=f"record {n}".encode(), partition=partition)
    assert producer.flush(30) == 0


class Reader:
    """Fetches through one FetchSession and moves each partition's position past the
    whole batches it is answered, keeping each partition's offsets and last answer."""

    def __init__(self, session: FetchSession, topic: str) -> None:
        self.session = session
        self.positions: dict[TP, int] = {(topic, p): 0 for p in range(PARTITIONS)}
        self.offsets: dict[TP, list[int]] = {tp: [] for tp in self.positions}
        self.last: dict[TP, Fetched] = {}

    async def fetch(self) -> dict[TP, Fetched]:
        got = await self.session.fetch(dict(self.positions))
        for tp, result in got.items():
            assert isinstance(result, Fetched), (tp, result)
            self.last[tp] = result
            for batch in split_batches(result.records).batches:
                header = batch.header
                self.offsets[tp] += range(header.base_offset, header.last_offset + 1)
                self.positions[tp] = header.last_offset + 1
        return {tp: r for tp, r in got.items() if isinstance(r, Fetched)}

    async def until_at(self, ends: dict[int, int], timeout: float) -> None:
        """Fetch until every partition's position is its end."""
        deadline = time.monotonic() + timeout
        while any(self.positions[(t, p)] < ends[p] for t, p in self.positions):
            assert time.monotonic() < deadline, (self.positions, ends)
            await self.fetch()


def test_idle_partitions_are_left_out_and_a_restart_loses_nothing(
    clusters: Clusters, cluster_a: LocalCluster, unique: str
) -> None:
    topic = unique
    create_topic(cluster_a, topic, PARTITIONS)
    _produce(cluster_a, topic, 0, 50)
    _produce(cluster_a, topic, 1, 30)

    async def scenario() -> Reader:
        session = FetchSession(cluster_a.client_properties(), max_wait_ms=100)
        await session.open()
        reader = Reader(session, topic)
        try:
            first: dict[TP, Fetched] = {}
            deadline = time.monotonic() + 30
            while not first:  # until the topic's leader is known
                assert time.monotonic() < deadline
                first = await reader.fetch()
            # the full Fetch creating the session answers every partition
            assert sorted(p for _, p in first) == list(range(PARTITIONS))
            assert [first[(topic, p)].high_watermark for p in range(PARTITIONS)] == [50, 30, 0, 0]
            await reader.until_at({0: 50, 1: 30, 2: 0, 3: 0}, timeout=30)
            # at the end of every partition: incremental answers name none of them
            idle = [await reader.fetch() for _ in range(10)]
            assert idle == [{}] * 10

            await asyncio.to_thread(_produce, cluster_a, topic, 3, 20)
            await reader.until_at({0: 50, 1: 30, 2: 0, 3: 20}, timeout=30)
            assert reader.last[(topic, 3)].high_watermark == 20

            # the broker restarts: its sessions are gone
            await asyncio.to_thread(clusters.kafka.stop, "A")
            stopped = [await reader.fetch() for _ in range(3)]
            assert stopped == [{}] * 3
            await asyncio.to_thread(clusters.kafka.start, "A")
            await asyncio.to_thread(_produce, cluster_a, topic, 2, 25)
            await asyncio.to_thread(_produce, cluster_a, topic, 0, 5)
            await reader.until_at({0: 55, 1: 30, 2: 25, 3: 20}, timeout=90)
            return reader
        finally:
            await session.close()

    reader = asyncio.run(scenario())
    ends = end_offsets(cluster_a, topic)
    assert ends == {0: 55, 1: 30, 2: 25, 3: 20}
    for (_, p), offsets in reader.offsets.items():
        assert offsets == list(range(ends[p])), p  # each once, in order, none skipped
    assert {p: f.high_watermark for (_, p), f in reader.last.items()} == ends


def test_a_frozen_broker_does_not_hold_a_fetch_and_its_records_come_after(
    clusters: Clusters, cluster_a: LocalCluster, unique: str
) -> None:
    topic = unique
    create_topic(cluster_a, topic, PARTITIONS)
    _produce(cluster_a, topic, 0, 10)
    broker = clusters.kafka.pid("A")
    assert broker is not None

    async def scenario() -> tuple[list[dict[TP, Fetched]], Reader]:
        session = FetchSession(cluster_a.client_properties(), max_wait_ms=100)
        await session.open()
        reader = Reader(session, topic)
        try:
            await reader.until_at({0: 10, 1: 0, 2: 0, 3: 0}, timeout=30)
            os.killpg(broker, signal.SIGSTOP)  # connections stay open, nothing answers
            try:
                # each call gives up waiting (max wait + grace) rather than hang until the
                # request times out (30 s); 10 s is far above the 1.1 s it should take
                frozen = [
                    await asyncio.wait_for(reader.fetch(), 10 * (0.1 + ANSWER_GRACE))
                    for _ in range(3)
                ]
            finally:
                os.killpg(broker, signal.SIGCONT)
            await asyncio.to_thread(_produce, cluster_a, topic, 1, 15)
            await reader.until_at({0: 10, 1: 15, 2: 0, 3: 0}, timeout=60)
            return frozen, reader
        finally:
            await session.close()

    frozen, reader = asyncio.run(scenario())
    assert frozen == [{}] * 3
    assert reader.offsets[(topic, 0)] == list(range(10))
    assert reader.offsets[(topic, 1)] == list(range(15))


def test_closing_a_fetch_session_closes_its_session_on_the_broker(
    cluster_a: LocalCluster, unique: str
) -> None:
    """As Kafka's consumer does on close: the broker's session cache gets its slot back
    at once (a daemon that stops leaves no session behind until eviction)."""
    topic = unique
    create_topic(cluster_a, topic, PARTITIONS)
    _produce(cluster_a, topic, 0, 10)

    async def ask(leader: int, session_id: int, epoch: int) -> int:
        """The error code of an incremental Fetch in session `session_id` at `epoch`."""
        client = AIOKafkaClient(bootstrap_servers=cluster_a.bootstrap_servers)
        await client.bootstrap()
        try:
            request = _SessionFetchRequest(
                FetchPlan(session_id, epoch, {}, [], {}),
                partition_max_bytes=1024,
                max_wait_time=0,
                min_bytes=0,
                max_bytes=1024,
            )
            return int((await client.send(leader, request)).error_code)
        finally:
            await client.close()

    async def scenario() -> tuple[int, int]:
        session = FetchSession(cluster_a.client_properties(), max_wait_ms=100)
        await session.open()
        reader = Reader(session, topic)
        try:
            await reader.until_at({0: 10, 1: 0, 2: 0, 3: 0}, timeout=30)
            await reader.fetch()  # an incremental Fetch: the session is in use
            ((leader, held),) = session._sessions.items()
            session_id, epoch = held.session_id, held.epoch
            assert session_id != NO_SESSION and epoch > 1
        finally:
            await session.close()
        return await ask(leader, session_id, epoch), await ask(leader, session_id + 1, 1)

    closed, unknown = asyncio.run(scenario())
    assert unknown == FETCH_SESSION_ID_NOT_FOUND  # what the broker answers for no session
    assert closed == FETCH_SESSION_ID_NOT_FOUND


@pytest.mark.parametrize("catch_up_after", [CATCH_UP_AFTER, None], ids=["caught-up", "as-is"])
def test_an_answer_that_waited_is_caught_up_with_the_records_after_it(
    cluster_a: LocalCluster, unique: str, catch_up_after: float | None
) -> None:
    """A copier's round: the next Fetch goes out with its produce and is answered while
    the produce waits; records that reach the leader after that answer come with it
    when it is read (caught up), not a round later (as-is)."""
    topic = unique
    create_topic(cluster_a, topic, 1)
    tp = (topic, 0)
    _produce(cluster_a, topic, 0, 5)

    def offsets(answer: Fetched) -> list[int]:
        return [
            offset
            for batch in split_batches(answer.records).batches
            for offset in range(batch.header.base_offset, batch.header.last_offset + 1)
        ]

    async def scenario() -> Fetched:
        # The catch-up's Fetch is waited for up to 10 s, not CATCH_UP_WAIT: a loaded test
        # machine can take longer than 50 ms to answer, and the join is what is tested.
        session = FetchSession(
            cluster_a.client_properties(),
            max_wait_ms=5000,
            catch_up_after=catch_up_after,
            catch_up_wait=10.0,
        )
        await session.open()
        try:
            first = None
            deadline = time.monotonic() + 30
            while first is None:  # until the leader is known and has answered
                assert time.monotonic() < deadline
                first = (await session.fetch({tp: 0})).get(tp)
            assert isinstance(first, Fetched) and offsets(first) == list(range(5))
            await session.prefetch({tp: 5})  # out while the round's produce waits
            (out,) = session._out.values()
            await asyncio.to_thread(_produce, cluster_a, topic, 0, 3)
            # the loop runs, as it does while a produce waits, until the answer is in
            await asyncio.wait_for(asyncio.shield(out), 30)
            await asyncio.to_thread(_produce, cluster_a, topic, 0, 4)  # after the answer
            await asyncio.sleep(2 * CATCH_UP_AFTER)
            answer = (await session.fetch({tp: 5}))[tp]
            assert isinstance(answer, Fetched)
            return answer
        finally:
            await session.close()

    answer = asyncio.run(scenario())
    assert answer.position == 5
    got = offsets(answer)
    if catch_up_after is None:
        # the answer as it came: some of the three records before it, none after
        assert got and got == list(range(5, 5 + len(got))) and got[-1] <= 7
    else:
        assert got == list(range(5, 12))
        assert answer.high_watermark == 12
