"""Byte-level tests of MM2's wire formats (mm2py.compat.formats).

Every expected byte string below is written by hand from MM2's Schema definitions
(comments show the derivation). All of them were also cross-checked against the real
classes of Kafka 4.1.1 (OffsetSync/Checkpoint/Heartbeat.recordKey()/recordValue(),
MirrorSourceTask.convertRecord() fed through Connect's OffsetStorageWriter with the
internal JsonConverter, and Utils.murmur2) and matched byte for byte.
"""

from __future__ import annotations

import pytest

from mm2py.compat.formats import (
    DEFAULT_OFFSET_STORAGE_PARTITIONS,
    SOURCE_CONNECTOR_NAME,
    SOURCE_ENDS_NAME,
    Checkpoint,
    Heartbeat,
    OffsetSync,
    SourceProgressKey,
    decode_progress_value,
    decode_source_end,
    encode_progress_value,
    encode_source_end,
    murmur2,
    partition_for_key,
    to_positive,
)

INT64_MAX = (1 << 63) - 1
INT64_MIN = -(1 << 63)
INT32_MAX = (1 << 31) - 1


def h(text: str) -> bytes:
    """Hex with spaces between fields, for readable vectors."""
    return bytes.fromhex(text.replace(" ", ""))


# ------------------------------------------------------------------- offset syncs

# KEY_SCHEMA = topic STRING, partition INT32; VALUE_SCHEMA = upstreamOffset INT64, offset INT64.
OFFSET_SYNC_VECTORS = [
    (
        OffsetSync("t", 0, 100, 200),
        # topic: len 1 = 0001, "t" = 74 | partition 0
        h("0001 74 00000000"),
        # upstreamOffset 100 = 0x64 | offset 200 = 0xc8
        h("0000000000000064 00000000000000c8"),
    ),
    (
        # Non-ASCII: 4 characters but 9 UTF-8 bytes: 主 e4b8bb, 题 e9a298, - 2d, é c3a9.
        OffsetSync("主题-é", 7, -1, INT64_MAX),
        h("0009 e4b8bb e9a298 2d c3a9 00000007"),
        # -1 is all ones in two's complement; INT64 max is 7fff...
        h("ffffffffffffffff 7fffffffffffffff"),
    ),
]


@pytest.mark.parametrize(("sync", "key", "value"), OFFSET_SYNC_VECTORS)
def test_offset_sync_bytes(sync: OffsetSync, key: bytes, value: bytes) -> None:
    assert sync.encode_key() == key
    assert sync.encode_value() == value
    assert OffsetSync.decode(key, value) == sync


# -------------------------------------------------------------------- checkpoints

# KEY_SCHEMA = group STRING, topic STRING, partition INT32;
# value = HEADER_SCHEMA (version INT16) + VALUE_SCHEMA_V0 (upstreamOffset INT64,
# offset INT64, metadata STRING).
CHECKPOINT_VECTORS = [
    (
        Checkpoint("g", "B.t", 3, 10, 20, "meta"),
        # group "g" = 0001 67 | topic "B.t" = 0003 422e74 | partition 3
        h("0001 67 0003 422e74 00000003"),
        # version 0 | upstreamOffset 10 | offset 20 | metadata "meta" = 0004 6d657461
        h("0000 000000000000000a 0000000000000014 0004 6d657461"),
    ),
    (
        # "grüppe": ü is c3bc, so 6 characters are 7 bytes.
        Checkpoint("grüppe", "A.x", 0, 0, INT64_MIN, ""),
        h("0007 6772c3bc707065 0003 412e78 00000000"),
        # version 0 | 0 | INT64 min = 8000... | empty metadata is just its length 0000
        h("0000 0000000000000000 8000000000000000 0000"),
    ),
]


@pytest.mark.parametrize(("checkpoint", "key", "value"), CHECKPOINT_VECTORS)
def test_checkpoint_bytes(checkpoint: Checkpoint, key: bytes, value: bytes) -> None:
    assert checkpoint.encode_key() == key
    assert checkpoint.encode_value() == value
    assert Checkpoint.decode(key, value) == checkpoint


def test_checkpoint_metadata_defaults_to_empty() -> None:
    assert Checkpoint("g", "t", 0, 1, 2).encode_value().endswith(h("0000"))


# --------------------------------------------------------------------- heartbeats

# KEY_SCHEMA = sourceClusterAlias STRING, targetClusterAlias STRING;
# value = version INT16 + VALUE_SCHEMA_V0 (timestamp INT64).
HEARTBEAT_VECTORS = [
    (
        Heartbeat("A", "B", 1_700_000_000_000),
        h("0001 41 0001 42"),
        # version 0 | 1700000000000 = 0x18bcfe56800
        h("0000 0000018bcfe56800"),
    ),
    (
        # "ünï" = c3bc 6e c3af: 3 characters, 5 bytes.
        Heartbeat("ünï", "B", -1),
        h("0005 c3bc6ec3af 0001 42"),
        h("0000 ffffffffffffffff"),
    ),
]


@pytest.mark.parametrize(("heartbeat", "key", "value"), HEARTBEAT_VECTORS)
def test_heartbeat_bytes(heartbeat: Heartbeat, key: bytes, value: bytes) -> None:
    assert heartbeat.encode_key() == key
    assert heartbeat.encode_value() == value
    assert Heartbeat.decode(key, value) == heartbeat


# ------------------------------------------------------------ round trips & limits

ROUND_TRIP_OFFSETS = [0, 1, -1, 2**31, -(2**31) - 1, INT64_MAX, INT64_MIN]


@pytest.mark.parametrize("offset", ROUND_TRIP_OFFSETS)
def test_round_trip_int64_range(offset: int) -> None:
    sync = OffsetSync("topic", INT32_MAX, offset, -offset if offset != INT64_MIN else 0)
    assert OffsetSync.decode(sync.encode_key(), sync.encode_value()) == sync
    cp = Checkpoint("group", "A.topic", -(2**31), offset, offset, "m€ta")
    assert Checkpoint.decode(cp.encode_key(), cp.encode_value()) == cp
    hb = Heartbeat("A", "B", offset)
    assert Heartbeat.decode(hb.encode_key(), hb.encode_value()) == hb


def test_string_length_counts_utf8_bytes_not_characters() -> None:
    # 16384 'é' are 16384 characters but 32768 bytes: one byte over STRING's limit.
    with pytest.raises(ValueError, match=r"OffsetSync key: field 'topic' is 32768 bytes"):
        OffsetSync("é" * 16384, 0, 0, 0).encode_key()
    longest = OffsetSync("é" * 16383 + "x", 0, 0, 0)  # 32767 bytes: the maximum
    assert longest.encode_key()[:2] == h("7fff")
    assert OffsetSync.decode(longest.encode_key(), longest.encode_value()) == longest


@pytest.mark.parametrize(
    ("encode", "message"),
    [
        (lambda: OffsetSync("t", 2**31, 0, 0).encode_key(), r"OffsetSync key: field 'partition'"),
        (lambda: OffsetSync("t", 0, 2**63, 0).encode_value(), r"field 'upstreamOffset'"),
        (lambda: OffsetSync("t", 0, 0, INT64_MIN - 1).encode_value(), r"field 'offset'"),
        (lambda: Checkpoint("g", "t", -(2**31) - 1, 0, 0).encode_key(), r"field 'partition'"),
        (lambda: Checkpoint("g", "t", 0, 0, 2**63).encode_value(), r"Checkpoint value.*'offset'"),
        (lambda: Heartbeat("A", "B", 2**63).encode_value(), r"Heartbeat value.*'timestamp'"),
        (lambda: OffsetSync("t", 0, "1", 0).encode_value(), r"must be an int, got str"),  # type: ignore[arg-type]
        (lambda: OffsetSync("\ud800", 0, 0, 0).encode_key(), r"cannot be encoded as UTF-8"),
    ],
)
def test_encode_out_of_range_names_the_field(encode: object, message: str) -> None:
    assert callable(encode)
    with pytest.raises(ValueError, match=message):
        encode()


# ---------------------------------------------------------------- decoding errors


def _all_vectors() -> list[tuple[type[OffsetSync | Checkpoint | Heartbeat], bytes, bytes]]:
    return [
        (type(obj), key, value)
        for obj, key, value in OFFSET_SYNC_VECTORS + CHECKPOINT_VECTORS + HEARTBEAT_VECTORS
    ]


@pytest.mark.parametrize(("cls", "key", "value"), _all_vectors())
def test_every_truncated_key_and_value_is_rejected(
    cls: type[OffsetSync | Checkpoint | Heartbeat], key: bytes, value: bytes
) -> None:
    name = cls.__name__
    for cut in range(len(key)):
        with pytest.raises(ValueError, match=rf"^{name} key is truncated: field '\w+'"):
            cls.decode(key[:cut], value)
    for cut in range(len(value)):
        with pytest.raises(ValueError, match=rf"^{name} value is truncated: field '\w+'"):
            cls.decode(key, value[:cut])


def test_truncation_message_says_where() -> None:
    # topic "t" is complete, partition has 3 of its 4 bytes.
    with pytest.raises(
        ValueError,
        match=r"OffsetSync key is truncated: field 'partition' needs 4 bytes at byte 3, "
        r"only 3 left \(6 bytes in total\)",
    ):
        OffsetSync.decode(h("0001 74 000000"), h("00" * 16))
    # The string claims 5 bytes but only 2 follow.
    with pytest.raises(ValueError, match=r"Heartbeat key is truncated: field 'sourceClusterAlias'"):
        Heartbeat.decode(h("0005 4142"), h("0000 0000000000000000"))


def test_null_key_or_value_is_rejected() -> None:
    value = OFFSET_SYNC_VECTORS[0][2]
    with pytest.raises(ValueError, match=r"OffsetSync key is null"):
        OffsetSync.decode(None, value)
    with pytest.raises(ValueError, match=r"Checkpoint value is null"):
        Checkpoint.decode(CHECKPOINT_VECTORS[0][1], None)


def test_negative_string_length_is_rejected() -> None:
    with pytest.raises(
        ValueError, match=r"Heartbeat key: field 'sourceClusterAlias' has a negative"
    ):
        Heartbeat.decode(h("ffff 41"), HEARTBEAT_VECTORS[0][2])


def test_invalid_utf8_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"Checkpoint key: field 'topic' is not valid UTF-8"):
        Checkpoint.decode(h("0001 67 0002 c328 00000000"), CHECKPOINT_VECTORS[0][2])


def test_trailing_bytes_are_ignored_like_mm2() -> None:
    # Kafka's Schema.read stops after the last field; MM2 reads such records fine.
    sync, key, value = OFFSET_SYNC_VECTORS[0]
    assert OffsetSync.decode(key + b"\x00", value + b"\xff\xff") == sync
    checkpoint, key, value = CHECKPOINT_VECTORS[0]
    assert Checkpoint.decode(key + b"\xaa", value + b"\x00\x01") == checkpoint


def test_other_versions_are_read_with_the_v0_layout() -> None:
    # MM2's valueSchema(version) only asserts version == 0 (assertions are off in
    # production), so a newer version that appends fields still reads as v0.
    checkpoint, key, value = CHECKPOINT_VECTORS[0]
    assert Checkpoint.decode(key, h("0001") + value[2:] + h("0000")) == checkpoint
    heartbeat, key, value = HEARTBEAT_VECTORS[0]
    assert Heartbeat.decode(key, h("0003") + value[2:] + h("01")) == heartbeat


def test_negative_version_is_rejected() -> None:
    _, key, value = CHECKPOINT_VECTORS[0]
    with pytest.raises(ValueError, match=r"Checkpoint value: bad version -1"):
        Checkpoint.decode(key, h("ffff") + value[2:])
    _, key, value = HEARTBEAT_VECTORS[0]
    with pytest.raises(ValueError, match=r"Heartbeat value: bad version -2"):
        Heartbeat.decode(key, h("fffe") + value[2:])


# ------------------------------------------------ Connect offsets: source progress


def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as an int."""
    value = 0
    units = s.encode("utf-16-be")
    for i in range(0, len(units), 2):
        value = (31 * value + int.from_bytes(units[i : i + 2], "big")) & 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def java_hashmap_bucket(key: str, table_size: int = 16) -> int:
    """HashMap.hash() spreads h ^ (h >>> 16); the bucket is (n - 1) & hash."""
    h32 = java_string_hash(key) & 0xFFFFFFFF
    return (h32 ^ (h32 >> 16)) & (table_size - 1)


def test_wrap_partition_hashmap_iterates_cluster_partition_topic() -> None:
    # MirrorUtils.wrapPartition puts topic, partition, cluster into a new HashMap
    # (table size 16; 3 entries never trigger a resize). Iteration, and so Jackson's
    # output, follows bucket index:
    #   "cluster".hashCode()   =    872092154 = 0x33fb11fa; ^ >>>16 -> 0x33fb2201; & 15 = 1
    #   "partition".hashCode() = -1799810326 = 0x94b912ea; ^ >>>16 -> 0x94b98653; & 15 = 3
    #   "topic".hashCode()     =    110546223 = 0x0696cd2f; ^ >>>16 -> 0x0696cbb9; & 15 = 9
    # Distinct buckets, so insertion order plays no part: cluster, partition, topic.
    assert java_string_hash("cluster") == 872092154
    assert java_string_hash("partition") == -1799810326
    assert java_string_hash("topic") == 110546223
    buckets = {k: java_hashmap_bucket(k) for k in ("topic", "partition", "cluster")}
    assert buckets == {"cluster": 1, "partition": 3, "topic": 9}
    assert sorted(buckets, key=buckets.__getitem__) == ["cluster", "partition", "topic"]
    key = SourceProgressKey(SOURCE_CONNECTOR_NAME, "A", "t", 0).encode()
    assert key.index(b'"cluster"') < key.index(b'"partition"') < key.index(b'"topic"')


# (key, exact key bytes, last offset, exact value bytes, murmur2 of key, partition of 25)
# The last two were computed by Kafka 4.1.1's Utils.murmur2 / toPositive on these keys.
PROGRESS_VECTORS = [
    (
        SourceProgressKey("MirrorSourceConnector", "A", "t", 0),
        b'["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"t"}]',
        41,
        b'{"offset":41}',
        -2079807616,
        7,
    ),
    (
        SourceProgressKey("MirrorSourceConnector", "primary", "foo", 1),
        b'["MirrorSourceConnector",{"cluster":"primary","partition":1,"topic":"foo"}]',
        10,
        b'{"offset":10}',
        -1757019779,
        19,
    ),
    (
        # Jackson escapes " and \ and control characters, the latter as \uXXXX with
        # upper-case hex except \b \t \n \f \r; '/' and DEL (0x7f) are written as is.
        SourceProgressKey("MirrorSourceConnector", 'clu"s\\t/er\x01\x1f\n\t\x7f', "top", INT32_MAX),
        b'["MirrorSourceConnector",{"cluster":"clu\\"s\\\\t/er\\u0001\\u001F\\n\\t\x7f",'
        b'"partition":2147483647,"topic":"top"}]',
        INT64_MAX,
        b'{"offset":9223372036854775807}',
        594749470,
        20,
    ),
    (
        # Non-ASCII is not escaped: raw UTF-8 (é = c3a9, 中 = e4b8ad).
        SourceProgressKey("MirrorSourceConnector", "é中", "orders.v2", 5),
        b'["MirrorSourceConnector",{"cluster":"\xc3\xa9\xe4\xb8\xad","partition":5,'
        b'"topic":"orders.v2"}]',
        0,
        b'{"offset":0}',
        -45293370,
        3,
    ),
]


@pytest.mark.parametrize(
    ("key", "key_bytes", "offset", "value_bytes", "hash32", "partition"), PROGRESS_VECTORS
)
def test_source_progress_bytes(
    key: SourceProgressKey,
    key_bytes: bytes,
    offset: int,
    value_bytes: bytes,
    hash32: int,
    partition: int,
) -> None:
    assert key.encode() == key_bytes
    assert SourceProgressKey.decode(key_bytes) == key
    assert encode_progress_value(offset) == value_bytes
    assert decode_progress_value(value_bytes) == offset
    assert murmur2(key_bytes) == hash32
    assert partition_for_key(key_bytes, DEFAULT_OFFSET_STORAGE_PARTITIONS) == partition


def test_source_progress_key_decode_accepts_any_order_and_whitespace() -> None:
    expected = SourceProgressKey("MirrorSourceConnector", "A", "t", 0)
    for text in [
        b'[ "MirrorSourceConnector" , { "topic" : "t" , "partition" : 0 , "cluster" : "A" } ]',
        b'["MirrorSourceConnector",{"partition":0,"topic":"t","cluster":"A"}]\n',
        b'\t["MirrorSourceConnector",\r\n{"cluster":"A",\n"topic":"t","partition":0}]',
    ]:
        assert SourceProgressKey.decode(text) == expected
        # Re-encoding always yields MM2's canonical bytes.
        assert SourceProgressKey.decode(text).encode() == PROGRESS_VECTORS[0][1]


def test_source_progress_key_keeps_connector_name() -> None:
    key = SourceProgressKey.decode(b'["my-mirror",{"cluster":"A","partition":3,"topic":"x"}]')
    assert key == SourceProgressKey("my-mirror", "A", "x", 3)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (None, r"is null"),
        (b"", r"not valid JSON"),
        (b'["MirrorSourceConnector",{"cluster":"A"', r"not valid JSON"),
        (b'{"cluster":"A","partition":0,"topic":"t"}', r"not a \[connector, partition\] array"),
        (b'["MirrorSourceConnector"]', r"not a \[connector, partition\] array"),
        (b'[1,{"cluster":"A","partition":0,"topic":"t"}]', r"connector name is not a string"),
        (b'["MirrorSourceConnector",null]', r"source partition is not a JSON object"),
        # MM2's other connectors share the offsets topic; their keys are not progress.
        (
            b'["MirrorHeartbeatConnector",{"sourceClusterAlias":"A","targetClusterAlias":"B"}]',
            r"'MirrorHeartbeatConnector' source partition has fields",
        ),
        (
            b'["MirrorCheckpointConnector",{"group":"g","partition":0,"topic":"t"}]',
            r"fields \['group', 'partition', 'topic'\]",
        ),
        (b'["M",{"cluster":"A","partition":0,"topic":"t","x":1}]', r"source partition has fields"),
        (b'["M",{"cluster":1,"partition":0,"topic":"t"}]', r"'cluster' is not a string"),
        (b'["M",{"cluster":"A","partition":0,"topic":null}]', r"'topic' is not a string"),
        (b'["M",{"cluster":"A","partition":-1,"topic":"t"}]', r"'partition' is not an integer"),
        (b'["M",{"cluster":"A","partition":2147483648,"topic":"t"}]', r"'partition'"),
        (b'["M",{"cluster":"A","partition":0.0,"topic":"t"}]', r"'partition'"),
        (b'["M",{"cluster":"A","partition":true,"topic":"t"}]', r"'partition'"),
        (b'["M",{"cluster":"A","partition":"0","topic":"t"}]', r"'partition'"),
    ],
)
def test_source_progress_key_decode_errors(data: bytes | None, message: str) -> None:
    with pytest.raises(ValueError, match=r"^Connect offsets key.*" + message):
        SourceProgressKey.decode(data)


@pytest.mark.parametrize("partition", [-1, 2**31, True])
def test_source_progress_key_encode_rejects_bad_partition(partition: int) -> None:
    with pytest.raises(ValueError, match=r"Connect offsets key: partition must be an int"):
        SourceProgressKey(SOURCE_CONNECTOR_NAME, "A", "t", partition).encode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # Tombstone: Connect drops the offset; MM2's unwrapOffset gives -1.
        (None, None),
        (b"null", None),
        (b"{}", None),
        (b'{"offset":null}', None),
        # MM2 treats a negative offset as uncommitted and does not seek.
        (b'{"offset":-1}', None),
        (b'{"offset":0}', 0),
        (b' { "offset" : 12345 , "extra" : "ignored" } ', 12345),
        (b'{"offset":9223372036854775807}', INT64_MAX),
    ],
)
def test_decode_progress_value(value: bytes | None, expected: int | None) -> None:
    assert decode_progress_value(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (b"", r"not valid JSON"),
        (b"[41]", r"not a JSON object"),
        (b'{"offset":"41"}', r"'offset' is not a 64-bit integer"),
        (b'{"offset":41.0}', r"'offset' is not a 64-bit integer"),
        (b'{"offset":true}', r"'offset' is not a 64-bit integer"),
        (b'{"offset":9223372036854775808}', r"'offset' is not a 64-bit integer"),
    ],
)
def test_decode_progress_value_errors(value: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=r"^Connect offsets value.*" + message):
        decode_progress_value(value)


@pytest.mark.parametrize("offset", [-1, INT64_MAX + 1, False])
def test_encode_progress_value_rejects_bad_offset(offset: int) -> None:
    with pytest.raises(ValueError, match=r"Connect offsets value: offset must be an int"):
        encode_progress_value(offset)


# ---------------------------------------------------------------------- murmur2


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # Kafka's UtilsTest.testMurmur2 vectors.
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
        # Every tail length (0-3 leftover bytes), from Kafka 4.1.1's Utils.murmur2.
        (b"", 275646681),
        (b"a", -1563381124),
        (b"ab", 316155434),
        (b"abcd", -1323649548),
        (b"abcde", 461995741),
    ],
)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_to_positive_clears_the_sign_bit() -> None:
    assert to_positive(0) == 0
    assert to_positive(-1) == INT32_MAX
    assert to_positive(-(2**31)) == 0  # where abs() would overflow in Java
    assert to_positive(-973932308) == 1173551340


def test_partition_for_key() -> None:
    # toPositive(-973932308) = 1173551340; 1173551340 % 25 = 15.
    assert partition_for_key(b"21", 25) == 15
    assert partition_for_key(b"21", 1) == 0
    with pytest.raises(ValueError, match=r"num_partitions must be positive"):
        partition_for_key(b"21", 0)


def test_a_source_end_record_shares_mm2_s_key_shape_under_its_own_connector() -> None:
    key = SourceProgressKey(SOURCE_ENDS_NAME, "A", "orders", 3).encode()
    assert key == b'["mm2py-source-ends",{"cluster":"A","partition":3,"topic":"orders"}]'
    value = encode_source_end(420, 1_795_000_000_123)
    assert value == b'{"end":420,"seen_at":1795000000123}'
    assert decode_source_end(value) == (420, 1_795_000_000_123)
    # What is not one of these decodes to None (MM2's progress value, nulls, garbage).
    for other in (None, b'{"offset":7}', b"null", b"[1,2]", b'{"end":true,"seen_at":1}', b"x"):
        assert decode_source_end(other) is None
    # MM2's progress decoder reads such a value as no progress, never an offset.
    assert decode_progress_value(value) is None
