"""MM2's wire formats: offset syncs, checkpoints, heartbeats and Connect source offsets.

Pure encode/decode, no I/O. Offset syncs, checkpoints and heartbeats use Kafka's protocol
``Schema`` types as MM2's classes do; progress records are Kafka Connect's offsets topic
as MM2's dedicated mode writes them (`SourceProgressKey`, `encode_progress_value`,
`partition_for_key`).

Invariants:
- every encoder produces exactly the bytes MM2 writes (pinned by byte-level test vectors);
- decoding is as lenient as MM2's readers (trailing bytes ignored; a version other than 0
  read with the version-0 layout) and stricter only where MM2 would produce garbage
  (negative versions, invalid UTF-8);
- any decoding error is a ``ValueError`` naming the record type, key or value, and field.
Design: docs/design/internal-topics.md.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Final, NoReturn

__all__ = [
    "AFTER_START_SYNC_HEADER",
    "CONTIGUOUS_SYNC_HEADER",
    "DEFAULT_OFFSET_STORAGE_PARTITIONS",
    "POSITION_SYNC_HEADER",
    "SOURCE_CONNECTOR_NAME",
    "Checkpoint",
    "Heartbeat",
    "OffsetSync",
    "SourceProgressKey",
    "decode_progress_value",
    "encode_progress_value",
    "is_after_start_sync",
    "is_contiguous_sync",
    "is_position_sync",
    "murmur2",
    "partition_for_key",
    "to_positive",
]

# Kafka's STRING type stores its length in an INT16.
MAX_STRING_BYTES: Final = 0x7FFF
INT32_MAX: Final = 0x7FFF_FFFF
INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1

# Version written in the INT16 header of checkpoint and heartbeat values.
CHECKPOINT_VERSION: Final = 0
HEARTBEAT_VERSION: Final = 0

# MM2's dedicated mode names each connector after its class's simple name.
SOURCE_CONNECTOR_NAME: Final = "MirrorSourceConnector"
# Connect's `offset.storage.partitions` default; the real count is the topic's.
DEFAULT_OFFSET_STORAGE_PARTITIONS: Final = 25

# Precompiled once: encoders run on hot paths.
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_I64: Final = struct.Struct(">q")
_I64_I64: Final = struct.Struct(">qq")
_I16_I64: Final = struct.Struct(">hq")
_I16_I64_I64: Final = struct.Struct(">hqq")


# --------------------------------------------------------------------------- helpers


def _encode_string(value: str, where: str, field: str) -> bytes:
    """STRING: INT16 length in bytes (not characters), then the UTF-8 bytes."""
    try:
        data = value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{where}: field '{field}' cannot be encoded as UTF-8: {e}") from None
    except AttributeError:
        raise ValueError(
            f"{where}: field '{field}' must be a str, got {type(value).__name__}"
        ) from None
    if len(data) > MAX_STRING_BYTES:
        raise ValueError(
            f"{where}: field '{field}' is {len(data)} bytes in UTF-8; "
            f"Kafka's STRING type holds at most {MAX_STRING_BYTES}"
        )
    return _I16.pack(len(data)) + data


def _range_error(where: str, checks: tuple[tuple[str, object, int, int], ...]) -> NoReturn:
    """Raise a ValueError naming the first field that does not fit its integer type."""
    for field, value, low, high in checks:
        if not isinstance(value, int):
            raise ValueError(f"{where}: field '{field}' must be an int, got {type(value).__name__}")
        if not low <= value <= high:
            raise ValueError(f"{where}: field '{field}' = {value} is outside [{low}, {high}]")
    raise ValueError(f"{where}: cannot encode {checks!r}")  # pragma: no cover


def _int64(field: str, value: object) -> tuple[str, object, int, int]:
    return (field, value, INT64_MIN, INT64_MAX)


def _not_null(data: bytes | None, where: str) -> bytes:
    if data is None:
        raise ValueError(f"{where} is null (tombstone); MM2 never writes one")
    return data


def _truncated(data: bytes, pos: int, need: int, where: str, field: str) -> NoReturn:
    raise ValueError(
        f"{where} is truncated: field '{field}' needs {need} bytes at byte {pos}, "
        f"only {max(len(data) - pos, 0)} left ({len(data)} bytes in total)"
    )


def _read_string(data: bytes, pos: int, where: str, field: str) -> tuple[str, int]:
    """Read a STRING at ``pos``; return it and the position after it."""
    if pos + 2 > len(data):
        _truncated(data, pos, 2, where, field)
    length: int = _I16.unpack_from(data, pos)[0]
    if length < 0:
        raise ValueError(f"{where}: field '{field}' has a negative length ({length})")
    start = pos + 2
    end = start + length
    if end > len(data):
        _truncated(data, start, length, where, field)
    try:
        return str(data[start:end], "utf-8"), end
    except UnicodeDecodeError as e:
        raise ValueError(f"{where}: field '{field}' is not valid UTF-8: {e}") from None


def _read_int32(data: bytes, pos: int, where: str, field: str) -> tuple[int, int]:
    if pos + 4 > len(data):
        _truncated(data, pos, 4, where, field)
    value: int = _I32.unpack_from(data, pos)[0]
    return value, pos + 4


def _read_fixed(
    data: bytes, st: struct.Struct, where: str, fields: tuple[tuple[str, int], ...]
) -> tuple[int, ...]:
    """Unpack ``st`` at the start of ``data``; ``fields`` are (name, size) for errors."""
    if len(data) < st.size:
        pos = 0
        for name, size in fields:
            if pos + size > len(data):
                _truncated(data, pos, size, where, name)
            pos += size
    return st.unpack_from(data, 0)


def _check_version(version: int, where: str) -> None:
    # MM2 reads any version with the v0 layout (see module docstring); only a
    # negative version is certainly not something MM2 wrote.
    if version < 0:
        raise ValueError(f"{where}: bad version {version}; MM2 writes version 0")


# ------------------------------------------------------------------- offset syncs


# mm2py marks the offset syncs it writes (MM2 ignores record headers there): it writes
# one wherever source and target offsets stop advancing together, so between two
# marked syncs of a partition they do. MM2's syncs are sparser and promise no such
# thing; translation treats the records between them as not known to be contiguous.
# The key is a wire value, kept as first written (it named a module since moved).
CONTIGUOUS_SYNC_HEADER: tuple[str, bytes] = ("mm2py.daemon.parts.sync", b"contiguous")


# And the first sync it writes for a partition after a (re)start: a writer that died
# may not have sent its last syncs (they are written after the records are
# acknowledged, exactly-once: committed), so the records between the sync before this
# one and this one are not known to be contiguous.
AFTER_START_SYNC_HEADER: tuple[str, bytes] = ("mm2py.sync.after-start", b"1")


# And a sync of a source position rather than of a copied record: every record before
# `upstream` is copied, the last one just before `downstream`, and the offsets between
# them hold no record a read_committed consumer sees (transaction markers, aborted or
# compacted-away records): `upstream` maps to `downstream` exactly, but nothing is known
# of `upstream` itself, so `upstream + 1` does not map to `downstream + 1` as it does past
# a copied record's sync.
POSITION_SYNC_HEADER: tuple[str, bytes] = ("mm2py.sync.position", b"1")


def is_contiguous_sync(headers: object) -> bool:
    """Whether a sync record's headers (a list of (key, value) pairs) carry mm2py's mark."""
    return isinstance(headers, list) and CONTIGUOUS_SYNC_HEADER in headers


def is_after_start_sync(headers: object) -> bool:
    """Whether a sync is the first its writer wrote for the partition after a start."""
    return isinstance(headers, list) and AFTER_START_SYNC_HEADER in headers


def is_position_sync(headers: object) -> bool:
    """Whether a sync is of a source position past skipped offsets, not of a record."""
    return isinstance(headers, list) and POSITION_SYNC_HEADER in headers


@dataclass(frozen=True, slots=True)
class OffsetSync:
    """A record of ``mm2-offset-syncs.<target>.internal``: upstream offset ↔ downstream offset.

    Key: topic STRING, partition INT32. Value: upstreamOffset INT64, offset INT64.
    ``topic`` and ``partition`` name the *source* topic-partition.
    """

    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int

    def encode_key(self) -> bytes:
        """The record key, as MM2's ``OffsetSync.recordKey()``."""
        head = _encode_string(self.topic, "OffsetSync key", "topic")
        try:
            return head + _I32.pack(self.partition)
        except struct.error:
            _range_error("OffsetSync key", (("partition", self.partition, -(1 << 31), INT32_MAX),))

    def encode_value(self) -> bytes:
        """The record value, as MM2's ``OffsetSync.recordValue()``."""
        try:
            return _I64_I64.pack(self.upstream_offset, self.downstream_offset)
        except struct.error:
            _range_error(
                "OffsetSync value",
                (
                    _int64("upstreamOffset", self.upstream_offset),
                    _int64("offset", self.downstream_offset),
                ),
            )

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None) -> OffsetSync:
        """Decode a record's key and value; raise ``ValueError`` if malformed."""
        where = "OffsetSync key"
        key = _not_null(key, where)
        topic, pos = _read_string(key, 0, where, "topic")
        partition, _ = _read_int32(key, pos, where, "partition")
        where = "OffsetSync value"
        upstream, downstream = _read_fixed(
            _not_null(value, where), _I64_I64, where, (("upstreamOffset", 8), ("offset", 8))
        )
        return cls(topic, partition, upstream, downstream)


# -------------------------------------------------------------------- checkpoints


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A record of ``<source>.checkpoints.internal``: a group's translated offset.

    Key: group STRING, topic STRING, partition INT32. Value: version INT16 (0),
    upstreamOffset INT64, offset INT64, metadata STRING. ``topic`` is the *remote*
    (target-side) topic name, as MM2 writes it.
    """

    consumer_group_id: str
    topic: str
    partition: int
    upstream_offset: int
    downstream_offset: int
    metadata: str = ""

    def encode_key(self) -> bytes:
        """The record key, as MM2's ``Checkpoint.recordKey()``."""
        where = "Checkpoint key"
        head = _encode_string(self.consumer_group_id, where, "group") + _encode_string(
            self.topic, where, "topic"
        )
        try:
            return head + _I32.pack(self.partition)
        except struct.error:
            _range_error(where, (("partition", self.partition, -(1 << 31), INT32_MAX),))

    def encode_value(self) -> bytes:
        """The record value (version 0), as MM2's ``Checkpoint.recordValue()``."""
        where = "Checkpoint value"
        tail = _encode_string(self.metadata, where, "metadata")
        try:
            head = _I16_I64_I64.pack(
                CHECKPOINT_VERSION, self.upstream_offset, self.downstream_offset
            )
        except struct.error:
            _range_error(
                where,
                (
                    _int64("upstreamOffset", self.upstream_offset),
                    _int64("offset", self.downstream_offset),
                ),
            )
        return head + tail

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None) -> Checkpoint:
        """Decode a record's key and value; raise ``ValueError`` if malformed."""
        where = "Checkpoint key"
        key = _not_null(key, where)
        group, pos = _read_string(key, 0, where, "group")
        topic, pos = _read_string(key, pos, where, "topic")
        partition, _ = _read_int32(key, pos, where, "partition")
        where = "Checkpoint value"
        value = _not_null(value, where)
        version, upstream, downstream = _read_fixed(
            value,
            _I16_I64_I64,
            where,
            (("version", 2), ("upstreamOffset", 8), ("offset", 8)),
        )
        _check_version(version, where)
        metadata, _ = _read_string(value, _I16_I64_I64.size, where, "metadata")
        return cls(group, topic, partition, upstream, downstream, metadata)


# --------------------------------------------------------------------- heartbeats


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """A record of the ``heartbeats`` topic.

    Key: sourceClusterAlias STRING, targetClusterAlias STRING.
    Value: version INT16 (0), timestamp INT64 (epoch milliseconds).
    """

    source_cluster_alias: str
    target_cluster_alias: str
    timestamp_ms: int

    def encode_key(self) -> bytes:
        """The record key, as MM2's ``Heartbeat.recordKey()``."""
        where = "Heartbeat key"
        return _encode_string(
            self.source_cluster_alias, where, "sourceClusterAlias"
        ) + _encode_string(self.target_cluster_alias, where, "targetClusterAlias")

    def encode_value(self) -> bytes:
        """The record value (version 0), as MM2's ``Heartbeat.recordValue()``."""
        try:
            return _I16_I64.pack(HEARTBEAT_VERSION, self.timestamp_ms)
        except struct.error:
            _range_error("Heartbeat value", (_int64("timestamp", self.timestamp_ms),))

    @classmethod
    def decode(cls, key: bytes | None, value: bytes | None) -> Heartbeat:
        """Decode a record's key and value; raise ``ValueError`` if malformed."""
        where = "Heartbeat key"
        key = _not_null(key, where)
        source, pos = _read_string(key, 0, where, "sourceClusterAlias")
        target, _ = _read_string(key, pos, where, "targetClusterAlias")
        where = "Heartbeat value"
        version, timestamp = _read_fixed(
            _not_null(value, where), _I16_I64, where, (("version", 2), ("timestamp", 8))
        )
        _check_version(version, where)
        return cls(source, target, timestamp)


# ------------------------------------------------- Connect offsets (source progress)

# Jackson's escaping of JSON strings: the two-character escapes for \b \t \n \f \r,
# \" and \\, and \u00XX with *upper-case* hex for the other control characters.
# Nothing else is escaped: non-ASCII goes out as raw UTF-8, '/' and DEL stay as is.
_JSON_ESCAPES: Final[dict[int, str]] = {
    **{c: f"\\u{c:04X}" for c in range(0x20)},
    0x08: "\\b",
    0x09: "\\t",
    0x0A: "\\n",
    0x0C: "\\f",
    0x0D: "\\r",
    ord('"'): '\\"',
    ord("\\"): "\\\\",
}


def _json_string_body(value: str) -> str:
    return value.translate(_JSON_ESCAPES)


def _preview(data: bytes, limit: int = 120) -> str:
    text = repr(bytes(data[:limit]))
    return text + ("..." if len(data) > limit else "")


def _json_int(value: object) -> bool:
    # JSON true/false parse to bool, which Python counts as int; Jackson does not.
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class SourceProgressKey:
    """Key of a Connect offsets record that holds MirrorSourceConnector's progress.

    Connect stores a source offset under the key ``[connectorName, sourcePartition]``
    serialized by its internal ``JsonConverter`` (schemas disabled, compact Jackson
    output). MM2's source partition is ``MirrorUtils.wrapPartition``'s
    ``HashMap`` {topic, partition, cluster}; Jackson writes it in HashMap iteration
    order, which for these three keys is always cluster, partition, topic. So the key
    for partition 0 of topic ``t`` from cluster ``A`` is exactly::

        ["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"t"}]

    Byte equality matters: Connect looks an offset up by the serialized key, so a key
    with another field order or spacing is invisible to MM2. :meth:`encode` produces
    MM2's bytes; :meth:`decode` accepts any field order and whitespace.
    """

    connector: str
    cluster: str
    topic: str
    partition: int

    def encode(self) -> bytes:
        """The record key, byte for byte as Connect writes it for MM2."""
        partition = self.partition
        if not (_json_int(partition) and 0 <= partition <= INT32_MAX):
            raise ValueError(
                f"Connect offsets key: partition must be an int in [0, {INT32_MAX}], "
                f"got {partition!r}"
            )
        try:
            return (
                f'["{_json_string_body(self.connector)}",'
                f'{{"cluster":"{_json_string_body(self.cluster)}",'
                f'"partition":{partition},'
                f'"topic":"{_json_string_body(self.topic)}"}}]'
            ).encode()
        except (AttributeError, TypeError, UnicodeEncodeError) as e:
            raise ValueError(f"Connect offsets key: cannot encode {self!r}: {e}") from None

    @classmethod
    def decode(cls, data: bytes | None) -> SourceProgressKey:
        """Parse a Connect offsets key; raise ``ValueError`` unless it is a source-progress key.

        Keys of MM2's other connectors (checkpoint, heartbeat) share the topic and are
        rejected too; callers reading the whole topic should skip on ``ValueError``.
        """
        where = "Connect offsets key"
        if data is None:
            raise ValueError(f"{where} is null")
        try:
            parsed = json.loads(data)
        except ValueError as e:
            raise ValueError(f"{where} is not valid JSON ({e}): {_preview(data)}") from None
        if not (isinstance(parsed, list) and len(parsed) == 2):
            raise ValueError(f"{where} is not a [connector, partition] array: {_preview(data)}")
        connector, partition_map = parsed
        if not isinstance(connector, str):
            raise ValueError(f"{where}: connector name is not a string: {_preview(data)}")
        if not isinstance(partition_map, dict):
            raise ValueError(f"{where}: source partition is not a JSON object: {_preview(data)}")
        if partition_map.keys() != {"cluster", "partition", "topic"}:
            raise ValueError(
                f"{where}: connector {connector!r} source partition has fields "
                f"{sorted(partition_map)}, not MirrorSourceConnector's "
                f"['cluster', 'partition', 'topic']"
            )
        cluster = partition_map["cluster"]
        topic = partition_map["topic"]
        partition = partition_map["partition"]
        if not isinstance(cluster, str):
            raise ValueError(f"{where}: 'cluster' is not a string: {_preview(data)}")
        if not isinstance(topic, str):
            raise ValueError(f"{where}: 'topic' is not a string: {_preview(data)}")
        # MM2's validateSourcePartitionPartition: a non-negative 32-bit integer.
        if not (_json_int(partition) and 0 <= partition <= INT32_MAX):
            raise ValueError(
                f"{where}: 'partition' is not an integer in [0, {INT32_MAX}]: {_preview(data)}"
            )
        return cls(connector, cluster, topic, partition)


# mm2py's own records in the Connect offsets topic, beside MirrorSourceConnector's: a
# source partition's end offset as the replicator last saw it (for `failover
# --disaster`). Their key has MM2's shape with another connector name, which MM2 (and
# Connect's offset store) reads past: no connector of MM2's looks it up.
SOURCE_ENDS_NAME: Final = "mm2py-source-ends"


def encode_source_end(end: int, seen_at_ms: int) -> bytes:
    """Value of a source-end record: ``{"end":N,"seen_at":MS}``."""
    if not (_json_int(end) and end >= 0 and _json_int(seen_at_ms) and seen_at_ms >= 0):
        raise ValueError(
            f"source end: end and seen_at must be ints >= 0, got {end!r}, {seen_at_ms!r}"
        )
    return b'{"end":%d,"seen_at":%d}' % (end, seen_at_ms)


def decode_source_end(value: bytes | None) -> tuple[int, int] | None:
    """(end, seen_at ms) of a source-end record, or None (a tombstone or not one of ours)."""
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    end, seen_at = parsed.get("end"), parsed.get("seen_at")
    if isinstance(end, bool) or isinstance(seen_at, bool):
        return None
    if not (isinstance(end, int) and isinstance(seen_at, int)):
        return None
    return end, seen_at


def encode_progress_value(last_offset: int) -> bytes:
    """Value of a source-progress record: ``{"offset":N}``.

    ``N`` is the source offset of the *last record copied* (``MirrorUtils.wrapOffset``
    of ``record.offset()``); MM2 resumes at ``N + 1``. To forget a partition's
    progress, write a tombstone (``None``) instead.
    """
    if not (_json_int(last_offset) and 0 <= last_offset <= INT64_MAX):
        raise ValueError(
            f"Connect offsets value: offset must be an int in [0, {INT64_MAX}], got {last_offset!r}"
        )
    return b'{"offset":%d}' % last_offset


def decode_progress_value(value: bytes | None) -> int | None:
    """The last source offset copied, or ``None`` when MM2 would treat it as no progress.

    ``None`` for a tombstone, JSON ``null``, a missing or null ``offset`` field, or a
    negative offset — the cases where MM2 does not seek and the source consumer's
    ``auto.offset.reset`` applies. Other fields in the object are ignored, as MM2 does.
    Raise ``ValueError`` where MM2 would fail (not JSON, not an object, a non-integer
    offset).
    """
    where = "Connect offsets value"
    if value is None:
        return None
    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise ValueError(f"{where} is not valid JSON ({e}): {_preview(value)}") from None
    if parsed is None:
        return None
    if not isinstance(parsed, dict):
        raise ValueError(f"{where} is not a JSON object: {_preview(value)}")
    offset = parsed.get("offset")
    if offset is None:
        return None
    if not (_json_int(offset) and INT64_MIN <= offset <= INT64_MAX):
        raise ValueError(f"{where}: 'offset' is not a 64-bit integer: {_preview(value)}")
    return offset if offset >= 0 else None


# ---------------------------------------------------------------- partitioning

_MASK32: Final = 0xFFFF_FFFF
_MURMUR2_SEED: Final = 0x9747B28C
_MURMUR2_M: Final = 0x5BD1E995


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2, seed 0x9747b28c, as a signed Java int.

    Words are read little-endian; all arithmetic wraps at 32 bits like Java ``int``,
    and ``>>>`` is a logical shift (done here on the unsigned value).
    """
    length = len(data)
    h = (_MURMUR2_SEED ^ length) & _MASK32
    words = length >> 2
    for k in struct.unpack_from(f"<{words}I", data):
        k = (k * _MURMUR2_M) & _MASK32
        k ^= k >> 24
        k = (k * _MURMUR2_M) & _MASK32
        h = ((h * _MURMUR2_M) & _MASK32) ^ k
    tail = words << 2
    remaining = length & 3
    if remaining:
        # Java's switch falls through from 3 to 2 to 1.
        if remaining == 3:
            h ^= data[tail + 2] << 16
        if remaining >= 2:
            h ^= data[tail + 1] << 8
        h ^= data[tail]
        h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 13
    h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x8000_0000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return number & 0x7FFF_FFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's Java producer picks for a non-null key.

    ``toPositive(murmur2(key)) % numPartitions``: what Connect's offsets-topic writer
    uses, so a progress key written by mm2py lands in the partition MM2 reads it from.
    librdkafka's ``murmur2``/``murmur2_random`` partitioners compute the same for
    non-null keys (confluent-kafka's default, ``consistent_random``, does not), so
    either configure that partitioner or pass this result as the explicit partition.
    """
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    return to_positive(murmur2(key)) % num_partitions
