"""Record batches for pass-through: vectors built by hand here (struct, the v2 layout of
DefaultRecordBatch.java), cross-checked against aiokafka's DefaultRecordBatchBuilder, which
also builds the compressed ones."""

from __future__ import annotations

import gzip
import random
import struct

import google_crc32c
import pytest
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from aiokafka.record.util import calc_crc32c

from mm2py.kafka.record_batches import (
    AbortedTransaction,
    Classified,
    Compression,
    CorruptBatchError,
    Decision,
    Placement,
    Reason,
    classify,
    crc32c,
    merge,
    merge_small,
    next_sequence,
    parse_header,
    rewrite_for_produce,
    split_batches,
    unpassable,
)

TS = 1_700_000_000_000


def zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def record(
    offset_delta: int,
    ts_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]] = (),  # type: ignore[assignment]
) -> bytes:
    body = b"\x00" + zigzag(ts_delta) + zigzag(offset_delta)
    body += zigzag(-1) if key is None else zigzag(len(key)) + key
    body += zigzag(-1) if value is None else zigzag(len(value)) + value
    body += zigzag(len(headers))
    for name, hvalue in headers:
        body += zigzag(len(name)) + name.encode()
        body += zigzag(-1) if hvalue is None else zigzag(len(hvalue)) + hvalue
    return zigzag(len(body)) + body


def batch(
    base_offset: int = 0,
    records: list[bytes] | None = None,
    *,
    attributes: int = 0,
    last_offset_delta: int | None = None,
    count: int | None = None,
    base_ts: int = TS,
    max_ts: int | None = None,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    leader_epoch: int = 0,
) -> bytes:
    """A v2 batch, laid out field by field."""
    records = [record(0, 0, b"k", b"v")] if records is None else records
    count = len(records) if count is None else count
    last_offset_delta = count - 1 if last_offset_delta is None else last_offset_delta
    after_crc = struct.pack(
        ">hiqqqhii",
        attributes,
        last_offset_delta,
        base_ts,
        base_ts if max_ts is None else max_ts,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) + b"".join(records)
    crc = calc_crc32c(after_crc)
    length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", base_offset, length, leader_epoch, 2, crc) + after_crc


def control(base_offset: int, producer_id: int, kind: int) -> bytes:
    """A transaction marker: key (version 0, type), value (version 0, coordinator epoch 0)."""
    key = struct.pack(">hh", 0, kind)
    value = struct.pack(">hi", 0, 0)
    return batch(
        base_offset,
        [record(0, 0, key, value)],
        attributes=0x30,
        producer_id=producer_id,
        producer_epoch=0,
    )


def txn(base_offset: int, producer_id: int, records: int = 1) -> bytes:
    return batch(
        base_offset,
        [record(i, 0, b"k", b"v") for i in range(records)],
        attributes=0x10,
        producer_id=producer_id,
        producer_epoch=0,
        base_sequence=base_offset,
    )


def aiokafka_batch(
    compression: int, count: int = 20, producer: tuple[int, int, int] = (-1, -1, -1)
) -> bytearray:
    builder = DefaultRecordBatchBuilder(2, compression, 0, *producer, 1 << 20)
    for i in range(count):
        builder.append(i, TS + i, f"key-{i}".encode(), b"v" * 200, [("h", f"{i}".encode())])
    return builder.build()


def test_crc32c_known_vector() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(memoryview(b"123456789")) == 0xE3069283
    assert crc32c(bytearray(b"123456789")) == 0xE3069283


def test_crc32c_is_the_cpus_and_agrees_with_aiokafkas() -> None:
    # google-crc32c's C build on the platforms with wheels (its pure-Python fallback would
    # be 25,000 times slower than the instruction; record_batches would use aiokafka's)
    assert google_crc32c.implementation == "c"
    rng = random.Random(7)
    for size in (0, 1, 7, 8, 63, 64, 1000, 65536, 100_003):
        data = rng.randbytes(size)
        assert crc32c(data) == calc_crc32c(data), size


def test_hand_built_batch_equals_aiokafka_builder() -> None:
    headers: list[tuple[str, bytes | None]] = [("h", b"\x00\x01"), ("n", None)]
    mine = batch(
        0,
        [record(0, 0, b"key-0", b"value-0", headers), record(1, 5, None, b"value-1", headers)],
        max_ts=TS + 5,
        producer_id=42,
        producer_epoch=3,
        base_sequence=17,
        leader_epoch=-1,
    )
    builder = DefaultRecordBatchBuilder(2, 0, 0, 42, 3, 17, 1 << 20)
    builder.append(0, TS, b"key-0", b"value-0", headers)
    builder.append(1, TS + 5, None, b"value-1", headers)
    theirs = bytes(builder.build())
    # a producer sends partitionLeaderEpoch -1 (the broker sets it)
    assert mine == theirs


def test_parse_header_fields() -> None:
    data = batch(
        1000,
        [record(0, 0, b"a", b"b"), record(1, 7, b"c", b"d")],
        attributes=0x13,  # lz4 code, transactional (header only: the payload is not read)
        max_ts=TS + 7,
        producer_id=4242,
        producer_epoch=9,
        base_sequence=77,
        leader_epoch=5,
    )
    header = parse_header(data)
    assert header.base_offset == 1000
    assert header.size == len(data)
    assert header.partition_leader_epoch == 5
    assert header.magic == 2
    assert header.crc == calc_crc32c(data[21:])
    assert header.compression is Compression.LZ4
    assert header.transactional and not header.control
    assert not header.log_append_time and not header.has_delete_horizon
    assert (header.last_offset_delta, header.record_count, header.last_offset) == (1, 2, 1001)
    assert (header.base_timestamp, header.max_timestamp) == (TS, TS + 7)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (4242, 9, 77)


def test_split_drops_a_truncated_tail() -> None:
    first, second, third = batch(0), batch(1), batch(2, [record(0, 0, b"x" * 50, b"y")])
    split = split_batches(first + second + third[:40])
    assert [b.header.base_offset for b in split.batches] == [0, 1]
    assert split.truncated == 40
    assert bytes(split.batches[1].data) == second
    # a tail shorter than baseOffset + length, and one cut after the header
    assert split_batches(first + third[:7]).truncated == 7
    assert split_batches(first + third[:-1]).truncated == len(third) - 1
    assert split_batches(b"").batches == []


def test_corrupt_bytes_raise() -> None:
    bad_magic = bytearray(batch(0))
    bad_magic[16] = 3
    with pytest.raises(CorruptBatchError, match="magic 3"):
        split_batches(bytes(bad_magic))
    short = bytearray(batch(0))
    struct.pack_into(">i", short, 8, 20)  # a v2 batch shorter than its header
    with pytest.raises(CorruptBatchError, match="length 20"):
        split_batches(bytes(short[:32]))


def test_crc_valid() -> None:
    data = bytearray(batch(0))
    assert split_batches(bytes(data)).batches[0].crc_valid()
    data[-1] ^= 0xFF
    assert not split_batches(bytes(data)).batches[0].crc_valid()


def test_rewrite_round_trip() -> None:
    headers: list[tuple[str, bytes | None]] = [("h", b"1")]
    source = batch(
        5000,
        [record(0, 0, b"a", b"1", headers), record(1, 3, b"b", None, headers)],
        max_ts=TS + 3,
        producer_id=42,
        producer_epoch=1,
        base_sequence=900,
        leader_epoch=12,
    )
    (original,) = split_batches(source).batches
    out = rewrite_for_produce(original, 7, 2, 30, transactional=False)
    header = parse_header(out)
    assert header.base_offset == 0
    assert header.partition_leader_epoch == -1
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 30)
    assert not header.transactional
    assert header.crc == calc_crc32c(bytes(out[21:]))
    # everything else is the source's, byte for byte
    assert out[17:] != source[17:]
    assert out[21:43] == source[21:43]
    assert out[57:] == source[57:]
    read = DefaultRecordBatch(bytes(out))
    assert read.validate_crc()
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in read] == [
        (0, TS, b"a", b"1", headers),
        (1, TS + 3, b"b", None, headers),
    ]
    transactional = rewrite_for_produce(original, 7, 2, 30, transactional=True)
    assert parse_header(transactional).transactional
    assert DefaultRecordBatch(bytes(transactional)).validate_crc()
    # and back: a transactional source batch produced by an idempotent producer
    (source_txn,) = split_batches(txn(10, 3)).batches
    assert not parse_header(rewrite_for_produce(source_txn, 7, 2, 0, False)).transactional


def test_rewrite_keeps_the_compressed_payload() -> None:
    # gzip, since aiokafka's zstd and lz4 need extras this project does not install (the
    # integration test passes zstd and lz4 batches that confluent-kafka wrote)
    source = aiokafka_batch(DefaultRecordBatch.CODEC_GZIP, producer=(11, 0, 0))
    (original,) = split_batches(source).batches
    assert original.header.compression is Compression.GZIP
    assert original.header.size < 20 * 200  # compressed indeed
    out = rewrite_for_produce(original, 99, 4, 1234, transactional=False)
    assert out[61:] == source[61:]
    assert bytes(split_batches(out).batches[0].payload) == bytes(original.payload)
    read = DefaultRecordBatch(bytes(out))
    assert read.validate_crc()
    assert [r.key for r in read] == [f"key-{i}".encode() for i in range(20)]


def test_hand_built_gzip_batch() -> None:
    records = [record(i, i, f"k{i}".encode(), b"x" * 100) for i in range(10)]
    payload = gzip.compress(b"".join(records))
    data = batch(
        0,
        [payload],
        attributes=1,
        count=10,
        max_ts=TS + 9,
        producer_id=5,
        producer_epoch=0,
        base_sequence=0,
    )
    (original,) = split_batches(data).batches
    assert original.crc_valid() and original.header.compression is Compression.GZIP
    out = rewrite_for_produce(original, 6, 1, 10, transactional=False)
    assert out[61:] == payload
    assert [r.timestamp for r in DefaultRecordBatch(bytes(out))] == [TS + i for i in range(10)]


def legacy_v1(offset: int) -> bytes:
    """A magic 1 message: crc, magic, attributes, timestamp, key, value."""
    body = struct.pack(">bbq", 1, 0, TS) + struct.pack(">i", 1) + b"k" + struct.pack(">i", 1)
    body += b"v"
    message = struct.pack(">I", 0) + body
    return struct.pack(">qi", offset, len(message)) + message


@pytest.mark.parametrize(
    ("data", "position", "reason"),
    [
        (batch(10), 10, Reason.WHOLE),
        (batch(10, [record(0, 0, b"a", b"1"), record(3, 0, b"b", b"2")]), 10, Reason.WHOLE),
        (
            batch(10, [record(0, 0, b"a", b"1"), record(3, 0, b"b", b"2")], last_offset_delta=3),
            10,
            Reason.OFFSET_GAPS,
        ),
        (
            batch(10, [record(0, 0, b"a", b"1"), record(1, 0, b"b", b"2")]),
            11,
            Reason.STARTS_BEFORE_POSITION,
        ),
        (batch(10, attributes=0x40), 10, Reason.DELETE_HORIZON),
        (batch(10, attributes=0x08), 10, Reason.LOG_APPEND_TIME),
        (control(10, 5, 1), 10, Reason.CONTROL),
        (legacy_v1(10), 10, Reason.LEGACY_MAGIC),
    ],
)
def test_classify_reasons(data: bytes, position: int, reason: Reason) -> None:
    (classified,) = classify(split_batches(data).batches, position, [])
    assert classified.reason is reason
    expected = {Reason.WHOLE: Decision.PASS, Reason.CONTROL: Decision.DROP}.get(
        reason, Decision.RECORDS
    )
    assert classified.decision is expected
    if reason is not Reason.WHOLE and reason is not Reason.STARTS_BEFORE_POSITION:
        assert unpassable(classified.batch.header) is reason
        with pytest.raises(ValueError, match=reason.value):
            rewrite_for_produce(classified.batch, 1, 0, 0, False)


def test_aborted_transactions_with_interleaved_producers() -> None:
    # P1 aborts its first transaction (offsets 0, 3) while P2 commits (2, 4); P1's second
    # transaction (8) commits; P3 aborts a transaction that started before the fetch (at 1)
    log = [
        txn(0, 1),  # P1, aborted
        txn(1, 3, records=1),  # P3, aborted, before the fetch position
        txn(2, 2),  # P2, committed
        txn(3, 1, records=2),  # P1, aborted (3, 4)
        batch(5, producer_id=9, producer_epoch=0, base_sequence=0),  # idempotent, no txn
        control(6, 2, 1),  # P2 COMMIT
        control(7, 1, 0),  # P1 ABORT
        txn(8, 1),  # P1 again, committed
        txn(9, 3),  # P3 still inside its aborted transaction
        control(10, 1, 1),  # P1 COMMIT
        control(11, 3, 0),  # P3 ABORT
    ]
    fetched = b"".join(log[2:])  # fetched at 2: P3's first batch is not in the response
    aborted = [AbortedTransaction(3, 1), AbortedTransaction(1, 0)]  # the broker's order varies
    got = [
        (c.batch.header.base_offset, c.reason)
        for c in classify(split_batches(fetched).batches, 2, aborted)
    ]
    assert got == [
        (2, Reason.WHOLE),
        (3, Reason.ABORTED),
        (5, Reason.WHOLE),
        (6, Reason.CONTROL),
        (7, Reason.CONTROL),
        (8, Reason.WHOLE),
        (9, Reason.ABORTED),
        (10, Reason.CONTROL),
        (11, Reason.CONTROL),
    ]
    # a second aborted transaction of P1 that starts at 8
    again = classify(
        split_batches(b"".join(log)).batches,
        0,
        [AbortedTransaction(1, 0), AbortedTransaction(3, 1), AbortedTransaction(1, 8)],
    )
    assert [c.reason for c in again][:4] == [Reason.ABORTED] * 2 + [Reason.WHOLE, Reason.ABORTED]
    assert again[7].reason is Reason.ABORTED
    # without aborted transactions (read_committed found none) everything is kept
    assert [c.decision for c in classify(split_batches(txn(0, 1)).batches, 0, [])] == [
        Decision.PASS
    ]


def test_next_sequence_wraps_as_kafka_does() -> None:
    assert next_sequence(0, 5) == 5
    assert next_sequence(0x7FFFFFFF - 5, 5) == 0x7FFFFFFF
    assert next_sequence(0x7FFFFFFF - 4, 5) == 0
    assert next_sequence(0x7FFFFFFF, 3) == 2


def test_placement_maps_offsets_one_for_one() -> None:
    placement = Placement(source_base_offset=100, record_count=3, target_base_offset=40)
    assert [placement.target_offset(o) for o in (100, 101, 102)] == [40, 41, 42]
    assert placement.source_last_offset == 102
    with pytest.raises(ValueError):
        placement.target_offset(103)


def read_records(data: bytes | bytearray | memoryview) -> list[tuple[int, int, bytes, bytes, list]]:
    """(offset, timestamp, key, value, headers) of each record, as aiokafka reads them."""
    return [
        (r.offset, r.timestamp, r.key, r.value, list(r.headers))
        for r in DefaultRecordBatch(bytes(data))
    ]


def passing(*datas: bytes | bytearray) -> list[Classified]:
    return classify([b for d in datas for b in split_batches(d).batches], 0, [])


def test_merge_keeps_every_record_its_offset_timestamp_and_headers() -> None:
    one = batch(100, [record(0, 0, b"a", b"1", [("h", b"x")])], base_ts=TS + 5)
    three = batch(
        101,
        [record(0, 0, b"b", b"2"), record(1, -3, None, b"3"), record(2, 9, b"d", None)],
        base_ts=TS + 10,
        max_ts=TS + 19,
        producer_id=7,
        producer_epoch=1,
        base_sequence=40,
    )
    batches = [split_batches(d).batches[0] for d in (one, three)]
    merged = merge(batches)
    assert merged.crc_valid()
    header = merged.header
    assert (header.base_offset, header.record_count, header.last_offset) == (100, 4, 103)
    assert (header.base_timestamp, header.max_timestamp) == (TS + 5, TS + 19)
    assert header.producer_id == -1
    assert read_records(merged.data) == read_records(one) + read_records(three)
    assert read_records(merged.data)[2][1] == TS + 7  # a delta below the batch's base


def test_merge_small_joins_runs_at_consecutive_offsets_only() -> None:
    small = [batch(i, [record(0, 0, b"k", b"v" * 100)]) for i in range(10, 14)]
    marker = control(14, 5, 1)
    after = [batch(i, [record(0, 0, b"k", b"v")]) for i in (15, 16)]
    items = merge_small(passing(*small, marker, *after))
    assert [
        (i.decision, i.batch.header.base_offset, i.batch.header.record_count) for i in items
    ] == [
        (Decision.PASS, 10, 4),
        (Decision.DROP, 14, 1),
        (Decision.PASS, 15, 2),
    ]
    assert read_records(items[0].batch.data) == [r for d in small for r in read_records(d)]


def test_merge_small_leaves_compressed_large_and_lone_batches_as_they_are() -> None:
    gzipped = bytes(aiokafka_batch(Compression.GZIP, count=2))
    large = batch(2, [record(0, 0, b"k", b"v" * 5000)])
    lone = batch(3)
    items = passing(
        struct.pack(">q", 0) + gzipped[8:],
        large,
        lone,
        batch(5),  # offset 4 is missing: not consecutive with `lone`
    )
    assert merge_small(items) == items


def test_merged_batches_close_before_the_size_limit() -> None:
    value = b"v" * 3000  # 3,070 bytes a batch: small, and 86 of them pass 256 KiB (85 do not)
    items = passing(*(batch(i, [record(0, 0, None, value)]) for i in range(100)))
    assert items[0].batch.header.size == 3070
    merged = merge_small(items)
    assert [i.batch.header.record_count for i in merged] == [85, 15]
    assert all(i.batch.header.size <= 256 << 10 for i in merged)
    assert merged[1].batch.header.base_offset == 85
