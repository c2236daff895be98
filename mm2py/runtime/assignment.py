"""How a flow's work is split into tasks and spread over the nodes of an mm2py cluster.

Nodes: every `mm2py run` with the same config is a member of one consumer group per
flow on the flow's target cluster (`mm2py.config.rules.group_id`), subscribed to a
small internal topic (`tasks_topic`) that has one partition per task. Kafka's group
protocol decides which member owns which partition, so it decides which node runs
which task: membership, failure detection and balancing are the group coordinator's,
nothing of mm2py's own.
Under the KIP-848 `consumer` protocol and under `classic` with `cooperative-sticky`
the moves are incremental: a node gives a task up (its copy loop stopped, flushed and
its progress recorded) before the task is handed to another node, so a planned move
loses and repeats nothing; a node that dies loses its tasks when its group session
expires, and they resume elsewhere from the last recorded progress.

Failover time is the group session, so ``cluster.group.protocol = auto`` chooses the
protocol by it (`choose_protocol`). Under `consumer` the broker alone sets the session
(``group.consumer.session.timeout.ms``: 45 s in Kafka 4.x, and 45 s is also its
minimum, so a managed or default broker gives 45 s and a client cannot ask for less).
Under `classic` the client sets it, down to the broker's
``group.min.session.timeout.ms`` (6 s by default). So `auto` takes `consumer` only
where the brokers offer it with a session no longer than CLASSIC_SESSION_TIMEOUT_MS,
and otherwise `classic` with cooperative-sticky and that session: on default Kafka 4
brokers a dead node's tasks move after 10 s rather than 45 s. Either way the group
coordinator alone decides that a member is gone.

Tasks: a source partition belongs to task `task_of(topic, partition, tasks)`, a pure
function of the partition and the task count. The partitions of one topic go round
the tasks from a starting task that depends on the topic's name only, so a topic's
partitions spread evenly, and a new topic or new partition never moves a partition
that is already copied: nothing already running changes task. (MM2 instead deals the
flow's whole sorted partition list round-robin anew on every change, and restarts every
task each time.) Task 0 also does the flow's once-per-flow work: creating remote
topics, and on its node the checkpoint, heartbeat and config/ACL sync parts.

The tasks topic's name carries the task count, so changing ``tasks.max`` starts a new
set of tasks rather than reusing partitions meant for another split.
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
# brokers' group.min.session.timeout.ms (6 s by default); heartbeats every third of it.
CLASSIC_SESSION_TIMEOUT_MS = 10000
CLASSIC_HEARTBEAT_INTERVAL_MS = 3000


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
