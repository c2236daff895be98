"""A node's membership in its flow's cluster: the group that hands out the flow's tasks.

How tasks are split and spread, and why moves lose nothing: mm2py.runtime.assignment.
This part joins the flow's group on the target cluster and turns the group's
decisions into calls on the daemon: `on_assigned(task ids)` when tasks come to this
node, `on_revoked(task ids)` when they leave. `on_revoked` returns only once the
tasks have stopped and recorded their progress, and the group hands a task to its
next owner only after that, so a planned move neither loses nor repeats a record.
When the part stops (SIGTERM, a restart of the flow, a failure) it gives up every
task first and leaves the group after, for the same reason.

The member's client.id carries what `mm2py status` shows of a node (see `NodeId`).
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from mm2py.config import ClusterConfig, FlowConfig
from mm2py.config.rules import group_id
from mm2py.kafka import clients
from mm2py.kafka.group_describe import describe_groups
from mm2py.kafka.topics import await_partitions, ensure_internal_topic
from mm2py.runtime.assignment import (
    CLASSIC_HEARTBEAT_INTERVAL_MS,
    CLASSIC_SESSION_TIMEOUT_MS,
    CONSUMER_SESSION_CONFIG,
    REBALANCE_PROTOCOLS_CONFIG,
    BrokerGroupSettings,
    GroupProtocol,
    choose_protocol,
    tasks_topic,
)
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import STOP_TIMEOUT, Part

log = logging.getLogger(__name__)

POLL_TIMEOUT = 0.2
JOIN_CHECK_INTERVAL = 2.0
# Keys the `consumer` protocol refuses on the client (the broker decides them).
_CLASSIC_ONLY_KEYS = (
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "partition.assignment.strategy",
)


@dataclass(frozen=True)
class NodeId:
    """Who a member is, as its client.id says: host, pid, start time, REST address."""

    host: str
    pid: int
    since_ms: int
    rest: str

    def client_id(self) -> str:
        return f"mm2py/{self.host}/{self.pid}/{self.since_ms}/{self.rest}"

    @staticmethod
    def parse(client_id: str) -> NodeId | None:
        """The NodeId of an mm2py member's client.id; None for anything else."""
        parts = client_id.split("/", 4)
        if len(parts) != 5 or parts[0] != "mm2py":
            return None
        try:
            return NodeId(parts[1], int(parts[2]), int(parts[3]), parts[4])
        except ValueError:
            return None

    @staticmethod
    def here(rest: str) -> NodeId:
        """This process, serving its REST API at `rest` (host:port)."""
        return NodeId(socket.gethostname(), os.getpid(), int(time.time() * 1000), rest)


class MemberPart(Part):
    """Holds this node's place in the flow's group; runs on the daemon's thread for it."""

    name = "member"
    pauses_in_place = True

    def __init__(
        self,
        flow: FlowConfig,
        target: ClusterConfig,
        metrics: Metrics,
        tasks: int,
        node: NodeId,
        on_assigned: Callable[[set[int]], None],
        on_revoked: Callable[[set[int]], None],
        copies: bool = True,
    ) -> None:
        """`copies`: the flow replicates (its tasks copy from the source), rather than only
        emitting heartbeats."""
        super().__init__(flow, metrics)
        self.copies = copies
        self.target = target
        self.tasks = tasks
        self.node = node
        self.group = group_id(flow.settings.cluster_group_prefix, flow.source, flow.target)
        self.topic = tasks_topic(flow.source, tasks)
        self.protocol: GroupProtocol | None = None
        self.owned: set[int] = set()
        self.rebalances = 0  # times tasks came or went
        # The group has answered (with tasks, or none when there are more nodes than tasks).
        self.joined = False
        self._on_assigned = on_assigned
        self._on_revoked = on_revoked

    def clusters(self) -> tuple[str, ...]:
        """The target (the group's); and the source, without which its tasks cannot copy:
        while no task runs here, this part is where an outage of either shows."""
        return (self.flow.source, self.flow.target) if self.copies else (self.flow.target,)

    # Pausing or restarting a flow acts on its tasks and parts; the node keeps its place
    # in the group (leaving it would move every task).

    def pause(self) -> None:
        self.paused = True

    def resume(self, timeout: float = STOP_TIMEOUT) -> None:
        self.paused = False

    def restart(self, timeout: float = STOP_TIMEOUT) -> None:
        if not self.running:
            self.start()

    def run(self) -> None:
        settings = self.flow.settings
        admin = clients.admin_client(self.target.librdkafka("admin"))
        ensure_internal_topic(
            admin,
            self.flow.target,
            self.topic,
            self.tasks,
            settings.offset_storage_replication_factor,  # as the progress topic beside it
            timeout=settings.admin_timeout,
        )
        await_partitions(admin, self.flow.target, self.topic, self.tasks, settings.admin_timeout)
        self.protocol = choose_protocol(
            settings.cluster_group_protocol, broker_group_settings(admin, settings.admin_timeout)
        )
        consumer = clients.consumer(self._consumer_props(), self._group_settings(self.protocol))
        log.info(
            "flow %s: joining the flow's cluster (group %s on cluster %s, %s protocol, %d tasks)",
            self.flow.name,
            self.group,
            self.flow.target,
            self.protocol,
            self.tasks,
        )
        consumer.subscribe(
            [self.topic], on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost
        )
        next_check = 0.0
        try:
            while not self.stopping.is_set():
                consumer.poll(POLL_TIMEOUT)  # no records: the poll serves the group's callbacks
                # A member given no task hears no callback under the `consumer` protocol:
                # it has joined once the group lists it.
                if not self.joined and time.monotonic() >= next_check:
                    next_check = time.monotonic() + JOIN_CHECK_INTERVAL
                    self.joined = self._listed(consumer.memberid())
        finally:
            self.joined = False
            self._give_up(self.owned)  # tasks stopped and flushed before the group hears of it
            consumer.close()

    def _listed(self, member_id: str | None) -> bool:
        """Whether the group counts `member_id` among its members now (described over
        Kafka's protocol: librdkafka's describe aborts the process if the coordinator's
        connection drops, as it does while the target's broker restarts)."""
        if not member_id:
            return False
        timeout = min(self.flow.settings.admin_timeout, JOIN_CHECK_INTERVAL * 2)
        described = describe_groups(self.target.librdkafka("admin"), [self.group], timeout)
        found = described.groups.get(self.group)
        return found is not None and any(m.member_id == member_id for m in found.members)

    def _consumer_props(self) -> dict[str, str]:
        props = dict(self.target.librdkafka("consumer"))
        for key in ("group.id", "group.instance.id", "group.protocol", *_CLASSIC_ONLY_KEYS):
            props.pop(key, None)
        return props

    def _group_settings(self, protocol: GroupProtocol) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "group.id": self.group,
            "client.id": self.node.client_id(),
            "group.protocol": protocol,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "error_cb": lambda err: self.note_client_error(self.flow.target, err),
        }
        if protocol == "classic":
            settings["partition.assignment.strategy"] = "cooperative-sticky"
            settings["session.timeout.ms"] = CLASSIC_SESSION_TIMEOUT_MS
            settings["heartbeat.interval.ms"] = CLASSIC_HEARTBEAT_INTERVAL_MS
        return settings

    def _assigned(self, _consumer: Any, partitions: Sequence[TopicPartition]) -> None:
        self.joined = True
        ids = {tp.partition for tp in partitions} - self.owned
        if ids:
            log.info("flow %s: tasks %s assigned to this node", self.flow.name, _ids(ids))
            self.owned |= ids
            self.rebalances += 1
            self._on_assigned(ids)

    def _revoked(self, _consumer: Any, partitions: Sequence[TopicPartition]) -> None:
        ids = {tp.partition for tp in partitions} & self.owned
        if ids:
            log.info("flow %s: tasks %s move to other nodes", self.flow.name, _ids(ids))
            self._give_up(ids)

    def _lost(self, _consumer: Any, partitions: Sequence[TopicPartition]) -> None:
        ids = {tp.partition for tp in partitions} & self.owned
        if ids:
            log.warning(
                "flow %s: tasks %s lost (this node missed its group session; "
                "they may already run elsewhere): stopping them",
                self.flow.name,
                _ids(ids),
            )
            self._give_up(ids)

    def _give_up(self, ids: set[int]) -> None:
        if ids:
            self._on_revoked(set(ids))
            self.owned -= ids
            self.rebalances += 1


def broker_group_settings(admin: AdminClient, timeout: float) -> BrokerGroupSettings:
    """The group protocols the target's brokers serve and their `consumer` session, each
    None if it cannot be told."""
    try:
        broker_id = min(clients.cluster_metadata(admin, timeout).brokers)
        broker = ConfigResource(ResourceType.BROKER, str(broker_id))
        configs = clients.admin_result(
            admin.describe_configs([broker], request_timeout=timeout)[broker], timeout
        )
    except (KafkaException, ValueError) as exc:  # ValueError: no broker listed
        log.info("cannot read the brokers' group settings (%s); using classic", exc)
        return BrokerGroupSettings(None, None)
    protocols = configs.get(REBALANCE_PROTOCOLS_CONFIG)
    session = configs.get(CONSUMER_SESSION_CONFIG)
    return BrokerGroupSettings(
        None if protocols is None else str(protocols.value),
        None if session is None or session.value is None else int(session.value),
    )


def _ids(ids: set[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))
