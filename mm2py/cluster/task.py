"""A task of a flow: its copy loop in an OS process of its own, driven by the node.

The node holds a `TaskPart` per task it owns; the part's thread starts the task's process
(a fork of the node's task server, below) and talks to it over a pipe: node -> task
("pause", bool), ("restart", None), ("stop", None); task -> node a `TaskReport` every
REPORT_INTERVAL and once at the end (changed partition statistics, failed partitions,
paused, unreachable clusters, the error that ended it).

Invariants:
- a restart restarts the copy loop in the same process, progress recorded first;
- a stop flushes the producer and records progress for every acknowledged record before
  the process exits: the next owner starts exactly after the last copied record;
- the task dies with its node and ignores SIGINT and SIGTERM: only the node stops it,
  over the pipe.

Task server: multiprocessing's `forkserver`, started by the node's first task process. It
is a fresh interpreter (no threads or librdkafka state of the node's) that imports the
copy path once (TASK_PRELOAD); each task process is a fork of it, which costs no
interpreter start and no imports (a spawned interpreter importing the copy path took
about 0.45 CPU-s a process). The server exits when the node does (it watches a pipe
from the node, however the node ends), and a task process is killed when its parent, the
server, exits (PR_SET_PDEATHSIG): a node killed with -9 leaves no copy loop behind. The
server ignores SIGINT and SIGTERM (mm2py.cluster.task_server), so a signal to the node's
whole process group does not end it, and with it the tasks, before the node has stopped
them.
Design: docs/design/task-assignment.md.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from mm2py import logs
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.replication.stats import (
    Extremes,
    PartitionStats,
    ReplicationStats,
    SchemaStats,
    summed,
)
from mm2py.runtime.assignment import TaskSlot
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import STOP_TIMEOUT, FlowPart, freeze_start_up
from mm2py.runtime.reachability import Reachability

log = logging.getLogger(__name__)

# The node's view of a task's statistics is at most this old; lag is measured every
# second (mm2py.parts.source). Each report looks at every partition's statistics: at
# 0.5 s an idle task of 2,000 partitions spent 0.6% of a core on it.
REPORT_INTERVAL = 1.0
# How often the node's thread for a task looks whether it should stop, when neither a
# report nor the process's end woke it (`TaskPart.stop` sends the stop itself).
WATCH_INTERVAL = 1.0
START_TIMEOUT = 60.0  # the task server's first start (an interpreter, mm2py's imports)
# What the task server imports before it forks task processes: the copy path.
TASK_PRELOAD = ("mm2py.cluster.task_server", "mm2py.parts.source")
_PR_SET_PDEATHSIG = 1


@dataclass
class TaskReport:
    """What a task process tells its node."""

    stats: dict[tuple[str, int], PartitionStats]  # only those changed since the last report
    failed_partitions: dict[str, str]
    paused: bool
    unreachable: set[str] = field(default_factory=set)
    errors: int = 0  # failures counted since the last report
    restarts: int = 0  # restarts done on request in this process
    error: str | None = None  # why the task ended, if it failed
    trace: str | None = None
    schemas: SchemaStats | None = None  # the task's schema registry counts (all, not changes)
    batches: dict[str, int] | None = None  # the task's batches by reason (all, not changes)


class TaskPart(FlowPart):
    """The node's handle on one task process (shows as the flow's "source" part, task N)."""

    name = "source"
    pauses_in_place = True

    def __init__(
        self,
        flow: FlowConfig,
        source: ClusterConfig,
        target: ClusterConfig,
        metrics: Metrics,
        slot: TaskSlot,
        stats: NodeStats,
    ) -> None:
        super().__init__(flow, source, target, metrics)
        self.slot = slot
        self.node_stats = stats
        self.report: TaskReport | None = None
        self.pid: int | None = None
        self._conn: Connection | None = None
        self._conn_lock = threading.Lock()
        self._stop_sent = False  # to the current process (under the lock)

    def failed_partitions(self) -> dict[str, str]:
        report = self.report
        return dict(report.failed_partitions) if report is not None else {}

    def partitions(self) -> list[tuple[str, int]]:
        """The remote topic partitions this task copies (as far as reported)."""
        return self.node_stats.task_partitions(self.slot.id)

    def pause(self, timeout: float = 5.0) -> None:
        """Pause in place; returns once the task's loop has paused (or `timeout`)."""
        self.paused = True
        self._send("pause", True)
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            report = self.report
            if report is not None and report.paused:
                return
            time.sleep(0.02)

    def resume(self, timeout: float = STOP_TIMEOUT) -> None:
        self.paused = False
        self._send("pause", False)

    def restart(self, timeout: float = STOP_TIMEOUT) -> None:
        """Restart the task's copy loop in its process (a new process if it has none)."""
        report = self.report
        if not self.running or report is None:
            self.stop(timeout)
            self.start()
            return
        done = report.restarts + 1
        self._send("restart", None)
        deadline = time.monotonic() + timeout
        while self.running and time.monotonic() < deadline:
            report = self.report
            if report is not None and report.restarts >= done:
                return
            time.sleep(0.02)

    def _send(self, command: str, arg: object) -> None:
        with self._conn_lock:
            if self._conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send((command, arg))

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self.stopping.set()
        self._send_stop()  # now: the run's thread may be waiting for up to WATCH_INTERVAL
        super().stop(timeout)

    def _send_stop(self) -> None:
        with self._conn_lock:
            if self._conn is not None and not self._stop_sent:
                self._stop_sent = True
                with contextlib.suppress(OSError, ValueError):
                    self._conn.send(("stop", None))

    def run(self) -> None:
        """Run the task's process until it ends or the part is stopped."""
        process, parent_end = SPARES.take()
        level, fmt = logs.chosen()
        parent_end.send((self.flow, self.source, self.target, self.slot, level, fmt))
        self.pid = process.pid
        # A new process counts its restarts from 0: the last one's report must not stand
        # for it (a restart would wait for a count this process never reaches).
        self.report = None
        with self._conn_lock:
            self._conn, self._stop_sent = parent_end, False
        if self.paused:
            self._send("pause", True)
        ended = False
        try:
            while not ended:
                if self.stopping.is_set():  # set before the process was connected
                    self._send_stop()
                # the process's end (sentinel) with its pipe drained: a last report first
                wait([parent_end, process.sentinel], WATCH_INTERVAL)
                if parent_end.poll():
                    try:
                        self._take(parent_end.recv())
                    # A process that ended with commands of ours unread resets the pipe
                    # rather than closing it: its end either way.
                    except (EOFError, ConnectionResetError):
                        ended = True
                elif not process.is_alive():
                    ended = True
        finally:
            with self._conn_lock:
                self._conn = None
            parent_end.close()
            process.join(2)
            if process.is_alive():
                process.kill()
                process.join(2)
            if self.pid == process.pid:  # (a run after it, past a stop's timeout, has its own)
                self.pid = None  # the status names no process that has ended
            self.node_stats.retire(self.slot.id)
        report = self.report
        if report is not None and report.error is not None:
            raise TaskFailed(report.error, report.trace)
        if not self.stopping.is_set():
            raise TaskFailed(f"task {self.slot.id} process ended (exit code {process.exitcode})")

    def _take(self, report: TaskReport) -> None:
        self.report = report
        self.node_stats.update(self.slot.id, report.stats)
        if report.schemas is not None:
            self.node_stats.update_schemas(self.slot.id, report.schemas)
        if report.batches is not None:
            self.node_stats.update_batches(self.slot.id, report.batches)
        if report.errors:
            self.errors.inc(report.errors)
        for alias in report.unreachable:
            if self.reachability is not None:
                self.reachability.failed(alias)


class SpareProcess:
    """One task process started ahead of need, waiting for the task it will run: a task
    that moves here after its node died starts copying at once. The node's first spare
    also starts the task server (an interpreter importing the copy path: a second or more
    on a busy machine), before any task needs it.

    A spare is kept only while the node may be given more tasks (`wanted`, from `prime`):
    one that runs every task of its flows (a node alone) is given none, and a spare costs
    a process (6 MB of its own, the rest shared with the server). At most one is
    started at a time, so tasks assigned together take one spare and start the others
    afresh, rather than each starting a spare of its own."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready: tuple[BaseProcess, Connection] | None = None
        self._starting = False
        self._closed = False
        self._wanted: Callable[[], bool] = lambda: True

    def prime(self, wanted: Callable[[], bool] | None = None) -> None:
        """Start the first spare, unless one is ready or starting (a node with no task yet
        may be given some any time); with `wanted`, keep one from now on only while
        `wanted()` (it must not block: it is asked under this object's lock)."""
        if wanted is not None:
            self._wanted = wanted
        self.refill()

    def take(self) -> tuple[BaseProcess, Connection]:
        with self._lock:
            ready, self._ready = self._ready, None
        if ready is None or not ready[0].is_alive():
            ready = _start_process()
        self.refill()
        return ready

    def refill(self) -> None:
        """Start a spare in the background, unless one is ready or starting, the node
        stops, or it wants none."""
        with self._lock:
            if self._closed or self._ready is not None or self._starting or not self._wanted():
                return
            self._starting = True
        threading.Thread(target=self._refill, name="spare-task-process", daemon=True).start()

    def _refill(self) -> None:
        try:
            spare = _start_process()
        except BaseException:
            with self._lock:
                self._starting = False
            raise
        with self._lock:
            self._starting = False
            if not self._closed:
                self._ready = spare
                return
        spare[1].close()  # the node is stopping

    def close(self) -> None:
        """No more spares: the waiting one exits (its pipe closes)."""
        with self._lock:
            self._closed = True
            ready, self._ready = self._ready, None
        if ready is not None:
            ready[1].close()
            ready[0].join(2)


SPARES = SpareProcess()


def _start_process() -> tuple[BaseProcess, Connection]:
    """A task process, forked by the node's task server (started by the first call)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(TASK_PRELOAD))
    parent_end, child_end = context.Pipe()
    process = context.Process(target=spare_main, args=(child_end,), name="mm2py-task")
    process.start()
    child_end.close()
    return process, parent_end


def spare_main(conn: Connection) -> None:
    """A task process before its task: import what a task needs, then wait for it.

    It ignores SIGINT and SIGTERM from its first line, as the task it becomes does: a
    Ctrl-C reaches every process of the terminal's group, and the node ends its spare
    by closing the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parent = os.getppid()
    _die_with_parent()
    if os.getppid() != parent:  # the server died before the request took hold
        os._exit(1)
    # The server imported it (TASK_PRELOAD), and ignored an error doing so: the error, if
    # any, shows here.
    import mm2py.parts.source  # noqa: F401

    try:
        flow, source, target, slot, level, fmt = conn.recv()
    except (EOFError, OSError):  # the node stopped, or it had this spare already
        return
    task_main(conn, flow, source, target, slot, level, fmt)


def changed_since(
    partitions: dict[tuple[str, int], PartitionStats],
    sent: dict[tuple[str, int], tuple[object, ...]],
) -> dict[tuple[str, int], PartitionStats]:
    """The partitions whose statistics differ from what `sent` says was last sent; `sent`
    is brought up to date."""
    changed = {}
    for key, stats in list(partitions.items()):  # a copy: the loop may add partitions
        now = stats.signature()
        if sent.get(key) != now:
            sent[key] = now
            changed[key] = stats
    return changed


class TaskFailed(Exception):
    """A task process ended with an error (its own trace is kept for the status)."""

    def __init__(self, message: str, trace: str | None = None) -> None:
        super().__init__(message)
        self.trace = trace


class NodeStats(ReplicationStats):
    """A flow's statistics on this node: what its task processes report, plus what
    tasks that ran here earlier counted, so that counters never go back when a task
    moves away or restarts (a moved partition keeps its counts, with no lag).

    MM2's windowed views (``metrics.mm2.names.enabled``) are the current task's, as
    MM2's own restart with their task; only its totals include the earlier counts.
    """

    def __init__(
        self, source: str, target: str, partition_labels: bool = False, mm2_names: bool = False
    ) -> None:
        super().__init__(source, target, partition_labels, mm2_names)
        self._lock = threading.Lock()
        self._earlier: dict[tuple[str, int], PartitionStats] = {}
        self._current: dict[int, dict[tuple[str, int], PartitionStats]] = {}
        self._schemas_earlier = SchemaStats()
        self._schemas_current: dict[int, SchemaStats] = {}
        self._batches_earlier: Counter[str] = Counter()
        self._batches_current: dict[int, dict[str, int]] = {}

    def update(self, task: int, changed: dict[tuple[str, int], PartitionStats]) -> None:
        """A task's report: the partitions whose statistics changed since its last one."""
        with self._lock:
            current = self._current.setdefault(task, {})
            if changed or not current:
                current.update(changed)
                self._rebuild()

    def update_schemas(self, task: int, counts: SchemaStats) -> None:
        """A task's report of its schema registry counts (its process's totals)."""
        with self._lock:
            self._schemas_current[task] = counts
            self._rebuild()

    def update_batches(self, task: int, counts: dict[str, int]) -> None:
        """A task's report of its batches by reason (its process's totals)."""
        with self._lock:
            self._batches_current[task] = counts
            self._rebuild()

    def task_partitions(self, task: int) -> list[tuple[str, int]]:
        """The partitions the running task has reported (none once it is retired)."""
        with self._lock:
            return sorted(self._current.get(task, {}))

    def retire(self, task: int) -> None:
        """The task's process ended: keep its counts, drop its lag."""
        with self._lock:
            for key, stats in self._current.pop(task, {}).items():
                kept = summed([self._earlier.get(key, PartitionStats()), stats])
                kept.lag = 0
                self._earlier[key] = kept
            ended = self._schemas_current.pop(task, None)
            if ended is not None:
                self._schemas_earlier.add(ended)
            self._batches_earlier.update(self._batches_current.pop(task, {}))
            self._rebuild()

    def _rebuild(self) -> None:
        merged = dict(self._earlier)
        for stats in self._current.values():
            for key, now in stats.items():
                earlier = self._earlier.get(key)
                merged[key] = now if earlier is None else _continued(earlier, now)
        self.partitions = merged
        if self._schemas_current or self.schemas is not None:
            schemas = SchemaStats()
            for counts in (self._schemas_earlier, *self._schemas_current.values()):
                schemas.add(counts)
            self.schemas = schemas
        if self._batches_current or self.batches is not None:
            batches = Counter(self._batches_earlier)
            for by_reason in self._batches_current.values():
                batches.update(by_reason)
            self.batches = dict(batches)


def _continued(earlier: PartitionStats, now: PartitionStats) -> PartitionStats:
    """`now` (a task's own counts) continuing from `earlier` (tasks before it here)."""
    out = copy.deepcopy(now)
    out.records += earlier.records
    out.bytes += earlier.bytes
    out.skipped += earlier.skipped
    for mine, before in ((out.record_age, earlier.record_age), (out.latency, earlier.latency)):
        mine.add(before)
        if isinstance(mine, Extremes):  # its window began at the task's own count
            mine.count_mark += sum(before.counts)
            mine.total_mark += before.total
    if out.meters is not None:
        out.meters.records += earlier.records
        out.meters.bytes += earlier.bytes
        if out.meters.prior is not None:
            start, records, size = out.meters.prior
            out.meters.prior = (start, records + earlier.records, size + earlier.bytes)
    return out


class _NotedFailures(Reachability):
    """In a task process: which clusters its clients could not reach (for the node)."""

    def __init__(self) -> None:
        super().__init__({}, {})
        self.noted: set[str] = set()

    def failed(self, alias: str, at: float | None = None) -> None:
        self.noted.add(alias)


def _errors_counted(metrics: Metrics, labels: dict[str, str]) -> float:
    """The part's mm2py_errors_total, read from the errors counter alone: the registry's
    `get_sample_value` collects every metric, the histograms of every topic included
    (measured: 10% of a core in an idle task of 2,000 partitions, at two reports a second)."""
    for family in metrics.errors.collect():
        for sample in family.samples:
            if sample.name == "mm2py_errors_total" and sample.labels == labels:
                return float(sample.value)
    return 0.0


def _die_with_parent() -> None:
    """Ask Linux to kill this process when its parent (the node's task server, which
    exits with the node) dies."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def task_main(
    conn: Connection,
    flow: FlowConfig,
    source: ClusterConfig,
    target: ClusterConfig,
    slot: TaskSlot,
    log_level: str,
    log_format: logs.LogFormat,
) -> None:
    """The task process (the spare it was, see `spare_main`): copy the slot's partitions
    until the node says stop."""
    logs.configure(log_level, log_format)
    logs.set_context(flow=flow.name, part=f"source task {slot.id}")
    from mm2py.parts.source import SourcePart  # the copy loop loads in the task only

    metrics = Metrics()
    part = SourcePart(flow, source, target, metrics, slot)
    noted = _NotedFailures()
    part.reachability = noted
    labels = {"source": flow.source, "target": flow.target, "part": part.name}
    counted = 0.0
    restarts = 0
    sent: dict[tuple[str, int], tuple[object, ...]] = {}  # what the node last heard
    freeze_start_up()
    part.start()

    def report(final: bool = False) -> None:
        nonlocal counted
        now_counted = _errors_counted(metrics, labels)
        failure = part.error if final else None
        conn.send(
            TaskReport(
                stats=changed_since(part.stats.partitions, sent),
                failed_partitions=part.failed_partitions(),
                paused=part.paused,
                unreachable=set(noted.noted),
                errors=int(now_counted - counted),
                restarts=restarts,
                error=str(failure) if failure is not None else None,
                trace=part.error_trace if final else None,
                schemas=copy.copy(part.stats.schemas),
                batches=None if part.stats.batches is None else dict(part.stats.batches),
            )
        )
        counted = now_counted
        noted.noted.clear()

    try:
        while part.running:
            if conn.poll(REPORT_INTERVAL):
                try:
                    command, arg = conn.recv()
                except EOFError:  # the node is gone
                    part.stop(STOP_TIMEOUT)
                    return
                if command == "pause":
                    part.pause() if arg else part.resume()
                elif command == "restart":
                    part.restart(STOP_TIMEOUT)
                    restarts += 1
                elif command == "stop":
                    part.stop(STOP_TIMEOUT)
            report()
        report(final=True)
    except (BrokenPipeError, EOFError, OSError):
        part.stop(STOP_TIMEOUT)
