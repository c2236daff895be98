"""Record batches as they travel, for batch pass-through (pure: no I/O).

- `split_batches(records)` cuts a Fetch response's records bytes into batches and reads each
  v2 header; a last batch cut short by the fetch size is left out (`Split.truncated` bytes).
- `classify(batches, position, aborted)` decides per batch, in log order: PASS (may be
  produced again as is after `rewrite_for_produce`), DROP (control batch, or a batch of an
  aborted transaction, filtered as a read_committed consumer filters), or RECORDS (must go
  record by record). `Reason` says why, as a value to log and count.
- `rewrite_for_produce` gives a PASS batch base offset 0, the producer's id, epoch and base
  sequence, its transactional bit, partition leader epoch -1 (what a producer sends) and a
  new CRC-32C over attributes..end. Records and the compressed payload are untouched.
- Offsets: a PASS batch holds `record_count` records at source offsets base..base+count-1,
  and the broker appends it at one target base offset, so record i of it lands at target
  base + i (`Placement`).
- `merge_small(items)` joins runs of small, uncompressed PASS batches that follow each
  other in the log (the next one's base offset is the last one's last offset + 1) into
  one batch each: the same records, bytes and timestamps, their offset and timestamp
  deltas counted from the run's first batch. A producer that sends as it goes (linger 0)
  writes a batch a record; produced as they are, each would be a Produce request of its
  own on the target. Compressed batches are never merged (that would mean decoding them).
CRC-32C is google-crc32c's, on the CPU's own instruction: 4.5 us for 64 KiB, where
aiokafka's Cython table takes 47 us (8-13% of a task's CPU in pass-through) and a
pure-Python one 115 ms. Where google-crc32c has only its pure-Python fallback (no wheel
for the platform), aiokafka's is used.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import google_crc32c
from aiokafka.record.util import calc_crc32c as _calc_crc32c

# Offsets of a v2 batch's fields (DefaultRecordBatch.java).
BASE_OFFSET = 0
LENGTH = 8
PARTITION_LEADER_EPOCH = 12
MAGIC = 16
CRC = 17
ATTRIBUTES = 21
LAST_OFFSET_DELTA = 23
BASE_TIMESTAMP = 27
MAX_TIMESTAMP = 35
PRODUCER_ID = 43
PRODUCER_EPOCH = 51
BASE_SEQUENCE = 53
RECORD_COUNT = 57
RECORDS = 61
HEADER_SIZE = RECORDS
# baseOffset and length come before what `length` counts.
LOG_OVERHEAD = 12

_HEADER = struct.Struct(">qiibIhiqqqhii")  # baseOffset .. recordCount, 61 bytes
_OFFSET_AND_LENGTH = struct.Struct(">qi")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # set: LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40

NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1
CONTROL_TYPE_ABORT = 0
CONTROL_TYPE_COMMIT = 1


class CorruptBatchError(ValueError):
    """Bytes that cannot be a record batch (not a short tail: that is `Split.truncated`)."""


_checksum = google_crc32c.value if google_crc32c.implementation == "c" else _calc_crc32c


def crc32c(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of `data`, as Kafka's v2 batches carry it."""
    # google-crc32c takes read-only bytes only (a copy costs 2 us for 64 KiB)
    whole = data if isinstance(data, bytes) else bytes(data)
    return int(_checksum(whole))


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """A batch's header fields. For magic 0 and 1 (legacy message sets) only base_offset,
    length and magic are read; the other fields are 0 or -1."""

    base_offset: int
    length: int  # bytes after the length field: the batch is length + LOG_OVERHEAD bytes
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int  # the delete horizon when `has_delete_horizon`
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return self.length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & COMPRESSION_MASK)

    @property
    def log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_BIT)


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """One batch: its header and its bytes (a view into the fetched records, not a copy)."""

    header: BatchHeader
    data: memoryview

    @property
    def payload(self) -> memoryview:
        """The records, compressed as the producer compressed them."""
        return self.data[RECORDS:]

    def crc_valid(self) -> bool:
        return self.header.magic == 2 and crc32c(self.data[ATTRIBUTES:]) == self.header.crc


@dataclass(frozen=True, slots=True)
class Split:
    batches: list[RecordBatch]
    truncated: int  # bytes of an incomplete last batch left out (0: none)


def parse_header(data: bytes | bytearray | memoryview) -> BatchHeader:
    """The header of the batch at the start of `data` (which holds at least its header)."""
    view = memoryview(data)
    if len(view) < MAGIC + 1:
        raise CorruptBatchError(f"{len(view)} bytes are too few for a batch header")
    base_offset, length = _OFFSET_AND_LENGTH.unpack_from(view, 0)
    magic = view[MAGIC]
    if magic < 2:
        return BatchHeader(base_offset, length, -1, magic, 0, 0, 0, -1, -1, -1, -1, -1, 0)
    if magic != 2:
        raise CorruptBatchError(f"batch at offset {base_offset} has unknown magic {magic}")
    if length + LOG_OVERHEAD < HEADER_SIZE:
        raise CorruptBatchError(f"batch at offset {base_offset} has length {length} < header")
    if len(view) < HEADER_SIZE:
        raise CorruptBatchError(f"batch at offset {base_offset}: header cut short")
    return BatchHeader(*_HEADER.unpack_from(view, 0))


def split_batches(records: bytes | bytearray | memoryview) -> Split:
    """The batches in a Fetch response's records bytes, in log order.

    The broker cuts a response at its size limit, so the last batch may be incomplete:
    it is left out (`truncated` says how many bytes), to be fetched again from its offset.
    """
    view = memoryview(records)
    batches: list[RecordBatch] = []
    pos = 0
    while len(view) - pos >= LOG_OVERHEAD:
        _, length = _OFFSET_AND_LENGTH.unpack_from(view, pos)
        if length < 0:
            raise CorruptBatchError(f"negative batch length {length} at byte {pos}")
        if length + LOG_OVERHEAD > len(view) - pos:
            break  # the size limit cut this batch
        batch = view[pos : pos + length + LOG_OVERHEAD]
        batches.append(RecordBatch(parse_header(batch), batch))
        pos += length + LOG_OVERHEAD
    return Split(batches, len(view) - pos)


class Decision(enum.Enum):
    PASS = "pass"
    DROP = "drop"
    RECORDS = "records"


class Reason(enum.Enum):
    """Why a batch got its decision (the value is a metric label / log word)."""

    WHOLE = "whole"  # PASS
    CONTROL = "control"  # DROP: a transaction marker (or another control record)
    ABORTED = "aborted"  # DROP: its transaction was aborted
    OFFSET_GAPS = "offset_gaps"  # RECORDS: compaction removed records: count != delta + 1
    STARTS_BEFORE_POSITION = "starts_before_position"  # RECORDS: fetched mid-batch
    DELETE_HORIZON = "delete_horizon"  # RECORDS: compaction set a delete horizon
    LOG_APPEND_TIME = "log_append_time"  # RECORDS: readers see the append time
    LEGACY_MAGIC = "legacy_magic"  # RECORDS: magic 0 or 1, not a v2 batch

    @property
    def decision(self) -> Decision:
        if self is Reason.WHOLE:
            return Decision.PASS
        if self in (Reason.CONTROL, Reason.ABORTED):
            return Decision.DROP
        return Decision.RECORDS


def unpassable(header: BatchHeader) -> Reason | None:
    """What in a batch's own header keeps it from being produced as is (None: nothing).

    The broker takes a producer's v2 batch only when count == lastOffsetDelta + 1
    (LogValidator.validateBatch) and never a control batch from a client.
    """
    if header.magic < 2:
        return Reason.LEGACY_MAGIC
    if header.control:
        return Reason.CONTROL
    if header.record_count != header.last_offset_delta + 1:
        return Reason.OFFSET_GAPS
    if header.has_delete_horizon:
        # baseTimestamp holds the horizon, not the first record's timestamp
        return Reason.DELETE_HORIZON
    if header.log_append_time:
        # a reader sees maxTimestamp (the append time) for every record; the records
        # themselves carry create times
        return Reason.LOG_APPEND_TIME
    return None


@dataclass(frozen=True)
class AbortedTransaction:
    """An entry of a Fetch response's aborted-transactions list."""

    producer_id: int
    first_offset: int


@dataclass(frozen=True, slots=True)
class Classified:
    batch: RecordBatch
    reason: Reason

    @property
    def decision(self) -> Decision:
        return self.reason.decision


def control_type(batch: RecordBatch) -> int:
    """The type in a control batch's first record key (0 ABORT, 1 COMMIT, ...); -1 for a
    batch that compaction emptied (Kafka's consumer reads no marker in it either)."""
    view = batch.payload
    if batch.header.record_count == 0 or not len(view):
        return -1
    pos = 0
    _, pos = _varint(view, pos)  # record length
    pos += 1  # record attributes
    _, pos = _varint(view, pos)  # timestamp delta
    _, pos = _varint(view, pos)  # offset delta
    key_length, pos = _varint(view, pos)
    if key_length < 4 or pos + 4 > len(view):
        raise CorruptBatchError(
            f"control batch at offset {batch.header.base_offset} has a key of {key_length} bytes"
        )
    _version, kind = struct.unpack_from(">hh", view, pos)
    return int(kind)


def classify(
    batches: Sequence[RecordBatch], position: int, aborted: Iterable[AbortedTransaction]
) -> list[Classified]:
    """Decide each batch of one fetch (in log order) fetched at `position`.

    Aborted transactions are filtered as Kafka's read_committed consumer does
    (CompletedFetch.nextFetchedRecord): before each batch with a producer id, the
    producers whose aborted transaction starts at or before the batch's last offset
    become aborted; their transactional batches are dropped until the producer's
    ABORT marker, which ends it.
    """
    pending = sorted(aborted, key=lambda a: a.first_offset)
    next_aborted = 0
    aborted_producers: set[int] = set()
    out: list[Classified] = []
    for batch in batches:
        header = batch.header
        if header.magic >= 2 and header.producer_id != NO_PRODUCER_ID:
            while (
                next_aborted < len(pending)
                and pending[next_aborted].first_offset <= header.last_offset
            ):
                aborted_producers.add(pending[next_aborted].producer_id)
                next_aborted += 1
            if header.control:
                if control_type(batch) == CONTROL_TYPE_ABORT:
                    aborted_producers.discard(header.producer_id)
                out.append(Classified(batch, Reason.CONTROL))
                continue
            if header.transactional and header.producer_id in aborted_producers:
                out.append(Classified(batch, Reason.ABORTED))
                continue
        reason = unpassable(header)
        if reason is None and header.base_offset < position:
            reason = Reason.STARTS_BEFORE_POSITION
        out.append(Classified(batch, reason or Reason.WHOLE))
    return out


def rewrite_for_produce(
    batch: RecordBatch,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
    transactional: bool,
) -> bytearray:
    """The batch as this producer sends it: base offset 0, partition leader epoch -1, the
    producer's id, epoch and base sequence (-1, -1, -1 when not idempotent), the
    transactional bit as asked, the CRC-32C recomputed. Everything else is kept."""
    reason = unpassable(batch.header)
    if reason is not None:
        raise ValueError(
            f"batch at offset {batch.header.base_offset} cannot be produced as is: {reason.value}"
        )
    out = bytearray(batch.data)
    attributes = batch.header.attributes & ~(TRANSACTIONAL_BIT | TIMESTAMP_TYPE_BIT)
    if transactional:
        attributes |= TRANSACTIONAL_BIT
    struct.pack_into(">q", out, BASE_OFFSET, 0)
    struct.pack_into(">i", out, PARTITION_LEADER_EPOCH, NO_PARTITION_LEADER_EPOCH)
    struct.pack_into(">h", out, ATTRIBUTES, attributes)
    struct.pack_into(">qhi", out, PRODUCER_ID, producer_id, producer_epoch, base_sequence)
    struct.pack_into(">I", out, CRC, crc32c(memoryview(out)[ATTRIBUTES:]))
    return out


# A PASS batch this small (one record of 1 KiB, a few of 100 B) is merged with its
# neighbours; a merged batch closes before it passes MERGED_BATCH_BYTES.
SMALL_BATCH_BYTES = 4 << 10
MERGED_BATCH_BYTES = 256 << 10


def _mergeable(header: BatchHeader) -> bool:
    return (
        header.size < SMALL_BATCH_BYTES
        and header.compression is Compression.NONE
        and unpassable(header) is None
    )


def merge_small(items: Sequence[Classified]) -> list[Classified]:
    """One partition's classified batches, in log order, with each run of small,
    uncompressed PASS batches at consecutive offsets merged into one PASS batch (see the
    module). Everything else is kept as it is, in its place."""
    out: list[Classified] = []
    run: list[RecordBatch] = []
    run_bytes = 0

    def close_run() -> None:
        nonlocal run_bytes
        if len(run) > 1:
            out.append(Classified(merge(run), Reason.WHOLE))
        elif run:
            out.append(Classified(run[0], Reason.WHOLE))
        run.clear()
        run_bytes = 0

    for item in items:
        header = item.batch.header
        if item.decision is not Decision.PASS or not _mergeable(header):
            close_run()
            out.append(item)
            continue
        follows = run and header.base_offset == run[-1].header.last_offset + 1
        if not follows or run_bytes + header.size > MERGED_BATCH_BYTES:
            close_run()
        run.append(item.batch)
        run_bytes += header.size
    close_run()
    return out


def merge(batches: Sequence[RecordBatch]) -> RecordBatch:
    """Uncompressed passable v2 batches at consecutive offsets as one: base offset and
    timestamp of the first, each record's deltas counted from them, keys, values and
    headers byte for byte; no producer id (`rewrite_for_produce` sets it)."""
    first = batches[0].header
    base_offset, base_ts = first.base_offset, first.base_timestamp
    records = bytearray()
    count = 0
    for batch in batches:
        header = batch.header
        if header.compression is not Compression.NONE or unpassable(header) is not None:
            raise ValueError(f"batch at offset {header.base_offset} cannot be merged")
        if header.base_offset != base_offset + count:
            raise ValueError(
                f"batch at offset {header.base_offset} does not follow offset "
                f"{base_offset + count - 1}"
            )
        view = batch.payload
        pos = 0
        for _ in range(header.record_count):
            length, pos = _varint(view, pos)
            end = pos + length
            if length < 3 or end > len(view):
                raise CorruptBatchError(
                    f"batch at offset {header.base_offset}: a record runs past the batch"
                )
            ts_delta, after = _varint(view, pos + 1)
            offset_delta, after = _varint(view, after)
            body = bytearray(view[pos : pos + 1])  # attributes
            body += _zigzag(header.base_timestamp + ts_delta - base_ts)
            body += _zigzag(header.base_offset + offset_delta - base_offset)
            body += view[after:end]
            records += _zigzag(len(body))
            records += body
            pos = end
        if pos != len(view):
            raise CorruptBatchError(
                f"batch at offset {header.base_offset}: {len(view) - pos} bytes after its records"
            )
        count += header.record_count
    after_crc = bytearray(
        struct.pack(
            ">hiqqqhii",
            0,  # no compression, create time, not transactional
            count - 1,
            base_ts,
            max(b.header.max_timestamp for b in batches),
            NO_PRODUCER_ID,
            -1,
            -1,
            count,
        )
    )
    after_crc += records
    length = len(after_crc) + ATTRIBUTES - LOG_OVERHEAD
    data = bytearray(
        struct.pack(">qiibI", base_offset, length, NO_PARTITION_LEADER_EPOCH, 2, crc32c(after_crc))
    )
    data += after_crc
    return RecordBatch(parse_header(data), memoryview(data))


def next_sequence(sequence: int, count: int) -> int:
    """The base sequence after a batch of `count` records at `sequence` (wraps at 2^31 - 1,
    as DefaultRecordBatch.incrementSequence does)."""
    if sequence > 0x7FFFFFFF - count:
        return count - (0x7FFFFFFF - sequence) - 1
    return sequence + count


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a passed-through batch landed: source offsets base..base+count-1 are target
    offsets target_base..target_base+count-1, one for one (a PASS batch has no gaps)."""

    source_base_offset: int
    record_count: int
    target_base_offset: int

    @property
    def source_last_offset(self) -> int:
        return self.source_base_offset + self.record_count - 1

    def target_offset(self, source_offset: int) -> int:
        delta = source_offset - self.source_base_offset
        if not 0 <= delta < self.record_count:
            raise ValueError(f"source offset {source_offset} is not in this batch")
        return self.target_base_offset + delta


def _zigzag(value: int) -> bytes:
    """`value` as a zigzag varint (a varlong for values beyond 32 bits, as Kafka reads)."""
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def _varint(view: memoryview, pos: int) -> tuple[int, int]:
    """A zigzag varint at `pos`: (value, position after it)."""
    shift = 0
    raw = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise CorruptBatchError("a varint runs past its batch")
        byte = view[pos]
        pos += 1
        raw |= (byte & 0x7F) << shift
        if not byte & 0x80:
            break
        shift += 7
    return (raw >> 1) ^ -(raw & 1), pos
