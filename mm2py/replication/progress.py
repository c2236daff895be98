"""Replication progress in `mm2-offsets.<source>.internal`, as MM2's dedicated mode keeps it.

The topic is Kafka Connect's offsets topic: the key names the source partition
(`["MirrorSourceConnector",{"cluster":"A","partition":0,"topic":"t"}]`), the
value is `{"offset":N}` with N the last source offset copied. Sharing the format
is what lets mm2py resume where MM2 stopped, and MM2 where mm2py stopped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from mm2py.compat.formats import (
    DEFAULT_OFFSET_STORAGE_PARTITIONS,
    SOURCE_CONNECTOR_NAME,
    SourceProgressKey,
    decode_progress_value,
    encode_progress_value,
    partition_for_key,
)
from mm2py.kafka import clients
from mm2py.kafka.topics import await_partitions, ensure_internal_topic

log = logging.getLogger(__name__)

SourcePartition = tuple[str, int]


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
        self._producer = clients.producer(
            target_props, {"acks": "all", "enable.idempotence": True, "linger.ms": 0}
        )

    def load(self, timeout: float = 60.0) -> dict[SourcePartition, int]:
        """Every recorded last-copied offset for this source cluster, read to the end."""
        consumer = clients.consumer(self._props, {"enable.partition.eof": True})
        try:
            deadline = time.monotonic() + timeout
            ends: dict[int, int] = {}
            for p in range(self.partitions):
                low, high = _watermarks(consumer, TopicPartition(self.topic, p), deadline)
                if high > low:
                    ends[p] = high
            if not ends:
                return {}
            consumer.assign([TopicPartition(self.topic, p, 0) for p in ends])
            found: dict[SourcePartition, int] = {}
            while ends and time.monotonic() < deadline:
                batch: list[Any] = consumer.consume(1000, 0.5)
                for msg in batch:
                    if msg.error():
                        if msg.error().code() == -191:  # partition EOF
                            ends.pop(msg.partition(), None)
                            continue
                        raise RuntimeError(f"reading {self.topic}: {msg.error().str()}")
                    self._apply(found, msg.key(), msg.value())
                    if msg.offset() + 1 >= ends.get(msg.partition(), 0):
                        ends.pop(msg.partition(), None)
            if ends:
                raise TimeoutError(f"could not read {self.topic} to its end in {timeout}s")
            return found
        finally:
            consumer.close()

    def _apply(
        self, found: dict[SourcePartition, int], key: bytes | None, value: bytes | None
    ) -> None:
        try:
            pkey = SourceProgressKey.decode(key)
        except ValueError:
            return  # other connectors (heartbeat, checkpoint) share the topic
        if pkey.connector != SOURCE_CONNECTOR_NAME or pkey.cluster != self.source_alias:
            return
        offset = decode_progress_value(value)
        where = (pkey.topic, pkey.partition)
        if offset is None:
            found.pop(where, None)
        else:
            found[where] = offset

    def submit(
        self,
        last_copied: Mapping[SourcePartition, int],
        on_written: Callable[[SourcePartition, int], None],
    ) -> None:
        """Send the last copied offsets; `on_written` runs for each one the target acknowledged.

        Acknowledgements are served by `poll()` or `flush()`.
        """
        for (topic, partition), offset in last_copied.items():
            key = SourceProgressKey(
                SOURCE_CONNECTOR_NAME, self.source_alias, topic, partition
            ).encode()

            def on_delivery(
                err: Any, _msg: Any, where: SourcePartition = (topic, partition), at: int = offset
            ) -> None:
                if err is None:
                    on_written(where, at)
                else:
                    log.warning("writing progress to %s failed: %s", self.topic, err)

            self._producer.produce(
                self.topic,
                key=key,
                value=encode_progress_value(offset),
                partition=partition_for_key(key, self.partitions),
                on_delivery=on_delivery,
            )
        self._producer.poll(0)

    def flush(self, timeout: float) -> bool:
        """Wait for every submitted write; True if none is left."""
        return int(self._producer.flush(timeout)) == 0

    def close(self) -> None:
        self._producer.flush(5)


_LEADER_PENDING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _watermarks(consumer: Any, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """Low and high watermark, retrying while a just-created topic gets its leader."""
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0]
            transient = err.retriable() or err.code() in _LEADER_PENDING
            if not transient or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
