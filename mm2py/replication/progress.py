"""Replication progress in `mm2-offsets.<source>.internal`, as MM2's dedicated mode keeps it.

The topic is Kafka Connect's offsets topic: the key names the source partition
(`["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"t"}]`), the
value is `{"offset":N}` with N the last source offset copied. Sharing the format
is what lets mm2py resume where MM2 stopped, and MM2 where mm2py stopped.

Beside them, mm2py keeps each source partition's end offset as the replicator last
saw it (`submit_ends`, key of connector ``mm2py-source-ends``, value
``{"end":N,"seen_at":MS}``), so that after a disaster `mm2py failover --disaster`
can tell what was never copied; MM2 reads past those keys.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.formats import (
    DEFAULT_OFFSET_STORAGE_PARTITIONS,
    SOURCE_CONNECTOR_NAME,
    SOURCE_ENDS_NAME,
    SourceProgressKey,
    decode_progress_value,
    decode_source_end,
    encode_progress_value,
    encode_source_end,
    partition_for_key,
)
from mm2py.config import FlowConfig
from mm2py.kafka import clients
from mm2py.kafka.reader import TopicReader
from mm2py.kafka.topics import await_partitions, ensure_internal_topic, list_offsets

log = logging.getLogger(__name__)

SourcePartition = tuple[str, int]


def apply_record(
    found: dict[SourcePartition, int],
    source_alias: str,
    key: bytes | None,
    value: bytes | None,
    ends: dict[SourcePartition, tuple[int, int]] | None = None,
) -> None:
    """Take one record of a progress topic into `found` (source partition -> last copied
    offset, of `source_alias`'s partitions; a tombstone removes it), and a source end into
    `ends` when given. Records of other connectors and clusters are left alone (pure)."""
    try:
        pkey = SourceProgressKey.decode(key)
    except ValueError:
        return  # other connectors (heartbeat, checkpoint) share the topic
    if pkey.cluster != source_alias:
        return
    if pkey.connector == SOURCE_ENDS_NAME and ends is not None:
        end = decode_source_end(value)
        if end is not None:
            ends[(pkey.topic, pkey.partition)] = end
        return
    if pkey.connector != SOURCE_CONNECTOR_NAME:
        return
    offset = decode_progress_value(value)
    where = (pkey.topic, pkey.partition)
    if offset is None:
        found.pop(where, None)
    else:
        found[where] = offset


def read_recorded(
    target_props: Mapping[str, str],
    target_alias: str,
    source_alias: str,
    topic: str,
    timeout: float,
) -> dict[SourcePartition, int]:
    """The last copied offset of each of `source_alias`'s partitions recorded in progress
    topic `topic`, read to its end; empty when the topic does not exist (nothing is
    created: for readers such as the REST API)."""
    found: dict[SourcePartition, int] = {}
    with TopicReader(target_props, target_alias) as reader:
        if reader.add_topic(topic, timeout=timeout):
            reader.read_to_end(
                lambda msg: apply_record(found, source_alias, msg.key(), msg.value()), timeout
            )
    return found


class ProgressStore:
    """Reads and writes the last copied source offset of each source partition."""

    def __init__(
        self,
        target_props: Mapping[str, str],
        target_alias: str,
        source_alias: str,
        topic: str,
        replication_factor: int,
        partitions: int = DEFAULT_OFFSET_STORAGE_PARTITIONS,
    ) -> None:
        """`partitions` and `replication_factor` are used only when the topic is created
        (``offset.storage.partitions``, -1 for the broker's default; MM2: 25)."""
        self.topic = topic
        self.source_alias = source_alias
        self.target_alias = target_alias
        self._props = target_props
        self._admin = clients.admin_client(target_props)
        ensure_internal_topic(
            self._admin,
            target_alias,
            self.topic,
            partitions,
            replication_factor,
        )
        self.partitions = await_partitions(self._admin, target_alias, self.topic)
        self._producer: Any = None  # made on the first `submit`
        # Each key written, by connector and source partition, with the partition of the
        # topic it goes to: a flow writes the same keys again and again, and
        # `partition_for_key` is murmur2 in Python.
        self._placed: dict[tuple[str, SourcePartition], tuple[int, bytes]] = {}

    @classmethod
    def of_flow(cls, flow: FlowConfig, target_props: Mapping[str, str]) -> ProgressStore:
        """The progress store of `flow`, on its target, by the flow's settings."""
        s = flow.settings
        return cls(
            target_props,
            flow.target,
            flow.source,
            flow.offsets_topic,
            s.offset_storage_replication_factor,
            s.offset_storage_partitions,
        )

    def load(
        self,
        timeout: float = 60.0,
        *,
        past_open_transactions: bool = False,
        source_ends: dict[SourcePartition, tuple[int, int]] | None = None,
    ) -> dict[SourcePartition, int]:
        """Every recorded last-copied offset for this source cluster, read to the end.

        The topic is read read_committed: progress written in a transaction that was
        aborted is never seen. With `past_open_transactions` the end is the topics'
        high watermark, past transactions still open (other tasks', or one a fenced
        writer left): the read waits until they end, so progress committed after
        them is not missed (exactly-once: missing it would copy records again).
        `source_ends`, when given, receives the source ends recorded: (end, seen_at ms).

        Raises ReaderError naming the topic and cluster when it cannot be read
        (ReaderTimeout, also a TimeoutError, after `timeout` seconds).
        """
        found: dict[SourcePartition, int] = {}
        deadline = time.monotonic() + timeout
        with TopicReader(
            self._props, self.target_alias, past_open_transactions=past_open_transactions
        ) as reader:
            if past_open_transactions:
                latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
                specs = {TopicPartition(self.topic, p): latest for p in range(self.partitions)}
                ends = list_offsets(self._admin, self.target_alias, specs, timeout, committed=False)
                reader.add(
                    {where: OFFSET_BEGINNING for where in ends},
                    {where: end for where, end in ends.items() if end > 0},
                )
            else:
                reader.add_topic(self.topic, self.partitions, timeout)
            reader.read_to_end(
                lambda msg: apply_record(
                    found, self.source_alias, msg.key(), msg.value(), source_ends
                ),
                max(deadline - time.monotonic(), 0.0),
            )
        return found

    def submit(
        self,
        last_copied: Mapping[SourcePartition, int],
        on_written: Callable[[SourcePartition, int], None],
    ) -> None:
        """Send the last copied offsets; `on_written` runs for each one the target acknowledged.

        Acknowledgements are served by `poll()` or `flush()`.
        """
        producer = self._own_producer()
        for where, offset in last_copied.items():
            self._send(producer, where, offset, self._on_delivery(where, offset, on_written))
        producer.poll(0)

    def submit_ends(
        self,
        ends: Mapping[SourcePartition, int],
        seen_at_ms: int,
        on_written: Callable[[SourcePartition, int], None],
    ) -> None:
        """Send each source partition's end offset as seen at `seen_at_ms`; `on_written`
        runs for each one the target acknowledged (served by `poll()` or `flush()`)."""
        producer = self._own_producer()
        for where, end in ends.items():
            partition, key = self._place(SOURCE_ENDS_NAME, where)
            producer.produce(
                self.topic,
                key=key,
                value=encode_source_end(end, seen_at_ms),
                partition=partition,
                on_delivery=self._on_delivery(where, end, on_written),
            )
        producer.poll(0)

    def _place(self, connector: str, where: SourcePartition) -> tuple[int, bytes]:
        """The key of `connector`'s record for `where`, and the partition it goes to (as
        Connect's producer would put the key)."""
        placed = self._placed.get((connector, where))
        if placed is None:
            key = SourceProgressKey(connector, self.source_alias, *where).encode()
            placed = self._placed[(connector, where)] = (
                partition_for_key(key, self.partitions),
                key,
            )
        return placed

    def _own_producer(self) -> Any:
        if self._producer is None:
            self._producer = clients.producer(
                self._props, {"acks": "all", "enable.idempotence": True, "linger.ms": 0}
            )
        return self._producer

    def _on_delivery(
        self, where: SourcePartition, value: int, on_written: Callable[[SourcePartition, int], None]
    ) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, _msg: Any) -> None:
            if err is None:
                on_written(where, value)
            else:
                log.warning("writing to %s failed: %s", self.topic, err)

        return on_delivery

    def write_in_transaction(
        self, producer: Any, last_copied: Mapping[SourcePartition, int]
    ) -> None:
        """Send the last copied offsets with `producer`, in its open transaction: they
        are recorded if and only if the transaction commits."""
        for where, offset in last_copied.items():
            self._send(producer, where, offset, None)

    def record(self, where: SourcePartition, offset: int) -> tuple[int, bytes, bytes]:
        """The progress record saying `offset` of `where` was the last copied: the
        partition of the topic it goes to (as Connect's producer would put its key), its
        key and value."""
        partition, key = self._place(SOURCE_CONNECTOR_NAME, where)
        return partition, key, encode_progress_value(offset)

    def _send(
        self,
        producer: Any,
        where: SourcePartition,
        offset: int,
        on_delivery: Callable[[Any, Any], None] | None,
    ) -> None:
        partition, key, value = self.record(where, offset)
        producer.produce(
            self.topic, key=key, value=value, partition=partition, on_delivery=on_delivery
        )

    def flush(self, timeout: float) -> bool:
        """Wait for every submitted write; True if none is left."""
        return self._producer is None or int(self._producer.flush(timeout)) == 0

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(5)
