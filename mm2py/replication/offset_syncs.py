"""Offset syncs: the one rule for when one is written, and the one writer.

Translation is exact (mm2py.compat.offsets) because of where syncs are written, per
source partition:

- at the first record copied after a (re)start,
- wherever the distance between source and target offsets changes (a gap on either
  side: transaction markers, aborted or compacted records on the source, another
  writer on the target),
- for the latest copied record whenever progress is recorded (every second),
- for the source consumer's position, when every record read is copied (exactly-once:
  committed) and the position is past the last one's next offset (the partition ends,
  for now, with transaction markers, aborted or compacted-away records): (position,
  last record's target offset + 1), marked as a position's (`POSITION_SYNC_HEADER`).
  A group that read everything sits at that position; without it no sync proved where
  it is until the next record was copied (issue 24). The copy loop asks the consumer
  for a partition's position only where its end offset, looked at every second to
  measure lag, is past both (`SyncRule.wants_position`), never in the copy's hot path;

and the first one of a partition after a start is marked as such: a writer killed
before it sent its last syncs leaves nothing proven between the sync before that one
and it (mm2py.compat.offsets translates there conservatively).

Between two syncs the offsets advance together, so any source offset maps to the
target offset of the first record at or after it. The daemon's copy loop and the
backfill both follow `SyncRule`, and both write through `OffsetSyncWriter`, which
marks each sync with mm2py's header (MM2 ignores it) so readers know the promise
holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka.admin import AdminClient

from mm2py.compat.formats import (
    AFTER_START_SYNC_HEADER,
    CONTIGUOUS_SYNC_HEADER,
    POSITION_SYNC_HEADER,
    OffsetSync,
)
from mm2py.config.rules import FlowRules
from mm2py.kafka.produce import produce_when_room
from mm2py.kafka.topics import ensure_internal_topic

# Exact translation of old positions needs old syncs: compaction keeps only the
# newest sync per partition, so keep a week of syncs out of its reach.
OFFSET_SYNCS_TOPIC_CONFIG: Mapping[str, str] = {"min.compaction.lag.ms": str(7 * 24 * 3600 * 1000)}


class SyncRule:
    """When one source partition's copy needs an offset sync (pure)."""

    __slots__ = ("delta", "position", "synced")

    def __init__(self) -> None:
        self.delta: int | None = None  # source minus target offset at the last sync
        self.synced = -1  # upstream offset of the last sync of a record
        self.position = -1  # the last source position synced (`on_position`)

    def on_copied(self, upstream: int, downstream: int) -> bool:
        """A record was acknowledged at `downstream`: True if it needs a sync (the first
        record, or the distance changed). Call in source-offset order."""
        delta = upstream - downstream
        if delta == self.delta:
            return False
        self.delta = delta
        self.synced = upstream
        return True

    def wants_position(self, end: int, upstream: int) -> bool:
        """The source partition's end offset is `end` and the last record copied is at
        `upstream`: True if the consumer may have skipped offsets up to the end that no
        position sync covers yet (ask for its position, then `on_position`). Cheap: the
        copy loop asks every partition once a second."""
        return end > upstream + 1 and end > self.position

    def on_position(
        self, position: int, upstream: int, downstream: int
    ) -> tuple[tuple[int, int, bool], ...]:
        """Every record read is copied (exactly-once: committed), the last one from source
        offset `upstream` to target offset `downstream`, and the source consumer's
        position is `position`. When the consumer skipped offsets after `upstream`
        (transaction markers, aborted or compacted-away records) and no sync covers
        `position` yet: the syncs to write, in order, as (upstream, downstream, is a
        position's): the last record's if not synced yet (after the position's, the
        store would take it for a copy again and drop the position's), then
        (position, downstream + 1).

        The next record copied, at `position` and `downstream + 1`, continues it (no sync
        for a new distance) but is still synced as a record (`synced` stays below it), so
        a group that reads it is proven to be past it."""
        skipped = position > upstream + 1
        if not skipped or position <= self.position or position <= self.synced:
            return ()
        self.delta = position - (downstream + 1)
        self.position = position
        if upstream > self.synced:
            self.synced = upstream
            return ((upstream, downstream, False), (position, downstream + 1, True))
        return ((position, downstream + 1, True),)

    def on_progress(self, upstream: int) -> bool:
        """Progress is recorded up to `upstream`: True if that record needs a sync."""
        if upstream <= self.synced:
            return False
        self.synced = upstream
        return True


class OffsetSyncWriter:
    """Writes offset syncs to ``mm2-offset-syncs.<target>.internal`` (partition 0)."""

    def __init__(self, producer: Any, topic: str) -> None:
        self.topic = topic
        self.failures: list[str] = []
        self._producer = producer
        self._started: set[tuple[str, int]] = set()  # partitions synced since this start
        self.written = 0  # syncs sent

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failures.append(err.str())

    def write(
        self, topic: str, partition: int, upstream: int, downstream: int, position: bool = False
    ) -> None:
        """Send one sync (waits for room when the producer's queue is full); the first
        of a partition carries AFTER_START_SYNC_HEADER too, a `position` sync (of a
        source position, not of a record: `SyncRule.on_position`) POSITION_SYNC_HEADER."""
        sync = OffsetSync(topic, partition, upstream, downstream)
        args = (self.topic, sync.encode_value(), sync.encode_key(), 0)
        headers = [CONTIGUOUS_SYNC_HEADER]
        if (topic, partition) not in self._started:
            self._started.add((topic, partition))
            headers.append(AFTER_START_SYNC_HEADER)
        if position:
            headers.append(POSITION_SYNC_HEADER)
        kwargs = {"headers": headers, "on_delivery": self._delivered}
        produce_when_room(self._producer, args, kwargs)
        self.written += 1

    def poll(self) -> None:
        self._producer.poll(0)

    def flush(self, timeout: float) -> int:
        """Wait for the syncs sent; the number not acknowledged in time."""
        return int(self._producer.flush(timeout))


def ensure_offset_syncs_topic(rules: FlowRules, admin: AdminClient, cluster_alias: str) -> None:
    """Create the flow's offset-syncs topic if missing, on the cluster of `admin` (the one
    ``offset-syncs.topic.location`` names)."""
    ensure_internal_topic(
        admin,
        cluster_alias,
        rules.offset_syncs_topic,
        1,
        rules.settings.offset_syncs_topic_replication_factor,
        OFFSET_SYNCS_TOPIC_CONFIG,
        rules.settings.admin_timeout,
    )
