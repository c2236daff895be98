"""The backfill driver: plan the ranges, run them as Spark tasks, hand over to the daemon.

The driver reads the clusters once (partitions, offsets, progress), creates the
remote topics as the source part would (same partition count, the source's
synced configs), and then keeps `parallelism` ranges copying at a time, each as
a one-task Spark job running `copier.copy_range` on an executor. A partition's
next range starts only when its previous range is committed, so records land on
each remote partition in source order (see `plan`).

Completion state is the progress in ``mm2-offsets.<source>.internal``, the same
record the daemon keeps: the copier writes it after every commit (``end - 1``
when a range is done). A backfill run again plans from it, so completed ranges
and committed parts of a range are not copied again, and `mm2py run` afterwards
continues at the first offset the backfill did not copy.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.backfill.copier import RangeTask, copy_range
from mm2py.backfill.environment import ExecutorPython, PythonEnvironmentError, executor_python
from mm2py.backfill.failures import task_failure_line
from mm2py.backfill.plan import (
    DEFAULT_RANGE_RECORDS,
    MIB,
    BackfillPlan,
    BackfillProgress,
    OffsetRange,
    PartitionBounds,
    RangeResult,
    RangeScheduler,
    plan_backfill,
)
from mm2py.compat.topic_configs import ConfigPropertyFilter
from mm2py.config import ClusterConfig, FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.access import ClusterAccessError, check_cluster_access
from mm2py.kafka.topics import (
    TopicAdminError,
    await_topics,
    list_offsets,
    partition_counts,
)
from mm2py.replication.offset_syncs import ensure_offset_syncs_topic
from mm2py.replication.progress import ProgressStore, SourcePartition
from mm2py.replication.remote_topics import ensure_remote_topics

log = logging.getLogger(__name__)

PROGRESS_INTERVAL = 2.0
PROGRESS_WRITE_TIMEOUT = 30.0
SPARK_LOG_CONFIG = Path(__file__).with_name("log4j2-spark.properties")


class BackfillError(Mm2pyError):
    """The backfill could not run or a range failed; one line that says why."""


@dataclass(frozen=True)
class BackfillOptions:
    """What `mm2py backfill` was asked to do."""

    source: str
    target: str
    topics: re.Pattern[str] | None = None  # among the flow's topics, these (full match)
    from_ms: int | None = None  # None: from the earliest offset
    until_ms: int | None = None  # None: up to the end when the backfill starts
    master: str | None = None  # None: spark-submit's master, else local[*]
    python_env: str | None = None  # the executors' packed environment; None: see environment
    range_records: int = DEFAULT_RANGE_RECORDS
    parallelism: int | None = None  # ranges copying at once; None: Spark's default parallelism


@dataclass
class BackfillSummary:
    """What a backfill did, for the summary at the end."""

    flow: str
    remote_topics: dict[str, str]  # source topic -> remote topic
    plan: BackfillPlan
    progress: BackfillProgress
    progress_topic: str
    syncs_topic: str | None  # None: offset syncs disabled
    syncs_cluster: str
    parallelism: int = 0
    seconds: float = 0.0  # the whole run
    copy_seconds: float = 0.0  # first range started -> last range committed


def run_backfill(
    config: MirrorConfig,
    options: BackfillOptions,
    on_progress: Callable[[str], None] = lambda _line: None,
) -> BackfillSummary:
    """Copy the planned ranges of flow source->target; raise BackfillError on failure."""
    started = time.monotonic()
    flow = config.flow(options.source, options.target)
    source, target = config.cluster(flow.source), config.cluster(flow.target)
    rules = FlowRules(flow)
    try:
        check_cluster_access(config, [flow.source, flow.target])
    except ClusterAccessError as exc:
        raise BackfillError(str(exc)) from None
    source_admin = clients.admin_client(source.librdkafka("admin"))
    target_admin = clients.admin_client(target.librdkafka("admin"))
    try:
        counts = partition_counts(source_admin, rules.settings.admin_timeout)
    except KafkaException as exc:
        raise BackfillError(f"listing the topics of cluster {flow.source}: {exc}") from None
    topics = {
        t: n
        for t, n in sorted(counts.items())
        if rules.should_replicate(t) and (options.topics is None or options.topics.fullmatch(t))
    }
    if not topics:
        wanted = f" and --topics {options.topics.pattern!r}" if options.topics else ""
        raise BackfillError(
            f"no topic of cluster {flow.source} matches flow {flow.name}'s topics{wanted}"
        )
    remote_of = {t: rules.remote_topic(t) for t in topics}
    _ensure_remote_topics(flow, rules, source_admin, target_admin, topics, remote_of)
    syncs_cluster = rules.offset_syncs_holder(source, target)
    syncs_topic = None
    try:
        if rules.settings.emit_offset_syncs_enabled:
            syncs_topic = rules.offset_syncs_topic
            ensure_offset_syncs_topic(
                rules,
                rules.offset_syncs_holder(source_admin, target_admin),
                syncs_cluster.alias,
            )
        store = ProgressStore(
            target.librdkafka("producer"),
            flow.target,
            flow.source,
            flow.offsets_topic,
            rules.settings.offset_storage_replication_factor,
            rules.settings.offset_storage_partitions,
        )
    except TopicAdminError as exc:
        raise BackfillError(str(exc)) from None
    try:
        try:
            stored = store.load()
        except (TimeoutError, RuntimeError) as exc:
            raise BackfillError(f"reading progress on cluster {flow.target}: {exc}") from None
        bounds = read_bounds(source_admin, flow.source, topics, options, stored)
        plan = plan_backfill(bounds, options.range_records)
        summary = BackfillSummary(
            flow.name,
            remote_of,
            plan,
            BackfillProgress(len(plan.ranges), plan.offsets),
            flow.offsets_topic,
            syncs_topic,
            syncs_cluster.alias,
        )
        _record_progress(store, dict(plan.progress_only), flow)
        if plan.ranges:
            task_for = _task_factory(
                flow, rules, source, target, syncs_cluster, syncs_topic, remote_of
            )
            sc, executors = spark_context(
                options.master, f"mm2py backfill {flow.name}", options.python_env
            )
            summary.parallelism = options.parallelism or max(sc.defaultParallelism, 1)
            copy_started = time.monotonic()
            _copy_ranges(
                sc,
                plan,
                task_for,
                summary,
                flow,
                on_progress,
                copy_started,
                queue_extra=options.parallelism is None,
                target_consumer_props=target.librdkafka("consumer"),
                executors=executors,
            )
            summary.copy_seconds = time.monotonic() - copy_started
    finally:
        store.close()
    summary.seconds = time.monotonic() - started
    return summary


# -- reading the clusters ---------------------------------------------------------


def _ensure_remote_topics(
    flow: FlowConfig,
    rules: FlowRules,
    source_admin: AdminClient,
    target_admin: AdminClient,
    topics: Mapping[str, int],
    remote_of: Mapping[str, str],
) -> None:
    """Create or grow the remote topics, with the source's synced configs (as the daemon)."""
    try:
        existing = partition_counts(target_admin, rules.settings.admin_timeout)
    except KafkaException as exc:
        raise BackfillError(f"listing the topics of cluster {flow.target}: {exc}") from None
    result = ensure_remote_topics(
        rules,
        source_admin,
        target_admin,
        topics,
        existing,
        ConfigPropertyFilter(rules.settings.config_properties_exclude),
    )
    if result.failed:
        raise BackfillError(next(iter(result.failed.values())))
    try:
        wanted = {remote_of[t]: n for t, n in topics.items()}
        await_topics(target_admin, flow.target, wanted, rules.settings.admin_timeout)
    except TopicAdminError as exc:
        raise BackfillError(str(exc)) from None


def _list_offsets(
    admin: AdminClient, cluster: str, specs: Mapping[TopicPartition, Any]
) -> dict[SourcePartition, int]:
    try:
        return list_offsets(admin, cluster, specs)
    except TopicAdminError as exc:
        raise BackfillError(str(exc)) from None


def read_bounds(
    admin: AdminClient,
    cluster: str,
    topics: Mapping[str, int],
    options: BackfillOptions,
    stored: Mapping[SourcePartition, int],
) -> list[PartitionBounds]:
    """Each partition's log start, end (last stable offset or --until) and --from offsets."""
    tps = [TopicPartition(t, p) for t, n in topics.items() for p in range(n)]
    first: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
    last: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    earliest = _list_offsets(admin, cluster, {tp: first for tp in tps})
    # With read_committed isolation, `latest` is the last stable offset.
    stable = _list_offsets(admin, cluster, {tp: last for tp in tps})
    by_time: dict[SourcePartition, int] = {}
    if options.from_ms is not None:
        spec = OffsetSpec.for_timestamp(options.from_ms)
        by_time = _list_offsets(admin, cluster, {tp: spec for tp in tps})
    until: dict[SourcePartition, int] = {}
    if options.until_ms is not None:
        spec = OffsetSpec.for_timestamp(options.until_ms)
        until = _list_offsets(admin, cluster, {tp: spec for tp in tps})
    bounds = []
    for tp in tps:
        key = (tp.topic, tp.partition)
        end = stable[key]
        if key in until and 0 <= until[key] < end:
            end = until[key]
        from_offset = None
        if options.from_ms is not None:
            # -1: no record at or after --from, so nothing to copy.
            from_offset = by_time[key] if by_time[key] >= 0 else end
        last_copied = stored.get(key)
        bounds.append(
            PartitionBounds(tp.topic, tp.partition, earliest[key], end, from_offset, last_copied)
        )
    return bounds


# -- Spark ------------------------------------------------------------------------


def spark_context(
    master: str | None, app_name: str, python_env: str | None = None
) -> tuple[Any, ExecutorPython]:
    """The SparkContext (spark-submit's if it runs us, else a new one on `master` or
    local[*]) and the Python its executors run (shipped with the job where needed)."""
    try:
        from pyspark import SparkConf, SparkContext
    except ImportError:
        raise BackfillError(
            "mm2py backfill needs pyspark: pip install 'mm2py[spark]' (and a Java 17 runtime)"
        ) from None
    conf = SparkConf()
    if master is None and not conf.contains("spark.master"):
        master = "local[*]"
    if master is not None:
        conf.setMaster(master)
    try:
        executors = executor_python(conf, python_env)
    except PythonEnvironmentError as exc:
        raise BackfillError(str(exc)) from None
    log.info("Spark executors run %s", executors.describe())
    if executors.archive is not None:
        shipped = [a for a in conf.get("spark.archives", "").split(",") if a]
        conf.set("spark.archives", ",".join([*shipped, executors.archive]))
    # SparkContext reads it when it starts; the executors start this path.
    os.environ["PYSPARK_PYTHON"] = executors.python
    if conf.get("spark.master", "").startswith("local"):
        conf.setIfMissing("spark.ui.enabled", "false")
    # Spark's own log lines stay out of the output (no effect under spark-submit, whose
    # driver JVM runs already).
    conf.setIfMissing(
        "spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={SPARK_LOG_CONFIG}"
    )
    conf.setAppName(app_name)
    conf.setIfMissing("spark.ui.showConsoleProgress", "false")
    # A speculative second attempt of a range would write the same partition twice at once.
    conf.set("spark.speculation", "false")
    sc = SparkContext.getOrCreate(conf)
    sc.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    return sc, executors


def _run_on_spark(sc: Any, task: RangeTask) -> RangeResult:
    """Copy one range as a one-task Spark job (blocks the calling thread)."""
    sc.setJobDescription(f"copy {task.range} to {task.remote_topic}")
    results: list[RangeResult] = sc.parallelize([task], 1).map(_copy_in_task).collect()
    return results[0]


def _copy_in_task(task: RangeTask) -> RangeResult:
    """The Spark task: copy the range, telling the copier when Spark retries it."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return copy_range(task, context.attemptNumber() if context is not None else 0)


def _task_factory(
    flow: FlowConfig,
    rules: FlowRules,
    source: ClusterConfig,
    target: ClusterConfig,
    syncs_cluster: ClusterConfig,
    syncs_topic: str | None,
    remote_of: Mapping[str, str],
) -> Callable[[OffsetRange], RangeTask]:
    source_props = source.librdkafka("consumer")
    target_props = target.librdkafka("producer")
    syncs_props = syncs_cluster.librdkafka("producer") if syncs_topic else None
    registries = None
    if flow.settings.schema_registry_sync_enabled:
        registries = (
            source.schema_registry_client(),
            target.schema_registry_client(),
            flow.settings.schema_registry_unresolved_ids,
        )

    def task_for(r: OffsetRange) -> RangeTask:
        return RangeTask(
            flow.name,
            flow.source,
            flow.target,
            r,
            remote_of[r.topic],
            # Fixed per source partition: each attempt fences the one before it.
            f"mm2py-backfill-{flow.name}-{r.topic}-{r.partition}",
            flow.offsets_topic,
            rules.settings.offset_storage_replication_factor,
            source_props,
            target_props,
            syncs_props,
            syncs_topic or "",
            registries,
        )

    return task_for


def _copy_ranges(
    sc: Any,
    plan: BackfillPlan,
    task_for: Callable[[OffsetRange], RangeTask],
    summary: BackfillSummary,
    flow: FlowConfig,
    on_progress: Callable[[str], None],
    started: float,
    queue_extra: bool,
    target_consumer_props: Mapping[str, str],
    executors: ExecutorPython,
) -> None:
    """Keep `summary.parallelism` ranges copying (each records its own progress)."""
    scheduler = RangeScheduler(plan.ranges)
    progress = summary.progress
    slots = summary.parallelism
    if queue_extra:
        # More ranges than Spark has cores wait in its queue, so a core that finishes
        # a range starts the next at once instead of waiting for the driver to notice
        # and submit a job (a few hundred ms per range).
        slots += max(1, slots // 2)
    running: dict[Future[RangeResult], OffsetRange] = {}
    watch = _RemoteEnds(target_consumer_props, task_for(plan.ranges[0]))
    next_line = 0.0
    pool = ThreadPoolExecutor(slots, thread_name_prefix="backfill-range")
    try:
        while not scheduler.done:
            while len(running) < slots:
                r = scheduler.next_range()
                if r is None:
                    break
                task = task_for(r)
                watch.starting(task)
                running[pool.submit(_run_on_spark, sc, task)] = r
            done, _ = wait(running, timeout=PROGRESS_INTERVAL, return_when=FIRST_COMPLETED)
            for future in done:
                r = running.pop(future)
                watch.finished(r)
                try:
                    result = future.result()
                except Exception as exc:
                    log.debug("copying %s failed", r, exc_info=True)
                    raise BackfillError(_task_failure(exc, r, executors)) from None
                scheduler.finished(r)
                progress.add(result)
                if result.interleaved:
                    log.warning(
                        "flow %s: at least %d records of another producer were interleaved in "
                        "%s-%d while %s was copied (is the daemon running for this flow?)",
                        flow.name,
                        result.interleaved,
                        summary.remote_topics[r.topic],
                        r.partition,
                        r,
                    )
            now = time.monotonic()
            if done or now >= next_line:
                line = progress.line(now - started, watch.in_flight(), watch.record_bytes)
                on_progress(line)
                next_line = now + PROGRESS_INTERVAL
    except BaseException:
        sc.cancelAllJobs()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        watch.close()


class _RemoteEnds:
    """How far running ranges got, from the end offsets of their remote partitions.

    For the progress line only: the count includes commit markers (one per
    transaction) and records of a transaction not committed yet.
    """

    def __init__(self, target_props: Mapping[str, str], sample: RangeTask) -> None:
        # read_uncommitted: the high watermark, not the last stable offset.
        self._consumer = clients.consumer(target_props, {"isolation.level": "read_uncommitted"})
        self._base: dict[OffsetRange, tuple[str, int]] = {}  # range -> (remote, end offset)
        self.record_bytes = _sample_record_bytes(sample)

    def _end(self, topic: str, partition: int) -> int | None:
        try:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), timeout=5
            )
        except KafkaException:
            return None
        return int(high)

    def starting(self, task: RangeTask) -> None:
        end = self._end(task.remote_topic, task.range.partition)
        if end is not None:
            self._base[task.range] = (task.remote_topic, end)

    def finished(self, r: OffsetRange) -> None:
        self._base.pop(r, None)

    def in_flight(self) -> int:
        """Records written to the target by the running ranges so far."""
        total = 0
        for r, (remote, base) in self._base.items():
            end = self._end(remote, r.partition)
            if end is not None:
                total += min(max(end - base, 0), r.offsets)
        return total

    def close(self) -> None:
        self._consumer.close()


def _sample_record_bytes(task: RangeTask, records: int = 500) -> float | None:
    """The average key + value size of the first records of a range (for MiB while
    no range has finished yet)."""
    consumer = clients.consumer(task.source_props, {"isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(task.range.topic, task.range.partition, task.range.start)])
        sizes: list[int] = []
        deadline = time.monotonic() + 2.0
        while len(sizes) < records and time.monotonic() < deadline:
            for msg in consumer.consume(records - len(sizes), 0.2):
                if msg.error() is None:
                    key, value = msg.key(), msg.value()
                    sizes.append((len(key) if key else 0) + (len(value) if value else 0))
        return sum(sizes) / len(sizes) if sizes else None
    except KafkaException:
        return None
    finally:
        consumer.close()


def _record_progress(
    store: ProgressStore, last_copied: Mapping[SourcePartition, int], flow: FlowConfig
) -> None:
    """Write progress and wait until the target acknowledged every record of it."""
    if not last_copied:
        return
    written: dict[SourcePartition, int] = {}
    store.submit(last_copied, written.__setitem__)
    if not store.flush(PROGRESS_WRITE_TIMEOUT) or written != dict(last_copied):
        raise BackfillError(
            f"writing progress to {store.topic} on cluster {flow.target} failed; "
            "run the backfill again (completed ranges are not copied again)"
        )


def _task_failure(exc: Exception, r: OffsetRange, executors: ExecutorPython) -> str:
    """One line for a failed Spark task (see `failures`)."""
    return task_failure_line(str(exc), str(r), executors.describe())


# -- the summary ------------------------------------------------------------------


def format_summary(summary: BackfillSummary) -> str:
    """What was copied, how fast, and where the daemon continues."""
    p = summary.progress
    plan = summary.plan
    out: list[str] = []
    rate = p.records / summary.copy_seconds if summary.copy_seconds > 0 else 0.0
    mib = p.bytes / MIB
    out.append(
        f"backfill {summary.flow}: {p.records:,} records ({mib:.1f} MiB) in "
        f"{p.ranges_done} ranges of {len(plan.partitions)} partitions, "
        f"{summary.seconds:.1f} s in all"
    )
    if summary.copy_seconds > 0:
        out.append(
            f"  copying: {summary.copy_seconds:.1f} s, {rate:,.0f} records/s, "
            f"{mib / summary.copy_seconds:.1f} MiB/s, {summary.parallelism} ranges at a time"
        )
    for topic, (records, nbytes) in sorted(p.per_topic.items()):
        out.append(
            f"  {topic} -> {summary.remote_topics[topic]}: {records:,} records, "
            f"{nbytes / MIB:.1f} MiB"
        )
    if plan.already_copied:
        out.append(
            f"  {len(plan.already_copied)} partitions were already copied up to their end "
            "(progress of the daemon or of an earlier backfill)"
        )
    if p.interleaved:
        out.append(
            f"  warning: at least {p.interleaved} records of other producers were interleaved in "
            "the remote partitions (run the backfill while the daemon does not copy this flow)"
        )
    syncs = (
        f"{p.syncs} offset syncs in {summary.syncs_topic} on {summary.syncs_cluster}"
        if summary.syncs_topic
        else "no offset syncs (emit.offset-syncs.enabled = false)"
    )
    out.append(
        f"  hand-over: progress in {summary.progress_topic} says where `mm2py run` continues "
        f"(the end offsets this backfill started with); {syncs}"
    )
    return "\n".join(out) + "\n"
