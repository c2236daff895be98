"""The daemon's REST API, shaped like Kafka Connect's, and /metrics on the same address.

    GET  /                        version, commit, Kafka cluster ID (as Kafka Connect's)
    GET  /flows                   names of the flows the daemon runs (A->B)
    GET  /flows/{flow}/status     each part's state (RUNNING/PAUSED/FAILED, trace), topics, lag
    PUT  /flows/{flow}/pause      stop reading records (202)
    PUT  /flows/{flow}/resume     continue where the pause stopped (202)
    POST /flows/{flow}/restart    stop and start every part of the flow
    GET  /health                  200 when every enabled flow runs, else 503
    GET  /cluster                 each flow's cluster: nodes, tasks, states, partitions
    GET  /metrics                 Prometheus exposition
    GET  /openapi.json            this API's OpenAPI document

Beside it, on the same listener, Kafka Connect's REST API over the same flows
(mm2py.daemon.connect_api: /connectors, /connector-plugins, Connect's error body).

`{flow}` is `A->B` percent-encoded (`A-%3EB`; most clients encode `>` themselves),
or `A-B` when that names exactly one flow. FastAPI generates the OpenAPI document
from the pydantic models in `mm2py.runtime.status`; uvicorn serves the app on a thread of
its own, so the daemon's parts and supervisor stay plain threads.
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations at
# runtime, including the FlowName alias local to build_app.
import gzip
import logging
import socket
import threading
from collections.abc import Callable
from typing import Annotated, Any

import uvicorn
from fastapi import FastAPI, Header, Path
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from mm2py import __version__
from mm2py.cluster.view import FlowCluster
from mm2py.daemon import connect_api
from mm2py.daemon.control import FlowControl
from mm2py.runtime.metrics import exposition
from mm2py.runtime.status import FlowStatus, Health, Problem, resolve_flow

log = logging.getLogger(__name__)

SERVER_STOP_TIMEOUT = 5.0


_NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such flow"}
}


def build_app(control: FlowControl) -> FastAPI:
    """The REST API over `control`."""
    app = FastAPI(
        title="mm2py",
        version=__version__,
        description="Operate a running mm2py daemon: flows, their parts, pause/resume/restart, "
        "health and Prometheus metrics. Shaped like Kafka Connect's REST API.",
        docs_url=None,  # Swagger UI would load scripts from a CDN
        redoc_url=None,
    )
    flows = control.flow_names()
    FlowName = Annotated[
        str,
        Path(
            description="`A->B` (percent-encoded: `A-%3EB`), or `A-B` if that names one flow",
            examples=flows or ["A->B"],
        ),
    ]

    def unknown(flow: str) -> JSONResponse:
        known = ", ".join(control.flow_names()) or "none"
        problem = Problem(error_code=404, message=f"no flow {flow!r}; flows: {known}")
        return JSONResponse(problem.model_dump(), status_code=404)

    def on_flow(
        flow: str, action: Callable[[str], None] | None = None
    ) -> FlowStatus | JSONResponse:
        """Do `action` to the flow `flow` names, then answer its status (404 if none)."""
        name = resolve_flow(flow, control.flow_names())
        if name is None:
            return unknown(flow)
        if action is not None:
            action(name)
        return control.flow_status(name)

    @app.get(
        "/cluster",
        response_model=list[FlowCluster],
        summary="each flow's cluster: its nodes, which runs which task, their states",
    )
    def cluster() -> list[FlowCluster]:
        return control.cluster_status()

    @app.get("/flows", response_model=list[str], summary="the flows this daemon runs")
    def list_flows() -> list[str]:
        return control.flow_names()

    @app.get(
        "/flows/{flow}/status",
        response_model=FlowStatus,
        responses=_NOT_FOUND,
        summary="states of a flow's parts, its topics with lag and latency",
    )
    def flow_status(flow: FlowName) -> FlowStatus | JSONResponse:
        return on_flow(flow)

    @app.put(
        "/flows/{flow}/pause",
        status_code=202,
        response_model=FlowStatus,
        responses=_NOT_FOUND,
        summary="stop reading records (positions are kept)",
    )
    def pause(flow: FlowName) -> FlowStatus | JSONResponse:
        return on_flow(flow, control.pause_flow)

    @app.put(
        "/flows/{flow}/resume",
        status_code=202,
        response_model=FlowStatus,
        responses=_NOT_FOUND,
        summary="continue a paused flow with the next record",
    )
    def resume(flow: FlowName) -> FlowStatus | JSONResponse:
        return on_flow(flow, control.resume_flow)

    @app.post(
        "/flows/{flow}/restart",
        response_model=FlowStatus,
        responses=_NOT_FOUND,
        summary="stop and start every part of a flow (retries stopped partitions)",
    )
    def restart(flow: FlowName) -> FlowStatus | JSONResponse:
        return on_flow(flow, control.restart_flow)

    @app.get(
        "/health",
        response_model=Health,
        responses={503: {"model": Health, "description": "an enabled flow does not run"}},
        summary="ready when every enabled flow runs",
    )
    def health() -> Health | JSONResponse:
        report = control.health()
        if report.ready:
            return report
        return JSONResponse(report.model_dump(), status_code=503)

    @app.get(
        "/metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "metrics"}},
        summary="Prometheus metrics",
    )
    def metrics(accept_encoding: Annotated[str, Header()] = "") -> Response:
        body = exposition(control.registry)
        if "gzip" not in accept_encoding:
            return Response(body, media_type=CONTENT_TYPE_LATEST)
        # Prometheus always asks for gzip: 2,000 partitions' text (2.5 MB) is sent as
        # ~80 KB. Level 1: most of the saving for a fraction of the time of level 9.
        return Response(
            gzip.compress(body, compresslevel=1),
            media_type=CONTENT_TYPE_LATEST,
            headers={"Content-Encoding": "gzip", "Vary": "Accept-Encoding"},
        )

    connect_api.mount(app, control)
    return app


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (OSError if it cannot be bound)."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=128)


class ApiServer:
    """Serves the app with uvicorn on a thread of its own, on an already bound socket."""

    def __init__(self, app: FastAPI, sock: socket.socket) -> None:
        self.socket = sock
        config = uvicorn.Config(
            app,
            log_config=None,  # keep mm2py's one-line (or JSON) logging
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=2,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="rest-api", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(SERVER_STOP_TIMEOUT)
        self.socket.close()
