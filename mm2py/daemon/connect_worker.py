"""Kafka Connect's view of the daemon's flows: each flow A->B as MM2's connectors and tasks.

A flow shows as the connectors Strimzi names `A->B.MirrorSourceConnector` (copying, with
config and ACL sync), `A->B.MirrorCheckpointConnector` (where checkpoints are emitted) and
`A->B.MirrorHeartbeatConnector` (where heartbeats are emitted): only those the flow runs.
Connect's entities (ServerInfo, ConnectorStateInfo, ConnectorInfo, ...) are the pydantic
models here; the mapping from flows to them is pure, and `LocalWorker` reads the daemon
through `FlowControl` only.

Invariant: `LocalWorker.tasks` is the one place that says which tasks a connector has, on
which worker, copying which partitions, in which state (this node's from its parts, other
nodes' from the cluster's view). Secrets show as "[hidden]", as Kafka's Password does.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Final, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from mm2py.config import ClusterConfig, FlowConfig, MirrorConfig
from mm2py.config.models import WORKER_KEYS, is_secret_key
from mm2py.config.rules import FlowRules
from mm2py.daemon.control import FlowControl
from mm2py.kafka import clients
from mm2py.kafka.internal_topics import load_checkpoints
from mm2py.replication.progress import read_recorded
from mm2py.runtime.status import FlowStatus, PartStatus, resolve_flow

log = logging.getLogger(__name__)

MIRROR_PACKAGE: Final = "org.apache.kafka.connect.mirror."
SOURCE: Final = "MirrorSourceConnector"
CHECKPOINT: Final = "MirrorCheckpointConnector"
HEARTBEAT: Final = "MirrorHeartbeatConnector"
KINDS: Final = (SOURCE, CHECKPOINT, HEARTBEAT)
TASK_CLASSES: Final = {
    SOURCE: "MirrorSourceTask",
    CHECKPOINT: "MirrorCheckpointTask",
    HEARTBEAT: "MirrorHeartbeatTask",
}
# The parts of a flow (mm2py.parts) and the connector whose work each one does:
# MM2's MirrorSourceConnector itself syncs topic configs and ACLs, its tasks copy.
KIND_OF_PART: Final = {
    "source": SOURCE,
    "sync": SOURCE,
    "checkpoint": CHECKPOINT,
    "heartbeat": HEARTBEAT,
}
TASK_PART: Final = {SOURCE: "source", CHECKPOINT: "checkpoint", HEARTBEAT: "heartbeat"}
HIDDEN: Final = "[hidden]"  # what Kafka's Password.toString() shows
OFFSETS_READ_TIMEOUT = 10.0
CLUSTER_ID_TIMEOUT = 2.0
CLUSTER_ID_RETRY = 30.0

T = TypeVar("T")
ConnectState = Literal["UNASSIGNED", "RUNNING", "PAUSED", "FAILED", "RESTARTING", "STOPPED"]


# -- response models (Connect's entities: ServerInfo, ConnectorStateInfo, ConnectorInfo,
# TaskInfo, PluginInfo, ConnectorOffsets, ErrorMessage) ------------------------------


class ServerInfo(BaseModel):
    """GET / (Connect's ServerInfo, with mm2py's name)."""

    name: str = "mm2py"
    version: str = Field(description="mm2py's version")
    commit: str = Field(description="the git commit mm2py runs from, or `unknown`")
    kafka_cluster_id: str | None = Field(
        description="the cluster ID of the first flow's target cluster (a Connect worker's "
        "own cluster); null while that cluster does not answer"
    )


class InstanceState(BaseModel):
    """The state of a connector instance on its worker."""

    state: ConnectState
    worker_id: str = Field(description="host:port of the worker's REST listener")
    version: str | None = Field(description="the connector's version (mm2py's)")
    trace: str | None = Field(default=None, description="the failure, only while FAILED")


class TaskState(BaseModel):
    """The state of a task on its worker."""

    id: int
    state: ConnectState
    worker_id: str
    version: str | None
    trace: str | None = None


class ConnectorStatus(BaseModel):
    name: str
    connector: InstanceState
    tasks: list[TaskState]
    type: Literal["source"] = "source"


class TaskId(BaseModel):
    connector: str
    task: int


class ConnectorInfo(BaseModel):
    name: str
    config: dict[str, str]
    tasks: list[TaskId]
    type: Literal["source"] = "source"


class TaskInfo(BaseModel):
    id: TaskId
    config: dict[str, str]


class ConnectorExpansion(BaseModel):
    """One connector of GET /connectors?expand=...: what was asked for."""

    status: ConnectorStatus | None = None
    info: ConnectorInfo | None = None


class PluginInfo(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    class_: str = Field(alias="class")
    type: Literal["source"] = "source"
    version: str


class ConnectorOffset(BaseModel):
    partition: dict[str, str | int]
    offset: dict[str, int]


class ConnectorOffsets(BaseModel):
    offsets: list[ConnectorOffset]


# -- the connectors of the daemon's flows (pure) ----------------------------------------


@dataclass(frozen=True)
class Connector:
    """One of a flow's MM2 connectors."""

    flow: FlowConfig
    kind: str  # SOURCE, CHECKPOINT or HEARTBEAT

    @property
    def name(self) -> str:
        return f"{self.flow.name}.{self.kind}"


@dataclass(frozen=True)
class Task:
    """One task of a connector, as the worker that runs it reports it."""

    id: int
    worker_id: str
    state: ConnectState
    trace: str | None = None
    # Source tasks: the source topic partitions copied, as `topic-partition`.
    partitions: tuple[str, ...] = ()
    # Checkpoint tasks: the consumer groups checkpointed.
    groups: tuple[str, ...] = ()


def kinds_run(status: FlowStatus) -> list[str]:
    """The connectors a flow runs, in Connect's order: source, checkpoint, heartbeat."""
    present = {KIND_OF_PART[p.part] for p in status.parts if p.part in KIND_OF_PART}
    return [kind for kind in KINDS if kind in present]


def split_name(name: str) -> tuple[str, str] | None:
    """`A->B.MirrorSourceConnector` -> ("A->B", "MirrorSourceConnector")."""
    flow, dot, kind = name.rpartition(".")
    return (flow, kind) if dot and kind in KINDS else None


def task_state(part: PartStatus) -> tuple[ConnectState, str | None]:
    """A part of a flow as the state of a Connect task, with the trace when FAILED.

    A task Connect runs keeps RUNNING while a cluster does not answer (its clients
    retry); it has FAILED when a record could not be written (a partition mm2py stopped).
    """
    if part.state == "FAILED":
        return "FAILED", part.trace or "failed"
    if part.state == "PAUSED":
        return "PAUSED", None
    if part.state == "UNREACHABLE" and part.trace:
        return "FAILED", part.trace + "\n" + "; ".join(part.unreachable)
    if part.failed_partitions:
        stopped = "\n".join(f"{tp}: {why}" for tp, why in sorted(part.failed_partitions.items()))
        return "FAILED", f"partitions stopped by a record the target rejected:\n{stopped}"
    if part.state in ("RUNNING", "UNREACHABLE"):
        return "RUNNING", None
    return "UNASSIGNED", None


def _cluster_task_state(state: str) -> ConnectState:
    """A task's state in the cluster's view as Connect names it (another node's task
    that no node runs now, or whose node does not answer: UNASSIGNED)."""
    if state in ("RUNNING", "PAUSED", "FAILED"):
        return state  # type: ignore[return-value]
    return "RUNNING" if state == "UNREACHABLE" else "UNASSIGNED"


def connector_state(
    kind: str, status: FlowStatus, tasks: Sequence[Task]
) -> tuple[ConnectState, str | None]:
    """The connector instance's own state: the config/ACL sync's for the source connector
    (what MM2's connector does itself), else that of its tasks when all are paused."""
    if kind == SOURCE:
        for part in status.parts:
            if part.part == "sync":
                state, trace = task_state(part)
                if state in ("FAILED", "PAUSED"):
                    return state, trace
    if tasks and all(t.state == "PAUSED" for t in tasks):
        return "PAUSED", None
    return "RUNNING", None


def _setting_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value)
    return str(value)


def _client_settings(cluster: ClusterConfig) -> tuple[dict[str, str], dict[str, str]]:
    """A cluster's settings as MM2 passes them to a connector: (common, per role `consumer.x`)."""
    common: dict[str, str] = {}
    for name, field in type(cluster).model_fields.items():
        value = getattr(cluster, name)
        if field.alias and value is not None:
            common[field.alias] = _shown(field.alias, value)
    common.update({k: _shown(k, v) for k, v in cluster.properties.items()})
    roles: dict[str, str] = {}
    for role in ("consumer", "producer", "admin"):
        props: Mapping[str, str | SecretStr] = getattr(cluster, role)
        roles.update({f"{role}.{k}": _shown(k, v) for k, v in props.items()})
    return common, roles


def _shown(key: str, value: object) -> str:
    if isinstance(value, SecretStr) or is_secret_key(key):
        return HIDDEN
    return str(value)


def connector_config(config: MirrorConfig, connector: Connector) -> dict[str, str]:
    """The connector's config as MM2's dedicated mode builds it (connectorBaseConfig): the
    flow's settings that were set, each cluster's client settings under `source.cluster.`/
    `target.cluster.` (per role under `source.`/`target.`), secrets as "[hidden]".

    The client settings are librdkafka's names, as mm2py holds them.
    """
    flow = connector.flow
    out: dict[str, str] = {}
    settings = flow.settings
    for name in sorted(settings.model_fields_set):
        alias = type(settings).model_fields[name].alias or name
        if alias in WORKER_KEYS:
            continue  # MM2 gives them to the worker, not to its connectors
        value: object = getattr(settings, name)
        if alias == "replication.policy.class":
            value = MIRROR_PACKAGE + str(value)
        out[alias] = _setting_text(value)
    for side, alias in (("source", flow.source), ("target", flow.target)):
        common, roles = _client_settings(config.cluster(alias))
        out.update({f"{side}.cluster.{k}": v for k, v in common.items()})
        out.update({f"{side}.{k}": v for k, v in roles.items()})
    out["name"] = connector.name
    out["connector.class"] = MIRROR_PACKAGE + connector.kind
    out["source.cluster.alias"] = flow.source
    out["target.cluster.alias"] = flow.target
    out["enabled"] = _setting_text(flow.enabled)
    return out


def task_config(config: MirrorConfig, connector: Connector, task: Task) -> dict[str, str]:
    """A task's config as MM2's taskConfigs give it: its connector's and its class; source
    and checkpoint tasks their index and the partitions or groups they work on."""
    out = connector_config(config, connector)
    out["task.class"] = MIRROR_PACKAGE + TASK_CLASSES[connector.kind]
    if connector.kind == SOURCE:
        out["task.index"] = str(task.id)
        out["task.assigned.partitions"] = ",".join(task.partitions)
    elif connector.kind == CHECKPOINT:
        out["task.index"] = str(task.id)
        out["task.assigned.groups"] = ",".join(task.groups)
    return out


def worker_id(listen: str) -> str:
    """host:port of a REST listener, as Connect names its workers (a wildcard host: this
    machine's name)."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# -- what the API reads from the daemon --------------------------------------------------


class LocalWorker:
    """The daemon as a Connect worker: its connectors, their tasks, offsets and states."""

    def __init__(self, control: FlowControl) -> None:
        self.control = control
        self.config: MirrorConfig = control.config
        self.config_file = str(control.config.path)
        self.worker_id = worker_id(control.listen)
        self._cluster_id: str | None = None
        self._cluster_id_next = 0.0  # monotonic time of the next try
        self._cluster_id_lock = threading.Lock()

    # -- connectors --------------------------------------------------------------------

    def flow(self, name: str) -> FlowConfig:
        return next(f for f in self.config.flows if f.name == name)

    def connectors(self) -> list[tuple[Connector, FlowStatus]]:
        """Every connector of every flow the daemon runs, with its flow's status."""
        out: list[tuple[Connector, FlowStatus]] = []
        for name in self.control.flow_names():
            status = self.control.flow_status(name)
            flow = self.flow(name)
            out.extend((Connector(flow, kind), status) for kind in kinds_run(status))
        return out

    def find(self, name: str) -> tuple[Connector, FlowStatus] | None:
        """The connector `name` names (`A->B.Kind`, or `A-B.Kind` for one flow A->B)."""
        split = split_name(name)
        if split is None:
            return None
        flow = resolve_flow(split[0], self.control.flow_names())
        if flow is None:
            return None
        status = self.control.flow_status(flow)
        if split[1] not in kinds_run(status):
            return None
        return Connector(self.flow(flow), split[1]), status

    # -- THE SEAM: which tasks a connector has, where, copying what, in which state ------

    def tasks(self, connector: Connector, status: FlowStatus) -> list[Task]:
        """The connector's tasks, wherever they run.

        This node's tasks come from its own parts (with their traces); the source
        connector's tasks on other nodes of the flow's mm2py cluster come from the
        cluster's view (mm2py.cluster.view: the group's assignment and each node's own
        report), each with that node as its worker. A checkpoint or heartbeat task runs
        on the node that owns task 0; elsewhere its part stands by and is not listed.
        """
        local = self._local_tasks(connector, status)
        standby = any(p.state == "STANDBY" for p in status.parts)
        if connector.kind != SOURCE and not standby:
            return local
        cluster = self.control.flow_cluster(connector.flow.name)
        if cluster is None or cluster.error is not None:
            return local
        if connector.kind != SOURCE:  # it runs on task 0's node, as that node is
            owner = cluster.once_per_flow_node
            health = {m.node: m.health for m in cluster.members}.get(owner or "")
            state: ConnectState = "RUNNING" if health == "READY" else "UNASSIGNED"
            return [replace(t, worker_id=owner or t.worker_id, state=state) for t in local]
        mine = {t.id: t for t in local}
        out = []
        for task in cluster.tasks:
            if task.task in mine and task.node in (None, self.worker_id):
                out.append(mine[task.task])
                continue
            out.append(
                Task(
                    id=task.task,
                    worker_id=task.node or self.worker_id,
                    state=_cluster_task_state(task.state),
                    partitions=self._source_partitions(connector.flow, task.partitions),
                )
            )
        return out

    def _local_tasks(self, connector: Connector, status: FlowStatus) -> list[Task]:
        """The connector's tasks that run on this node, from its parts."""
        part_name = TASK_PART[connector.kind]
        parts = [p for p in status.parts if p.part == part_name]
        out = []
        for index, part in enumerate(parts):
            state, trace = task_state(part)
            # PartStatus.task and .partitions (remote topic partitions) come with tasks.
            task_id, remote = part.task, part.partitions
            partitions: tuple[str, ...] = ()
            groups: tuple[str, ...] = ()
            if connector.kind == SOURCE:
                partitions = self._source_partitions(connector.flow, remote)
            elif connector.kind == CHECKPOINT:
                groups = self._checkpointed_groups(connector.flow)
            out.append(
                Task(
                    id=task_id if isinstance(task_id, int) else index,
                    worker_id=self.worker_id,
                    state=state,
                    trace=trace,
                    partitions=partitions,
                    groups=groups,
                )
            )
        return out

    def _parts(self, flow: FlowConfig, kind: type[T]) -> list[T]:
        """The parts of `flow` of a class that run on this node."""
        return [p for p in self.control.flow_parts(flow.name) if isinstance(p, kind)]

    def _checkpointed_groups(self, flow: FlowConfig) -> tuple[str, ...]:
        from mm2py.parts.checkpoint import CheckpointPart

        return tuple(sorted({g for part in self._parts(flow, CheckpointPart) for g in part.groups}))

    def _source_partitions(self, flow: FlowConfig, remote: object) -> tuple[str, ...]:
        """The source partitions a source task copies, from the remote ones it reports
        (or, before tasks report them, the flow's source part's statistics)."""
        pairs: list[tuple[str, int]] = []
        if isinstance(remote, list) and remote:
            for text in remote:
                topic, _, partition = str(text).rpartition("-")
                pairs.append((topic, int(partition)))
        else:
            from mm2py.parts.source import SourcePart

            for part in self._parts(flow, SourcePart):
                pairs.extend(list(part.stats.partitions))
        policy = FlowRules(flow).policy
        named = {(policy.upstream_topic(topic) or topic, p) for topic, p in pairs}
        return tuple(f"{topic}-{p}" for topic, p in sorted(named))

    # -- offsets, read from Kafka as Connect reads its offsets topic --------------------

    def offsets(self, connector: Connector) -> list[ConnectorOffset]:
        """KIP-875's offsets: the flow's progress (source), the partitions of its
        checkpoints (checkpoint, offset 0 as MM2 records), the heartbeat pair (heartbeat)."""
        flow = connector.flow
        if connector.kind == HEARTBEAT:
            pair: dict[str, str | int] = {
                "sourceClusterAlias": flow.source,
                "targetClusterAlias": flow.target,
            }
            return [ConnectorOffset(partition=pair, offset={"offset": 0})]
        target = self.config.cluster(flow.target).librdkafka("consumer")
        if connector.kind == CHECKPOINT:
            topic = FlowRules(flow).policy.checkpoints_topic(flow.source)
            found = load_checkpoints(target, flow.target, topic, timeout=OFFSETS_READ_TIMEOUT)
            return [
                ConnectorOffset(
                    partition={"group": group, "topic": remote, "partition": partition},
                    offset={"offset": 0},
                )
                for group, remote, partition in sorted(found or {})
            ]
        progress = read_progress(target, flow, OFFSETS_READ_TIMEOUT)
        return [
            ConnectorOffset(
                partition={"cluster": flow.source, "partition": partition, "topic": topic},
                offset={"offset": offset},
            )
            for (topic, partition), offset in sorted(progress.items())
        ]

    def kafka_cluster_id(self) -> str | None:
        """The cluster ID of the first flow's target: asked until it answers, at most
        once every CLUSTER_ID_RETRY seconds (GET / answers null meanwhile, at once)."""
        with self._cluster_id_lock:
            now = time.monotonic()
            if self._cluster_id is None and now >= self._cluster_id_next:
                self._cluster_id_next = now + CLUSTER_ID_RETRY
                names = self.control.flow_names()
                if names:
                    target = self.config.cluster(self.flow(names[0]).target)
                    self._cluster_id = ask_cluster_id(target)
            return self._cluster_id


def read_progress(
    target_props: Mapping[str, str], flow: FlowConfig, timeout: float
) -> dict[tuple[str, int], int]:
    """The last copied offset of each source partition of `flow`, read from its progress
    topic (mm2py.replication.progress) on the target; empty when there is none yet."""
    return read_recorded(target_props, flow.target, flow.source, flow.offsets_topic, timeout)


def ask_cluster_id(cluster: ClusterConfig) -> str | None:
    """The cluster's ID, or None when it does not answer in time."""
    admin = clients.admin_client(cluster.librdkafka("admin"), {"log_level": 0})
    try:
        described = clients.cluster_metadata(admin, CLUSTER_ID_TIMEOUT)
    except Exception as exc:  # asked again later; GET / answers null meanwhile
        log.debug("cluster %s: no cluster ID yet: %s", cluster.alias, clients.error_text(exc))
        return None
    cluster_id = getattr(described, "cluster_id", None)
    return str(cluster_id) if cluster_id else None
