"""mm2py's own API over the daemon's flows: /flows, /health and /metrics.

    GET  /flows                   names of the flows the daemon runs (A->B)
    GET  /flows/{flow}/status     each part's state (RUNNING/PAUSED/FAILED, trace), topics, lag
    PUT  /flows/{flow}/pause      stop reading records (202)
    PUT  /flows/{flow}/resume     continue where the pause stopped (202)
    POST /flows/{flow}/restart    stop and start every part of the flow
    GET  /health                  200 when every enabled flow runs, else 503
    GET  /metrics                 Prometheus exposition (gzip when asked)

`{flow}` is `A->B` percent-encoded (`A-%3EB`), or `A-B` when that names exactly one flow
(`resolve_flow`); any other is 404 naming the flows there are. Every answer of a flow is
its status after the action.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations.
import gzip
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, Path
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mm2py.daemon.control import Control, FlowControl
from mm2py.daemon.problems import ApiProblem
from mm2py.runtime.metrics import exposition
from mm2py.runtime.status import FlowStatus, Health, Problem, resolve_flow

router = APIRouter()

# The examples of the OpenAPI document are the daemon's flows (mm2py.daemon.api).
FlowName = Annotated[
    str,
    Path(
        description="`A->B` (percent-encoded: `A-%3EB`), or `A-B` if that names one flow",
        examples=["A->B"],
    ),
]

_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such flow"}
}


def on_flow(
    control: FlowControl, flow: str, action: Callable[[str], None] | None = None
) -> FlowStatus:
    """Do `action` to the flow `flow` names, then answer its status (404 if none)."""
    name = resolve_flow(flow, control.flow_names())
    if name is None:
        known = ", ".join(control.flow_names()) or "none"
        raise ApiProblem(404, f"no flow {flow!r}; flows: {known}")
    if action is not None:
        action(name)
    return control.flow_status(name)


@router.get("/flows", response_model=list[str], summary="the flows this daemon runs")
def list_flows(control: Control) -> list[str]:
    return control.flow_names()


@router.get(
    "/flows/{flow}/status",
    response_model=FlowStatus,
    responses=_NOT_FOUND,
    summary="states of a flow's parts, its topics with lag and latency",
)
def flow_status(flow: FlowName, control: Control) -> FlowStatus:
    return on_flow(control, flow)


@router.put(
    "/flows/{flow}/pause",
    status_code=202,
    response_model=FlowStatus,
    responses=_NOT_FOUND,
    summary="stop reading records (positions are kept)",
)
def pause(flow: FlowName, control: Control) -> FlowStatus:
    return on_flow(control, flow, control.pause_flow)


@router.put(
    "/flows/{flow}/resume",
    status_code=202,
    response_model=FlowStatus,
    responses=_NOT_FOUND,
    summary="continue a paused flow with the next record",
)
def resume(flow: FlowName, control: Control) -> FlowStatus:
    return on_flow(control, flow, control.resume_flow)


@router.post(
    "/flows/{flow}/restart",
    response_model=FlowStatus,
    responses=_NOT_FOUND,
    summary="stop and start every part of a flow (retries stopped partitions)",
)
def restart(flow: FlowName, control: Control) -> FlowStatus:
    return on_flow(control, flow, control.restart_flow)


@router.get(
    "/health",
    response_model=Health,
    responses={503: {"model": Health, "description": "an enabled flow does not run"}},
    summary="ready when every enabled flow runs",
)
def health(control: Control) -> Health | JSONResponse:
    report = control.health()
    if report.ready:
        return report
    return JSONResponse(report.model_dump(), status_code=503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "metrics"}},
    summary="Prometheus metrics",
)
def metrics(control: Control, accept_encoding: Annotated[str, Header()] = "") -> Response:
    body = exposition(control.registry)
    if "gzip" not in accept_encoding:
        return Response(body, media_type=CONTENT_TYPE_LATEST)
    # Prometheus always asks for gzip, and thousands of partitions' text shrinks some
    # thirtyfold (docs/benchmarks.md). Level 1: most of the saving for a fraction of the
    # time of level 9.
    return Response(
        gzip.compress(body, compresslevel=1),
        media_type=CONTENT_TYPE_LATEST,
        headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
    )
