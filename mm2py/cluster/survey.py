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

from confluent_kafka import KafkaException

from mm2py.cluster.member import MemberPart, NodeId
from mm2py.cluster.view import FlowCluster, Member, flow_cluster
from mm2py.kafka import clients
from mm2py.runtime.status import FlowStatus

log = logging.getLogger(__name__)

NODE_TIMEOUT = 2.0
GROUP_TIMEOUT = 3.0


class SurveyError(Exception):
    """The flow's group could not be described."""


def group_members(member: MemberPart, timeout: float) -> list[Member]:
    """The mm2py members of the flow's group with the tasks each owns."""
    admin = clients.admin_client(member.target.librdkafka("admin"))
    try:
        future = admin.describe_consumer_groups([member.group], request_timeout=timeout)
        described = clients.admin_result(future[member.group], timeout)
    except KafkaException as exc:
        raise SurveyError(
            f"cannot describe group {member.group} on cluster {member.flow.target}: "
            f"{clients.error_text(exc)}"
        ) from None
    found: list[Member] = []
    for m in described.members:
        node = NodeId.parse(m.client_id or "")
        if node is None:
            continue
        assigned = m.assignment.topic_partitions if m.assignment else []
        found.append(Member(node, [tp.partition for tp in assigned if tp.topic == member.topic]))
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
