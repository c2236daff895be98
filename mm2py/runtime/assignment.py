"""How a flow's work is split into tasks and spread over the nodes of an mm2py cluster.

Nodes of one config form one consumer group per flow on the flow's target
(`mm2py.config.rules.group_id`), subscribed to `tasks_topic`, one partition per task:
the group coordinator alone decides which node runs which task, and that a node is gone.
`choose_protocol` picks KIP-848 `consumer` only where the brokers' session is no longer
than CLASSIC_SESSION_TIMEOUT_MS, else `classic` with cooperative-sticky.

Invariants:
- a source partition's task is `task_of(topic, partition, tasks)`, a pure function of the
  partition and the task count; a new topic or partition never moves a copied partition;
- a planned move is incremental: a node stops, flushes and records its task's progress
  before the task is handed on; a dead node's tasks resume from recorded progress;
- task 0 does the once-per-flow work (remote topics, checkpoint, heartbeat, sync);
- the tasks topic's name carries the task count: a new tasks.max is a new set of tasks.
Design: docs/design/task-assignment.md.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

GroupProtocol = Literal["consumer", "classic"]

# Broker setting that lists the group protocols a Kafka 4.x broker serves.
REBALANCE_PROTOCOLS_CONFIG = "group.coordinator.rebalance.protocols"
# Broker setting: the session of a `consumer` protocol member (Kafka 4.x: 45 s).
CONSUMER_SESSION_CONFIG = "group.consumer.session.timeout.ms"
# The classic protocol's session, set by the client: a node that stops answering loses
# its tasks after this, and they move (Kafka Connect's default too). At least the
# brokers' group.min.session.timeout.ms (6 s by default).
CLASSIC_SESSION_TIMEOUT_MS = 10000
# A classic member hears of a rebalance in its next heartbeat's answer, and a move
# under cooperative-sticky takes two rounds (the task is given up, then handed on):
# each round waits up to this for the members to rejoin. Kafka's consumer and Connect
# heartbeat every 3 s; mm2py every second, one small request a second per node and
# flow, so that a node joining or leaving moves tasks a few seconds sooner.
CLASSIC_HEARTBEAT_INTERVAL_MS = 1000


@dataclass(frozen=True)
class BrokerGroupSettings:
    """What the target's brokers say of their groups; None where it could not be read
    (an older broker, or no right to describe its configs)."""

    protocols: str | None  # group.coordinator.rebalance.protocols, e.g. "classic,consumer"
    consumer_session_ms: int | None  # group.consumer.session.timeout.ms


def task_of(topic: str, partition: int, tasks: int) -> int:
    """The task (0..tasks-1) that copies `topic`'s `partition`.

    crc32 of the name, not Python's hash(): every node must compute the same task.
    """
    return (zlib.crc32(topic.encode()) + partition) % tasks


def tasks_topic(source: str, tasks: int) -> str:
    """The internal topic on the target whose partitions stand for the flow's tasks."""
    return f"mm2py-tasks.{source}.{tasks}.internal"


def task_counts(topics: Iterable[str], source: str) -> set[int]:
    """The task counts that `tasks_topic` names among `topics` (a flow's earlier splits:
    exactly-once fences their tasks' transactional ids)."""
    pattern = re.compile(rf"mm2py-tasks\.{re.escape(source)}\.([0-9]+)\.internal")
    return {int(m[1]) for t in topics if (m := pattern.fullmatch(t))}


def choose_protocol(wanted: str, brokers: BrokerGroupSettings) -> GroupProtocol:
    """The group protocol for ``cluster.group.protocol = wanted`` (auto, consumer or
    classic): `auto` takes `consumer` where the brokers offer it with a session no
    longer than the classic one mm2py sets, else `classic` (see the module's docstring)."""
    if wanted == "consumer":
        return "consumer"
    if wanted == "classic":
        return "classic"
    offered = {p.strip() for p in (brokers.protocols or "").split(",")}
    short = (
        brokers.consumer_session_ms is not None
        and brokers.consumer_session_ms <= CLASSIC_SESSION_TIMEOUT_MS
    )
    return "consumer" if "consumer" in offered and short else "classic"


@dataclass(frozen=True)
class TaskSlot:
    """One task of a flow split into `count` tasks."""

    id: int
    count: int

    def owns(self, topic: str, partition: int) -> bool:
        return task_of(topic, partition, self.count) == self.id

    @property
    def creates_topics(self) -> bool:
        """Task 0 creates and grows the flow's remote topics; the others wait for them."""
        return self.id == 0


# A flow run as one task.
WHOLE_FLOW = TaskSlot(0, 1)
