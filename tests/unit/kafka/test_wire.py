"""mm2py.kafka.wire against aiokafka's generic structs: the same bytes out, the same
fields back, for the values the copy path sends and the answers brokers give."""

from __future__ import annotations

import struct
from io import BytesIO

import pytest
from aiokafka.protocol.fetch import FetchRequest_v11, FetchResponse_v11
from aiokafka.protocol.produce import ProduceRequest_v7, ProduceResponse_v7

from mm2py.kafka import wire

PRODUCES = [
    (None, -1, 30_000, [("t", [(0, b"\x00\x01batch")])]),
    (
        "mm2py-A->B-0",
        -1,
        1_500,
        [("orders", [(0, b"a" * 300), (7, b"")]), ("zählung.ß", [(2_000_000, b"\xff" * 3)])],
    ),
    ("", 1, 0, []),
]


@pytest.mark.parametrize(("transactional_id", "acks", "timeout", "topics"), PRODUCES)
def test_a_produce_is_encoded_as_aiokafkas_v7(
    transactional_id: str | None,
    acks: int,
    timeout: int,
    topics: list[tuple[str, list[tuple[int, bytes]]]],
) -> None:
    theirs = ProduceRequest_v7(transactional_id, acks, timeout, topics).encode()
    assert wire.encode_produce(transactional_id, acks, timeout, topics) == theirs


FETCHES = [
    dict(
        max_wait_ms=500,
        min_bytes=1,
        max_bytes=52_428_800,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=[("t", [(0, 0, 1_048_576), (3, 2**40, 1)])],
        forgotten=[],
    ),
    dict(
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1024,
        isolation_level=0,
        session_id=123_456_789,
        session_epoch=2**31 - 1,
        topics=[],
        forgotten=[("gone", [0, 5]), ("ünï", [])],
    ),
]


@pytest.mark.parametrize("fetch", FETCHES)
def test_a_fetch_is_encoded_as_aiokafkas_v11(fetch: dict[str, object]) -> None:
    topics = [
        (topic, [(p, -1, position, -1, limit) for p, position, limit in partitions])
        for topic, partitions in fetch["topics"]  # type: ignore[attr-defined]
    ]
    theirs = FetchRequest_v11(
        -1,
        fetch["max_wait_ms"],
        fetch["min_bytes"],
        fetch["max_bytes"],
        fetch["isolation_level"],
        fetch["session_id"],
        fetch["session_epoch"],
        topics,
        fetch["forgotten"],
        "",
    ).encode()
    assert wire.encode_fetch(**fetch) == theirs  # type: ignore[arg-type]


PRODUCE_ANSWERS = [
    ([("t", [(0, 0, 41, -1, 0)])], 0),
    (
        [
            ("orders", [(0, 10, -1, -1, -1), (3, 47, -1, -1, -1)]),
            ("zählung", [(1, 0, 2**40, 1_700_000_000_000, 5)]),
        ],
        250,
    ),
    ([], 0),
]


@pytest.mark.parametrize(("topics", "throttle"), PRODUCE_ANSWERS)
def test_a_produce_answer_decodes_to_aiokafkas_fields(
    topics: list[tuple[str, list[tuple[object, ...]]]], throttle: int
) -> None:
    body = ProduceResponse_v7(topics, throttle).encode()
    theirs = ProduceResponse_v7.decode(BytesIO(body))
    ours = wire.decode_produce_answer(body)
    assert ours.topics == theirs.topics
    assert ours.throttle_time_ms == theirs.throttle_time_ms == throttle


FETCH_ANSWERS = [
    (0, 0, 7, [("t", [(0, 0, 100, 90, 0, [], -1, b"\x00" * 61)])]),
    (
        0,
        0,
        0,
        [
            (
                "t",
                [(1, 1, -1, -1, -1, None, -1, None), (2, 0, 5, 5, 5, [(9, 3), (11, 4)], -1, b"")],
            ),
            ("üu", [(0, 0, 2**50, 2**50, 0, [], 2, b"xyz")]),
        ],
    ),
    (10, 70, 0, []),  # FETCH_SESSION_ID_NOT_FOUND, no partition
]


@pytest.mark.parametrize(("throttle", "code", "session", "topics"), FETCH_ANSWERS)
def test_a_fetch_answer_decodes_to_aiokafkas_fields(
    throttle: int, code: int, session: int, topics: list[tuple[str, list[tuple[object, ...]]]]
) -> None:
    body = FetchResponse_v11(throttle, code, session, topics).encode()
    theirs = FetchResponse_v11.decode(BytesIO(body))
    ours = wire.decode_fetch_answer(body)
    assert ours.topics == theirs.topics
    assert (ours.throttle_time_ms, ours.error_code, ours.session_id) == (
        theirs.throttle_time_ms,
        theirs.error_code,
        theirs.session_id,
    )


def test_an_answer_cut_short_is_an_error_not_a_shorter_answer() -> None:
    body = FetchResponse_v11(0, 0, 0, [("t", [(0, 0, 5, 5, 0, [], -1, b"abcdef")])]).encode()
    with pytest.raises(ValueError, match="runs past"):
        wire.decode_fetch_answer(body[:-2])
    with pytest.raises(struct.error):
        wire.decode_produce_answer(ProduceResponse_v7([("t", [])], 0).encode()[:-3])


def test_the_raw_clients_send_wires_bytes_at_v7_and_v11_and_aiokafkas_below() -> None:
    from aiokafka.protocol.produce import ProduceRequest

    from mm2py.kafka.raw_clients import FetchPlan, _Produce, _SessionFetchRequest

    topics = [("t", [(0, b"batch"), (1, b"more")])]
    kafka_4 = {0: (3, 12), 1: (4, 17)}  # Produce and Fetch versions a Kafka 4.1 broker takes
    ours = _Produce(transactional_id="x", required_acks=-1, timeout=9, topics=topics)
    theirs = ProduceRequest(transactional_id="x", required_acks=-1, timeout=9, topics=topics)
    assert ours.prepare(kafka_4).API_VERSION == 7  # aiokafka's highest
    assert ours.prepare(kafka_4).encode() == theirs.prepare(kafka_4).encode()
    old = {0: (3, 6)}
    assert ours.prepare(old).API_VERSION == 6
    assert ours.prepare(old).encode() == theirs.prepare(old).encode()  # aiokafka's own

    plan = FetchPlan(77, 3, {("t", 0): 10, ("u", 2): 5}, [("gone", 1)], {})
    fetch = _SessionFetchRequest(
        plan, partition_max_bytes=100, max_wait_time=500, min_bytes=1, max_bytes=1000
    )
    expected = FetchRequest_v11(
        -1,
        500,
        1,
        1000,
        1,  # read_committed
        77,
        3,
        [("t", [(0, -1, 10, -1, 100)]), ("u", [(2, -1, 5, -1, 100)])],
        [("gone", [1])],
        "",
    ).encode()
    assert fetch.prepare(kafka_4).encode() == expected

    # answers are read from aiokafka's buffer, past the response header it has read
    answer = FetchResponse_v11(0, 0, 77, [("t", [(0, 0, 11, 11, 0, [], -1, b"r")])]).encode()
    buffer = BytesIO(b"\x00\x00\x00\x05" + answer)
    buffer.read(4)  # the correlation id
    decoded = fetch.prepare(kafka_4).RESPONSE_TYPE.decode(buffer)
    assert (decoded.session_id, decoded.topics) == (77, [("t", [(0, 0, 11, 11, 0, [], -1, b"r")])])
    answer = ProduceResponse_v7([("t", [(0, 0, 3, -1, 0)])], 0).encode()
    buffer = BytesIO(b"\x00\x00\x00\x06" + answer)
    buffer.read(4)
    decoded = ours.prepare(kafka_4).RESPONSE_TYPE.decode(buffer)
    assert decoded.topics == [("t", [(0, 0, 3, -1, 0)])]
