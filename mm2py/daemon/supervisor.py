"""The replicator daemon: runs every enabled flow's parts, restarts failed ones, serves REST.

Whether each cluster answers is watched in one place (mm2py.runtime.reachability): a
part whose cluster has not answered for cluster.unreachable.grace.ms shows UNREACHABLE,
and a part that failed meanwhile is restarted as soon as the cluster answers again.

Each flow's copying is split into tasks shared by every node (`mm2py run` with the
same config) of the flow's cluster (mm2py.runtime.assignment): a `MemberPart` holds
this node's place in the flow's group and hands the daemon the tasks that come and
go; each task runs as a `TaskPart` (its copy loop in a process of its own). The
flow's once-per-flow parts (checkpoint, config/ACL sync, heartbeat) run only on the
node that owns task 0 and show STANDBY on the others.

The REST API (mm2py.daemon.api) and /metrics share the listen address. Requests that
pause, resume or restart a flow come on the API's threads; they and the
supervisor take turns through one lock, so a part is never restarted by both.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import signal
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import FrameType

from prometheus_client import CollectorRegistry

from mm2py.cluster.member import MemberPart, NodeId
from mm2py.cluster.metrics import NodeCollector
from mm2py.cluster.survey import SurveyError, survey
from mm2py.cluster.task import SPARES, NodeStats, TaskPart
from mm2py.cluster.view import FlowCluster
from mm2py.config import FlowConfig, MirrorConfig
from mm2py.errors import Mm2pyError
from mm2py.kafka.access import check_cluster_access
from mm2py.parts.checkpoint import CheckpointPart
from mm2py.parts.ends import SourceEndsPart
from mm2py.parts.heartbeat import HeartbeatPart
from mm2py.parts.sync import SyncPart
from mm2py.runtime.assignment import TaskSlot
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import STOP_TIMEOUT, Part, freeze_start_up
from mm2py.runtime.reachability import ClusterProbe, Reachability, ReachabilityCollector
from mm2py.runtime.status import (
    FlowStatus,
    Health,
    LatencyWindow,
    PartStatus,
    TopicStatus,
    flow_state,
    health,
)

log = logging.getLogger(__name__)

SUPERVISE_INTERVAL = 0.5
MAX_BACKOFF = 60.0


class ListenError(Mm2pyError):
    """The daemon's HTTP address cannot be bound."""


def parse_listen(address: str) -> tuple[str, int]:
    """`host:port` -> (host, port); a bare port binds to 127.0.0.1."""
    host, _, port = address.rpartition(":")
    return (host or "127.0.0.1", int(port))


def rest_address(host: str, port: int) -> str:
    """Where other nodes reach this node's REST API (a wildcard host: this machine's name)."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def build_parts(
    config: MirrorConfig,
    flows: Sequence[FlowConfig],
    metrics: Metrics,
    heartbeat_flows: Sequence[FlowConfig] = (),
) -> list[Part]:
    """The once-per-flow parts of every selected flow, and a heartbeat part for every
    heartbeat pair (the copying itself runs in tasks: `Daemon`)."""
    parts: list[Part] = []
    for flow in flows:
        source, target = config.cluster(flow.source), config.cluster(flow.target)
        if flow.settings.period("emit.checkpoints") is not None:
            parts.append(CheckpointPart(flow, source, target, metrics))
        if SyncPart.wanted(flow):
            parts.append(SyncPart(flow, source, target, metrics))
        parts.append(SourceEndsPart(flow, source, target, metrics))
    watched: set[str] = set()  # one heartbeat watcher per target cluster
    for flow in heartbeat_flows:
        target = config.cluster(flow.target)
        parts.append(HeartbeatPart(flow, target, metrics, watch=flow.target not in watched))
        watched.add(flow.target)
    return parts


@dataclass
class Supervised:
    """A part with its restart bookkeeping."""

    part: Part
    failures: int = 0
    restart_at: float | None = None
    last_error: str | None = field(default=None)
    # It failed while a cluster it uses was unreachable: restart it when that answers.
    failed_in_outage: bool = False
    # Runs only on the node that owns the flow's task 0 (STANDBY elsewhere).
    once_per_flow: bool = False


class Daemon:
    """Owns the parts of every selected flow for the lifetime of `mm2py run`."""

    def __init__(
        self,
        config: MirrorConfig,
        flows: Sequence[FlowConfig],
        listen: str,
        heartbeat_flows: Sequence[FlowConfig] | None = None,
    ) -> None:
        """`heartbeat_flows` defaults to every heartbeat pair (MM2 without --clusters)."""
        self.config = config
        self.flows = list(flows)
        self.listen = listen
        self.metrics = Metrics()
        self._stopping = threading.Event()
        if heartbeat_flows is None:
            heartbeat_flows = config.heartbeat_flows()
        self.parts = [
            Supervised(part, once_per_flow=True)
            for part in build_parts(config, self.flows, self.metrics, heartbeat_flows)
        ]
        # One statistics object per replicating flow, fed by the flow's tasks on this node.
        self.stats: dict[str, NodeStats] = {}
        for flow in self.flows:
            stats = NodeStats(
                flow.source,
                flow.target,
                flow.settings.metrics_partition_labels,
                flow.settings.metrics_mm2_names_enabled,
            )
            self.stats[flow.name] = stats
            self.metrics.replication.add(stats)
        # One member per flow with parts here (a pair that only heartbeats has one task).
        members: dict[str, FlowConfig] = {f.name: f for f in self.flows}
        for sup in self.parts:
            members.setdefault(sup.part.flow.name, sup.part.flow)
        self._members = list(members.values())
        self._leading: set[str] = set()  # flows whose task 0 is on this node
        self._paused: set[str] = set()  # flows paused by request (tasks start paused)
        self.reachability = build_reachability(
            config, [sup.part for sup in self.parts], list(self.flows)
        )
        for sup in self.parts:
            sup.part.reachability = self.reachability
        self.metrics.registry.register(ReachabilityCollector(self.reachability))
        self._control = threading.RLock()
        self._latency = {flow.name: LatencyWindow() for flow in self.flows}
        for flow in self._members:
            self.metrics.flow_info.labels(flow.name, flow.source, flow.target).set(1)

    @property
    def registry(self) -> CollectorRegistry:
        return self.metrics.registry

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if signum is not None:
            log.info("received %s, stopping", signal.Signals(signum).name)
        self._stopping.set()

    def run(self) -> None:
        """Start everything, supervise until a stop is requested, then stop: the parts
        within STOP_TIMEOUT in all, whether or not their clusters answer."""
        check_cluster_access(
            self.config,
            {a for sup in self.parts for a in (sup.part.flow.source, sup.part.flow.target)},
        )
        from mm2py.daemon.api import ApiServer, bind, build_app  # FastAPI loads only for `run`

        host, port = parse_listen(self.listen)
        try:
            server = ApiServer(build_app(self), bind(host, port))
        except OSError as exc:
            raise ListenError(
                f"cannot listen on {self.listen}: {exc.strerror}; "
                "is another mm2py running there? choose another address with --listen"
            ) from None
        server.start()
        self._add_members(NodeId.here(rest_address(host, server.socket.getsockname()[1])))
        log.info(
            "mm2py serving the REST API and /metrics on http://%s:%d; flows: %s",
            host,
            port,
            ", ".join(f.name for f in self.flows) or "none",
        )
        freeze_start_up()
        probe = ClusterProbe(
            self.reachability,
            {a: self.config.cluster(a).librdkafka("admin") for a in self.reachability.aliases},
        )
        probe.start()
        if self.stats:
            SPARES.prime(self._may_be_given_tasks)
        self._start_parts()
        try:
            while not self._stopping.wait(SUPERVISE_INTERVAL):
                with self._control:
                    self._supervise()
                self._record_latency()
        finally:
            self._stop_parts()
            probe.stop()
            server.stop()

    def _start_parts(self) -> None:
        """Start the members and the parts every node runs (the once-per-flow parts start
        with task 0). A member can be given tasks before the others have started: its
        thread then adds and starts their parts (`_tasks_assigned`), which waits for the
        control lock held here and is not in the copy of the list this goes over, so no
        task is started twice (two processes copying the same partitions)."""
        with self._control:
            for sup in list(self.parts):
                if not sup.once_per_flow:
                    sup.part.start()

    def _add_members(self, node: NodeId) -> None:
        self.metrics.registry.register(NodeCollector(node, self._member_parts))
        for flow in self._members:
            tasks = flow.settings.tasks_max if flow.name in self.stats else 1
            member = MemberPart(
                flow,
                self.config.cluster(flow.target),
                self.metrics,
                tasks,
                node,
                on_assigned=functools.partial(self._tasks_assigned, flow, tasks),
                on_revoked=functools.partial(self._tasks_revoked, flow),
                copies=flow.name in self.stats,
            )
            member.reachability = self.reachability
            self.parts.append(Supervised(member))

    def _member_parts(self) -> list[MemberPart]:
        return [s.part for s in list(self.parts) if isinstance(s.part, MemberPart)]

    # -- tasks coming and going (called on a member's thread) -------------------------

    def _tasks_assigned(self, flow: FlowConfig, tasks: int, ids: set[int]) -> None:
        """Start the tasks given to this node; with task 0, the flow's once-per-flow parts."""
        with self._control:
            started: list[Part] = []
            stats = self.stats.get(flow.name)
            if stats is not None:
                for task in sorted(ids):
                    task_part = TaskPart(
                        flow,
                        self.config.cluster(flow.source),
                        self.config.cluster(flow.target),
                        self.metrics,
                        TaskSlot(task, tasks),
                        stats,
                    )
                    task_part.reachability = self.reachability
                    task_part.paused = flow.name in self._paused
                    self.parts.append(Supervised(task_part))
                    started.append(task_part)
            if 0 in ids:
                self._leading.add(flow.name)
                started += [
                    s.part
                    for s in self._parts_of(flow.name)
                    if s.once_per_flow and not s.part.idle_by_request
                ]
            for part in started:
                part.start()

    def _tasks_revoked(self, flow: FlowConfig, ids: set[int]) -> None:
        """Stop the tasks taken from this node, each flushed and its progress recorded,
        before returning (the group gives them to their next owner only then)."""
        with self._control:
            leaving = [
                s
                for s in self._parts_of(flow.name)
                if (isinstance(s.part, TaskPart) and s.part.slot.id in ids)
                or (s.once_per_flow and 0 in ids)
            ]
            if 0 in ids:
                self._leading.discard(flow.name)
            self.parts = [
                s for s in self.parts if not (isinstance(s.part, TaskPart) and s in leaving)
            ]
            _stop_all([s.part for s in leaving])
        if not self._stopping.is_set():
            SPARES.refill()  # the tasks are another node's now: they may come back

    def _may_be_given_tasks(self) -> bool:
        """Whether a task could move to this node: some copying flow has tasks that it does
        not run (a node that runs them all keeps no spare task process)."""
        running = Counter(
            s.part.flow.name for s in list(self.parts) if isinstance(s.part, TaskPart)
        )
        return any(
            running[f.name] < f.settings.tasks_max for f in self.flows if f.name in self.stats
        )

    def _standby(self, sup: Supervised) -> bool:
        """A once-per-flow part whose flow's task 0 runs on another node."""
        return sup.once_per_flow and sup.part.flow.name not in self._leading

    def _supervise(self) -> None:
        now = time.monotonic()
        for sup in self.parts:
            part = sup.part
            if part.running or part.idle_by_request or self._standby(sup):
                continue
            outages = self.reachability.outages(part.clusters())
            if sup.restart_at is None:
                sup.failures += 1
                sup.last_error = str(part.error) if part.error else "stopped"
                sup.failed_in_outage = bool(outages)
                delay = min(2.0 ** (sup.failures - 1), MAX_BACKOFF)
                sup.restart_at = now + delay
                log.warning(
                    "flow %s: %s part stopped (%s)%s; restarting in %.0fs",
                    part.flow.name,
                    part.name,
                    sup.last_error,
                    "".join(f", {o.describe()} unreachable" for o in outages),
                    delay,
                )
            elif now >= sup.restart_at or (sup.failed_in_outage and not outages):
                sup.restart_at = None
                sup.failed_in_outage = False
                part.start()

    # -- control and status, for the REST API (called on its threads) ---------------

    def flow_names(self) -> list[str]:
        """Every flow with a part here, replicating ones first, in config order."""
        names: list[str] = []
        for sup in self.parts:
            if sup.part.flow.name not in names:
                names.append(sup.part.flow.name)
        return names

    def _parts_of(self, name: str) -> list[Supervised]:
        return [sup for sup in self.parts if sup.part.flow.name == name]

    def pause_flow(self, name: str) -> None:
        """Pause every part of the flow: no records are read until `resume_flow`."""
        with self._control:
            self._paused.add(name)
            for sup in self._parts_of(name):
                sup.part.pause()
        log.info("flow %s: paused by request", name, extra={"flow": name})

    def resume_flow(self, name: str) -> None:
        with self._control:
            self._paused.discard(name)
            for sup in self._parts_of(name):
                if not self._standby(sup):
                    sup.part.resume()
                else:
                    sup.part.paused = False
        log.info("flow %s: resumed by request", name, extra={"flow": name})

    def restart_flow(self, name: str) -> None:
        """Stop every part of the flow (in parallel), then start them again."""
        with self._control:
            parts = [s for s in self._parts_of(name) if not self._standby(s)]
            restarters = [
                threading.Thread(target=sup.part.restart, args=(STOP_TIMEOUT,)) for sup in parts
            ]
            for t in restarters:
                t.start()
            for t in restarters:
                t.join()
            for sup in parts:
                sup.restart_at = None
                sup.last_error = None
        log.info("flow %s: restarted by request", name, extra={"flow": name})

    def flow_status(self, name: str) -> FlowStatus:
        """States of the flow's parts; its topics with lag and recent latency."""
        parts: list[PartStatus] = []
        flow = None
        for sup in self._parts_of(name):
            flow = sup.part.flow
            parts.append(self._part_status(sup))
        if flow is None:
            raise KeyError(name)
        replicating = name in self.stats
        topics = self._topic_status(name) if replicating else []
        # Lag measured before a cluster stopped answering is no longer known.
        lag_unknown = bool(self.reachability.outages((flow.source, flow.target)))
        if lag_unknown:
            topics = [t.model_copy(update={"lag_records": None}) for t in topics]
        return FlowStatus(
            name=name,
            source=flow.source,
            target=flow.target,
            replicating=replicating,
            delivery="exactly-once" if flow.settings.exactly_once != "off" else "at-least-once",
            copier=flow.settings.copier,
            copier_reason=flow.settings.copier_reason,
            state=flow_state(parts),
            parts=parts,
            topics=topics,
            lag_records=None if lag_unknown else sum(t.lag_records or 0 for t in topics),
        )

    def health(self) -> Health:
        return health(self.flow_status(name) for name in self.flow_names())

    def flow_parts(self, name: str) -> list[Part]:
        return [sup.part for sup in list(self.parts) if sup.part.flow.name == name]

    def flow_cluster(self, name: str) -> FlowCluster | None:
        """One flow's cluster (None: no member here, or its group cannot be described)."""
        for member in self._member_parts():
            if member.flow.name == name:
                try:
                    return survey(member, functools.partial(self.flow_status, name))
                except SurveyError:
                    return None
        return None

    def cluster_status(self) -> list[FlowCluster]:
        """Every flow's cluster as its group and its nodes describe it (nodes asked in
        parallel; a flow whose group cannot be described says why)."""
        out: list[FlowCluster] = []
        for member in self._member_parts():
            try:
                out.append(survey(member, functools.partial(self.flow_status, member.flow.name)))
            except SurveyError as exc:
                out.append(
                    FlowCluster(
                        flow=member.flow.name,
                        group=member.group,
                        protocol=member.protocol,
                        tasks_max=member.tasks,
                        members=[],
                        tasks=[],
                        once_per_flow_node=None,
                        error=str(exc),
                    )
                )
        return out

    def _part_status(self, sup: Supervised) -> PartStatus:
        part = sup.part
        if isinstance(part, TaskPart):
            status = self._part_state(sup, part.failed_partitions())
            partitions = [f"{topic}-{p}" for topic, p in part.partitions()]
            return status.model_copy(
                update={"task": part.slot.id, "pid": part.pid, "partitions": partitions}
            )
        if self._standby(sup):
            return PartStatus(part=part.name, state="STANDBY", restarts=sup.failures)
        status = self._part_state(sup, {})
        if isinstance(part, MemberPart) and status.state == "RUNNING" and not part.joined:
            return status.model_copy(update={"state": "JOINING"})
        return status

    def _part_state(self, sup: Supervised, failed: dict[str, str]) -> PartStatus:
        part = sup.part
        if part.paused and (part.running or part.idle_by_request):
            return PartStatus(part=part.name, state="PAUSED", restarts=sup.failures)
        outages = self.reachability.outages(part.clusters())
        if outages:
            return PartStatus(
                part=part.name,
                state="UNREACHABLE",
                restarts=sup.failures,
                trace=None if part.running else (part.error_trace or sup.last_error),
                failed_partitions=failed,
                unreachable=[o.describe() for o in outages],
            )
        if part.running:
            return PartStatus(
                part=part.name, state="RUNNING", restarts=sup.failures, failed_partitions=failed
            )
        trace = part.error_trace or sup.last_error or "stopped"
        return PartStatus(part=part.name, state="FAILED", restarts=sup.failures, trace=trace)

    def _topic_status(self, name: str) -> list[TopicStatus]:
        by_topic: dict[str, list[tuple[int, int]]] = defaultdict(list)
        flow_stats = self.stats[name]
        partitions = list(flow_stats.partitions.items())
        for (topic, _partition), stats in partitions:
            by_topic[topic].append((stats.records, stats.lag))
        latency = self._latency[name].quantiles(_latency_counts(flow_stats))
        skipped: dict[str, int] = defaultdict(int)
        for (topic, _partition), stats in partitions:
            skipped[topic] += stats.skipped
        out = []
        for topic, rows in sorted(by_topic.items()):
            p50, p99 = latency.get(topic, [None, None])
            out.append(
                TopicStatus(
                    topic=topic,
                    partitions=len(rows),
                    records=sum(r for r, _lag in rows),
                    lag_records=sum(lag for _r, lag in rows),
                    latency_p50_seconds=p50,
                    latency_p99_seconds=p99,
                    skipped_records=skipped[topic],
                )
            )
        return out

    def _record_latency(self) -> None:
        now = time.monotonic()
        for name, stats in self.stats.items():
            window = self._latency[name]
            # Summing every partition's buckets is costly with thousands of partitions
            # (docs/benchmarks.md): only when the window keeps a snapshot (every 5 s),
            # not at every supervision.
            if window.due(now):
                window.record(now, _latency_counts(stats))

    def _stop_parts(self) -> None:
        # Members first: each gives its tasks up (flushed, progress recorded) and then
        # leaves its group, so the other nodes take the tasks over from that progress.
        # One deadline for both passes: a part the first pass waited for in vain (stuck
        # in a call to a cluster, up to admin.timeout.ms) is not waited for again.
        deadline = time.monotonic() + STOP_TIMEOUT
        _stop_all([s.part for s in self.parts if isinstance(s.part, MemberPart)], deadline)
        _stop_all([s.part for s in self.parts], deadline)
        SPARES.close()
        # A task process that did not end in time would hold the exit (multiprocessing
        # waits for its children): it has flushed what it could.
        for child in multiprocessing.active_children():
            log.warning("a task process (pid %s) did not stop in time; killing it", child.pid)
            child.kill()
        log.info("mm2py stopped")


def _stop_all(parts: Sequence[Part], deadline: float | None = None) -> None:
    """Stop `parts` in parallel, waiting for them until `deadline` (monotonic; by default
    STOP_TIMEOUT from now). A part still running then is left to end on its own: its
    thread, and the one waiting for it, do not hold the process's exit."""
    if deadline is None:
        deadline = time.monotonic() + STOP_TIMEOUT
    remaining = max(deadline - time.monotonic(), 0.1)
    stoppers = [
        threading.Thread(target=part.stop, args=(remaining,), daemon=True) for part in parts
    ]
    for t in stoppers:
        t.start()
    for t in stoppers:
        t.join(max(deadline - time.monotonic(), 0.1))


def build_reachability(
    config: MirrorConfig, parts: Sequence[Part], flows: Sequence[FlowConfig] = ()
) -> Reachability:
    """Reachability of every cluster a part or a replicating flow uses; a cluster's grace
    is the shortest of the `cluster.unreachable.grace.ms` of the flows that use it."""
    grace: dict[str, float] = {}
    uses = [(part.flow, part.clusters()) for part in parts]
    uses += [(flow, (flow.source, flow.target)) for flow in flows]
    for flow, aliases in uses:
        for alias in aliases:
            seconds = flow.settings.unreachable_grace
            grace[alias] = min(grace.get(alias, seconds), seconds)
    return Reachability({a: config.cluster(a).bootstrap_servers for a in grace}, grace)


def _latency_counts(flow_stats: NodeStats) -> dict[str, list[int]]:
    """Replication latency bucket counts of each remote topic, summed over partitions."""
    out: dict[str, list[int]] = {}
    for (topic, _partition), stats in list(flow_stats.partitions.items()):
        total = out.setdefault(topic, [0] * len(stats.latency.counts))
        for i, count in enumerate(stats.latency.counts):
            total[i] += count
    return out
