"""The shared raw clients with a stand-in for AIOKafkaClient: one Fetch per leader for all
its partitions, several partitions' batches in one Produce, sequences per partition, and
errors that stay with their partition."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.protocol.fetch import FetchRequest
from aiokafka.protocol.produce import ProduceRequest
from aiokafka.protocol.transaction import InitProducerIdRequest

from mm2py.kafka import raw_clients
from mm2py.kafka.raw_clients import (
    BatchRejected,
    Fetched,
    FetchSession,
    IdempotentProduceSession,
    LoopTimeout,
    OffsetOutOfRange,
    RawCopyClients,
    RawLoop,
    RawPartitionError,
    _joined,
    _whole_batches,
)
from mm2py.kafka.record_batches import AbortedTransaction, split_batches
from tests.unit.kafka.test_raw_partition import batches

NOT_LEADER = 6
OFFSET_OUT_OF_RANGE = 1
MESSAGE_TOO_LARGE = 10
OUT_OF_ORDER = 45
TP = tuple[str, int]


class Cluster:
    def __init__(self, leaders: dict[TP, int]) -> None:
        self.leaders = leaders
        self.unauthorized_topics: set[str] = set()
        self.listeners: list[Any] = []

    def add_listener(self, listener: Any) -> None:
        self.listeners.append(listener)

    def updated(self) -> None:
        """A metadata update: listeners are told, as aiokafka's ClusterMetadata tells them."""
        for listener in self.listeners:
            listener(self)

    def leader_for_partition(self, tp: Any) -> int | None:
        return self.leaders.get((tp.topic, tp.partition))

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        found = {p for t, p in self.leaders if t == topic}
        return found or None


class Client:
    """Leaders per partition; scripted error codes per (partition, its nth request). A
    partition holds the producer's state once a batch of it is appended: until then any
    base sequence is taken, as Kafka's ProducerAppendInfo takes it (KIP-360)."""

    def __init__(self, leaders: dict[TP, int], errors: dict[tuple[TP, int], int] | None = None):
        self.cluster = Cluster(leaders)
        self.errors = errors or {}
        self.seen: dict[TP, int] = {}
        self.requests: list[tuple[int, Any]] = []
        self.logs: dict[TP, dict[int, int]] = {}  # base sequence -> offset (dedup)
        self.ends: dict[TP, int] = {}
        self.next_sequences: dict[TP, int] = {}  # where the producer's state is held
        self.producing = 0
        self.out_with: list[int] = []  # each Produce: how many were out with it, itself too

    async def bootstrap(self) -> None:
        pass

    async def close(self) -> None:
        pass

    def add_topic(self, _topic: str) -> None:
        pass

    def get_random_node(self) -> int:
        return 1

    def force_metadata_update(self) -> asyncio.Future[bool]:
        self.cluster.updated()
        done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        done.set_result(True)
        return done

    def _code(self, tp: TP) -> int:
        n = self.seen.get(tp, 0)
        self.seen[tp] = n + 1
        return self.errors.get((tp, n), 0)

    async def send(self, node: int, request: Any) -> Any:
        self.requests.append((node, request))
        if isinstance(request, InitProducerIdRequest):
            return SimpleNamespace(error_code=0, producer_id=5, producer_epoch=0)
        if isinstance(request, FetchRequest):
            topics = []
            for topic, partitions in request.topics:
                answers = []
                for partition, position, _max in partitions:
                    code = self._code((topic, partition))
                    records = b"" if code else f"{topic}-{partition}@{position}".encode()
                    answers.append((partition, code, 100, 100, 0, [], -1, records))
                topics.append((topic, answers))
            return SimpleNamespace(API_VERSION=11, error_code=0, topics=topics)
        assert isinstance(request, ProduceRequest)
        self.producing += 1
        self.out_with.append(self.producing)
        await asyncio.sleep(0)  # the other requests of a window go out meanwhile
        self.producing -= 1
        topics = []
        for topic, partitions in request._topics:
            answers = []
            for partition, payload in partitions:
                tp = (topic, partition)
                code = self._code(tp)
                header = split_batches(payload).batches[0].header
                offset = -1
                log = self.logs.setdefault(tp, {})
                expected = self.next_sequences.get(tp)
                duplicate = header.base_sequence in log
                if not code and not duplicate and expected not in (None, header.base_sequence):
                    code = OUT_OF_ORDER
                if not code:
                    if not duplicate:
                        log[header.base_sequence] = self.ends.get(tp, 0)
                        self.ends[tp] = self.ends.get(tp, 0) + header.record_count
                        self.next_sequences[tp] = header.base_sequence + header.record_count
                    offset = log[header.base_sequence]
                answers.append((partition, code, offset, -1, 0))
            topics.append((topic, answers))
        return SimpleNamespace(topics=topics)


def clients(client: Client, retry_timeout: float = 5.0) -> RawCopyClients:
    props = {"bootstrap.servers": "fake:9092"}
    return RawCopyClients(
        FetchSession(props, retry_timeout=retry_timeout, client_factory=lambda: client),
        IdempotentProduceSession(props, retry_timeout=retry_timeout, client_factory=lambda: client),
        "A->B",
    )


def fetch_requests(client: Client) -> list[tuple[int, list[tuple[str, list[tuple[int, int]]]]]]:
    """(node, [(topic, [(partition, position)])]) of each Fetch."""
    return [
        (node, [(t, [(p, pos) for p, pos, _ in ps]) for t, ps in request.topics])
        for node, request in client.requests
        if isinstance(request, FetchRequest)
    ]


def produce_requests(client: Client) -> list[list[tuple[str, int, int]]]:
    """[(topic, partition, base sequence)] of each Produce."""
    return [
        [
            (t, p, split_batches(payload).batches[0].header.base_sequence)
            for t, ps in request._topics
            for p, payload in ps
        ]
        for _node, request in client.requests
        if isinstance(request, ProduceRequest)
    ]


def test_one_fetch_per_leader_covers_all_its_partitions() -> None:
    client = Client({("t", 0): 1, ("t", 1): 2, ("u", 0): 1})
    with clients(client) as raw:
        got = raw.fetch({("t", 0): 3, ("t", 1): 7, ("u", 0): 0})
        # the one to node 2 may still be out: the rest comes in the next call
        while len(got) < 3:
            got.update(raw.fetch({("t", 0): 3, ("t", 1): 7, ("u", 0): 0}))
    assert sorted(fetch_requests(client)) == [
        (1, [("t", [(0, 3)]), ("u", [(0, 0)])]),
        (2, [("t", [(1, 7)])]),
    ]
    first = got[("t", 0)]
    assert isinstance(first, Fetched)
    assert (first.position, first.records, first.high_watermark) == (3, b"t-0@3", 100)


def test_an_answer_for_a_position_the_copier_left_is_not_used() -> None:
    client = Client({("t", 0): 1, ("t", 1): 1})
    with clients(client) as raw:
        raw.produce({}, prefetch={("t", 0): 3, ("t", 1): 7})
        got = raw.fetch({("t", 0): 10, ("t", 1): 7})  # t-0 was moved meanwhile
        assert list(got) == [("t", 1)]
        assert raw.fetch({("t", 0): 10, ("t", 1): 8})[("t", 0)].position == 10  # type: ignore[union-attr]


def test_fetch_errors_stay_with_their_partition() -> None:
    client = Client(
        {("t", 0): 1, ("t", 1): 1, ("t", 2): 1},
        {(("t", 1), 0): NOT_LEADER, (("t", 2), 0): OFFSET_OUT_OF_RANGE},
    )
    positions = {("t", 0): 0, ("t", 1): 0, ("t", 2): 9}
    with clients(client) as raw:
        got = raw.fetch(positions)
        assert sorted(got) == [("t", 0), ("t", 2)]  # t-1 is retried
        assert isinstance(got[("t", 2)], OffsetOutOfRange)
        assert "t-2 on fake:9092" in str(got[("t", 2)]) and "log start" in str(got[("t", 2)])
        assert ("t", 1) in raw.fetch(positions)


def test_a_partition_that_keeps_failing_is_named() -> None:
    client = Client({("t", 0): 1, ("t", 1): 1}, {(("t", 1), n): NOT_LEADER for n in range(99)})
    with (
        clients(client, retry_timeout=0.3) as raw,
        pytest.raises(RawPartitionError, match=r"fetch for t-1 on fake:9092 failed: still"),
    ):
        for _ in range(99):
            raw.fetch({("t", 0): 0, ("t", 1): 0})


def test_partitions_share_produce_requests_with_their_own_sequences() -> None:
    client = Client({("A.t", 0): 1, ("A.t", 1): 1, ("A.u", 0): 2})
    sent = batches(7)  # 3 records each
    with clients(client) as raw:
        got = raw.produce({("A.t", 0): sent[:2], ("A.t", 1): sent[:7], ("A.u", 0): sent[:1]})
        assert got == {
            ("A.t", 0): [0, 3],
            ("A.t", 1): [0, 3, 6, 9, 12, 15, 18],
            ("A.u", 0): [0],
        }
        assert raw.produce({("A.t", 0): sent[:1]}) == {("A.t", 0): [6]}
    assert produce_requests(client) == [
        # node 1, the first window: one batch of a partition new to the producer
        [("A.t", 0, 0), ("A.t", 1, 0)],
        [("A.u", 0, 0)],  # node 2
        # then at most 5 batches of a partition out
        [("A.t", 0, 3), ("A.t", 1, 3)],
        [("A.t", 1, 6)],
        [("A.t", 1, 9)],
        [("A.t", 1, 12)],
        [("A.t", 1, 15)],
        [("A.t", 1, 18)],  # the next window
        [("A.t", 0, 6)],  # the next call goes on with the partition's sequence
    ]


def test_a_leader_change_resends_a_partition_from_its_failed_batch() -> None:
    client = Client({("A.t", 0): 1, ("A.t", 1): 1}, {(("A.t", 1), 1): NOT_LEADER})
    sent = batches(3)
    with clients(client) as raw:
        got = raw.produce({("A.t", 0): sent, ("A.t", 1): sent})
    assert got == {("A.t", 0): [0, 3, 6], ("A.t", 1): [0, 3, 6]}
    assert produce_requests(client) == [
        [("A.t", 0, 0), ("A.t", 1, 0)],  # one each: new to the producer
        [("A.t", 0, 3), ("A.t", 1, 3)],  # A.t-1 fails here ...
        [("A.t", 0, 6), ("A.t", 1, 6)],  # ... so this one of it is sent again too
        [("A.t", 1, 3)],
        [("A.t", 1, 6)],
    ]


def test_a_partition_new_to_the_producer_has_one_batch_out_until_one_is_acknowledged() -> None:
    # Its topic just created, the leader refuses the first batch ("not leader") and then
    # serves the partition: a second batch sent with the first would land alone, ahead
    # of it (no producer state there yet), and the first's resend be out of order.
    client = Client({("A.t", 0): 1}, {(("A.t", 0), 0): NOT_LEADER})
    sent = batches(3)
    with clients(client) as raw:
        assert raw.produce({("A.t", 0): sent}) == {("A.t", 0): [0, 3, 6]}
    assert produce_requests(client) == [
        [("A.t", 0, 0)],  # not leader yet
        [("A.t", 0, 0)],  # alone again: nothing of it is acknowledged
        [("A.t", 0, 3)],
        [("A.t", 0, 6)],
    ]
    assert client.ends[("A.t", 0)] == 9  # each batch once, in order


def test_a_partition_not_acknowledged_for_long_has_one_batch_out_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Past PRODUCER_STATE_TRUSTED the broker may have dropped the producer's state there
    # (producer.id.expiration.ms, or retention took every batch that made it).
    client = Client({("A.t", 0): 1})
    sent = batches(2)
    with clients(client) as raw:
        assert raw.produce({("A.t", 0): sent}) == {("A.t", 0): [0, 3]}
        assert raw.produce({("A.t", 0): sent}) == {("A.t", 0): [6, 9]}
        monkeypatch.setattr(raw_clients, "PRODUCER_STATE_TRUSTED", 0.0)
        assert raw.produce({("A.t", 0): sent}) == {("A.t", 0): [12, 15]}
    assert [r[0][2] for r in produce_requests(client)] == [0, 3, 6, 9, 12, 15]
    assert client.out_with == [
        1, 1,  # new to the producer: one, and once acknowledged, the one left
        1, 2,  # acknowledged just before: both out together
        1, 1,  # not acknowledged within PRODUCER_STATE_TRUSTED: one at a time
    ]  # fmt: skip


def test_a_rejected_batch_is_its_partitions_result_alone() -> None:
    client = Client({("A.t", 0): 1, ("A.t", 1): 1}, {(("A.t", 1), 1): MESSAGE_TOO_LARGE})
    sent = batches(3)
    with clients(client) as raw:
        got = raw.produce({("A.t", 0): sent, ("A.t", 1): sent})
        assert got[("A.t", 0)] == [0, 3, 6]
        rejected = got[("A.t", 1)]
        assert isinstance(rejected, BatchRejected)
        assert "produce for A.t-1 on fake:9092 failed: MessageSizeTooLarge" in str(rejected)
        assert "max.message.bytes" in str(rejected)
        # the refused batch was not appended: the partition's sequence goes on from it
        assert raw.produce_session.sequences[("A.t", 1)] == 3


def test_the_loop_gives_up_waiting_apart_from_a_coroutines_own_timeout() -> None:
    async def slow() -> int:
        await asyncio.sleep(30)
        return 1

    async def own_timeout() -> None:
        raise TimeoutError("the coroutine's")

    loop = RawLoop("test-loop")
    try:
        with pytest.raises(LoopTimeout):
            loop.run(slow(), 0.05)
        with pytest.raises(TimeoutError, match="the coroutine's") as raised:
            loop.run(own_timeout(), 5)
        assert not isinstance(raised.value, LoopTimeout)
        assert loop.run(asyncio.sleep(0, result=7), 5) == 7
    finally:
        loop.stop()


def test_the_loop_runs_on_its_callers_thread_and_what_a_call_leaves_out_goes_on_later() -> None:
    loop = RawLoop("test-loop")

    async def thread_of_the_call() -> int:
        return threading.get_ident()

    async def leave_out(seconds: float) -> asyncio.Task[str]:
        async def answer() -> str:
            await asyncio.sleep(seconds)
            return "answered"

        task = asyncio.ensure_future(answer())
        await asyncio.sleep(0)  # it has started: sent, say, and waits for its answer
        return task

    async def wait_for(task: asyncio.Task[str]) -> str:
        return await task

    try:
        assert loop.run(thread_of_the_call()) == threading.get_ident()
        out = loop.run(leave_out(0.05))
        assert not out.done()
        time.sleep(0.1)  # between calls nothing runs on the loop
        assert not out.done()
        assert loop.run(wait_for(out), 5) == "answered"
        forgotten = loop.run(leave_out(30))
    finally:
        loop.stop()
    assert forgotten.cancelled()


def batch_at(offset: int) -> bytes:
    """A batch of three records whose base offset is `offset` (the base offset is outside
    the batch's CRC, which covers what follows the attributes' offset)."""
    return struct.pack(">q", offset) + batches(1)[0].data[8:]


def test_an_answer_is_joined_with_what_came_after_its_whole_batches() -> None:
    whole = batch_at(0) + batch_at(3)
    first = Fetched(
        position=0,
        records=whole + batch_at(6)[:20],  # the answer's size limit cut its last batch
        aborted=[AbortedTransaction(7, 1)],
        high_watermark=9,
        last_stable_offset=9,
        log_start_offset=0,
    )
    assert _whole_batches(first) == (6, len(whole))
    then = Fetched(
        position=6,
        records=batch_at(6) + batch_at(9),
        aborted=[AbortedTransaction(7, 1), AbortedTransaction(8, 9)],
        high_watermark=14,
        last_stable_offset=12,
        log_start_offset=2,
    )
    joined = _joined(first, len(whole), then)
    split = split_batches(joined.records)
    assert [b.header.base_offset for b in split.batches] == [0, 3, 6, 9]
    assert split.truncated == 0
    assert joined.position == 0
    assert joined.aborted == [AbortedTransaction(7, 1), AbortedTransaction(8, 9)]
    assert (joined.high_watermark, joined.last_stable_offset, joined.log_start_offset) == (
        14,
        12,
        2,
    )


def test_an_answer_without_a_whole_batch_has_no_end_to_catch_up_from() -> None:
    def answer(records: bytes) -> Fetched:
        return Fetched(0, records, [], 5, 5, 0)

    assert _whole_batches(answer(b"")) is None
    assert _whole_batches(answer(batch_at(0)[:30])) is None  # cut short
    assert _whole_batches(answer(struct.pack(">qi", 0, -4))) is None  # unreadable
