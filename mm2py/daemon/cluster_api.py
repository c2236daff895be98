"""mm2py's cluster API: GET /cluster, each flow's mm2py cluster (nodes, tasks, states).

The answer is the daemon's `FlowControl.cluster_status()` as it is (mm2py.cluster.view).
"""

# No `from __future__ import annotations`: FastAPI reads the endpoints' annotations.
from fastapi import APIRouter

from mm2py.cluster.view import FlowCluster
from mm2py.daemon.control import Control

router = APIRouter()


@router.get(
    "/cluster",
    response_model=list[FlowCluster],
    summary="each flow's cluster: its nodes, which runs which task, their states",
)
def cluster(control: Control) -> list[FlowCluster]:
    return control.cluster_status()
