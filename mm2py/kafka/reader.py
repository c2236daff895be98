"""Reading partitions to a known end, then following them: the one reader of internal topics.

`TopicReader` owns one consumer (from `mm2py.kafka.clients`) and reads MM2's internal
topics and any partition that must be read up to a known offset, as MM2's KafkaBasedLog:
`add_topic`/`add` note where to start and end, `read_to_end(on_record)` hands over every
record up to the ends, `read(on_record)` what arrived since (following).

Invariants:
- a partition is at its end once the record before its end offset was read or the
  consumer reports the partition's end (markers, aborted, compacted records hold none);
- with `past_open_transactions`, the end counts only at or past the end offset, so
  nothing committed before it is missed;
- with `stop_at_end`, nothing at or past an end is handed over; otherwise it is;
- records of partitions no longer assigned are never handed over;
- failures raise `ReaderError` naming topic, partition and cluster; timeouts `ReaderTimeout`.
Design: docs/design/internal-topics.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, Message, TopicPartition

from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.consume import consume_batch

log = logging.getLogger(__name__)

Key = tuple[str, int]  # (topic, partition)
OnRecord = Callable[[Message], None]
OnError = Callable[[KafkaError], None]

BATCH = 1000
POLL_TIMEOUT = 0.2
READ_TIMEOUT = 60.0
METADATA_TIMEOUT = 10.0
WATERMARK_TIMEOUT = 30.0
# Longest single watermark request; a just-created topic is asked again until the
# caller's timeout.
_WATERMARK_REQUEST_TIMEOUT = 10.0
_RETRY_PAUSE = 0.2

# What every reader needs; a caller's overrides (e.g. isolation.level) come on top.
READER_SETTINGS: dict[str, Any] = {
    "enable.partition.eof": True,  # how a reader learns it reached the end
    "auto.offset.reset": "earliest",  # a start offset gone to retention: the oldest left
    "enable.auto.commit": False,
    "fetch.wait.max.ms": 100,  # at the tail, answer fast rather than wait for bytes
}

# A topic created a moment ago has no leader yet for a short while, and the client's
# metadata may not show its partitions yet.
_LEADER_PENDING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
        KafkaError._UNKNOWN_TOPIC,
    }
)


class ReaderError(Mm2pyError, RuntimeError):
    """Reading a topic failed; the message names the topic, partition and cluster."""


class ReaderTimeout(ReaderError, TimeoutError):
    """Reading a topic to its end, or asking for its offsets, took too long."""


def _never() -> bool:
    return False


class TopicReader:
    """One consumer reading partitions up to the end offsets they had when added, then on.

    Not thread-safe: one thread owns a reader (the part's or the tool's).
    """

    def __init__(
        self,
        props: Mapping[str, str],
        cluster_alias: str,
        overrides: Mapping[str, Any] | None = None,
        *,
        stop_at_end: bool = False,
        past_open_transactions: bool = False,
        consumer: Any = None,
    ) -> None:
        """`consumer` replaces the one built from `props` (for tests without a broker)."""
        self.cluster_alias = cluster_alias
        self.stop_at_end = stop_at_end
        self.past_open_transactions = past_open_transactions
        self._consumer: Any = (
            consumer
            if consumer is not None
            else clients.consumer(props, {**READER_SETTINGS, **(overrides or {})})
        )
        self._assigned: set[Key] = set()
        self._bounds: dict[Key, int] = {}  # end offset of each partition added with one
        self._pending: dict[Key, int] = {}  # partitions short of their end -> end offset
        self._next: dict[Key, int] = {}  # next offset to read, where known
        self.last_error: KafkaError | None = None  # the latest error of the client as a whole

    # -- metadata and offsets -----------------------------------------------------------

    def partition_count(self, topic: str, timeout: float = METADATA_TIMEOUT) -> int | None:
        """How many partitions `topic` has; None when the cluster does not know it (yet)."""
        try:
            meta = self._consumer.list_topics(topic, timeout=timeout).topics.get(topic)
        except KafkaException as exc:
            raise self._error(topic, None, "reading its metadata failed", exc) from None
        if meta is None or not meta.partitions:
            return None
        if meta.error is not None:
            if meta.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise ReaderError(
                    f"not allowed to read topic {topic} on cluster {self.cluster_alias}: "
                    "grant DESCRIBE and READ on it to the configured user"
                )
            return None
        return len(meta.partitions)

    def watermarks(
        self, topic: str, partition: int, timeout: float = WATERMARK_TIMEOUT
    ) -> tuple[int, int]:
        """Low and high watermark of a partition, asked again while its leader is pending."""
        tp = TopicPartition(topic, partition)
        deadline = time.monotonic() + timeout
        while True:
            left = max(deadline - time.monotonic(), 0.1)
            try:
                low, high = self._consumer.get_watermark_offsets(
                    tp, timeout=min(_WATERMARK_REQUEST_TIMEOUT, left), cached=False
                )
                return int(low), int(high)
            except KafkaException as exc:
                err = exc.args[0]
                transient = err.retriable() or err.code() in _LEADER_PENDING
                if not transient:
                    raise self._error(topic, partition, "reading its offsets failed", exc) from None
                if time.monotonic() >= deadline:
                    raise ReaderTimeout(
                        f"reading the offsets of {topic}-{partition} on cluster "
                        f"{self.cluster_alias} failed for {timeout:g}s: {err.str()}"
                    ) from None
            time.sleep(_RETRY_PAUSE)

    # -- what to read ---------------------------------------------------------------------

    def add(self, starts: Mapping[Key, int], ends: Mapping[Key, int] | None = None) -> None:
        """Read these partitions from their start offsets (or OFFSET_BEGINNING/OFFSET_END).

        A partition in `ends` is read up to that end offset; one that is not has no end
        to reach (it is only followed).
        """
        ends = ends or {}
        new = [TopicPartition(t, p, offset) for (t, p), offset in starts.items()]
        for key, start in starts.items():
            self._assigned.add(key)
            if start >= 0:
                self._next[key] = start
            end = ends.get(key)
            if end is None:
                continue
            self._bounds[key] = end
            if start < 0 or start < end:
                self._pending[key] = end
        if new:
            self._consumer.incremental_assign(new)

    def add_topic(
        self,
        topic: str,
        partitions: int | None = None,
        timeout: float = WATERMARK_TIMEOUT,
    ) -> bool:
        """Read every partition of `topic` from its beginning up to its end offset now.

        `partitions` is the partition count when the caller knows it. False (and
        nothing added) when the topic does not exist.
        """
        count = partitions if partitions is not None else self.partition_count(topic)
        if count is None:
            return False
        deadline = time.monotonic() + timeout
        starts: dict[Key, int] = {}
        ends: dict[Key, int] = {}
        for p in range(count):
            low, high = self.watermarks(topic, p, max(deadline - time.monotonic(), 0.1))
            starts[(topic, p)] = OFFSET_BEGINNING
            if high > low:
                ends[(topic, p)] = high
        self.add(starts, ends)
        return True

    def clear(self) -> None:
        """Stop reading every partition."""
        if self._assigned:
            self._consumer.unassign()
        self._assigned.clear()
        self._bounds.clear()
        self._pending.clear()
        self._next.clear()

    @property
    def at_end(self) -> bool:
        """Every partition added with an end offset has reached it."""
        return not self._pending

    def positions(self) -> dict[Key, int]:
        """The next offset to read of each partition where one was read or given."""
        return dict(self._next)

    # -- reading ----------------------------------------------------------------------

    def read(
        self,
        on_record: OnRecord,
        timeout: float = POLL_TIMEOUT,
        *,
        on_error: OnError | None = None,
        max_records: int = BATCH,
    ) -> int:
        """Hand what arrived to `on_record`, waiting up to `timeout` for the first record.

        Returns how many records were handed over. An error on a partition raises
        ReaderError, or goes to `on_error` when given (fatal errors always raise).
        """
        count = 0
        for msg in consume_batch(self._consumer, max_records, timeout):
            err = msg.error()
            key: Key = (msg.topic(), msg.partition())
            if err is not None:
                committed_end = (
                    err.code() == KafkaError._PARTITION_EOF and self.past_open_transactions
                )
                if committed_end and msg.offset() < self._pending.get(key, -1):
                    continue  # at the end of what is committed so far
                self._on_error(key, err, on_error)
                continue
            if key not in self._assigned:
                continue  # left over from partitions read before clear()
            offset = msg.offset()
            if self.stop_at_end and offset >= self._bounds.get(key, offset + 1):
                self._pending.pop(key, None)  # written after the end was taken
                continue
            self._next[key] = offset + 1
            end = self._pending.get(key)
            if end is not None and offset + 1 >= end:
                del self._pending[key]
            on_record(msg)
            count += 1
        return count

    def read_to_end(
        self,
        on_record: OnRecord,
        timeout: float = READ_TIMEOUT,
        stopping: Callable[[], bool] = _never,
    ) -> None:
        """Hand every record up to the partitions' end offsets to `on_record`.

        Returns early when `stopping()` says so; raises ReaderTimeout after `timeout`.
        """
        deadline = time.monotonic() + timeout
        while self._pending and not stopping():
            if time.monotonic() > deadline:
                raise ReaderTimeout(self._short_of_end(timeout))
            self.read(on_record, POLL_TIMEOUT)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> TopicReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- helpers ------------------------------------------------------------------------

    def _on_error(self, key: Key, err: KafkaError, on_error: OnError | None) -> None:
        topic, partition = key
        if topic is None or partition is None or partition < 0:
            # The client as a whole (a broker connection lost): librdkafka retries.
            self.last_error = err
            if err.fatal():
                raise ReaderError(f"reading from cluster {self.cluster_alias}: {err.str()}")
            if on_error is not None:
                on_error(err)
            else:
                log.debug("cluster %s: %s", self.cluster_alias, err.str())
            return
        if key not in self._assigned:
            return
        if err.code() == KafkaError._PARTITION_EOF:
            self._pending.pop(key, None)
            return
        if on_error is None or err.fatal():
            raise ReaderError(
                f"reading {topic}-{partition} on cluster {self.cluster_alias}: {err.str()}"
            )
        on_error(err)

    def _short_of_end(self, timeout: float) -> str:
        (topic, partition), end = min(self._pending.items())
        at = self._next.get((topic, partition))
        where = "has not been read yet" if at is None else f"is at offset {at}"
        others = len(self._pending) - 1
        more = f" (and {others} more partition(s) short of their end)" if others else ""
        cause = f"; last error: {self.last_error.str()}" if self.last_error is not None else ""
        return (
            f"reading {_topics(self._pending)} on cluster {self.cluster_alias} to its end took "
            f"over {timeout:g}s: {topic}-{partition} {where}, its end is {end}{more}{cause}"
        )

    def _error(
        self, topic: str, partition: int | None, what: str, exc: KafkaException
    ) -> ReaderError:
        err = exc.args[0] if exc.args else exc
        reason = err.str() if isinstance(err, KafkaError) else str(err)
        name = topic if partition is None else f"{topic}-{partition}"
        kind = ReaderTimeout if isinstance(err, KafkaError) and _timed_out(err) else ReaderError
        return kind(f"{name} on cluster {self.cluster_alias}: {what}: {reason}")


def _timed_out(err: KafkaError) -> bool:
    return err.code() in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)


def _topics(keys: Iterable[Key]) -> str:
    return ", ".join(sorted({t for t, _p in keys}))
