"""`mm2py verify`: read each replicated partition on both clusters and compare them.

The comparison itself is in `mm2py.tools.digest`; this module finds the partitions,
reads them (the source `read_committed`, so aborted records are skipped as the
source part skips them) and reports progress. End offsets are taken on the target
first, then on the source: everything the target holds then was copied from
records the source held a moment later, so a correct copy never shows more
records than its source.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from confluent_kafka import KafkaException

from mm2py.compat.offsets import OffsetSyncStore
from mm2py.config import FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.internal_topics import read_offset_syncs
from mm2py.kafka.reader import ReaderError, TopicReader
from mm2py.kafka.topics import partition_counts
from mm2py.tools.digest import (
    PartitionComparison,
    PartitionResult,
    Unaligned,
    VerifyReport,
    align,
    record_digest,
)

BATCH = 2000
POLL_TIMEOUT = 0.5
STALL_TIMEOUT = 30.0  # no record and no end of partition for this long: give up
PROGRESS_MIN_RECORDS = 50_000  # smaller runs finish before a bar would help

WATERMARK_TIMEOUT = 10.0
# The source is read as the source part reads it: aborted records are not copied.
READER_SETTINGS: dict[str, Any] = {"isolation.level": "read_committed"}

Progress = Callable[[int], None]


class VerifyError(Mm2pyError):
    """Reading a cluster failed (the message names the cluster and partition)."""


def select_topics(
    rules: FlowRules, source_topics: dict[str, int], pattern: str | None
) -> list[str]:
    """Replicated source topics to verify: those matching `pattern` (source or remote name).

    Without a pattern, heartbeats topics are left out: they change every second.
    """
    chosen = []
    regex = re.compile(pattern) if pattern else None
    for topic in sorted(source_topics):
        if not rules.should_replicate(topic):
            continue
        if regex is None:
            if rules.policy.is_heartbeats_topic(topic):
                continue
        elif not (regex.fullmatch(topic) or regex.fullmatch(rules.remote_topic(topic))):
            continue
        chosen.append(topic)
    return chosen


class _Side:
    """One cluster's reader, reading one partition from a start offset up to an end snapshot."""

    def __init__(self, reader: TopicReader, cluster: str, topic: str, partition: int) -> None:
        self.reader = reader
        self.cluster = cluster
        self.topic = topic
        self.partition = partition
        self.end = 0
        self.last_seen = time.monotonic()

    @property
    def done(self) -> bool:
        return self.reader.at_end

    def watermarks(self) -> tuple[int, int]:
        try:
            return self.reader.watermarks(self.topic, self.partition, WATERMARK_TIMEOUT)
        except ReaderError as exc:
            raise VerifyError(str(exc)) from None

    def start(self, offset: int, end: int) -> None:
        key = (self.topic, self.partition)
        self.reader.clear()
        self.reader.add({key: offset}, {key: end})
        self.end = end
        self.last_seen = time.monotonic()

    def read(self, add: Callable[[int, bytes], None]) -> int:
        """Feed the next batch to `add`; returns how many records were read."""

        # Typed as Any: records here are complete (offset, headers as a list), not Optional.
        def on_record(msg: Any) -> None:
            add(
                msg.offset(),
                record_digest(msg.key(), msg.value(), msg.headers(), msg.timestamp()[1]),
            )

        try:
            count = self.reader.read(on_record, POLL_TIMEOUT, max_records=BATCH)
        except ReaderError as exc:
            raise VerifyError(str(exc)) from None
        now = time.monotonic()
        if count:
            self.last_seen = now
        elif not self.done and now - self.last_seen > STALL_TIMEOUT:
            last = self.reader.last_error
            raise VerifyError(
                f"reading {self.topic}-{self.partition} on cluster {self.cluster}: nothing "
                f"arrived for {STALL_TIMEOUT:.0f}s before its end offset {self.end}"
                + (f" (last error: {last.str()})" if last is not None else "")
            )
        return count


class Verifier:
    """Compares every replicated partition of one flow."""

    def __init__(self, config: MirrorConfig, flow: FlowConfig) -> None:
        self.flow = flow
        self.rules = FlowRules(flow)
        self.source = config.cluster(flow.source)
        self.target = config.cluster(flow.target)
        self._syncs: OffsetSyncStore | None = None
        self._syncs_read = False

    def run(self, pattern: str | None = None, progress: Progress | None = None) -> VerifyReport:
        source_admin = clients.admin_client(self.source.librdkafka("admin"))
        target_admin = clients.admin_client(self.target.librdkafka("admin"))
        try:
            source_topics = partition_counts(source_admin)
            target_topics = partition_counts(target_admin)
        except KafkaException as exc:
            raise VerifyError(f"listing topics failed: {exc}") from None
        results: list[PartitionResult] = []
        src = self._reader(self.source.librdkafka("consumer"), self.flow.source)
        tgt = self._reader(self.target.librdkafka("consumer"), self.flow.target)
        try:
            for topic in select_topics(self.rules, source_topics, pattern):
                remote = self.rules.remote_topic(topic)
                for partition in range(source_topics[topic]):
                    if partition >= target_topics.get(remote, 0):
                        results.append(
                            PartitionResult(
                                topic,
                                remote,
                                partition,
                                "missing",
                                detail=f"{remote}-{partition} does not exist on cluster "
                                f"{self.flow.target}",
                            )
                        )
                        continue
                    results.append(
                        self._compare(
                            _Side(src, self.flow.source, topic, partition),
                            _Side(tgt, self.flow.target, remote, partition),
                            progress,
                        )
                    )
        finally:
            src.close()
            tgt.close()
        return VerifyReport(self.flow.name, results)

    @staticmethod
    def _reader(props: dict[str, str], cluster_alias: str) -> TopicReader:
        return TopicReader(props, cluster_alias, READER_SETTINGS, stop_at_end=True)

    def _offset_syncs(self) -> OffsetSyncStore | None:
        if not self._syncs_read:
            cluster = self.rules.offset_syncs_holder(self.source, self.target)
            try:
                self._syncs = read_offset_syncs(
                    cluster.librdkafka("consumer"), cluster.alias, self.rules.offset_syncs_topic
                )
            except ReaderError as exc:
                raise VerifyError(str(exc)) from None
            self._syncs_read = True
        return self._syncs

    def _compare(self, source: _Side, target: _Side, progress: Progress | None) -> PartitionResult:
        topic, remote, partition = source.topic, target.topic, source.partition
        t_low, t_high = target.watermarks()  # the target first: see the module docstring
        s_low, s_high = source.watermarks()
        translation = None
        if s_low or t_low:
            syncs = self._offset_syncs()
            translation = syncs.translation(topic, partition, s_low) if syncs else None
        try:
            s_start, t_start = align(s_low, t_low, translation)
        except Unaligned as why:
            return PartitionResult(topic, remote, partition, "unaligned", detail=str(why))
        source.start(s_start, s_high)
        target.start(t_start, t_high)
        cmp = PartitionComparison()
        while not (source.done and target.done):
            pending_source, pending_target = cmp.pending
            # Read the side that is behind, so that few records wait for their pair.
            if not source.done and (target.done or pending_source <= pending_target):
                read = source.read(cmp.add_source)
                if source.done:
                    cmp.end_source()
            else:
                read = target.read(cmp.add_target)
                if target.done:
                    cmp.end_target()
            if progress is not None and read:
                progress(read)
        return cmp.result(topic, remote, partition, s_start, t_start)

    def estimate(self, pattern: str | None = None) -> int:
        """Roughly how many records `run` reads (both sides), for a progress bar."""
        admin = clients.admin_client(self.source.librdkafka("admin"))
        total = 0
        with self._reader(self.source.librdkafka("consumer"), self.flow.source) as reader:
            topics = partition_counts(admin)
            for topic in select_topics(self.rules, topics, pattern):
                for partition in range(topics[topic]):
                    try:
                        low, high = reader.watermarks(topic, partition, WATERMARK_TIMEOUT)
                    except ReaderError as exc:
                        raise VerifyError(str(exc)) from None
                    total += 2 * max(high - low, 0)
        return total


class ProgressBar:
    """A one-line bar on a terminal's stderr, redrawn at most ten times a second."""

    def __init__(self, total: int, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.total = max(total, 1)
        self.stream = stream
        self.width = width
        self.done = 0
        self._drawn = 0.0

    def __call__(self, records: int) -> None:
        self.done += records
        now = time.monotonic()
        if now - self._drawn >= 0.1:
            self._drawn = now
            self._draw()

    def _draw(self) -> None:
        share = min(self.done / self.total, 1.0)
        filled = int(share * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\rverifying [{bar}] {share:4.0%}  {self.done} records")
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\r" + " " * (self.width + 40) + "\r")
        self.stream.flush()
