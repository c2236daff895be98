"""The daemon's REST listener: one FastAPI app over `FlowControl`, served by uvicorn.

The app serves three APIs, each a module-level router:

    mm2py.daemon.cluster_api    GET /cluster: each flow's cluster of mm2py nodes
    mm2py.daemon.flows_api      /flows (status, pause, resume, restart), /health, /metrics
    mm2py.daemon.connect_api    Kafka Connect's API over the same flows (/, /connectors, ...)

and GET /openapi.json, generated from the pydantic models (mm2py.runtime.status, Connect's
entities). Endpoints reach the daemon only through the app's state (`Control`, the
Connect worker); every error answers one body, `Problem` (mm2py.daemon.problems). uvicorn
serves the app on a thread of its own, so the daemon's parts and supervisor stay plain
threads.
"""

from __future__ import annotations

import logging
import socket
import threading
from typing import Any

import uvicorn
from fastapi import FastAPI

from mm2py import __version__
from mm2py.daemon import cluster_api, connect_api, flows_api, problems
from mm2py.daemon.connect_worker import LocalWorker
from mm2py.daemon.control import FlowControl

log = logging.getLogger(__name__)

SERVER_STOP_TIMEOUT = 5.0
ROUTERS = (cluster_api.router, flows_api.router, connect_api.router)


class MirrorApp(FastAPI):
    """The REST API over one daemon. Its OpenAPI document gives that daemon's flows and
    connectors as the examples of the path parameters that name them."""

    def __init__(self, control: FlowControl) -> None:
        super().__init__(
            title="mm2py",
            version=__version__,
            description="Operate a running mm2py daemon: flows, their parts, "
            "pause/resume/restart, health and Prometheus metrics. Shaped like Kafka Connect's "
            "REST API.",
            docs_url=None,  # Swagger UI would load scripts from a CDN
            redoc_url=None,
        )
        worker = LocalWorker(control)
        self.state.control = control
        self.state.connect_worker = worker
        self.path_examples = {
            "flow": control.flow_names() or ["A->B"],
            "name": [c.name for c, _s in worker.connectors()] or ["A->B.MirrorSourceConnector"],
        }
        for router in ROUTERS:
            self.include_router(router)
        problems.install(self, ROUTERS)

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is None:
            schema = super().openapi()
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    for parameter in operation.get("parameters", []):
                        examples = self.path_examples.get(parameter["name"])
                        if parameter["in"] == "path" and examples is not None:
                            parameter["schema"]["examples"] = examples
        return self.openapi_schema  # type: ignore[return-value]


def build_app(control: FlowControl) -> FastAPI:
    """The REST API over `control`."""
    return MirrorApp(control)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (OSError if it cannot be bound).

    Made with the TCP protocol number, which `socket.create_server` leaves at 0: asyncio
    turns Nagle's algorithm off (TCP_NODELAY) only on connections whose socket says TCP,
    and uvicorn writes an answer's head and body apart. With Nagle on, a client that keeps
    its connection (Prometheus, requests' sessions, Connect's REST clients) got each
    body one delayed acknowledgement late, 40 ms on Linux, from its second request on."""
    family, kind, proto, _name, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto or socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


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
