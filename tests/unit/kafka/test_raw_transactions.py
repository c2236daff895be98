"""The pure parts of mm2py.kafka.raw_transactions: batches built from records, and the
error a coordinator's answer carries."""

from __future__ import annotations

from types import SimpleNamespace

from aiokafka.record.default_records import DefaultRecordBatch

from mm2py.kafka.raw_transactions import RECORDS_BATCH_BYTES, _error_code, build_batches
from mm2py.kafka.record_batches import Compression, rewrite_for_produce


def _read(data: bytes) -> list[tuple[object, ...]]:
    batch = DefaultRecordBatch(data)
    return [(r.offset, r.key, r.value, r.timestamp, list(r.headers)) for r in batch]


def test_records_become_one_uncompressed_batch_with_what_a_reader_needs() -> None:
    records = [
        (b"k0", b"v0", 1_700_000_000_000, [("h", b"1")]),
        (None, b"v1", 1_700_000_000_005, []),
        (b"k2", None, 1_699_999_999_990, [("empty", None)]),
    ]
    (batch,) = build_batches(records)
    header = batch.header
    assert header.record_count == 3 and header.base_offset == 0
    assert header.compression is Compression.NONE and not header.transactional
    assert not header.log_append_time and batch.crc_valid()
    assert header.max_timestamp == 1_700_000_000_005
    produced = bytes(rewrite_for_produce(batch, 7, 1, 40, True))
    assert _read(produced) == [
        (0, b"k0", b"v0", 1_700_000_000_000, [("h", b"1")]),
        (1, None, b"v1", 1_700_000_000_005, []),
        (2, b"k2", None, 1_699_999_999_990, [("empty", None)]),
    ]


def test_records_past_the_batch_size_go_in_further_batches_in_order() -> None:
    value = b"x" * (RECORDS_BATCH_BYTES // 4)
    records = [(f"k{i}".encode(), value, 1_700_000_000_000 + i, []) for i in range(9)]
    batches = build_batches(records)
    assert len(batches) == 3
    assert [b.header.record_count for b in batches] == [3, 3, 3]
    keys = [key for b in batches for (_, key, *_rest) in _read(bytes(b.data))]
    assert keys == [f"k{i}".encode() for i in range(9)]


def test_a_record_larger_than_a_batch_gets_one_of_its_own() -> None:
    big = b"y" * (RECORDS_BATCH_BYTES + 10)
    batches = build_batches([(b"a", b"1", 1, []), (b"b", big, 2, []), (b"c", b"3", 3, [])])
    assert [b.header.record_count for b in batches] == [1, 1, 1]


def test_no_records_no_batch() -> None:
    assert build_batches([]) == []


def test_a_coordinators_answer_gives_its_error() -> None:
    assert _error_code(SimpleNamespace(error_code=51)) == 51
    assert _error_code(SimpleNamespace(error_code=0)) == 0
    # AddPartitionsToTxn: the failing partition's error, not the others' "not attempted"
    added = SimpleNamespace(errors=[("t", [(0, 55), (1, 53)]), ("u", [(0, 55)])])
    assert _error_code(added) == 53
    assert _error_code(SimpleNamespace(errors=[("t", [(0, 0), (1, 0)])])) == 0
