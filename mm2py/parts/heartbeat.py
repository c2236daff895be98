"""The heartbeat part of a pair A->B: emit heartbeats to B and watch the ones that reach B.

Emitting is MM2's MirrorHeartbeatConnector/Task: every emit.heartbeats.interval.seconds a
``Heartbeat(A, B, now)`` goes to partition 0 of ``heartbeats`` on B (created when
missing: one partition, compacted), for every ordered pair, replicating or not.

Watching: one part per target T consumes every heartbeats topic on T and exports
``mm2py_heartbeat_age_seconds{source, target, hops}``. Invariants:
- hops are MM2's (`countHopsForTopic`): from the topic name, counted from its innermost
  alias; the local ``heartbeats`` is ``source=T, hops=0``;
- the age is computed at scrape time, so it keeps growing while a path is broken;
- paths of the same length from one source share a series, the fresher one.
Design: docs/design/parts.md.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from mm2py.compat.formats import Heartbeat
from mm2py.compat.policy import ReplicationPolicy, count_hops
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.config.rules import FlowRules
from mm2py.kafka import clients
from mm2py.kafka.reader import ReaderError, TopicReader
from mm2py.kafka.topics import ensure_internal_topic, partition_counts
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import Part
from mm2py.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

# Watching: records read back per partition when a heartbeats topic is first seen
# (the newest heartbeat is among the last few), and the longest wait for records.
TAIL_RECORDS = 100
POLL_TIMEOUT = 0.2
WATERMARK_TIMEOUT = 10.0
# How often new heartbeats topics are looked for when topic refresh is disabled.
DEFAULT_TOPIC_REFRESH = 600.0
STOP_FLUSH_TIMEOUT = 5.0

PRODUCER_TUNING: dict[str, Any] = {"acks": "all", "linger.ms": 0}
CONSUMER_TUNING: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.offset.store": False,
}


@dataclass(frozen=True)
class HeartbeatPath:
    """Where the heartbeats of one topic come from: ``origin`` cluster, ``hops`` away."""

    origin: str
    hops: int


def heartbeat_path(policy: ReplicationPolicy, topic: str, local_alias: str) -> HeartbeatPath | None:
    """The path of a heartbeats topic read on cluster ``local_alias``; None for other topics.

    ``heartbeats`` itself is 0 hops from ``local_alias``; a remote heartbeats topic is
    ``count_hops`` away from its innermost source (``B.A.heartbeats``: A, 2 hops).
    """
    if not policy.is_heartbeats_topic(topic):
        return None
    origin: str | None = None
    current = topic
    for _ in range(len(topic) + 1):  # names shrink at every hop; the bound is a guard
        source = policy.topic_source(current)
        upstream = policy.upstream_topic(current)
        if source is None or upstream is None:
            break
        origin = source
        if upstream == current:
            break
        current = upstream
    if origin is None:
        return HeartbeatPath(local_alias, 0)
    hops = count_hops(policy, topic, origin)
    return HeartbeatPath(origin, hops) if hops > 0 else None


class HeartbeatPart(Part):
    """Emits the heartbeats of one pair; with ``watch``, also exports heartbeat ages on its target.

    Only one heartbeat part per target cluster should watch, so that each series
    has one writer.
    """

    name = "heartbeat"

    def __init__(
        self, flow: FlowConfig, target: ClusterConfig, metrics: Metrics, *, watch: bool
    ) -> None:
        super().__init__(flow, metrics)
        self.target = target
        self.watch = watch
        self.rules = FlowRules(flow)
        period = flow.settings.period("emit.heartbeats")
        if period is None:
            raise ValueError(f"flow {flow.name}: heartbeats are disabled; build no heartbeat part")
        self.interval = float(period)
        self.topic = self.rules.policy.heartbeats_topic()
        self.admin_timeout = flow.settings.admin_timeout  # MM2's admin.timeout.ms
        refresh = self.rules.refresh_topics_interval
        self.refresh_interval = refresh if refresh != float("inf") else DEFAULT_TOPIC_REFRESH
        # Newest heartbeat timestamp (ms) per exported path; survives restarts of the part.
        self.newest: dict[HeartbeatPath, int] = {}
        self._paths: dict[str, HeartbeatPath] = {}  # heartbeats topic -> its path
        self._bad_topics: set[str] = set()

    # -- the loop -----------------------------------------------------------------

    def run(self) -> None:
        """Emit (and watch) until stopped. Raises on errors the daemon should restart from."""
        self._admin = clients.admin_client(self.target.librdkafka("admin"))
        self._ensure_topic()
        self._producer = clients.producer(self.target.librdkafka("producer"), PRODUCER_TUNING)
        self._reader: TopicReader | None = None
        self._watched: set[tuple[str, int]] = set()  # partitions this run's reader reads
        if self.watch:
            self._reader = TopicReader(
                self.target.librdkafka("consumer"), self.flow.target, CONSUMER_TUNING
            )
        try:
            self._loop()
        finally:
            self._shutdown()

    def _loop(self) -> None:
        scheduler = Scheduler(f"flow {self.flow.name}", self.errors)
        # MM2 sleeps one interval between heartbeats; the scheduler never emits bursts
        # to catch up.
        scheduler.add("emitting heartbeats", self._emit, self.interval)
        if self._reader is not None:
            scheduler.add("finding heartbeats topics", self._refresh_topics, self.refresh_interval)
        while not self.stopping.is_set():
            wait = scheduler.run_due()
            self._producer.poll(0)
            if self._reader is not None:
                self._reader.read(self._on_record, min(wait, POLL_TIMEOUT), on_error=self._on_error)
            else:
                self.stopping.wait(wait)

    def _ensure_topic(self) -> None:
        """Create ``heartbeats`` on the target as MM2 does, unless it exists.

        Checking first keeps a target where the topic was made by an administrator
        usable without the CREATE permission (MM2 also carries on there).
        """
        if self.topic in partition_counts(self._admin, self.admin_timeout):
            return
        ensure_internal_topic(
            self._admin,
            self.flow.target,
            self.topic,
            1,
            self.rules.settings.heartbeats_topic_replication_factor,
            timeout=self.admin_timeout,
        )

    def _emit(self) -> None:
        now_ms = int(time.time() * 1000)
        heartbeat = Heartbeat(self.flow.source, self.flow.target, now_ms)
        self._producer.produce(
            self.topic,
            heartbeat.encode_value(),
            heartbeat.encode_key(),
            0,
            on_delivery=self._on_delivery,
            timestamp=now_ms,
        )

    def _on_delivery(self, err: KafkaError | None, _msg: Any) -> None:
        if err is None:
            return
        # The next heartbeat follows within one interval; a lost one is only a gap.
        self.errors.inc()
        log.warning(
            "flow %s: heartbeat to %s on cluster %s not written: %s",
            self.flow.name,
            self.topic,
            self.flow.target,
            err.str(),
        )

    # -- watching -----------------------------------------------------------------

    def _refresh_topics(self) -> None:
        """Read every partition of every heartbeats topic not read yet, from its tail."""
        reader = self._reader
        if reader is None:
            return
        try:
            counts = partition_counts(self._admin, self.admin_timeout)
        except KafkaException as exc:
            log.warning("flow %s: listing topics failed, retrying later: %s", self.flow.name, exc)
            return
        new: dict[tuple[str, int], int] = {}
        for topic, partitions in sorted(counts.items()):
            path = self._paths.get(topic)
            if path is None:
                path = heartbeat_path(self.rules.policy, topic, self.flow.target)
                if path is None:
                    continue
                self._paths[topic] = path
            for partition in range(partitions):
                if (topic, partition) in self._watched:
                    continue
                try:
                    low, high = reader.watermarks(topic, partition, WATERMARK_TIMEOUT)
                except ReaderError as exc:
                    log.warning("flow %s: %s", self.flow.name, exc)
                    continue
                new[(topic, partition)] = max(low, high - TAIL_RECORDS)
                self._watched.add((topic, partition))
        if new:
            reader.add(new)
            log.info(
                "flow %s: watching heartbeats in %s on cluster %s",
                self.flow.name,
                ", ".join(f"{t}-{p}" for t, p in new),
                self.flow.target,
            )

    def _export(self, path: HeartbeatPath, timestamp_ms: int) -> None:
        """Start the series of a path at its first heartbeat; its age is computed per scrape."""
        newest = self.newest
        newest[path] = timestamp_ms
        gauge = self.metrics.heartbeat_age.labels(path.origin, self.flow.target, str(path.hops))
        gauge.set_function(lambda: time.time() - newest[path] / 1000.0)

    def _on_error(self, err: KafkaError) -> None:
        log.warning("flow %s: reading heartbeats: %s", self.flow.name, err.str())

    def _on_record(self, msg: Any) -> None:
        topic = msg.topic()
        try:
            heartbeat = Heartbeat.decode(msg.key(), msg.value())
        except ValueError as exc:
            if topic not in self._bad_topics:
                self._bad_topics.add(topic)
                log.warning(
                    "flow %s: skipping records of %s on cluster %s that are not heartbeats: %s",
                    self.flow.name,
                    topic,
                    self.flow.target,
                    exc,
                )
            return
        path = self._paths[topic]
        newest = self.newest.get(path)
        if newest is None:
            self._export(path, heartbeat.timestamp_ms)
        elif heartbeat.timestamp_ms > newest:
            self.newest[path] = heartbeat.timestamp_ms

    def _shutdown(self) -> None:
        try:
            self._producer.flush(STOP_FLUSH_TIMEOUT)
        finally:
            if self._reader is not None:
                self._reader.close()
