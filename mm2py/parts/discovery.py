"""Topic discovery of a flow: which source partitions to copy, remote topics made ready.

Every ``refresh.topics.interval.seconds`` the source part asks `TopicDiscovery.refresh()`
what changed: partitions of replicated topics not seen before (their remote topics
created or grown first, in one batch) and partitions whose source topic is gone.

A task (mm2py.runtime.assignment) sees only its own partitions. Task 0 creates and
grows the remote topics of the whole flow; another task takes a partition once its
remote partition exists, and says it is `waiting` meanwhile so that it looks again soon.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.topic_configs import ConfigPropertyFilter
from mm2py.config.rules import FlowRules
from mm2py.kafka.topics import TopicAdminError, await_topics, list_offsets, partition_counts
from mm2py.replication.copy_loop import NewPartition
from mm2py.replication.progress import SourcePartition
from mm2py.replication.remote_topics import ensure_remote_topics
from mm2py.runtime.assignment import WHOLE_FLOW, TaskSlot

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicChanges:
    """What a topic refresh found: partitions to start copying, partitions whose
    source topic no longer exists."""

    new: list[NewPartition]
    gone: list[SourcePartition]
    # Where new partitions without progress start: their log start offsets.
    earliest: dict[SourcePartition, int] = field(default_factory=dict)
    failures: int = 0  # topics that could not be made ready (logged)
    # Partitions of this task whose remote partition task 0 has not made yet.
    waiting: bool = False


class TopicDiscovery:
    """Finds a flow's partitions to copy and prepares their remote topics."""

    def __init__(
        self,
        rules: FlowRules,
        source_admin: AdminClient,
        target_admin: AdminClient,
        producer: Any,
        stored: set[SourcePartition],
        slot: TaskSlot = WHOLE_FLOW,
    ) -> None:
        """`producer` is the copy loop's: it must see new remote partitions before they are
        produced to; `stored` are the partitions with progress (they need no start look-up);
        `slot` is the task whose partitions are wanted."""
        self.rules = rules
        self.slot = slot
        self._source_admin = source_admin
        self._target_admin = target_admin
        self._producer = producer
        self._stored = stored
        self._config_filter = ConfigPropertyFilter(rules.settings.config_properties_exclude)
        self._discovered: set[SourcePartition] = set()
        self._timeout = rules.settings.admin_timeout

    def refresh(self) -> TopicChanges:
        """Create or grow remote topics; say which partitions are new and which are gone."""
        rules = self.rules
        flow = rules.flow
        try:
            source_counts = partition_counts(self._source_admin, self._timeout)
            target_counts = partition_counts(self._target_admin, self._timeout)
        except KafkaException as exc:
            log.warning("flow %s: listing topics failed, retrying later: %s", flow.name, exc)
            return TopicChanges([], [])
        replicated = {t: n for t, n in source_counts.items() if rules.should_replicate(t)}
        if self.slot.creates_topics:
            ready = self._make_ready(replicated, target_counts)
            copyable = replicated
        else:
            ready = set(replicated)
            copyable = {t: target_counts.get(rules.remote_topic(t), 0) for t in replicated}
        failures = len(replicated) - len(ready)
        mine = [
            (topic, partition)
            for topic in sorted(ready)
            for partition in range(replicated[topic])
            if self.slot.owns(topic, partition) and (topic, partition) not in self._discovered
        ]
        new = [
            NewPartition(topic, partition, rules.remote_topic(topic))
            for topic, partition in mine
            if partition < min(copyable[topic], replicated[topic])
        ]
        self._discovered.update((p.topic, p.partition) for p in new)
        # A deleted source topic: stop fetching it (its remote topic is kept, as MM2 does).
        gone = sorted(where for where in self._discovered if where[0] not in source_counts)
        self._discovered.difference_update(gone)
        return TopicChanges(new, gone, self._earliest(new), failures, waiting=len(new) < len(mine))

    def _make_ready(self, replicated: dict[str, int], target_counts: dict[str, int]) -> set[str]:
        """Create or grow the remote topics (task 0's job); the source topics now ready."""
        rules = self.rules
        flow = rules.flow
        result = ensure_remote_topics(
            rules,
            self._source_admin,
            self._target_admin,
            replicated,
            target_counts,
            self._config_filter,
        )
        for reason in result.failed.values():
            log.error("flow %s: %s", flow.name, reason)
        ready = set(result.ready)
        if result.changed:
            try:
                await_topics(self._producer, flow.target, result.changed, self._timeout)
            except TopicAdminError as exc:
                log.error("flow %s: %s", flow.name, exc)
                ready -= {t for t in ready if rules.remote_topic(t) in result.changed}
        return ready

    def _earliest(self, new: list[NewPartition]) -> dict[SourcePartition, int]:
        """Log start offsets of the new partitions that have no progress yet.

        Assigned at OFFSET_BEGINNING, a partition waits for librdkafka to look its
        start up; now and then, on a consumer just created, that never happened and
        the partition stayed unfetched while others were copied. An explicit offset
        needs no look-up. On failure the partitions start at OFFSET_BEGINNING.
        """
        spec: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        wanted = {
            TopicPartition(p.topic, p.partition): spec
            for p in new
            if (p.topic, p.partition) not in self._stored
        }
        try:
            return list_offsets(self._source_admin, self.rules.flow.source, wanted, self._timeout)
        except Exception as exc:  # a look-up only: the partitions are copied either way
            log.warning(
                "flow %s: reading start offsets failed (%s); starting at the beginning",
                self.rules.flow.name,
                exc,
            )
            return {}
