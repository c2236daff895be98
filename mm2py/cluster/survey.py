"""Asks the group and the other nodes what the flow's cluster looks like (I/O of the view).

The group's description (on the flow's target cluster) names the members and their
tasks; each other node's REST API (`GET /flows/{flow}/status`, at the address its
client.id carries) says what its tasks are doing. Nodes are asked in parallel, each
for at most `timeout` seconds; one that does not answer shows UNREACHABLE.
"""

from __future__ import annotations

import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from mm2py.cluster.member import MemberPart, NodeId
from mm2py.cluster.view import FlowCluster, Member, flow_cluster
from mm2py.kafka.group_describe import describe_groups
from mm2py.runtime.status import FlowStatus

log = logging.getLogger(__name__)

NODE_TIMEOUT = 2.0
GROUP_TIMEOUT = 3.0


class SurveyError(Exception):
    """The flow's group could not be described."""


def group_members(member: MemberPart, timeout: float) -> list[Member]:
    """The mm2py members of the flow's group with the tasks each owns."""
    described = describe_groups(member.target.librdkafka("admin"), [member.group], timeout)
    group = described.groups.get(member.group)
    if group is None:
        why = described.failures.get(member.group, "no answer")
        raise SurveyError(
            f"cannot describe group {member.group} on cluster {member.flow.target}: {why}"
        )
    found: list[Member] = []
    for m in group.members:
        node = NodeId.parse(m.client_id)
        if node is None:
            continue
        tasks = [p for topic, p in m.assignment if topic == member.topic]
        found.append(Member(node, tasks))
    return found


def flow_status_of(node: str, flow: str, timeout: float) -> FlowStatus | None:
    """Another node's status of `flow`, or None if it does not answer in time."""
    url = f"http://{node}/flows/{urllib.parse.quote(flow, safe='')}/status"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return FlowStatus.model_validate(json.loads(resp.read()))
    except (OSError, ValueError) as exc:
        log.debug("node %s did not say how flow %s runs there: %s", node, flow, exc)
        return None


def survey(
    member: MemberPart,
    local_status: Callable[[], FlowStatus],
    timeout: float = NODE_TIMEOUT,
) -> FlowCluster:
    """The flow's cluster as the group and every node see it."""
    here = member.node.rest
    members = group_members(member, GROUP_TIMEOUT)
    others = sorted({m.node.rest for m in members} - {here})
    reports: dict[str, FlowStatus | None] = {here: local_status()}
    if others:
        with ThreadPoolExecutor(max_workers=min(len(others), 8)) as pool:
            answers = pool.map(lambda n: flow_status_of(n, member.flow.name, timeout), others)
            reports.update(zip(others, answers, strict=True))
    return flow_cluster(
        member.flow.name,
        member.group,
        member.protocol,
        member.tasks,
        members,
        reports,
        here,
    )
