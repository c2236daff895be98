"""Kafka Connect's REST API over the daemon's flows, as a Connect worker running MM2 answers.

Routes (`router`): GET /, /connectors (?expand=status|info), /connectors/{c}, its
/config, /status, /tasks, /tasks/{t}/status and /offsets (KIP-875, from the flow's
progress), /connector-plugins; PUT /connectors/{c}/pause|resume (202); POST
/connectors/{c}/restart (204, or 202 with a status) and /tasks/{t}/restart (204).

Invariants:
- writes mm2py cannot honour (its config file defines the connectors) answer 409, as
  Connect answers a request that conflicts with the worker's state;
- pause and resume act on the flow as a whole (`pause_target`);
- errors are `Problem`s (mm2py.daemon.problems); `A-B` names `A->B` when that is one flow;
- the endpoints read the daemon through the app's `LocalWorker` (connect_worker) alone.
Design: docs/design/rest-api.md.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations.
import json
import re
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path as FilePath
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import JSONResponse, Response

from mm2py import __version__
from mm2py.daemon.connect_worker import (
    KINDS,
    MIRROR_PACKAGE,
    SOURCE,
    Connector,
    ConnectorExpansion,
    ConnectorInfo,
    ConnectorOffsets,
    ConnectorStatus,
    ConnectState,
    InstanceState,
    LocalWorker,
    PluginInfo,
    ServerInfo,
    Task,
    TaskId,
    TaskInfo,
    TaskState,
    connector_config,
    connector_state,
    kinds_run,
    task_config,
)
from mm2py.daemon.problems import ERROR, ApiProblem, status_line
from mm2py.kafka.reader import ReaderError
from mm2py.runtime.status import FlowStatus, Problem

router = APIRouter(tags=["Kafka Connect"])


async def connect_worker(request: Request) -> LocalWorker:
    """The daemon as a Connect worker, for the app that serves `request` (a dependency)."""
    worker: LocalWorker = request.app.state.connect_worker
    return worker


Worker = Annotated[LocalWorker, Depends(connect_worker)]
# The examples of the OpenAPI document are the daemon's connectors (mm2py.daemon.api).
ConnectorName = Annotated[
    str,
    Path(
        description="`A->B.MirrorSourceConnector` (percent-encoded: `A-%3EB.Mirror...`)",
        examples=["A->B.MirrorSourceConnector"],
    ),
]
TaskNumber = Annotated[str, Path(description="the task's id (0, 1, ...)", examples=["0"])]


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


_NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {**ERROR, "description": "no such connector"}}
_CONFLICT: dict[int | str, dict[str, Any]] = {
    409: {**ERROR, "description": "mm2py's connectors come from its config file"}
}
_JSON_OBJECT = {
    "requestBody": {
        "content": {"application/json": {"schema": {"type": "object"}}},
        "required": False,
    }
}


def connector_or_404(worker: LocalWorker, name: str, message: str) -> tuple[Connector, FlowStatus]:
    found = worker.find(name)
    if found is None:
        raise ApiProblem(404, message.format(name=name))
    return found


def status_of(worker: LocalWorker, connector: Connector, status: FlowStatus) -> ConnectorStatus:
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


def info_of(worker: LocalWorker, connector: Connector, status: FlowStatus) -> ConnectorInfo:
    return ConnectorInfo(
        name=connector.name,
        config=connector_config(worker.config, connector),
        tasks=[
            TaskId(connector=connector.name, task=t.id) for t in worker.tasks(connector, status)
        ],
    )


@router.get("/", response_model=ServerInfo, summary="version, commit and Kafka cluster ID")
def server_info(worker: Worker) -> ServerInfo:
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
    worker: Worker,
    expand: Annotated[list[str] | None, Query(description="status and/or info")] = None,
) -> list[str] | dict[str, ConnectorExpansion]:
    connectors = worker.connectors()
    if expand is None:
        return [c.name for c, _s in connectors]
    out = {}
    for connector, status in connectors:
        out[connector.name] = ConnectorExpansion(
            status=status_of(worker, connector, status) if "status" in expand else None,
            info=info_of(worker, connector, status) if "info" in expand else None,
        )
    return out


@router.post(
    "/connectors",
    status_code=409,
    response_model=Problem,
    responses={400: {**ERROR, "description": "the body is not JSON"}, **_CONFLICT},
    openapi_extra=_JSON_OBJECT,
    summary="refused (409): the config file defines the connectors",
)
async def create_connector(request: Request, worker: Worker) -> Problem:
    body = await request.body()
    try:
        request_json = json.loads(body) if body.strip() else {}
    except ValueError:
        raise ApiProblem(400, "the request body is not JSON") from None
    name = request_json.get("name") if isinstance(request_json, dict) else None
    if isinstance(name, str) and worker.find(name.strip()) is not None:
        raise ApiProblem(409, f"Connector {name.strip()} already exists")
    raise ApiProblem(
        409,
        f"mm2py runs the connectors of the flows in {worker.config_file}; connectors cannot be "
        "created over REST: enable the flow there (A->B.enabled = true) and restart mm2py",
    )


@router.get(
    "/connectors/{name}",
    response_model=ConnectorInfo,
    responses=_NOT_FOUND,
    summary="a connector's config and tasks",
)
def get_connector(name: ConnectorName, worker: Worker) -> ConnectorInfo:
    return info_of(worker, *connector_or_404(worker, name, "Connector {name} not found"))


@router.get(
    "/connectors/{name}/config",
    response_model=dict[str, str],
    responses=_NOT_FOUND,
    summary="the flow's settings as the connector's config (secrets [hidden])",
)
def get_config(name: ConnectorName, worker: Worker) -> dict[str, str]:
    connector, _status = connector_or_404(worker, name, "Connector {name} not found")
    return connector_config(worker.config, connector)


def refuse_change(worker: LocalWorker, name: str, missing: str | None) -> None:
    if missing is not None and worker.find(name) is None:
        raise ApiProblem(404, missing.format(name=name))
    raise ApiProblem(
        409,
        f"the config of connector {name} comes from {worker.config_file}; change it there "
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
def put_config(name: ConnectorName, worker: Worker) -> None:
    refuse_change(worker, name, None)


@router.patch(
    "/connectors/{name}/config",
    status_code=409,
    response_model=Problem,
    responses={**_NOT_FOUND, **_CONFLICT},
    openapi_extra=_JSON_OBJECT,
    summary="refused (409): the config file defines the connectors",
)
def patch_config(name: ConnectorName, worker: Worker) -> None:
    refuse_change(worker, name, "Connector {name} not found")


@router.delete(
    "/connectors/{name}",
    status_code=409,
    response_model=Problem,
    responses={**_NOT_FOUND, **_CONFLICT},
    summary="refused (409): the config file defines the connectors",
)
def delete_connector(name: ConnectorName, worker: Worker) -> None:
    refuse_change(worker, name, "Connector {name} not found")


@router.put(
    "/connectors/{name}/stop",
    status_code=409,
    response_model=Problem,
    responses={**_NOT_FOUND, **_CONFLICT},
    summary="refused (409): mm2py's connectors run or are paused",
)
def stop_connector(name: ConnectorName, worker: Worker) -> None:
    connector_or_404(worker, name, "Unknown connector {name}")
    raise ApiProblem(
        409,
        f"mm2py cannot stop connector {name}; pause it (PUT /connectors/{name}/pause) "
        f"or disable its flow in {worker.config_file}",
    )


@router.get(
    "/connectors/{name}/status",
    response_model=ConnectorStatus,
    response_model_exclude_none=True,
    responses=_NOT_FOUND,
    summary="the states of the connector and its tasks",
)
def get_status(name: ConnectorName, worker: Worker) -> ConnectorStatus:
    return status_of(
        worker, *connector_or_404(worker, name, "No status found for connector {name}")
    )


@router.get(
    "/connectors/{name}/tasks",
    response_model=list[TaskInfo],
    responses=_NOT_FOUND,
    summary="each task's config, with the partitions it copies",
)
def get_tasks(name: ConnectorName, worker: Worker) -> list[TaskInfo]:
    connector, status = connector_or_404(worker, name, "Connector {name} not found")
    return [
        TaskInfo(
            id=TaskId(connector=connector.name, task=t.id),
            config=task_config(worker.config, connector, t),
        )
        for t in worker.tasks(connector, status)
    ]


def task_or_404(
    worker: LocalWorker, name: str, task: str, message: str
) -> tuple[Connector, FlowStatus, Task]:
    number = task_number(task)
    if number is None:
        raise ApiProblem(404, status_line(404))  # Jersey: not an Integer
    connector, status = connector_or_404(worker, name, "Unknown connector: {name}")
    for t in worker.tasks(connector, status):
        if t.id == number:
            return connector, status, t
    raise ApiProblem(404, message.format(task=f"{connector.name}-{number}"))


@router.get(
    "/connectors/{name}/tasks/{task}/status",
    response_model=TaskState,
    response_model_exclude_none=True,
    responses={404: {**ERROR, "description": "no such connector or task"}},
    summary="one task's state",
)
def get_task_status(name: ConnectorName, task: TaskNumber, worker: Worker) -> TaskState:
    _c, _s, found = task_or_404(worker, name, task, "No status found for task {task}")
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
        503: {**ERROR, "description": "the target cluster did not answer in time"},
    },
    summary="the connector's offsets (KIP-875), read from the flow's progress",
)
def get_offsets(name: ConnectorName, worker: Worker) -> ConnectorOffsets:
    connector, _status = connector_or_404(worker, name, "Connector {name} not found")
    try:
        return ConnectorOffsets(offsets=worker.offsets(connector))
    except ReaderError as exc:
        raise ApiProblem(503, str(exc)) from None


def refuse_offsets(worker: LocalWorker, name: str) -> None:
    connector, _status = connector_or_404(worker, name, "Connector {name} not found")
    raise ApiProblem(
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
def patch_offsets(name: ConnectorName, worker: Worker) -> None:
    refuse_offsets(worker, name)


@router.delete(
    "/connectors/{name}/offsets",
    status_code=409,
    response_model=Problem,
    responses={**_NOT_FOUND, **_CONFLICT},
    summary="refused (409): offsets change only while a connector is STOPPED",
)
def delete_offsets(name: ConnectorName, worker: Worker) -> None:
    refuse_offsets(worker, name)


def pause_target(worker: LocalWorker, name: str) -> tuple[Connector, str]:
    """The flow a pause or resume of the connector applies to (409 when that would
    reach beyond the connector: its flow pauses as a whole)."""
    connector, status = connector_or_404(worker, name, "Unknown connector {name}")
    if connector.kind != SOURCE and kinds_run(status) != [connector.kind]:
        source = f"{connector.flow.name}.{SOURCE}"
        raise ApiProblem(
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
        409: {**ERROR, "description": "pause the flow's source connector instead"},
    },
    summary="pause the connector's flow (202)",
)
def pause(name: ConnectorName, worker: Worker) -> Response:
    _connector, flow = pause_target(worker, name)
    worker.control.pause_flow(flow)
    return Response(status_code=202)


@router.put(
    "/connectors/{name}/resume",
    status_code=202,
    response_class=Response,
    responses={
        202: {"description": "resumed"},
        **_NOT_FOUND,
        409: {**ERROR, "description": "resume the flow's source connector instead"},
    },
    summary="resume the connector's flow (202)",
)
def resume(name: ConnectorName, worker: Worker) -> Response:
    _connector, flow = pause_target(worker, name)
    worker.control.resume_flow(flow)
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
    worker: Worker,
    name: ConnectorName,
    include_tasks: Annotated[
        str, Query(alias="includeTasks", description="true restarts the tasks too")
    ] = "false",
    only_failed: Annotated[
        str, Query(alias="onlyFailed", description="true restarts only what FAILED")
    ] = "false",
) -> Response:
    connector, status = connector_or_404(worker, name, "Unknown connector: {name}")
    with_tasks, failed_only = java_boolean(include_tasks), java_boolean(only_failed)
    if not with_tasks and not failed_only:
        worker.control.restart_flow(connector.flow.name)
        return Response(status_code=204)
    tasks = worker.tasks(connector, status)
    state, _trace = connector_state(connector.kind, status, tasks)
    if restart_plan(state, tasks, with_tasks, failed_only):
        worker.control.restart_flow(connector.flow.name)
    after = status_of(worker, connector, worker.control.flow_status(connector.flow.name))
    body = after.model_dump(exclude_none=True)
    return JSONResponse(body, status_code=202)


@router.post(
    "/connectors/{name}/tasks/{task}/restart",
    status_code=204,
    response_class=Response,
    responses={
        204: {"description": "restarted"},
        404: {**ERROR, "description": "no such connector or task"},
    },
    summary="restart a task (its flow's parts stop and start from their progress)",
)
def restart_task(name: ConnectorName, task: TaskNumber, worker: Worker) -> Response:
    connector, _status, _task = task_or_404(worker, name, task, "Unknown task: {task}")
    worker.control.restart_flow(connector.flow.name)
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
