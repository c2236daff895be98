"""Confluent's wire framing of registry-encoded keys and values, and subject names (pure).

A framed key or value is ``0x00`` (the magic byte), the schema id as a 4-byte big-endian
signed integer, then the payload (Avro binary; Protobuf message indexes then the message;
JSON text). Only the id depends on the registry: rewriting it leaves the payload, Protobuf
message indexes included, byte for byte as it was. Anything shorter than five bytes or not
starting with the magic byte is not framed and stays as it is.

Subjects: with Confluent's default TopicNameStrategy a topic's value schemas live under
``<topic>-value`` and its key schemas under ``<topic>-key``; on the target they belong under
the remote topic's name (``A.orders-value``). Subjects of other strategies (RecordName,
TopicRecordName, or any other name) keep their names.
"""

from __future__ import annotations

MAGIC = 0
HEADER_SIZE = 5
KEY_SUFFIX = "-key"
VALUE_SUFFIX = "-value"


def schema_id(data: bytes | None) -> int | None:
    """The schema id of a framed key or value; None when `data` is not framed."""
    if data is None or len(data) < HEADER_SIZE or data[0] != MAGIC:
        return None
    return int.from_bytes(data[1:HEADER_SIZE], "big", signed=True)


def header(schema_id: int) -> bytes:
    """The 5-byte framing header for `schema_id`."""
    return b"\x00" + schema_id.to_bytes(4, "big", signed=True)


def with_schema_id(data: bytes, new_id: int) -> bytes:
    """`data` (framed) with its schema id replaced by `new_id`; the payload unchanged."""
    return header(new_id) + data[HEADER_SIZE:]


def topic_subjects(topic: str) -> tuple[str, str]:
    """The TopicNameStrategy subjects of `topic`: (key subject, value subject)."""
    return topic + KEY_SUFFIX, topic + VALUE_SUFFIX


def remote_subject(subject: str, topic: str, remote_topic: str) -> str:
    """The target's name for a source `subject` met in a record of `topic`.

    ``<topic>-key`` and ``<topic>-value`` become ``<remote_topic>-key|-value``; any other
    subject (another naming strategy, a referenced schema's own subject) keeps its name.
    """
    for suffix in (KEY_SUFFIX, VALUE_SUFFIX):
        if subject == topic + suffix:
            return remote_topic + suffix
    return subject
