"""The source part of a flow A->B: copy records, keep remote topics, progress and offset syncs.

One thread per flow runs a batch consume/produce loop on confluent-kafka. Every
record keeps its partition, key, value, headers and timestamp; the source is
read `read_committed`. The only per-record Python work is the produce call and
its delivery report, which tells the target offset of each copied record.

Offset syncs are written so that translation can be exact: one at the first
record a partition copies after a (re)start, one whenever the distance
between source and target offsets changes (a gap on either side: transaction
markers, aborted or compacted records), and one for the latest copied record
at every progress commit. Between two syncs the offsets advance together, so
any source offset maps to the target offset of the first record at or after it.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.formats import CONTIGUOUS_SYNC_HEADER, OffsetSync
from mm2py.compat.topic_configs import ConfigPropertyFilter
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.daemon.metrics import Metrics, PartitionStats, ReplicationStats
from mm2py.daemon.part import FlowPart
from mm2py.kafka import clients
from mm2py.kafka.configs import remote_topic_configs
from mm2py.kafka.topics import (
    TopicAdminError,
    await_partitions,
    create_topic,
    ensure_internal_topic,
    grow_topic,
    list_offsets,
    partition_counts,
    plan_remote_topics,
)
from mm2py.logs import partition_fields
from mm2py.replication.progress import ProgressStore, SourcePartition

log = logging.getLogger(__name__)

BATCH_SIZE = 5000
POLL_TIMEOUT = 0.1
PROGRESS_INTERVAL = 1.0
LAG_INTERVAL = 1.0
STOP_FLUSH_TIMEOUT = 7.0
PAUSE_TIMEOUT = 5.0
LEARN_TOPIC_TIMEOUT = 2.0

# Exact translation of old positions needs old syncs: compaction keeps only the
# newest sync per partition, so keep a week of syncs out of its reach.
OFFSET_SYNCS_TOPIC_CONFIG = {"min.compaction.lag.ms": str(7 * 24 * 3600 * 1000)}

CONSUMER_TUNING: dict[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "earliest",
    "queued.max.messages.kbytes": 32768,
    "fetch.wait.max.ms": 100,
    "fetch.queue.backoff.ms": 5,
}
PRODUCER_TUNING: dict[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
    # Batches still fill while earlier requests are in flight; waiting longer
    # only adds latency.
    "linger.ms": 1,
    "batch.size": 1000000,
    "queue.buffering.max.kbytes": 65536,
    "queue.buffering.max.messages": 200000,
}


@dataclass(frozen=True)
class TopicChanges:
    """What a topic refresh found: partitions to start copying, partitions whose
    source topic no longer exists."""

    new: list[tuple[str, int, str]]  # (topic, partition, remote topic)
    gone: list[SourcePartition]
    # Where new partitions without progress start: their log start offsets.
    earliest: dict[SourcePartition, int] = field(default_factory=dict)


class PartitionFailed(RuntimeError):
    """The target rejected a record: the partition stops until restarted."""


@dataclass
class PartitionState:
    """The copy state of one source partition and its remote partition."""

    topic: str
    partition: int
    remote_topic: str
    stats: PartitionStats
    inflight: deque[int] = field(default_factory=deque)  # source offsets awaiting acks
    acked: int = -1  # last source offset the target acknowledged
    acked_downstream: int = -1
    submitted: int = -1  # last offset sent to the progress topic
    committed: int = -1  # last offset the progress topic acknowledged
    synced: int = -1  # upstream offset of the last offset sync
    delta: int | None = None  # source offset minus target offset since the last sync
    failure: str | None = None
    gone: bool = False  # its source topic was deleted; unassigned until it exists again
    failed_size: int = 0


class SourcePart(FlowPart):
    """Copies every replicated topic of one flow."""

    name = "source"
    pauses_in_place = True

    def __init__(
        self,
        flow: FlowConfig,
        source: ClusterConfig,
        target: ClusterConfig,
        metrics: Metrics,
    ) -> None:
        super().__init__(flow, source, target, metrics)
        self.stats = ReplicationStats(flow.source, flow.target)
        self._config_filter = ConfigPropertyFilter(flow.settings.config_properties_exclude)
        metrics.replication.add(self.stats)
        self._by_source: dict[SourcePartition, PartitionState] = {}
        self._by_remote: dict[tuple[str, int], PartitionState] = {}
        self._restart_reason: str | None = None
        self._consumer_paused = False

    def failed_partitions(self) -> dict[str, str]:
        """Partitions stopped by a rejected record, with the reason (from any thread)."""
        return {
            f"{s.remote_topic}-{s.partition}": s.failure
            for s in list(self._by_source.values())  # a copy: the loop may add partitions
            if s.failure is not None
        }

    # -- pausing in place: the consumer stops fetching; positions, progress and
    # connections stay, so resuming continues with the next record, none lost or
    # read twice.

    def pause(self, timeout: float = PAUSE_TIMEOUT) -> None:
        """Pause; returns once the copy loop has paused its consumer (or `timeout`)."""
        self.paused = True
        deadline = time.monotonic() + timeout
        while self.running and not self._consumer_paused and time.monotonic() < deadline:
            time.sleep(0.01)

    def resume(self, timeout: float = 9.0) -> None:
        self.paused = False

    def restart(self, timeout: float = 9.0) -> None:
        """Stop and start again; a paused part starts paused."""
        self.stop(timeout)
        self.start()

    def _apply_pause(self) -> None:
        paused = self.paused
        tps = [
            TopicPartition(s.topic, s.partition)
            for s in self._by_source.values()
            if s.failure is None and not s.gone
        ]
        if paused:
            self._consumer.pause(tps)
            log.info("flow %s: paused; no records are read until resumed", self.flow.name)
        else:
            self._consumer.resume(tps)
            log.info("flow %s: resumed", self.flow.name)
        self._consumer_paused = paused

    # -- the copy loop -------------------------------------------------------

    def run(self) -> None:
        """Copy until stopped. Raises on errors the daemon should restart from."""
        flow, rt = self.flow, self.rules
        source_props = self.source.librdkafka("consumer")
        target_props = self.target.librdkafka("producer")
        self._source_admin = clients.admin_client(self.source.librdkafka("admin"))
        self._target_admin = clients.admin_client(self.target.librdkafka("admin"))
        self.progress = ProgressStore(
            self.target.librdkafka("producer"),
            flow.target,
            flow.source,
            flow.offsets_topic,
            rt.settings.offset_storage_replication_factor,
        )
        self._stored = self.progress.load()
        self._sync_producer = self._open_sync_producer()
        self._consumer = clients.consumer(
            source_props,
            {**CONSUMER_TUNING, "error_cb": self._access_watch(self.source, source_props)},
        )
        self._producer = clients.producer(
            target_props,
            {**PRODUCER_TUNING, "error_cb": self._access_watch(self.target, target_props)},
        )
        self._by_source.clear()
        self._by_remote.clear()
        self._restart_reason = None
        self._consumer_paused = False
        self._discovered: set[SourcePartition] = set()
        self._found: queue.SimpleQueue[TopicChanges] = queue.SimpleQueue()
        loop_done = threading.Event()
        # Topic discovery calls admin APIs that can take a while; it runs beside
        # the copy loop so that they never delay records.
        discovery = threading.Thread(
            target=self._discover_topics,
            args=(loop_done,),
            name=f"discovery-{flow.name}",
            daemon=True,
        )
        discovery.start()
        try:
            self._loop()
        finally:
            loop_done.set()
            self._shutdown()
            discovery.join(5)

    def _open_sync_producer(self) -> Any:
        rt = self.rules
        if not rt.settings.emit_offset_syncs_enabled:
            return None
        cluster = self.source if rt.offset_syncs_on_source else self.target
        admin = self._source_admin if rt.offset_syncs_on_source else self._target_admin
        ensure_internal_topic(
            admin,
            cluster.alias,
            rt.offset_syncs_topic,
            1,
            rt.settings.offset_syncs_topic_replication_factor,
            OFFSET_SYNCS_TOPIC_CONFIG,
        )
        return clients.producer(cluster.librdkafka("producer"), {"linger.ms": 50})

    def _loop(self) -> None:
        consumer, producer = self._consumer, self._producer
        produce, poll = producer.produce, producer.poll
        by_source = self._by_source
        on_delivery = self._on_delivery
        found = self._found
        next_progress = time.monotonic() + PROGRESS_INTERVAL
        next_lag = 0.0
        while not self.stopping.is_set():
            now = time.monotonic()
            while not found.empty():
                changes = found.get()
                if changes.gone:
                    self._forget(changes.gone)
                if changes.new:
                    self._assign(changes.new, changes.earliest)
            if now >= next_progress:
                self._commit_progress()
                next_progress = now + PROGRESS_INTERVAL
            if now >= next_lag:
                self._update_lag()
                next_lag = now + LAG_INTERVAL
            if self.paused != self._consumer_paused:
                self._apply_pause()
            # Take what is queued at once; if nothing is, wait for the first record
            # only (consume() would wait for a full batch or the timeout).
            # Typed as Any: the hot loop relies on records being complete, not Optional.
            msgs: list[Any] = consumer.consume(BATCH_SIZE, 0)
            if not msgs:
                first = consumer.poll(POLL_TIMEOUT)
                if first is not None:
                    msgs = [first, *consumer.consume(BATCH_SIZE - 1, 0)]
            wall = time.time()
            for msg in msgs:
                if msg.error() is not None:
                    self._consume_error(msg)
                    continue
                state = by_source[(msg.topic(), msg.partition())]
                if state.failure is not None:
                    continue
                offset = msg.offset()
                ts = msg.timestamp()[1]
                key = msg.key()
                value = msg.value()
                state.inflight.append(offset)
                stats = state.stats
                stats.record_age.observe(wall - ts / 1000.0)
                stats.bytes += (len(key) if key else 0) + (len(value) if value else 0)
                while True:
                    try:
                        produce(
                            state.remote_topic,
                            value,
                            key,
                            state.partition,
                            on_delivery=on_delivery,
                            timestamp=ts,
                            headers=msg.headers(),
                        )
                        break
                    except BufferError:
                        # The target is slower than the source: wait for acks. When
                        # stopping, drop this record: nothing after it was sent, so
                        # progress (acked records only) stays correct.
                        poll(0.05)
                        if self.stopping.is_set():
                            state.inflight.pop()
                            return
                    except KafkaException as exc:
                        state.inflight.pop()
                        self._fail_partition(state, offset, exc.args[0].str(), _size(msg))
                        break
            poll(0)
            if self._restart_reason:
                raise RuntimeError(self._restart_reason)

    def _on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        state = self._by_remote[(msg.topic(), msg.partition())]
        upstream = state.inflight.popleft()
        if err is not None:
            if err.code() == KafkaError._MSG_TIMED_OUT:
                # Nothing is lost: the part restarts from its last progress.
                self._restart_reason = (
                    f"copying {state.topic}-{state.partition} offset {upstream} to "
                    f"{state.remote_topic} on {self.flow.target} failed: {err.str()}"
                )
            else:
                self._fail_partition(state, upstream, err.str(), _size(msg))
            return
        if state.failure is not None:
            return
        downstream = msg.offset()
        if upstream - downstream != state.delta:
            state.delta = upstream - downstream
            self._emit_sync(state, upstream, downstream)
        state.acked = upstream
        state.acked_downstream = downstream
        stats = state.stats
        stats.records += 1
        stats.latency.observe(time.time() - msg.timestamp()[1] / 1000.0)

    def _fail_partition(self, state: PartitionState, offset: int, reason: str, size: int) -> None:
        """Stop a partition whose record the target rejected, naming the record.

        The target rejects a whole batch when one record is too large, so every
        record of the batch reports the error; the largest one is named.
        """
        first = state.failure is None
        if not first and size <= state.failed_size:
            return
        state.failed_size = size
        state.failure = (
            f"target {self.flow.target} rejected record {state.topic}-{state.partition} "
            f"offset {offset} ({size} bytes) for remote topic {state.remote_topic}: {reason}; "
            "the partition is stopped: fix the cause and restart the flow"
        )
        log.error(
            "flow %s: %s",
            self.flow.name,
            state.failure,
            extra=partition_fields(state.topic, state.partition),
        )
        if first:
            self.errors.inc()
            self._consumer.pause([TopicPartition(state.topic, state.partition)])

    def _emit_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        if self._sync_producer is None:
            return
        sync = OffsetSync(state.topic, state.partition, upstream, downstream)
        self._sync_producer.produce(
            self.rules.offset_syncs_topic,
            sync.encode_value(),
            sync.encode_key(),
            0,
            headers=[CONTIGUOUS_SYNC_HEADER],
        )
        state.synced = upstream

    def _consume_error(self, msg: Any) -> None:
        err = msg.error()
        if err.fatal():
            raise KafkaException(err)
        log.warning(
            "flow %s: reading %s-%s from %s: %s",
            self.flow.name,
            msg.topic(),
            msg.partition(),
            self.flow.source,
            err.str(),
            extra=partition_fields(msg.topic(), msg.partition()),
        )

    # -- periodic work --------------------------------------------------------

    def _commit_progress(self, wait: bool = False) -> None:
        """Record the acknowledged positions (and the latest offset syncs).

        In the copy loop the writes are only submitted (`committed` advances when
        the target acknowledges them); at shutdown they are awaited.
        """
        self._producer.poll(0)
        changed = {}
        for key, state in self._by_source.items():
            if state.acked > state.submitted:
                changed[key] = state.acked
                state.submitted = state.acked
                if state.acked > state.synced:
                    self._emit_sync(state, state.acked, state.acked_downstream)
        if self._sync_producer is not None:
            self._sync_producer.poll(0)
        self.progress.submit(changed, self._progress_written)
        if wait:
            self.progress.flush(max(self._stop_deadline - time.monotonic(), 0.1))

    def _progress_written(self, where: SourcePartition, offset: int) -> None:
        state = self._by_source[where]
        state.committed = max(state.committed, offset)

    def _update_lag(self) -> None:
        # A paused partition is not fetched, so its cached end offset would stand still.
        cached = not self._consumer_paused
        for state in self._by_source.values():
            if state.gone:
                continue
            tp = TopicPartition(state.topic, state.partition)
            try:
                low, high = self._consumer.get_watermark_offsets(tp, timeout=1, cached=cached)
            except KafkaException:
                continue
            if high < 0:
                continue
            nxt = state.acked + 1 if state.acked >= 0 else low
            state.stats.lag = max(high - max(nxt, low), 0)

    def _discover_topics(self, loop_done: threading.Event) -> None:
        """Every refresh interval: find new topics and partitions, prepare remote topics."""
        every = self.rules.refresh_topics_interval
        while not loop_done.is_set():
            try:
                found = self._refresh_topics()
            except Exception as exc:  # logged and counted; the next refresh tries again
                log.error("flow %s: topic refresh failed: %s", self.flow.name, exc)
                self.errors.inc()
            else:
                if found.new or found.gone:
                    self._found.put(found)
            loop_done.wait(every if every != float("inf") else None)

    def _refresh_topics(self) -> TopicChanges:
        """Create or grow remote topics; say which partitions are new and which are gone."""
        rt, flow = self.rules, self.flow
        try:
            source_counts = partition_counts(self._source_admin)
            target_counts = partition_counts(self._target_admin)
        except KafkaException as exc:
            log.warning("flow %s: listing topics failed, retrying later: %s", flow.name, exc)
            return TopicChanges([], [])
        replicated = {t: n for t, n in source_counts.items() if rt.should_replicate(t)}
        remote_of = {t: rt.remote_topic(t) for t in replicated}
        plan = plan_remote_topics({remote_of[t]: n for t, n in replicated.items()}, target_counts)
        configs = self._creation_configs([t for t in replicated if remote_of[t] in plan.create])
        ready = set(replicated)
        for topic in replicated:
            remote = remote_of[topic]
            try:
                if remote in plan.create:
                    topic_configs = configs[topic]
                    if isinstance(topic_configs, str):
                        # Never create a remote topic without its configs: with the
                        # target's default retention, old records would be deleted.
                        raise TopicAdminError(f"{topic_configs}; not creating {remote} yet")
                    create_topic(
                        self._target_admin,
                        flow.target,
                        remote,
                        plan.create[remote],
                        rt.settings.replication_factor,
                        topic_configs,
                    )
                elif remote in plan.grow:
                    grow_topic(self._target_admin, flow.target, remote, plan.grow[remote])
                if remote in plan.create or remote in plan.grow:
                    self._await_producer_metadata(remote, replicated[topic])
            except TopicAdminError as exc:
                log.error("flow %s: %s", flow.name, exc)
                self.errors.inc()
                ready.discard(topic)
        new = [
            (topic, partition, remote_of[topic])
            for topic in sorted(ready)
            for partition in range(replicated[topic])
            if (topic, partition) not in self._discovered
        ]
        self._discovered.update((topic, partition) for topic, partition, _ in new)
        # A deleted source topic: stop fetching it (its remote topic is kept, as MM2 does).
        gone = sorted(where for where in self._discovered if where[0] not in source_counts)
        self._discovered.difference_update(gone)
        return TopicChanges(new, gone, self._earliest(new))

    def _earliest(self, new: list[tuple[str, int, str]]) -> dict[SourcePartition, int]:
        """Log start offsets of the new partitions that have no progress yet.

        Assigned at OFFSET_BEGINNING, a partition waits for librdkafka to look its
        start up; now and then, on a consumer just created, that never happened and
        the partition stayed unfetched while others were copied. An explicit offset
        needs no look-up. On failure the partitions start at OFFSET_BEGINNING.
        """
        spec: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        wanted = {
            TopicPartition(topic, partition): spec
            for topic, partition, _ in new
            if (topic, partition) not in self._stored
        }
        try:
            return list_offsets(self._source_admin, self.flow.source, wanted)
        except Exception as exc:  # a look-up only: the partitions are copied either way
            log.warning(
                "flow %s: reading start offsets failed (%s); starting at the beginning",
                self.flow.name,
                exc,
            )
            return {}

    def _assign(
        self, found: list[tuple[str, int, str]], earliest: Mapping[SourcePartition, int]
    ) -> None:
        """Start copying newly found partitions (on the copy loop's thread)."""
        new: list[TopicPartition] = []
        for topic in sorted({topic for topic, _, _ in found}):
            self._learn_topic(topic)
        for topic, partition, remote in found:
            state = self._by_source.get((topic, partition))
            if state is not None:
                # Its topic was deleted and exists again: continue after the last copied
                # offset (beyond the new topic's end, the consumer starts at its earliest).
                state.gone = False
                stored: int | None = state.acked if state.acked >= 0 else None
            else:
                state = PartitionState(
                    topic, partition, remote, self.stats.partition(remote, partition)
                )
                stored = self._stored.get((topic, partition))
                if stored is not None:
                    state.acked = state.committed = state.submitted = stored
                self._by_source[(topic, partition)] = state
                self._by_remote[(remote, partition)] = state
            if stored is not None:
                start = stored + 1
            else:
                start = earliest.get((topic, partition), OFFSET_BEGINNING)
            new.append(TopicPartition(topic, partition, start))
        self._consumer.incremental_assign(new)
        if self._consumer_paused:
            self._consumer.pause([TopicPartition(tp.topic, tp.partition) for tp in new])
        log.info(
            "flow %s: now copying %s",
            self.flow.name,
            ", ".join(f"{tp.topic}-{tp.partition}" for tp in new),
        )

    def _access_watch(
        self, cluster: ClusterConfig, props: Mapping[str, str]
    ) -> Callable[[KafkaError], None]:
        """An error_cb that fails the part when `cluster` refuses the login or certificate.

        A password changed or a certificate expired while the daemon runs shows when a
        connection is made again; librdkafka would retry forever. The part fails with
        what to check instead (its state FAILED, /health not ready) and the daemon
        retries it with backoff.
        """

        def watch(err: KafkaError) -> None:
            if clients.is_access_error(err) and self._restart_reason is None:
                self._restart_reason = clients.access_problem(cluster.alias, props, err)

        return watch

    def _learn_topic(self, topic: str) -> None:
        """Make the consumer's metadata show `topic` (on the copy loop's thread).

        The consumer fetches nothing from a partition its metadata does not show (a
        topic created a moment ago, e.g. by another flow) until a periodic refresh,
        up to 10 s later. A consumer's metadata must not be asked for from another
        thread while it polls: librdkafka then never answers.
        """
        try:
            self._consumer.list_topics(topic, timeout=LEARN_TOPIC_TIMEOUT)
        except KafkaException as exc:
            log.warning(
                "flow %s: no metadata for %s from %s yet (%s); copying starts when the "
                "consumer's next refresh shows it",
                self.flow.name,
                topic,
                self.flow.source,
                exc.args[0].str(),
            )

    def _forget(self, gone: list[SourcePartition]) -> None:
        """Stop copying partitions whose source topic was deleted (on the loop's thread)."""
        tps = []
        for where in gone:
            state = self._by_source.get(where)
            if state is not None and not state.gone:
                state.gone = True
                state.stats.lag = 0
                tps.append(TopicPartition(*where))
        if not tps:
            return
        self._consumer.incremental_unassign(tps)
        for topic in sorted({tp.topic for tp in tps}):
            log.info(
                "flow %s: topic %s was deleted on cluster %s; stopped copying its "
                "partitions (the remote topic is kept)",
                self.flow.name,
                topic,
                self.flow.source,
            )

    def _creation_configs(self, topics: list[str]) -> dict[str, dict[str, str] | str]:
        """The synced configs new remote topics are created with (or why they are unknown)."""
        return remote_topic_configs(
            self._source_admin, self.flow.source, topics, self._config_filter
        )

    def _await_producer_metadata(self, remote: str, partitions: int) -> None:
        """Make the producer see all partitions of a new or grown remote topic.

        Without this, producing to a partition created a moment ago fails with
        "unknown partition" until librdkafka's next periodic metadata refresh.
        """
        await_partitions(self._producer, self.flow.target, remote, partitions)

    def _shutdown(self) -> None:
        """Flush what is in flight, record progress, close clients."""
        self._stop_deadline = deadline = time.monotonic() + STOP_FLUSH_TIMEOUT
        try:
            self._producer.flush(max(deadline - time.monotonic(), 0.1))
            self._commit_progress(wait=True)
            if self._sync_producer is not None:
                self._sync_producer.flush(max(deadline - time.monotonic(), 0.1))
        finally:
            self._consumer.close()
            self.progress.close()


def _size(msg: Any) -> int:
    """Key plus value bytes of a record."""
    key, value = msg.key(), msg.value()
    return (len(key) if key else 0) + (len(value) if value else 0)
