"""Byte-level tests of Confluent's framing and subject naming (mm2py.compat.schema_framing)."""

from __future__ import annotations

import pytest

from mm2py.compat.schema_framing import (
    header,
    remote_subject,
    schema_id,
    topic_subjects,
    with_schema_id,
)


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (h("00 00000001 02 61"), 1),  # Avro string "a" under id 1
        (h("00 00000100"), 256),  # framing only: an empty payload
        (h("00 7fffffff 00"), 2**31 - 1),
        (h("00 ffffffff 00"), -1),  # signed, as Java's ByteBuffer.getInt reads it
        (h("00 00010203 00 0a03 616263"), 66051),  # Protobuf: message index 0, then the message
    ],
)
def test_schema_id_of_framed_data(data: bytes, expected: int) -> None:
    assert schema_id(data) == expected


@pytest.mark.parametrize(
    "data",
    [None, b"", h("00"), h("00 000000"), h("01 00000001 00"), b'{"id": 1}', h("7b 00000001")],
)
def test_unframed_data_has_no_schema_id(data: bytes | None) -> None:
    assert schema_id(data) is None


def test_header() -> None:
    assert header(1) == h("00 00000001")
    assert header(2**31 - 1) == h("00 7fffffff")


def test_with_schema_id_rewrites_the_id_only() -> None:
    protobuf = h("00 00000007 04 02 00 0a 03 616263")  # indexes [1, 0], then the message
    assert with_schema_id(protobuf, 300) == h("00 0000012c 04 02 00 0a 03 616263")
    assert with_schema_id(h("00 00000007"), 2**31 - 1) == h("00 7fffffff")
    assert schema_id(with_schema_id(protobuf, 12345)) == 12345


def test_topic_name_strategy_subjects_follow_the_remote_topic() -> None:
    assert topic_subjects("orders") == ("orders-key", "orders-value")
    assert remote_subject("orders-value", "orders", "A.orders") == "A.orders-value"
    assert remote_subject("orders-key", "orders", "A.orders") == "A.orders-key"


def test_other_subjects_keep_their_names() -> None:
    # RecordNameStrategy, TopicRecordNameStrategy, another topic's subject, a reference.
    assert remote_subject("com.acme.Order", "orders", "A.orders") == "com.acme.Order"
    assert remote_subject("orders-com.acme.Order", "orders", "A.orders") == (
        "orders-com.acme.Order"
    )
    assert remote_subject("payments-value", "orders", "A.orders") == "payments-value"
    assert remote_subject("orders-value", "orders", "orders") == "orders-value"  # identity
