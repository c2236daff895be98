"""mm2py verify's pure core: digests, pairing records of both sides, alignment, report."""

from __future__ import annotations

import io
import json

import pytest

from mm2py.compat.offsets import Translation
from mm2py.tools.digest import (
    PartitionComparison,
    Unaligned,
    VerifyReport,
    align,
    format_json,
    format_text,
    record_digest,
)
from mm2py.tools.verify import ProgressBar


def _d(i: int, value: bytes | None = None) -> bytes:
    return record_digest(f"k{i}".encode(), value or f"v{i}".encode(), [("h", b"1")], 1000 + i)


def test_digest_covers_key_value_headers_timestamp_and_tells_null_from_empty() -> None:
    base = record_digest(b"k", b"v", [("a", b"1"), ("b", None)], 5)
    assert base == record_digest(b"k", b"v", [("a", b"1"), ("b", None)], 5)
    variants = [
        record_digest(None, b"v", [("a", b"1"), ("b", None)], 5),
        record_digest(b"", b"v", [("a", b"1"), ("b", None)], 5),
        record_digest(b"k", None, [("a", b"1"), ("b", None)], 5),
        record_digest(b"k", b"v", [("b", None), ("a", b"1")], 5),  # header order
        record_digest(b"k", b"v", [("a", b"1"), ("b", b"")], 5),
        record_digest(b"k", b"v", [("a", b"1")], 5),
        record_digest(b"k", b"v", [("a", b"1"), ("b", None)], 6),
        record_digest(b"kv", b"", [("a", b"1"), ("b", None)], 5),  # field boundaries
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_equal_sequences_match_whatever_the_offsets_and_interleaving() -> None:
    cmp = PartitionComparison()
    for i in range(10):  # the target first, with other offsets (markers on the source)
        cmp.add_target(i, _d(i))
    for i in range(10):
        cmp.add_source(i * 2 + 1, _d(i))
    cmp.end_source()
    cmp.end_target()
    result = cmp.result("t", "A.t", 0)
    assert result.status == "match" and result.ok
    assert (result.source_records, result.target_records, result.compared) == (10, 10, 10)
    assert result.source_digest == result.target_digest
    assert cmp.pending == (0, 0)


def test_a_target_behind_its_source_passes_and_says_how_far() -> None:
    cmp = PartitionComparison()
    for i in range(5):
        cmp.add_target(i, _d(i))
    cmp.end_target()
    for i in range(8):
        cmp.add_source(i, _d(i))
    cmp.end_source()
    result = cmp.result("t", "A.t", 0)
    assert result.status == "behind" and result.ok
    assert result.compared == 5 and "3 source records" in result.detail


def test_a_record_produced_into_the_remote_topic_is_caught() -> None:
    # At the end: the target has more records than its source.
    cmp = PartitionComparison()
    for i in range(5):
        cmp.add_source(i, _d(i))
        cmp.add_target(i, _d(i))
    cmp.add_target(5, _d(99))
    cmp.end_source()
    cmp.end_target()
    assert cmp.result("t", "A.t", 0).status == "extra"
    # In the middle: every later record is shifted.
    cmp = PartitionComparison()
    target = [_d(0), _d(1), _d(99), _d(2), _d(3)]
    for i, digest in enumerate(target):
        cmp.add_target(100 + i, digest)
    for i in range(4):
        cmp.add_source(i, _d(i))
    cmp.end_source()
    cmp.end_target()
    result = cmp.result("t", "A.t", 0)
    assert result.status == "mismatch" and not result.ok
    assert result.first_difference is not None
    assert (result.first_difference.index, result.first_difference.source_offset) == (2, 2)
    assert result.first_difference.target_offset == 102
    assert result.source_digest != result.target_digest


def test_alignment_from_the_start_or_through_the_offset_syncs() -> None:
    assert align(0, 0, None) == (0, 0)
    assert align(40, 0, Translation(37, True)) == (40, 37)
    with pytest.raises(Unaligned, match="no offset sync places the source's first record"):
        align(40, 0, None)
    with pytest.raises(Unaligned, match="no offset sync places the source's first record"):
        align(40, 0, Translation(37, False))  # an inexact translation places nothing
    with pytest.raises(Unaligned, match="the target no longer has the copy of source offset 40"):
        align(40, 50, Translation(37, True))


def test_report_table_and_json() -> None:
    ok = PartitionComparison()
    ok.add_source(0, _d(0))
    ok.add_target(0, _d(0))
    ok.end_source()
    ok.end_target()
    bad = PartitionComparison()
    bad.add_source(0, _d(0))
    bad.add_target(0, _d(1))
    bad.end_source()
    bad.end_target()
    report = VerifyReport("A->B", [ok.result("t", "A.t", 0), bad.result("t", "A.t", 1)])
    assert not report.ok
    text = format_text(report)
    assert "MISMATCH" in text and "t-1: record 0" in text and "1 do not match" in text
    doc = json.loads(format_json(report))
    assert doc["ok"] is False
    assert [p["status"] for p in doc["partitions"]] == ["match", "mismatch"]
    assert doc["partitions"][1]["first_difference"]["source_offset"] == 0


def test_progress_bar_draws_one_line_and_clears_it() -> None:
    stream = io.StringIO()
    bar = ProgressBar(200, stream=stream, width=10)
    bar(50)
    assert stream.getvalue() == "\rverifying [##--------]  25%  50 records"
    bar.close()
    assert "\n" not in stream.getvalue() and stream.getvalue().endswith("\r")
