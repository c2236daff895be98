"""The cluster view: the group's members joined with each node's own report (pure)."""

from __future__ import annotations

from mm2py.cluster.member import NodeId
from mm2py.cluster.view import Member, flow_cluster, format_cluster
from mm2py.runtime.status import FlowStatus, PartStatus


def _node(port: int) -> NodeId:
    return NodeId("h", 100 + port, 1_700_000_000_000, f"h:{port}")


def _report(*parts: PartStatus) -> FlowStatus:
    return FlowStatus(
        name="A->B",
        source="A",
        target="B",
        replicating=True,
        delivery="at-least-once",
        state="RUNNING",
        parts=list(parts),
        topics=[],
        lag_records=0,
    )


def _task(task: int, state: str = "RUNNING", partitions: tuple[str, ...] = ()) -> PartStatus:
    return PartStatus.model_validate(
        {"part": "source", "state": state, "restarts": 0, "task": task, "partitions": partitions}
    )


def test_members_tasks_and_states_come_together() -> None:
    members = [Member(_node(1), [0, 2]), Member(_node(2), [1])]
    reports = {
        "h:1": _report(
            _task(0, partitions=("A.t-0",)),
            _task(2, "FAILED"),
            PartStatus(part="checkpoint", state="RUNNING", restarts=0),
        ),
        "h:2": None,  # did not answer
    }
    cluster = flow_cluster("A->B", "mm2py-A->B", "consumer", 4, members, reports, "h:1")
    assert [(t.task, t.node, t.state, t.partitions) for t in cluster.tasks] == [
        (0, "h:1", "RUNNING", ["A.t-0"]),
        (1, "h:2", "UNKNOWN", []),
        (2, "h:1", "FAILED", []),
        (3, None, "UNASSIGNED", []),
    ]
    assert [(m.node, m.tasks, m.health, m.this_node) for m in cluster.members] == [
        ("h:1", [0, 2], "NOT READY", True),
        ("h:2", [1], "UNREACHABLE", False),
    ]
    assert cluster.once_per_flow_node == "h:1"
    assert cluster.members[0].since == "2023-11-14T22:13:20Z"


def test_a_node_whose_once_per_flow_parts_stand_by_is_ready() -> None:
    members = [Member(_node(1), [1])]
    reports = {"h:1": _report(_task(1), PartStatus(part="sync", state="STANDBY", restarts=0))}
    cluster = flow_cluster("A->B", "g", "classic", 2, members, reports, "h:1")
    assert cluster.members[0].health == "READY"
    assert cluster.once_per_flow_node is None  # task 0 has no owner right now
    text = "\n".join(format_cluster([cluster]))
    assert "A->B cluster: 1 node(s), 2 task(s), group g (classic)" in text
    assert any(line.split() == ["0", "-", "UNASSIGNED", "-"] for line in text.splitlines())
    assert any(line.split()[:2] == ["h:1", "*"] for line in text.splitlines())


def test_a_heartbeat_only_pairs_task_is_its_heartbeat_part() -> None:
    report = FlowStatus(
        name="B->A",
        source="B",
        target="A",
        replicating=False,
        delivery="at-least-once",
        state="RUNNING",
        parts=[
            PartStatus(part="heartbeat", state="RUNNING", restarts=0),
            PartStatus(part="member", state="RUNNING", restarts=0),
        ],
        topics=[],
        lag_records=0,
    )
    cluster = flow_cluster(
        "B->A", "g", "consumer", 1, [Member(_node(1), [0])], {"h:1": report}, "h:1"
    )
    assert [(t.task, t.state) for t in cluster.tasks] == [(0, "RUNNING")]
