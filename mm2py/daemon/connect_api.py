"""Kafka Connect's REST API over the daemon's flows, as a Connect worker running MM2 answers.

Mounted beside the /flows API on the same listener (`mount`). Each flow A->B shows as
the connectors Strimzi names `A->B.MirrorSourceConnector` (copying, with config and ACL
sync), `A->B.MirrorCheckpointConnector` (where checkpoints are emitted) and
`A->B.MirrorHeartbeatConnector` (where heartbeats are emitted): only those the flow runs.

    GET  /                                      version, commit, kafka_cluster_id
    GET  /connectors                            names; ?expand=status and/or ?expand=info
    GET  /connectors/{c}                        name, config, tasks, type
    GET  /connectors/{c}/config                 the flow's MM2 settings, secrets "[hidden]"
    GET  /connectors/{c}/status                 connector and task states, worker_id, trace
    GET  /connectors/{c}/tasks                  each task's config (task.assigned.partitions)
    GET  /connectors/{c}/tasks/{t}/status       one task's state
    GET  /connectors/{c}/offsets                KIP-875, read from the flow's progress in Kafka
    GET  /connector-plugins                     MM2's three connector classes
    PUT  /connectors/{c}/pause, /resume         202 (the flow as a whole: `pause_target`)
    POST /connectors/{c}/restart                204; 202 with the status given includeTasks or
                                                onlyFailed (Connect's RestartRequest)
    POST /connectors/{c}/tasks/{t}/restart      204

Writes mm2py cannot honour (its config file defines the connectors) answer 409, as
Connect answers a request that conflicts with the worker's state: creating,
reconfiguring, stopping or deleting a connector, altering its offsets (Connect: only
while STOPPED, which mm2py's connectors never are). Every error of the listener, /flows
and unknown paths included, is Connect's `{"error_code", "message"}`. A connector named
with `A-B` in place of `A->B` is found when that names one flow, as on /flows.

Where tasks come from: `LocalWorker.tasks`, the one place that says which tasks a
connector has, on which worker, copying which partitions, in which state. Today it reads
the daemon's own parts (one source task per flow, id 0, on this node); a cluster's task
view replaces that method alone.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at
# runtime, including the aliases local to `mount`.
import json
import logging
import re
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from http import HTTPStatus
from pathlib import Path as FilePath
from typing import Annotated, Any, Final, Literal, TypeVar

from fastapi import APIRouter, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import BaseRoute, Match

from mm2py import __version__
from mm2py.config import ClusterConfig, FlowConfig, MirrorConfig
from mm2py.config.models import WORKER_KEYS, is_secret_key
from mm2py.config.rules import FlowRules
from mm2py.daemon.control import FlowControl
from mm2py.kafka import clients
from mm2py.kafka.internal_topics import load_checkpoints
from mm2py.kafka.reader import ReaderError
from mm2py.replication.progress import read_recorded
from mm2py.runtime.status import FlowStatus, PartStatus, Problem, resolve_flow

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


class ConnectProblem(Exception):
    """An answer with Connect's error body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def java_boolean(text: str | None) -> bool:
    """Java's Boolean.valueOf, as Connect reads its query flags: "true" in any case, else false."""
    return text is not None and text.strip().lower() == "true"


def task_number(text: str) -> int | None:
    """A task id from the path (Java's Integer.valueOf), or None when it is not one."""
    if not re.fullmatch(r"[+-]?\d{1,10}", text):
        return None
    number = int(text)
    return number if -(2**31) <= number < 2**31 else None


def restart_plan(
    connector_state: ConnectState, tasks: Sequence[Task], include_tasks: bool, only_failed: bool
) -> bool:
    """Whether a restart request (Connect's RestartRequest) restarts anything."""
    if not only_failed:
        return True
    if connector_state == "FAILED":
        return True
    return include_tasks and any(t.state == "FAILED" for t in tasks)


@lru_cache(maxsize=1)
def commit_id() -> str:
    """The git commit of the checkout mm2py runs from (16 hex digits, as Connect shows
    its own), else "unknown" (an installed package)."""
    git = FilePath(__file__).resolve().parents[2] / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[5:]
            path = git / ref
            if path.exists():
                head = path.read_text().strip()
            else:
                packed = (git / "packed-refs").read_text().splitlines()
                head = next(line.split()[0] for line in packed if line.endswith(" " + ref))
    except (OSError, StopIteration):
        return "unknown"
    return head[:16] if re.fullmatch(r"[0-9a-f]{40,64}", head) else "unknown"


# -- what the API reads from the daemon --------------------------------------------------


class LocalWorker:
    """The daemon as a Connect worker: its connectors, their tasks, offsets and states."""

    def __init__(self, control: "FlowControl") -> None:
        self.control = control
        self.config: MirrorConfig = control.config
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


# -- the endpoints ------------------------------------------------------------------------

_ERROR = {"model": Problem}
_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {**_ERROR, "description": "no such connector"}}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {**_ERROR, "description": "mm2py's connectors come from its config file"}
}
_JSON_OBJECT = {
    "requestBody": {
        "content": {"application/json": {"schema": {"type": "object"}}},
        "required": False,
    }
}


def _status_line(code: int) -> str:
    """Jersey's words for an error status, as Connect answers them: `HTTP 404 Not Found`."""
    phrase = _phrase(code)
    return f"HTTP {code} {phrase}" if phrase else f"HTTP {code}"


def mount(app: FastAPI, control: "FlowControl") -> None:
    """Add Connect's endpoints to `app` and make every error answer Connect's error body."""
    worker = LocalWorker(control)
    config_file = str(control.config.path)
    known = [c.name for c, _s in worker.connectors()]
    ConnectorName = Annotated[
        str,
        Path(
            description="`A->B.MirrorSourceConnector` (percent-encoded: `A-%3EB.Mirror...`)",
            examples=known or ["A->B.MirrorSourceConnector"],
        ),
    ]
    TaskNumber = Annotated[str, Path(description="the task's id (0, 1, ...)", examples=["0"])]
    router = APIRouter(tags=["Kafka Connect"])

    @app.exception_handler(ConnectProblem)
    def connect_problem(_request: Request, exc: ConnectProblem) -> JSONResponse:
        return JSONResponse({"error_code": exc.status, "message": exc.message}, exc.status)

    @app.exception_handler(StarletteHTTPException)
    def http_problem(request: Request, exc: StarletteHTTPException) -> Response:
        # Unknown paths and methods, as Jersey words them for Connect.
        detail = exc.detail if exc.detail and exc.detail != _phrase(exc.status_code) else None
        body = {"error_code": exc.status_code, "message": detail or _status_line(exc.status_code)}
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            # Starlette names the methods of the first route of the path only.
            routes = [*request.app.routes, *router.routes]
            headers["Allow"] = ", ".join(allowed_methods(request, routes))
        return JSONResponse(body, exc.status_code, headers=headers)

    def connector_or_404(name: str, message: str) -> tuple[Connector, FlowStatus]:
        found = worker.find(name)
        if found is None:
            raise ConnectProblem(404, message.format(name=name))
        return found

    def status_of(connector: Connector, status: FlowStatus) -> ConnectorStatus:
        tasks = worker.tasks(connector, status)
        state, trace = connector_state(connector.kind, status, tasks)
        return ConnectorStatus(
            name=connector.name,
            connector=InstanceState(
                state=state, worker_id=worker.worker_id, version=__version__, trace=trace
            ),
            tasks=[
                TaskState(
                    id=t.id,
                    state=t.state,
                    worker_id=t.worker_id,
                    version=__version__,
                    trace=t.trace,
                )
                for t in tasks
            ],
        )

    def info_of(connector: Connector, status: FlowStatus) -> ConnectorInfo:
        return ConnectorInfo(
            name=connector.name,
            config=connector_config(worker.config, connector),
            tasks=[
                TaskId(connector=connector.name, task=t.id) for t in worker.tasks(connector, status)
            ],
        )

    @router.get("/", response_model=ServerInfo, summary="version, commit and Kafka cluster ID")
    def server_info() -> ServerInfo:
        return ServerInfo(
            version=__version__, commit=commit_id(), kafka_cluster_id=worker.kafka_cluster_id()
        )

    @router.get(
        "/connectors",
        response_model=list[str] | dict[str, ConnectorExpansion],
        response_model_exclude_none=True,
        summary="the connectors of the daemon's flows (names, or with ?expand= status/info)",
    )
    def list_connectors(
        expand: Annotated[list[str] | None, Query(description="status and/or info")] = None,
    ) -> list[str] | dict[str, ConnectorExpansion]:
        connectors = worker.connectors()
        if expand is None:
            return [c.name for c, _s in connectors]
        out = {}
        for connector, status in connectors:
            out[connector.name] = ConnectorExpansion(
                status=status_of(connector, status) if "status" in expand else None,
                info=info_of(connector, status) if "info" in expand else None,
            )
        return out

    @router.post(
        "/connectors",
        status_code=409,
        response_model=Problem,
        responses={400: {**_ERROR, "description": "the body is not JSON"}, **_CONFLICT},
        openapi_extra=_JSON_OBJECT,
        summary="refused (409): the config file defines the connectors",
    )
    async def create_connector(request: Request) -> Problem:
        body = await request.body()
        try:
            request_json = json.loads(body) if body.strip() else {}
        except ValueError:
            raise ConnectProblem(400, "the request body is not JSON") from None
        name = request_json.get("name") if isinstance(request_json, dict) else None
        if isinstance(name, str) and worker.find(name.strip()) is not None:
            raise ConnectProblem(409, f"Connector {name.strip()} already exists")
        raise ConnectProblem(
            409,
            f"mm2py runs the connectors of the flows in {config_file}; connectors cannot be "
            "created over REST: enable the flow there (A->B.enabled = true) and restart mm2py",
        )

    @router.get(
        "/connectors/{name}",
        response_model=ConnectorInfo,
        responses=_NOT_FOUND,
        summary="a connector's config and tasks",
    )
    def get_connector(name: ConnectorName) -> ConnectorInfo:
        return info_of(*connector_or_404(name, "Connector {name} not found"))

    @router.get(
        "/connectors/{name}/config",
        response_model=dict[str, str],
        responses=_NOT_FOUND,
        summary="the flow's settings as the connector's config (secrets [hidden])",
    )
    def get_config(name: ConnectorName) -> dict[str, str]:
        connector, _status = connector_or_404(name, "Connector {name} not found")
        return connector_config(worker.config, connector)

    def refuse_change(name: str, missing: str | None) -> None:
        if missing is not None and worker.find(name) is None:
            raise ConnectProblem(404, missing.format(name=name))
        raise ConnectProblem(
            409,
            f"the config of connector {name} comes from {config_file}; change it there "
            "and restart mm2py",
        )

    @router.put(
        "/connectors/{name}/config",
        status_code=409,
        response_model=Problem,
        responses=_CONFLICT,
        openapi_extra=_JSON_OBJECT,
        summary="refused (409): the config file defines the connectors",
    )
    def put_config(name: ConnectorName) -> None:
        refuse_change(name, None)

    @router.patch(
        "/connectors/{name}/config",
        status_code=409,
        response_model=Problem,
        responses={**_NOT_FOUND, **_CONFLICT},
        openapi_extra=_JSON_OBJECT,
        summary="refused (409): the config file defines the connectors",
    )
    def patch_config(name: ConnectorName) -> None:
        refuse_change(name, "Connector {name} not found")

    @router.delete(
        "/connectors/{name}",
        status_code=409,
        response_model=Problem,
        responses={**_NOT_FOUND, **_CONFLICT},
        summary="refused (409): the config file defines the connectors",
    )
    def delete_connector(name: ConnectorName) -> None:
        refuse_change(name, "Connector {name} not found")

    @router.put(
        "/connectors/{name}/stop",
        status_code=409,
        response_model=Problem,
        responses={**_NOT_FOUND, **_CONFLICT},
        summary="refused (409): mm2py's connectors run or are paused",
    )
    def stop_connector(name: ConnectorName) -> None:
        connector_or_404(name, "Unknown connector {name}")
        raise ConnectProblem(
            409,
            f"mm2py cannot stop connector {name}; pause it (PUT /connectors/{name}/pause) "
            f"or disable its flow in {config_file}",
        )

    @router.get(
        "/connectors/{name}/status",
        response_model=ConnectorStatus,
        response_model_exclude_none=True,
        responses=_NOT_FOUND,
        summary="the states of the connector and its tasks",
    )
    def get_status(name: ConnectorName) -> ConnectorStatus:
        return status_of(*connector_or_404(name, "No status found for connector {name}"))

    @router.get(
        "/connectors/{name}/tasks",
        response_model=list[TaskInfo],
        responses=_NOT_FOUND,
        summary="each task's config, with the partitions it copies",
    )
    def get_tasks(name: ConnectorName) -> list[TaskInfo]:
        connector, status = connector_or_404(name, "Connector {name} not found")
        return [
            TaskInfo(
                id=TaskId(connector=connector.name, task=t.id),
                config=task_config(worker.config, connector, t),
            )
            for t in worker.tasks(connector, status)
        ]

    def task_or_404(name: str, task: str, message: str) -> tuple[Connector, FlowStatus, Task]:
        number = task_number(task)
        if number is None:
            raise ConnectProblem(404, _status_line(404))  # Jersey: not an Integer
        connector, status = connector_or_404(name, "Unknown connector: {name}")
        for t in worker.tasks(connector, status):
            if t.id == number:
                return connector, status, t
        raise ConnectProblem(404, message.format(task=f"{connector.name}-{number}"))

    @router.get(
        "/connectors/{name}/tasks/{task}/status",
        response_model=TaskState,
        response_model_exclude_none=True,
        responses={404: {**_ERROR, "description": "no such connector or task"}},
        summary="one task's state",
    )
    def get_task_status(name: ConnectorName, task: TaskNumber) -> TaskState:
        _c, _s, found = task_or_404(name, task, "No status found for task {task}")
        return TaskState(
            id=found.id,
            state=found.state,
            worker_id=found.worker_id,
            version=__version__,
            trace=found.trace,
        )

    @router.get(
        "/connectors/{name}/offsets",
        response_model=ConnectorOffsets,
        responses={
            **_NOT_FOUND,
            503: {**_ERROR, "description": "the target cluster did not answer in time"},
        },
        summary="the connector's offsets (KIP-875), read from the flow's progress",
    )
    def get_offsets(name: ConnectorName) -> ConnectorOffsets:
        connector, _status = connector_or_404(name, "Connector {name} not found")
        try:
            return ConnectorOffsets(offsets=worker.offsets(connector))
        except ReaderError as exc:
            raise ConnectProblem(503, str(exc)) from None

    def refuse_offsets(name: str) -> None:
        connector, _status = connector_or_404(name, "Connector {name} not found")
        raise ConnectProblem(
            409,
            "Connectors must be in the STOPPED state before their offsets can be modified; "
            f"mm2py's connectors never are (the progress of {connector.flow.name} is in "
            f"{connector.flow.offsets_topic} on cluster {connector.flow.target})",
        )

    @router.patch(
        "/connectors/{name}/offsets",
        status_code=409,
        response_model=Problem,
        responses={**_NOT_FOUND, **_CONFLICT},
        openapi_extra=_JSON_OBJECT,
        summary="refused (409): offsets change only while a connector is STOPPED",
    )
    def patch_offsets(name: ConnectorName) -> None:
        refuse_offsets(name)

    @router.delete(
        "/connectors/{name}/offsets",
        status_code=409,
        response_model=Problem,
        responses={**_NOT_FOUND, **_CONFLICT},
        summary="refused (409): offsets change only while a connector is STOPPED",
    )
    def delete_offsets(name: ConnectorName) -> None:
        refuse_offsets(name)

    def pause_target(name: str) -> tuple[Connector, str]:
        """The flow a pause or resume of the connector applies to (409 when that would
        reach beyond the connector: its flow pauses as a whole)."""
        connector, status = connector_or_404(name, "Unknown connector {name}")
        if connector.kind != SOURCE and kinds_run(status) != [connector.kind]:
            source = f"{connector.flow.name}.{SOURCE}"
            raise ConnectProblem(
                409,
                f"mm2py pauses and resumes a flow as a whole: {source} pauses "
                f"{connector.flow.name} with its checkpoints and heartbeats",
            )
        return connector, connector.flow.name

    @router.put(
        "/connectors/{name}/pause",
        status_code=202,
        response_class=Response,
        responses={
            202: {"description": "paused"},
            **_NOT_FOUND,
            409: {**_ERROR, "description": "pause the flow's source connector instead"},
        },
        summary="pause the connector's flow (202)",
    )
    def pause(name: ConnectorName) -> Response:
        _connector, flow = pause_target(name)
        control.pause_flow(flow)
        return Response(status_code=202)

    @router.put(
        "/connectors/{name}/resume",
        status_code=202,
        response_class=Response,
        responses={
            202: {"description": "resumed"},
            **_NOT_FOUND,
            409: {**_ERROR, "description": "resume the flow's source connector instead"},
        },
        summary="resume the connector's flow (202)",
    )
    def resume(name: ConnectorName) -> Response:
        _connector, flow = pause_target(name)
        control.resume_flow(flow)
        return Response(status_code=202)

    @router.post(
        "/connectors/{name}/restart",
        status_code=204,
        response_model=None,
        responses={
            202: {"model": ConnectorStatus, "description": "with includeTasks or onlyFailed"},
            204: {"description": "restarted"},
            **_NOT_FOUND,
        },
        summary="restart the connector's flow (its parts stop and start from their progress)",
    )
    def restart(
        name: ConnectorName,
        include_tasks: Annotated[
            str, Query(alias="includeTasks", description="true restarts the tasks too")
        ] = "false",
        only_failed: Annotated[
            str, Query(alias="onlyFailed", description="true restarts only what FAILED")
        ] = "false",
    ) -> Response:
        connector, status = connector_or_404(name, "Unknown connector: {name}")
        with_tasks, failed_only = java_boolean(include_tasks), java_boolean(only_failed)
        if not with_tasks and not failed_only:
            control.restart_flow(connector.flow.name)
            return Response(status_code=204)
        tasks = worker.tasks(connector, status)
        state, _trace = connector_state(connector.kind, status, tasks)
        if restart_plan(state, tasks, with_tasks, failed_only):
            control.restart_flow(connector.flow.name)
        after = status_of(connector, control.flow_status(connector.flow.name))
        body = after.model_dump(exclude_none=True)
        return JSONResponse(body, status_code=202)

    @router.post(
        "/connectors/{name}/tasks/{task}/restart",
        status_code=204,
        response_class=Response,
        responses={
            204: {"description": "restarted"},
            404: {**_ERROR, "description": "no such connector or task"},
        },
        summary="restart a task (its flow's parts stop and start from their progress)",
    )
    def restart_task(name: ConnectorName, task: TaskNumber) -> Response:
        connector, _status, _task = task_or_404(name, task, "Unknown task: {task}")
        control.restart_flow(connector.flow.name)
        return Response(status_code=204)

    @router.get(
        "/connector-plugins",
        response_model=list[PluginInfo],
        summary="the connector classes mm2py answers for (MM2's three)",
    )
    def connector_plugins(
        connectors_only: Annotated[
            str, Query(alias="connectorsOnly", description="mm2py has only connectors")
        ] = "true",
    ) -> list[PluginInfo]:
        return [
            PluginInfo.model_validate({"class": MIRROR_PACKAGE + kind, "version": __version__})
            for kind in sorted(KINDS)
        ]

    app.include_router(router)


def allowed_methods(request: Request, routes: Sequence[BaseRoute]) -> list[str]:
    """Every method one of `routes` serves on the request's path (an included router's
    own routes must be among them: FastAPI wraps them in one route of its own)."""
    methods: set[str] = set()
    scope = {**request.scope, "method": "GET"}
    for route in routes:
        route_methods = getattr(route, "methods", None)
        if route_methods and route.matches(scope)[0] != Match.NONE:
            methods.update(route_methods)
    return sorted(methods)


def _phrase(code: int) -> str:
    try:
        return HTTPStatus(code).phrase
    except ValueError:
        return ""
