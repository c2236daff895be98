"""`mm2py verify`'s pure core: record digests, the record-by-record comparison of a
source partition with its remote partition, and the report (table and JSON).

Offsets differ between the two sides wherever the source has transaction markers,
aborted or compacted-away records, so records are paired by sequence: the n-th
committed source record after the aligned start with the n-th target record after
it. Each side's running digest covers key, value, headers and timestamp of every
paired record, in order. Records only one side has are counted, not paired: a
target behind its source is still being copied; a target with more records than
its source holds something that was not copied from it.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Final, Literal

from mm2py.compat.offsets import Translation

Status = Literal["match", "behind", "mismatch", "extra", "missing", "unaligned"]

# Statuses that pass: equal, or equal as far as the target has copied yet.
PASSING: Final = frozenset({"match", "behind"})

Headers = Sequence[tuple[str, bytes | None]] | None

_NONE: Final = struct.pack(">i", -1)


def _field(data: bytes | None) -> bytes:
    return _NONE if data is None else struct.pack(">i", len(data)) + data


def record_digest(
    key: bytes | None, value: bytes | None, headers: Headers, timestamp: int
) -> bytes:
    """A digest of what replication must keep: key, value, headers (in order), timestamp.

    Each field is length-prefixed, so a null differs from an empty value and no two
    records share an encoding.
    """
    h = hashlib.blake2b(digest_size=16)
    h.update(_field(key))
    h.update(_field(value))
    headers = headers or ()
    h.update(struct.pack(">i", len(headers)))
    for name, data in headers:
        h.update(_field(name.encode()))
        h.update(_field(data))
    h.update(struct.pack(">q", timestamp))
    return h.digest()


@dataclass(frozen=True)
class Difference:
    """The first pair of records that differ."""

    index: int  # position in the compared sequence, from 0
    source_offset: int
    target_offset: int


@dataclass(frozen=True)
class PartitionResult:
    """One source partition against its remote partition."""

    topic: str
    remote_topic: str
    partition: int
    status: Status
    source_records: int = 0  # read from the aligned start to the end
    target_records: int = 0
    compared: int = 0
    source_digest: str = ""
    target_digest: str = ""
    source_start: int | None = None  # the aligned start offsets
    target_start: int | None = None
    first_difference: Difference | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status in PASSING


class PartitionComparison:
    """Pairs the records of both sides as they are read, in any interleaving.

    Feed each side's records in offset order with `add_source`/`add_target`, then
    `result()`. Only unpaired records are buffered, and none once the other side
    has ended (`end_source`/`end_target`): reading the two sides in turns keeps
    memory small for any partition size.
    """

    def __init__(self) -> None:
        self._source: deque[tuple[int, bytes]] = deque()
        self._target: deque[tuple[int, bytes]] = deque()
        self._source_hash = hashlib.blake2b(digest_size=16)
        self._target_hash = hashlib.blake2b(digest_size=16)
        self.source_records = 0
        self.target_records = 0
        self.compared = 0
        self.source_ended = False
        self.target_ended = False
        self.first_difference: Difference | None = None

    def add_source(self, offset: int, digest: bytes) -> None:
        self.source_records += 1
        if self._target or not self.target_ended:
            self._source.append((offset, digest))
            self._pair()

    def add_target(self, offset: int, digest: bytes) -> None:
        self.target_records += 1
        if self._source or not self.source_ended:
            self._target.append((offset, digest))
            self._pair()

    def end_source(self) -> None:
        """No more source records: target records still waiting stay unpaired."""
        self.source_ended = True
        self._target.clear()

    def end_target(self) -> None:
        """No more target records: source records still waiting stay unpaired."""
        self.target_ended = True
        self._source.clear()

    @property
    def pending(self) -> tuple[int, int]:
        """Unpaired records buffered: (source, target)."""
        return len(self._source), len(self._target)

    def _pair(self) -> None:
        while self._source and self._target:
            s_offset, s_digest = self._source.popleft()
            t_offset, t_digest = self._target.popleft()
            self._source_hash.update(s_digest)
            self._target_hash.update(t_digest)
            if s_digest != t_digest and self.first_difference is None:
                self.first_difference = Difference(self.compared, s_offset, t_offset)
            self.compared += 1

    def result(
        self,
        topic: str,
        remote_topic: str,
        partition: int,
        source_start: int | None = None,
        target_start: int | None = None,
    ) -> PartitionResult:
        status: Status
        extra = self.target_records - self.source_records
        if self.first_difference is not None:
            d = self.first_difference
            status = "mismatch"
            detail = (
                f"record {d.index} of the compared range differs: source offset "
                f"{d.source_offset}, target offset {d.target_offset}"
            )
        elif extra > 0:
            status = "extra"
            detail = f"the target has {extra} records more than its source"
        elif extra < 0:
            status = "behind"
            detail = f"{-extra} source records not on the target yet"
        else:
            status, detail = "match", ""
        return PartitionResult(
            topic=topic,
            remote_topic=remote_topic,
            partition=partition,
            status=status,
            source_records=self.source_records,
            target_records=self.target_records,
            compared=self.compared,
            source_digest=self._source_hash.hexdigest(),
            target_digest=self._target_hash.hexdigest(),
            source_start=source_start,
            target_start=target_start,
            first_difference=self.first_difference,
            detail=detail,
        )


class Unaligned(Exception):
    """No offsets on the two sides are known to hold the same record: the partition
    cannot be compared record by record (status "unaligned"); the message says why."""


def align(source_low: int, target_low: int, translation: Translation | None) -> tuple[int, int]:
    """The offsets where the comparison starts on each side; Unaligned if there are none.

    With neither side's start deleted, both sides start at their beginning. Otherwise
    the offset syncs place the first source record still present on the target
    (`translation` of `source_low`); if the target deleted that copy already, the
    partition cannot be compared record by record.
    """
    if source_low == 0 and target_low == 0:
        return (0, 0)
    if translation is None or not translation.exact:
        raise Unaligned(
            f"the source starts at offset {source_low} and the target at {target_low} "
            "(retention) and no offset sync places the source's first record on the target"
        )
    if translation.downstream < target_low:
        raise Unaligned(
            f"the target no longer has the copy of source offset {source_low} (its records "
            f"start at {target_low}, the copy was at {translation.downstream})"
        )
    return (source_low, translation.downstream)


# -- the report -----------------------------------------------------------------------


@dataclass(frozen=True)
class VerifyReport:
    flow: str
    partitions: list[PartitionResult]

    @property
    def ok(self) -> bool:
        """Every partition matches; a run that compared nothing proves nothing."""
        return bool(self.partitions) and all(p.ok for p in self.partitions)


def format_text(report: VerifyReport) -> str:
    """A table, one row per partition, then the details of what did not match."""
    if not report.partitions:
        return f"flow {report.flow}: no replicated topic matched\n"
    rows = [["TOPIC", "REMOTE TOPIC", "PARTITION", "SOURCE", "TARGET", "DIGEST", "STATUS"]]
    for p in report.partitions:
        digest = p.source_digest[:12]
        if p.source_digest != p.target_digest and p.compared:
            digest = f"{p.source_digest[:12]}≠{p.target_digest[:12]}"
        rows.append(
            [
                p.topic,
                p.remote_topic,
                str(p.partition),
                str(p.source_records),
                str(p.target_records),
                digest if p.compared else "-",
                p.status.upper() if not p.ok else p.status,
            ]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    details = [f"{p.topic}-{p.partition}: {p.detail}" for p in report.partitions if p.detail]
    if details:
        lines.append("")
        lines.extend(details)
    failed = sum(not p.ok for p in report.partitions)
    lines.append("")
    lines.append(
        f"flow {report.flow}: {len(report.partitions)} partitions, "
        + ("all match" if not failed else f"{failed} do not match")
    )
    return "\n".join(lines) + "\n"


def format_json(report: VerifyReport) -> str:
    doc = {
        "flow": report.flow,
        "ok": report.ok,
        "partitions": [asdict(p) | {"ok": p.ok} for p in report.partitions],
    }
    return json.dumps(doc, indent=2) + "\n"
