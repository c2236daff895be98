"""Reading MM2's offset-syncs and checkpoints topics, with the one reader (`TopicReader`).

- `read_offset_syncs`: every offset sync of a syncs topic in an `OffsetSyncStore`
  (verify, translate-offsets).
- `OffsetSyncTail`: the same, read to the end once and then followed (the checkpoint
  part translates with it while the replicator keeps writing syncs).
- `load_checkpoints`: the latest checkpoint of every group and partition
  (the checkpoint part at start, translate-offsets).

A record that does not decode is skipped with a warning, as MM2 does. Reading
failures raise `ReaderError` (a timeout `ReaderTimeout`), naming topic and cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from confluent_kafka import Message

from mm2py.compat.formats import (
    Checkpoint,
    OffsetSync,
    is_after_start_sync,
    is_contiguous_sync,
    is_position_sync,
)
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.kafka.reader import READ_TIMEOUT, TopicReader

log = logging.getLogger(__name__)

# (group, remote topic, partition) -> (latest checkpoint, its record timestamp in ms)
Checkpoints = dict[tuple[str, str, int], tuple[Checkpoint, int]]


def _never() -> bool:
    return False


def read_offset_syncs(
    props: Mapping[str, str], cluster_alias: str, topic: str, timeout: float = READ_TIMEOUT
) -> OffsetSyncStore | None:
    """Every offset sync of `topic` in a store, or None when the topic does not exist."""
    tail = OffsetSyncTail(props, cluster_alias, topic)
    try:
        return tail.store if tail.open(timeout=timeout) else None
    finally:
        tail.close()


class OffsetSyncTail:
    """An offset-syncs topic read into `store` to its end once, then followed."""

    def __init__(self, props: Mapping[str, str], cluster_alias: str, topic: str) -> None:
        self.cluster_alias = cluster_alias
        self.topic = topic
        self.store = OffsetSyncStore()
        self._reader = TopicReader(props, cluster_alias)
        self._added = False

    def open(self, stopping: Callable[[], bool] = _never, timeout: float = READ_TIMEOUT) -> bool:
        """Read every sync there is now; False (nothing read) when the topic does not exist.

        Returns True only once the end was reached (not when `stopping()` cut it short).
        """
        if not self._added:
            if not self._reader.add_topic(self.topic):
                return False
            self._added = True
        self._reader.read_to_end(self._on_record, timeout, stopping)
        return self._reader.at_end

    def poll(self, timeout: float) -> int:
        """Add the syncs written since the last call (waiting up to `timeout`)."""
        return self._reader.read(self._on_record, timeout)

    def close(self) -> None:
        self._reader.close()

    def _on_record(self, msg: Message) -> None:
        try:
            sync = OffsetSync.decode(msg.key(), msg.value())
        except ValueError as exc:
            log.warning(
                "skipping offset sync at offset %s of %s on cluster %s: %s",
                msg.offset(),
                self.topic,
                self.cluster_alias,
                exc,
            )
            return
        headers = msg.headers()
        self.store.add(
            sync,
            msg.offset(),
            contiguous=is_contiguous_sync(headers),
            after_start=is_after_start_sync(headers),
            position=is_position_sync(headers),
        )


def load_checkpoints(
    props: Mapping[str, str],
    cluster_alias: str,
    topic: str,
    keep: Callable[[Checkpoint], bool] = lambda _cp: True,
    stopping: Callable[[], bool] = _never,
    timeout: float = READ_TIMEOUT,
) -> Checkpoints | None:
    """The latest (checkpoint, record timestamp in ms) per (group, topic, partition).

    None when the topic does not exist. `keep` selects the checkpoints to return.
    """
    found: Checkpoints = {}

    def on_record(msg: Message) -> None:
        try:
            cp = Checkpoint.decode(msg.key(), msg.value())
        except ValueError as exc:
            log.warning(
                "skipping %s offset %s on cluster %s: %s", topic, msg.offset(), cluster_alias, exc
            )
            return
        if keep(cp):
            found[(cp.consumer_group_id, cp.topic, cp.partition)] = (cp, msg.timestamp()[1])

    with TopicReader(props, cluster_alias) as reader:
        if not reader.add_topic(topic):
            return None
        reader.read_to_end(on_record, timeout, stopping)
    return found
