"""What the REST APIs (mm2py's and Kafka Connect's) need from the daemon: `FlowControl`,
implemented by `mm2py.daemon.supervisor.Daemon`. The APIs see the daemon only through it:
`build_app` puts it in the app's state, and an endpoint asks for it with `Control`."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from mm2py.cluster.view import FlowCluster
from mm2py.config import MirrorConfig
from mm2py.runtime.part import Part
from mm2py.runtime.status import FlowStatus, Health


class FlowControl(Protocol):
    """What the API needs from the daemon (implemented by `mm2py.daemon.supervisor.Daemon`)."""

    @property
    def registry(self) -> CollectorRegistry: ...

    @property
    def config(self) -> MirrorConfig: ...

    @property
    def listen(self) -> str: ...

    def flow_names(self) -> list[str]: ...

    def flow_status(self, name: str) -> FlowStatus: ...

    def pause_flow(self, name: str) -> None: ...

    def resume_flow(self, name: str) -> None: ...

    def restart_flow(self, name: str) -> None: ...

    def health(self) -> Health: ...

    def cluster_status(self) -> list[FlowCluster]: ...

    def flow_cluster(self, name: str) -> FlowCluster | None: ...

    def flow_parts(self, name: str) -> list[Part]:
        """The parts of flow `name` that run on this node."""
        ...


async def flow_control(request: Request) -> FlowControl:
    """The daemon behind the app that serves `request` (a FastAPI dependency)."""
    control: FlowControl = request.app.state.control
    return control


Control = Annotated[FlowControl, Depends(flow_control)]
