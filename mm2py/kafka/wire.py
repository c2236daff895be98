"""The copy path's two requests on the wire, encoded and decoded by hand: Produce v7 and
Fetch v11, and their answers. Pure: bytes in, bytes or tuples out.

Contract: each function gives, byte for byte and field for field, what aiokafka's
generic structs (`ProduceRequest_v7`, `ProduceResponse_v7`, `FetchRequest_v11`,
`FetchResponse_v11`) give for the same values (tests/unit/kafka/test_wire.py compares
them), in the shapes mm2py.kafka.raw_clients reads: an answer's topics are
`(topic, [partition tuple, ...])` as aiokafka's are. Those structs walk a schema field by
field for every value, and a copier sends a Fetch and a Produce each round, a few hundred
rounds a second: `python -m bench.wire` times a round's four (8 partitions) at 232-253 us
of CPU through aiokafka's structs and 68-81 us here (two runs; docs/benchmarks.md, "The
copy path's requests encoded by hand"). Strings are UTF-8 with an int16 length (-1: null),
bytes with an int32 length (-1: null), arrays with an int32 count (-1: null), all
big-endian, as Kafka's non-flexible versions have them.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_PRODUCE_HEAD = struct.Struct(">hi")  # acks, timeout_ms
_FETCH_HEAD = struct.Struct(">iiiibii")  # replica, max wait, min/max bytes, isolation, session
_FETCH_PARTITION = struct.Struct(">iiqqi")  # partition, leader epoch, offset, log start, max
# partition, error, base offset, log append time, log start offset
_PRODUCE_ANSWER = struct.Struct(">ihqqq")
_FETCH_ANSWER = struct.Struct(">ihqqq")  # partition, error, high, last stable, log start
_ABORTED = struct.Struct(">qq")  # producer id, first offset

REPLICA_CONSUMER = -1  # a Fetch's replica id from a client, not a follower
UNKNOWN = -1  # a partition's current leader epoch and log start offset, as a consumer sends


def _string(value: str | None) -> bytes:
    if value is None:
        return _I16.pack(-1)
    data = value.encode()
    return _I16.pack(len(data)) + data


def encode_produce(
    transactional_id: str | None,
    acks: int,
    timeout_ms: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, bytes]]]],
) -> bytes:
    """A Produce v7 request's body (v3 to v8 share it): `topics` as (topic,
    [(partition, record batches)])."""
    parts = [_string(transactional_id), _PRODUCE_HEAD.pack(acks, timeout_ms)]
    parts.append(_I32.pack(len(topics)))
    for topic, partitions in topics:
        parts.append(_string(topic))
        parts.append(_I32.pack(len(partitions)))
        for partition, records in partitions:
            parts.append(_I32.pack(partition))
            parts.append(_I32.pack(len(records)))
            parts.append(records)
    return b"".join(parts)


def encode_fetch(
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    isolation_level: int,
    session_id: int,
    session_epoch: int,
    topics: Sequence[tuple[str, Sequence[tuple[int, int, int]]]],
    forgotten: Sequence[tuple[str, Sequence[int]]],
    rack_id: str = "",
) -> bytes:
    """A Fetch v11 request's body, as a consumer sends it: `topics` as (topic,
    [(partition, position, partition max bytes)]), `forgotten` as (topic, [partition])."""
    parts = [
        _FETCH_HEAD.pack(
            REPLICA_CONSUMER,
            max_wait_ms,
            min_bytes,
            max_bytes,
            isolation_level,
            session_id,
            session_epoch,
        ),
        _I32.pack(len(topics)),
    ]
    for topic, partitions in topics:
        parts.append(_string(topic))
        parts.append(_I32.pack(len(partitions)))
        for partition, position, limit in partitions:
            parts.append(_FETCH_PARTITION.pack(partition, UNKNOWN, position, UNKNOWN, limit))
    parts.append(_I32.pack(len(forgotten)))
    for topic, numbers in forgotten:
        parts.append(_string(topic))
        parts.append(_I32.pack(len(numbers)))
        parts.extend(_I32.pack(number) for number in numbers)
    parts.append(_string(rack_id))
    return b"".join(parts)


class _Reader:
    """Reads a body front to back in place (a string's or bytes field's bytes are copied
    out, nothing else); a body cut short raises ValueError (struct.error for a number)."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = memoryview(data)
        self.at = 0

    def take(self, shape: struct.Struct) -> tuple[int, ...]:
        values = shape.unpack_from(self.data, self.at)
        self.at += shape.size
        return values

    def int16(self) -> int:
        return int(self.take(_I16)[0])

    def int32(self) -> int:
        return int(self.take(_I32)[0])

    def _chunk(self, length: int) -> memoryview:
        end = self.at + length
        if end > len(self.data):
            raise ValueError(f"a field of {length} bytes runs past the body's {len(self.data)}")
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def string(self) -> str | None:
        length = self.int16()
        return None if length < 0 else str(self._chunk(length), "utf-8")

    def bytes_(self) -> bytes | None:
        length = self.int32()
        return None if length < 0 else bytes(self._chunk(length))

    def count(self) -> int:
        """An array's length; -1 (null) reads as -1."""
        return self.int32()


@dataclass(frozen=True)
class ProduceAnswer:
    """A Produce v7 answer: `topics` as (topic, [(partition, error code, base offset,
    log append time, log start offset)])."""

    API_VERSION = 7
    topics: list[tuple[str | None, list[tuple[object, ...]]]]
    throttle_time_ms: int


def decode_produce_answer(data: bytes | memoryview) -> ProduceAnswer:
    """A Produce v7 answer's body (after the response header)."""
    reader = _Reader(data)
    topics: list[tuple[str | None, list[tuple[object, ...]]]] = []
    for _ in range(reader.count()):
        topic = reader.string()
        partitions: list[tuple[object, ...]] = []
        for _ in range(reader.count()):
            partitions.append(reader.take(_PRODUCE_ANSWER))
        topics.append((topic, partitions))
    return ProduceAnswer(topics, reader.int32())


@dataclass(frozen=True)
class FetchAnswer:
    """A Fetch v11 answer: `topics` as (topic, [(partition, error code, high watermark,
    last stable offset, log start offset, aborted transactions as [(producer id, first
    offset)] or None, preferred read replica, records or None)])."""

    API_VERSION = 11
    throttle_time_ms: int
    error_code: int
    session_id: int
    topics: list[tuple[str | None, list[tuple[object, ...]]]]


def decode_fetch_answer(data: bytes | memoryview) -> FetchAnswer:
    """A Fetch v11 answer's body (after the response header)."""
    reader = _Reader(data)
    throttle, error_code, session_id = reader.int32(), reader.int16(), reader.int32()
    topics: list[tuple[str | None, list[tuple[object, ...]]]] = []
    for _ in range(reader.count()):
        topic = reader.string()
        partitions: list[tuple[object, ...]] = []
        for _ in range(reader.count()):
            head = reader.take(_FETCH_ANSWER)
            aborted_count = reader.count()
            aborted = (
                None if aborted_count < 0 else [reader.take(_ABORTED) for _ in range(aborted_count)]
            )
            replica = reader.int32()
            partitions.append((*head, aborted, replica, reader.bytes_()))
        topics.append((topic, partitions))
    return FetchAnswer(throttle, error_code, session_id, topics)
