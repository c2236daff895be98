"""The source part of a flow A->B: its copy loop, fed by topic discovery.

One thread runs the copier (the record copier, mm2py.replication.copy_loop, or the
batch copier, mm2py.replication.batch_copier, as mm2py.config.copy_mode chose) and its
periodic work
(progress every PROGRESS_INTERVAL, lag every LAG_INTERVAL, on the part's scheduler
between batches); a second thread runs
topic discovery (mm2py.parts.discovery) every
``refresh.topics.interval.seconds`` and hands what it found to the loop through a
queue, so admin calls never delay records. How offset syncs make translation
exact: mm2py.replication.offset_syncs.

Exactly-once (the flow's ``exactly_once`` setting is not off): the task's producer
is transactional, with the task's id (`transactional_id`): librdkafka's for the record
copier, the raw clients' for the batch copier (mm2py.kafka.raw_transactions). Before
anything is read, initialising it fences the task's previous owner (a node that died or was cut
off, whose open transaction it aborts), the tasks of an earlier ``tasks.max``
that this split has no task for and, in task 0, MM2's tasks of the flow when MM2 ran
it (`_fence_mirrormaker2`); only then is the progress read, past transactions
still open, so it is the committed progress the task continues from. A record the
target rejects aborts the transaction; the loop starts again from the last commit
without that partition (stopped, as at-least-once stops it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from mm2py.config import ClusterConfig, FlowConfig
from mm2py.kafka import clients
from mm2py.kafka.raw_clients import (
    FetchSession,
    IdempotentProduceSession,
    RawCopyClients,
)
from mm2py.kafka.raw_transactions import RawTransactionalClients, TransactionalProduceSession
from mm2py.parts.discovery import TopicChanges, TopicDiscovery
from mm2py.replication import transactions
from mm2py.replication.batch_copier import BatchCopier
from mm2py.replication.batch_transactions import RawTransactions
from mm2py.replication.client_settings import (
    CONSUMER_REQUIRED,
    PRODUCER_REQUIRED,
    copy_settings,
)
from mm2py.replication.committers import PartitionRejected, RunUnproven, Transactions
from mm2py.replication.copier import Copier
from mm2py.replication.copy_loop import CopyLoop, OffsetResetLog
from mm2py.replication.exactly_once import (
    mirrormaker2_transactional_id,
    mirrormaker2_worker_group,
    refusal,
    transactional_id,
)
from mm2py.replication.offset_syncs import OffsetSyncWriter, ensure_offset_syncs_topic
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.schemas import SchemaTranslator, translator_for
from mm2py.replication.stats import ReplicationStats, SchemaStats
from mm2py.runtime.assignment import WHOLE_FLOW, TaskSlot, task_counts
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import STOP_TIMEOUT, FlowPart
from mm2py.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 1.0
LAG_INTERVAL = 1.0
STOP_FLUSH_TIMEOUT = 7.0
PAUSE_TIMEOUT = 5.0
WAITING_RETRY = 1.0
# Reading the progress waits for transactions still open (a dead writer's: until its
# successor fences it, at most the flow's transaction timeout), and this much longer.
LOAD_PAST_TRANSACTIONS_MARGIN = 30.0

# mm2py's tuning for the copy loop's clients; the cluster's own settings win.
CONSUMER_TUNING: Mapping[str, Any] = {
    "auto.offset.reset": "earliest",
    "queued.max.messages.kbytes": 32768,
    # Kafka's and librdkafka's default. How long the broker holds a fetch that finds no
    # records: one arriving answers it at once, so this only sets how often an idle
    # consumer asks (librdkafka sends every assigned partition in each fetch). At 100 ms
    # an idle task of 2,000 partitions spent 3.7% of a core in its broker thread, at 500
    # ms 1.2%.
    "fetch.wait.max.ms": 500,
    "fetch.queue.backoff.ms": 5,
}
PRODUCER_TUNING: Mapping[str, Any] = {
    # Records wait at most 5 ms for others to share their request (Kafka 4's default,
    # which MM2 copies with). Measured at 5,000 records/s of 1 KiB on two cores
    # (docs/benchmarks.md): sending each batch at once (a flush per caught-up read) made
    # so many small requests that the machine ran out of CPU and the tail went to
    # ~0.8 s; 1 ms had a lower p99 than 5 ms (55 against 72 ms) but cost about a
    # quarter of the throughput.
    "linger.ms": 5,
    "batch.size": 1000000,
    "queue.buffering.max.kbytes": 65536,
    "queue.buffering.max.messages": 200000,
}


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
        slot: TaskSlot = WHOLE_FLOW,
    ) -> None:
        """`slot`: the task of the flow this part copies (by default the whole flow)."""
        super().__init__(flow, source, target, metrics)
        self.slot = slot
        self.stats = ReplicationStats(
            flow.source,
            flow.target,
            flow.settings.metrics_partition_labels,
            flow.settings.metrics_mm2_names_enabled,
        )
        metrics.replication.add(self.stats)
        self._loop: Copier | None = None
        self._access_failure: str | None = None
        # Partitions copied with a delivery report per record since a run of theirs was
        # not proven (mm2py.replication.delivery), while this part lives.
        self._per_record_reports: set[SourcePartition] = set()
        # Schema registry replication's counts, over every loop of this part.
        if flow.settings.schema_registry_sync_enabled:
            self.stats.schemas = SchemaStats()

    def failed_partitions(self) -> dict[str, str]:
        """Partitions stopped by a rejected record, with the reason (from any thread)."""
        loop = self._loop
        return loop.failed_partitions() if loop is not None else {}

    # -- pausing in place: the consumer stops fetching; positions, progress and
    # connections stay, so resuming continues with the next record, none lost or
    # read twice.

    def pause(self, timeout: float = PAUSE_TIMEOUT) -> None:
        """Pause; returns once the copy loop has paused its consumer (or `timeout`)."""
        self.paused = True
        deadline = time.monotonic() + timeout
        while self.running and not self._loop_paused() and time.monotonic() < deadline:
            time.sleep(0.01)

    def _loop_paused(self) -> bool:
        loop = self._loop
        return loop is not None and loop.paused

    def resume(self, timeout: float = STOP_TIMEOUT) -> None:
        self.paused = False

    def restart(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop and start again; a paused part starts paused."""
        self.stop(timeout)
        self.start()

    # -- running ------------------------------------------------------------------

    @property
    def exactly_once(self) -> bool:
        return self.flow.settings.exactly_once != "off"

    @property
    def _load_timeout(self) -> float:
        """How long reading the progress may wait for open transactions (exactly-once)."""
        return self.flow.settings.transaction_timeout_ms / 1000 + LOAD_PAST_TRANSACTIONS_MARGIN

    def run(self) -> None:
        """Copy until stopped. Raises on errors the daemon should restart from."""
        # Exactly-once: partitions stopped by a rejected record, kept across the loops
        # that follow the abort.
        failed: dict[SourcePartition, str] = {}
        while True:
            try:
                self._run(failed)
                return
            except (PartitionRejected, RunUnproven):
                if self.stopping.is_set():
                    return
                # The loop logged the partition it stops or copies again; an open
                # transaction was aborted.
                continue

    def _run(self, failed: dict[SourcePartition, str]) -> None:
        flow, rules = self.flow, self.rules
        source_props = self.source.librdkafka("consumer")
        target_props = self.target.librdkafka("producer")
        source_admin = clients.admin_client(self.source.librdkafka("admin"))
        target_admin = clients.admin_client(self.target.librdkafka("admin"))
        progress = ProgressStore(
            target_props,
            flow.target,
            flow.source,
            flow.offsets_topic,
            rules.settings.offset_storage_replication_factor,
            rules.settings.offset_storage_partitions,
        )
        target_watch = self._access_watch(self.target, target_props)
        txns: Transactions | None = None
        raw = (
            self._raw_clients(source_props, target_props) if flow.settings.copies_batches else None
        )
        if self.exactly_once and isinstance(raw, RawTransactionalClients):
            # The raw producer writes the transactions; the record path's producer only
            # learns of new remote topics (TopicDiscovery) and writes nothing.
            producer = self._plain_producer(target_props, target_watch)
            raw.open()  # InitProducerId: fences the previous owner
            try:
                self._fence_others(target_admin, target_props)
                txns = Transactions(
                    flow.settings.transaction_boundary_interval_ms / 1000,
                    writer=RawTransactions(raw),
                    when_caught_up=flow.settings.commit_when_caught_up,
                )
                stored = progress.load(self._load_timeout, past_open_transactions=True)
            except BaseException:
                raw.close()
                raise
        elif self.exactly_once:
            producer, txn_log = transactions.transactional_producer(
                target_props,
                PRODUCER_TUNING,
                f"cluster {flow.target} producer",
                self.transactional_id(self.slot.id),
                timeout_ms=flow.settings.transaction_timeout_ms,
                error_cb=target_watch,
            )
            producer.init_transactions(transactions.INIT_TIMEOUT)  # fences the previous owner
            self._fence_others(target_admin, target_props)
            txns = Transactions(
                flow.settings.transaction_boundary_interval_ms / 1000,
                txn_log,
                when_caught_up=flow.settings.commit_when_caught_up,
            )
            stored = progress.load(self._load_timeout, past_open_transactions=True)
        else:
            producer = self._plain_producer(target_props, target_watch)
            stored = progress.load()
        syncs = self._open_sync_writer(source_admin, target_admin)
        self._access_failure = None
        # Tells the copy loop which partitions librdkafka reset (records deleted unread).
        reset_log = OffsetResetLog(clients.ClusterLog(source_props.get("bootstrap.servers", "")))
        consumer = clients.consumer(
            source_props,
            {
                **copy_settings(
                    source_props,
                    CONSUMER_TUNING,
                    CONSUMER_REQUIRED,
                    f"cluster {flow.source} consumer",
                ),
                "error_cb": self._access_watch(self.source, source_props),
                "logger": reset_log,
                # The batch copier's hand-over to the record path reads to a batch's end,
                # which compaction may have emptied: the end of the partition ends it too.
                **({"enable.partition.eof": True} if flow.settings.copies_batches else {}),
            },
        )
        schemas: SchemaTranslator | None = None
        if flow.settings.schema_registry_sync_enabled:
            schemas = translator_for(
                flow.name,
                self.source,
                self.target,
                flow.settings.schema_registry_unresolved_ids,
                self.stats.schemas,
            )
        loop: Copier
        chosen = flow.settings
        log.info(
            "flow %s copies %s (replication.copy.mode = %s%s)",
            flow.name,
            "record batches as they are" if chosen.copies_batches else "record by record",
            chosen.replication_copy_mode,
            f"; {chosen.copier_reason}" if chosen.copier_reason else "",
        )
        if raw is not None:
            loop = self._batch_copier(raw, consumer, producer, progress, syncs, stored, txns)
        else:
            loop = self._record_copier(
                consumer, producer, progress, syncs, stored, txns, failed, target_props, schemas
            )
            reset_log.on_reset = loop.offset_reset
        self._loop = loop
        discovery = TopicDiscovery(
            rules, source_admin, target_admin, producer, set(stored), self.slot
        )
        found: queue.SimpleQueue[TopicChanges] = queue.SimpleQueue()
        loop_done = threading.Event()
        # Topic discovery calls admin APIs that can take a while; it runs beside
        # the copy loop so that they never delay records.
        discovering = threading.Thread(
            target=self._discover,
            args=(discovery, found, loop_done),
            name=f"discovery-{flow.name}",
            daemon=True,
        )
        discovering.start()
        try:
            self._copy(loop, found)
        finally:
            loop_done.set()
            try:
                loop.finish(time.monotonic() + STOP_FLUSH_TIMEOUT)
            finally:
                consumer.close()
                progress.close()
                if schemas is not None:
                    schemas.close()
                discovering.join(5)

    def _record_copier(
        self,
        consumer: Any,
        producer: Any,
        progress: ProgressStore,
        syncs: OffsetSyncWriter | None,
        stored: Mapping[SourcePartition, int],
        txns: Transactions | None,
        failed: dict[SourcePartition, str],
        target_props: Mapping[str, str],
        schemas: SchemaTranslator | None,
    ) -> CopyLoop:
        """The record copier (the loader's choice: mm2py.config.copy_mode)."""
        flow, rules = self.flow, self.rules
        return CopyLoop(
            flow.name,
            flow.target,
            consumer,
            producer,
            progress,
            syncs,
            self.stats,
            stored,
            on_partition_failed=self.errors.inc,
            poll_timeout=rules.settings.consumer_poll_timeout,
            transactions=txns,
            failed=failed,
            per_record_reports=self._per_record_reports,
            schemas=schemas,
        )

    def _plain_producer(self, target_props: Mapping[str, str], watch: Any) -> Any:
        """The at-least-once producer of the target (idempotent, not transactional)."""
        settings = copy_settings(
            target_props, PRODUCER_TUNING, PRODUCER_REQUIRED, f"cluster {self.flow.target} producer"
        )
        return clients.producer(target_props, {**settings, "error_cb": watch})

    def _fence_others(self, target_admin: Any, target_props: Mapping[str, str]) -> None:
        """Exactly-once, once this task's own id is initialised: fence the ids of earlier
        splits' tasks this one has no successor for, and (task 0) MM2's."""
        topics = target_admin.list_topics(timeout=self.rules.settings.admin_timeout).topics
        self._fence_earlier_splits(topics, target_props)
        if self.slot.id == 0:
            self._fence_mirrormaker2(topics, target_props)

    def _raw_clients(
        self, source_props: Mapping[str, str], target_props: Mapping[str, str]
    ) -> RawCopyClients:
        """The batch copier's raw clients (not open yet): exactly-once, their producer
        writes transactions with this task's transactional id."""
        flow = self.flow
        fetch = FetchSession.like_consumer(source_props, alias=flow.source)
        if not self.exactly_once:
            return RawCopyClients(
                fetch, IdempotentProduceSession(target_props, alias=flow.target), flow.name
            )
        session = TransactionalProduceSession(
            target_props,
            self.transactional_id(self.slot.id),
            transaction_timeout_ms=flow.settings.transaction_timeout_ms,
            alias=flow.target,
        )
        return RawTransactionalClients(fetch, session, flow.name)

    def _batch_copier(
        self,
        raw: RawCopyClients,
        consumer: Any,
        producer: Any,
        progress: ProgressStore,
        syncs: OffsetSyncWriter | None,
        stored: Mapping[SourcePartition, int],
        txns: Transactions | None,
    ) -> BatchCopier:
        """The batch copier (the loader's choice where nothing keeps a flow from it:
        mm2py.config.copy_mode), with the record path's consumer and producer for
        batches that must go record by record (exactly-once, their records go through
        the raw transactional producer)."""
        flow = self.flow
        return BatchCopier(
            flow.name,
            flow.target,
            consumer,
            producer,
            progress,
            syncs,
            self.stats,
            stored,
            raw,
            poll_timeout=self.rules.settings.consumer_poll_timeout,
            on_partition_failed=self.errors.inc,
            transactions=txns,
        )

    def _copy(self, loop: Copier, found: queue.SimpleQueue[TopicChanges]) -> None:
        periodic = Scheduler(f"flow {self.flow.name}")
        if not self.exactly_once:  # else progress is written in each transaction
            periodic.add("recording progress", loop.commit_progress, PROGRESS_INTERVAL)
        periodic.add("measuring lag", loop.update_lag, LAG_INTERVAL)
        stopping = self.stopping.is_set
        while not stopping():
            while not found.empty():
                changes = found.get()
                if changes.gone:
                    self._let_go(loop, changes)
                if changes.new:
                    loop.assign(changes.new, changes.earliest)
            periodic.run_due()
            if self.paused != loop.paused:
                loop.set_paused(self.paused)
            if self._access_failure is not None:
                raise RuntimeError(self._access_failure)
            if not loop.copy_batch(stopping):
                return

    def _let_go(self, loop: Copier, changes: TopicChanges) -> None:
        for topic in loop.unassign(changes.gone):
            log.info(
                "flow %s: topic %s was deleted on cluster %s; stopped copying its "
                "partitions (the remote topic is kept)",
                self.flow.name,
                topic,
                self.flow.source,
            )

    def _discover(
        self,
        discovery: TopicDiscovery,
        found: queue.SimpleQueue[TopicChanges],
        loop_done: threading.Event,
    ) -> None:
        """Every refresh interval: find new topics and partitions, prepare remote topics."""

        def refresh() -> None:
            changes = discovery.refresh()
            if changes.failures:
                self.errors.inc(changes.failures)
            if changes.new or changes.gone:
                found.put(changes)
            if changes.waiting:  # for task 0 to make remote partitions: look again soon
                scheduler.add("waiting for remote topics", refresh, None, delay=WAITING_RETRY)

        every = self.rules.refresh_topics_interval
        # Any failure is logged and counted; the next refresh tries again.
        scheduler = Scheduler(f"flow {self.flow.name}", self.errors)
        scheduler.add(
            "refreshing topics",
            refresh,
            every if every != float("inf") else None,
            retry_on=(Exception,),
        )
        scheduler.run(loop_done)

    def transactional_id(self, task: int) -> str:
        flow = self.flow
        return transactional_id(flow.settings.cluster_group_prefix, flow.source, flow.target, task)

    def _fence_earlier_splits(
        self, topics: Collection[str], target_props: Mapping[str, str]
    ) -> None:
        """Fence the tasks of earlier ``tasks.max`` values that this split has no task for
        (their transactional ids; the others are the ids of this split's tasks, which
        fence them when they start). The earlier splits are known by their tasks topics
        among the target's `topics`."""
        count = self.slot.count
        earlier = [n for n in task_counts(topics, self.flow.source) if n > count]
        ids = [self.transactional_id(t) for t in range(count, max(earlier, default=count))]
        if ids:
            log.info(
                "flow %s: fencing the transactional ids %s (tasks of an earlier tasks.max: %s)",
                self.flow.name,
                ", ".join(ids),
                ", ".join(str(n) for n in sorted(earlier)),
            )
            transactions.fence(target_props, ids, self.flow.settings.transaction_timeout_ms)

    def _fence_mirrormaker2(self, topics: Collection[str], target_props: Mapping[str, str]) -> None:
        """Fence MM2's tasks of this flow when MM2 ran it (its config topic is among the
        target's `topics`): a transaction MM2 left open (killed mid-copy) is aborted now,
        not after its transaction.timeout.ms (Connect's 60 s), which read_committed readers
        of the remote topics would wait out; an MM2 still copying the flow stops. Its tasks
        are at most ``tasks.max`` (as in a config file both run). A target that refuses
        (no ACL for MM2's ids) or does not answer leaves MM2's transactions to time out."""
        flow = self.flow
        if flow.mirrormaker2_configs_topic not in topics:
            return
        count = max(flow.settings.tasks_max, self.slot.count)
        ids = [mirrormaker2_transactional_id(flow.source, t) for t in range(count)]
        log.info(
            "flow %s: MirrorMaker 2 ran this flow (%s is on cluster %s): fencing its tasks' "
            "transactional ids %s",
            flow.name,
            flow.mirrormaker2_configs_topic,
            flow.target,
            ", ".join(ids),
        )
        for tid in ids:
            try:
                transactions.fence(target_props, [tid], flow.settings.transaction_timeout_ms)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                why = (
                    refusal(
                        err, flow.target, target_props, mirrormaker2_worker_group(flow.source), tid
                    ).reason
                    if isinstance(err, KafkaError)
                    else str(exc)
                )
                log.warning(
                    "flow %s: could not fence MirrorMaker 2's tasks: %s; a transaction MM2"
                    " left open is aborted by cluster %s only after its"
                    " transaction.timeout.ms",
                    flow.name,
                    why,
                    flow.target,
                )
                return

    def _open_sync_writer(self, source_admin: Any, target_admin: Any) -> OffsetSyncWriter | None:
        rules = self.rules
        if not rules.settings.emit_offset_syncs_enabled:
            return None
        cluster = rules.offset_syncs_holder(self.source, self.target)
        admin = rules.offset_syncs_holder(source_admin, target_admin)
        ensure_offset_syncs_topic(rules, admin, cluster.alias)
        producer = clients.producer(cluster.librdkafka("producer"), {"linger.ms": 50})
        return OffsetSyncWriter(producer, rules.offset_syncs_topic)

    def _access_watch(
        self, cluster: ClusterConfig, props: Mapping[str, str]
    ) -> Callable[[KafkaError], None]:
        """An error_cb that fails the part when `cluster` refuses the login or certificate,
        and tells the daemon when `cluster` cannot be reached (`note_client_error`).

        A password changed or a certificate expired while the daemon runs shows when a
        connection is made again; librdkafka would retry forever. The part fails with
        what to check instead (its state FAILED, /health not ready) and the daemon
        retries it with backoff.
        """

        def watch(err: KafkaError) -> None:
            self.note_client_error(cluster.alias, err)
            if clients.is_access_error(err) and self._access_failure is None:
                self._access_failure = clients.access_problem(cluster.alias, props, err)

        return watch
