"""The whole cluster of a flow as any node shows it: members, tasks, their states (pure).

Who is a member and which tasks it owns is the group's answer (DescribeGroups on the
target cluster, mm2py.cluster.survey); what state each task is in and which
partitions it copies is its node's answer (that node's own REST status). This module
puts the two together into the REST API's `/cluster` answer and the lines
`mm2py status` prints.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field

from mm2py.cluster.member import NodeId
from mm2py.runtime.status import FlowStatus, PartState, PartStatus, flow_state, text_table

TaskState = PartState | Literal["UNASSIGNED", "UNKNOWN"]
NodeHealth = Literal["READY", "NOT READY", "UNREACHABLE"]


class MemberStatus(BaseModel):
    """One node of the flow's cluster."""

    node: str = Field(description="the node's REST address, host:port")
    host: str
    pid: int
    since: str = Field(description="when the node started, ISO-8601 UTC")
    tasks: list[int] = Field(description="the tasks the group gave this node")
    health: NodeHealth = Field(
        description="READY when every part of the flow on the node runs; UNREACHABLE when "
        "its REST API did not answer"
    )
    this_node: bool = Field(description="the node that answered this request")


class TaskStatus(BaseModel):
    """One task of the flow, wherever it runs."""

    task: int
    node: str | None = Field(description="REST address of the node that runs it")
    state: TaskState = Field(
        description="as the node reports it; UNASSIGNED while no node owns it (a node "
        "died and its session has not expired, or a move is under way), UNKNOWN when the "
        "owner's REST API did not answer"
    )
    partitions: list[str] = Field(description="remote topic partitions it copies")
    restarts: int = 0


class FlowCluster(BaseModel):
    """A flow's cluster: the nodes that share its tasks."""

    flow: str
    group: str = Field(description="the consumer group on the target cluster")
    protocol: str | None = Field(description="consumer or classic; null until joined")
    tasks_max: int
    members: list[MemberStatus]
    tasks: list[TaskStatus]
    once_per_flow_node: str | None = Field(
        description="the node running task 0 and the flow's checkpoints, heartbeats and sync"
    )
    error: str | None = Field(
        default=None, description="why the group could not be described (members unknown)"
    )


@dataclass(frozen=True)
class Member:
    """What the group says of one member."""

    node: NodeId
    tasks: list[int]


def flow_cluster(
    flow: str,
    group: str,
    protocol: str | None,
    tasks_max: int,
    members: Sequence[Member],
    reports: Mapping[str, FlowStatus | None],
    here: str,
) -> FlowCluster:
    """Put the group's members together with each node's own status of the flow.

    `reports` maps a node's REST address to its flow status (None: it did not answer).
    """
    member_rows: list[MemberStatus] = []
    tasks: dict[int, TaskStatus] = {
        t: TaskStatus(task=t, node=None, state="UNASSIGNED", partitions=[])
        for t in range(tasks_max)
    }
    owner_of_0: str | None = None
    for member in sorted(members, key=lambda m: (m.node.host, m.node.rest)):
        rest = member.node.rest
        report = reports.get(rest)
        shown = {p.task: p for p in report.parts if p.task is not None} if report else {}
        if report is not None and 0 not in shown and not report.replicating:
            # A pair that only emits heartbeats: its task 0 is the once-per-flow parts.
            work = [p for p in report.parts if p.part != "member"]
            if work:
                shown[0] = PartStatus(part="heartbeat", state=flow_state(work), restarts=0)
        for task in member.tasks:
            if task == 0:
                owner_of_0 = rest
            part = shown.get(task)
            tasks[task] = TaskStatus(
                task=task,
                node=rest,
                state=part.state if part else "UNKNOWN",
                partitions=part.partitions if part else [],
                restarts=part.restarts if part else 0,
            )
        if report is None:
            health: NodeHealth = "UNREACHABLE"
        else:
            fine = ("RUNNING", "STANDBY")
            health = "READY" if all(p.state in fine for p in report.parts) else "NOT READY"
        member_rows.append(
            MemberStatus(
                node=rest,
                host=member.node.host,
                pid=member.node.pid,
                since=_iso(member.node.since_ms),
                tasks=sorted(member.tasks),
                health=health,
                this_node=rest == here,
            )
        )
    return FlowCluster(
        flow=flow,
        group=group,
        protocol=protocol,
        tasks_max=tasks_max,
        members=member_rows,
        tasks=[tasks[t] for t in sorted(tasks)],
        once_per_flow_node=owner_of_0,
    )


def _iso(epoch_ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch_ms / 1000))


def format_cluster(clusters: Sequence[FlowCluster]) -> list[str]:
    """`mm2py status`'s cluster section: per flow, its nodes and then its tasks."""
    lines: list[str] = []
    for cluster in clusters:
        if cluster.error is not None:
            lines += [f"{cluster.flow} cluster: unknown ({cluster.error})", ""]
            continue
        lines.append(
            f"{cluster.flow} cluster: {len(cluster.members)} node(s), "
            f"{cluster.tasks_max} task(s), group {cluster.group} ({cluster.protocol or '-'})"
        )
        rows = [["NODE", "HOST", "PID", "SINCE", "TASKS", "HEALTH"]]
        for m in cluster.members:
            mark = " *" if m.this_node else ""
            tasks = ",".join(str(t) for t in m.tasks) or "-"
            rows.append([m.node + mark, m.host, str(m.pid), m.since, tasks, m.health])
        lines.extend(text_table(rows, "  "))
        rows = [["TASK", "NODE", "STATE", "PARTITIONS"]]
        for t in cluster.tasks:
            rows.append([str(t.task), t.node or "-", t.state, " ".join(t.partitions) or "-"])
        lines.append("")
        lines.extend(text_table(rows, "  "))
        lines.append("")
    return lines
