"""The checkpoint part of a flow A->B: consumer-group positions on A, translated for B.

As MM2's MirrorCheckpointConnector/Task: lists the source groups that pass the filters
(every refresh.groups.interval.seconds), translates their committed offsets with the
offset syncs and writes a checkpoint per remote partition to
``<source>.checkpoints.internal`` (every emit.checkpoints.interval.seconds); with
sync.group.offsets.enabled, commits them to the group on the target.

Invariants:
- a checkpoint never moves back: written when first, when the group was rewound on the
  source, or when its target offset is later (existing ones are loaded at start);
- a safe checkpoint is replaced by the exact one as soon as new syncs prove it
  (`proven_by_new_syncs`), not at the next emission;
- group offsets are committed on the target only while the group has no members there,
  and never backwards; a failing-over group never skips a record it did not consume.
Design and what a group may read twice: docs/design/parts.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from mm2py.compat.filters import should_checkpoint_group
from mm2py.compat.formats import Checkpoint
from mm2py.compat.offsets import OffsetSyncStore, Translation
from mm2py.compat.policy import checkpoint_topic
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.config.rules import FlowRules
from mm2py.kafka import clients
from mm2py.kafka.groups import (
    CommittedOffset,
    GroupOffsets,
    commit_group_offsets,
    describe_groups,
    list_groups,
    read_committed,
)
from mm2py.kafka.internal_topics import OffsetSyncTail, load_checkpoints
from mm2py.kafka.topics import ensure_internal_topic, topic_partitions
from mm2py.replication.stats import Sensor
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import FlowPart
from mm2py.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

POLL_TIMEOUT = 0.2
WRITE_TIMEOUT = 10.0  # for the target to acknowledge a batch of checkpoints
# How often to look again for an offset-syncs topic that does not exist yet.
SYNCS_RETRY_INTERVAL = 2.0
OPEN_SYNCS = "reading offset syncs"

CHECKPOINT_PRODUCER: dict[str, Any] = {"acks": "all", "linger.ms": 5}


# ------------------------------------------------------------------ pure logic


class CheckpointStore:
    """The latest checkpoint of every group and remote partition (MM2's CheckpointStore)."""

    def __init__(self) -> None:
        self.groups: dict[str, dict[tuple[str, int], Checkpoint]] = {}

    def add(self, checkpoint: Checkpoint) -> None:
        group = self.groups.setdefault(checkpoint.consumer_group_id, {})
        group[(checkpoint.topic, checkpoint.partition)] = checkpoint

    def get(self, group: str, topic: str, partition: int) -> Checkpoint | None:
        return self.groups.get(group, {}).get((topic, partition))

    def of_group(self, group: str) -> dict[tuple[str, int], Checkpoint]:
        """The group's checkpoints by (remote topic, partition)."""
        return dict(self.groups.get(group, {}))


def is_newer(checkpoint: Checkpoint, last: Checkpoint | None) -> bool:
    """Whether `checkpoint` replaces `last` (MM2's checkpointIsMoreRecent).

    Yes for the first one, after the group was rewound on the source, and when the
    target offset advanced; never for a target offset that would move back.
    """
    if last is None:
        return True
    if checkpoint.upstream_offset < last.upstream_offset:
        return True
    return checkpoint.downstream_offset > last.downstream_offset


def translate_group(
    group: str,
    offsets: GroupOffsets,
    rules: FlowRules,
    syncs: OffsetSyncStore,
) -> list[tuple[Checkpoint, Translation]]:
    """Checkpoints for every committed offset of `group` that the syncs translate.

    Only topics passing the topic filter are checkpointed (MM2 applies no other
    rule here); partitions without syncs at or before the offset are left out.
    """
    flow = rules.flow
    out: list[tuple[Checkpoint, Translation]] = []
    for (topic, partition), committed in sorted(offsets.items()):
        if not rules.topic_filter.should_replicate_topic(topic):
            continue
        found = syncs.translation(topic, partition, committed.offset)
        if found is None:
            continue
        remote = checkpoint_topic(rules.policy, topic, flow.source, flow.target)
        checkpoint = Checkpoint(
            group, remote, partition, committed.offset, found.downstream, committed.metadata
        )
        out.append((checkpoint, found))
    return out


def proven_by_new_syncs(
    offsets: Mapping[str, GroupOffsets],
    pending: Iterable[tuple[str, str, int]],
    rules: FlowRules,
    syncs: OffsetSyncStore,
    store: CheckpointStore,
) -> list[tuple[Checkpoint, Translation]]:
    """The checkpoints that the syncs now prove exact and that improve the last one
    written, for the (group, remote topic, partition) keys still `pending` an exact
    checkpoint; `offsets` are the groups' committed offsets as last read."""
    waiting: dict[str, set[tuple[str, int]]] = {}
    for group, topic, partition in pending:
        waiting.setdefault(group, set()).add((topic, partition))
    out = []
    for group in sorted(waiting):
        if group not in offsets:
            continue
        for cp, found in translate_group(group, offsets[group], rules, syncs):
            if (
                found.exact
                and (cp.topic, cp.partition) in waiting[group]
                and is_newer(cp, store.get(group, cp.topic, cp.partition))
            ):
                out.append((cp, found))
    return out


def offsets_to_sync(
    checkpoints: Mapping[tuple[str, int], Checkpoint],
    target_offsets: Mapping[tuple[str, int], int],
) -> dict[tuple[str, int], Checkpoint]:
    """The checkpoints that move a target group forward (never backwards)."""
    return {
        key: cp
        for key, cp in checkpoints.items()
        if key not in target_offsets or target_offsets[key] < cp.downstream_offset
    }


# -------------------------------------------------------------------- the part


class CheckpointPart(FlowPart):
    """Writes checkpoints of one flow's consumer groups; optionally syncs group offsets."""

    name = "checkpoint"

    def __init__(
        self,
        flow: FlowConfig,
        source: ClusterConfig,
        target: ClusterConfig,
        metrics: Metrics,
    ) -> None:
        super().__init__(flow, source, target, metrics)
        self.checkpoints_topic = self.rules.policy.checkpoints_topic(flow.source)
        self.groups: set[str] = set()
        self._latency = metrics.checkpoint_latency
        # Group listings, offset reads and commits: MM2's admin.timeout.ms.
        self.admin_timeout = flow.settings.admin_timeout
        # (group, remote topic, partition) -> when a committed offset not yet
        # reflected by an exact checkpoint was first read.
        self._pending: dict[tuple[str, str, int], float] = {}
        # The groups' committed offsets as the last emission read them.
        self._offsets: Mapping[str, GroupOffsets] = {}
        # MM2's checkpoint-latency-ms by (group, remote topic, partition), when enabled.
        self.mm2_latency: dict[tuple[str, str, int], Sensor] | None = None
        if flow.settings.metrics_mm2_names_enabled:
            self.mm2_latency = {}
            metrics.replication.add_checkpoints(flow.source, flow.target, self.mm2_latency)

    # -- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        """Checkpoint until stopped. Raises on errors the daemon should restart from."""
        s, flow = self.rules.settings, self.flow
        self._source_admin = clients.admin_client(self.source.librdkafka("admin"))
        self._target_admin = clients.admin_client(self.target.librdkafka("admin"))
        ensure_internal_topic(
            self._target_admin,
            flow.target,
            self.checkpoints_topic,
            1,
            s.checkpoints_topic_replication_factor,
            timeout=self.admin_timeout,
        )
        self.store = CheckpointStore()
        loaded = load_checkpoints(
            self.target.librdkafka("consumer"),
            flow.target,
            self.checkpoints_topic,
            stopping=self.stopping.is_set,
        )
        for cp, _ts in (loaded or {}).values():
            self.store.add(cp)
        self._syncs_ready = False
        self._told_no_syncs = False
        syncs_cluster = self.rules.offset_syncs_holder(self.source, self.target)
        self._producer = clients.producer(self.target.librdkafka("producer"), CHECKPOINT_PRODUCER)
        self._sync_tail = OffsetSyncTail(
            syncs_cluster.librdkafka("consumer"), syncs_cluster.alias, self.rules.offset_syncs_topic
        )
        self.syncs: OffsetSyncStore = self._sync_tail.store
        try:
            self._loop()
        finally:
            self._sync_tail.close()
            self._producer.flush(2)

    def _loop(self) -> None:
        s = self.rules.settings
        self._started = time.monotonic()
        self._scheduler = Scheduler(f"flow {self.flow.name}", self.errors)
        self._scheduler.add(OPEN_SYNCS, self._open_syncs, SYNCS_RETRY_INTERVAL)
        # MM2 loads the groups once even when refreshing is disabled.
        self._scheduler.add(
            "finding consumer groups", self._find_groups, s.period("refresh.groups")
        )
        while not self.stopping.is_set():
            wait = min(self._scheduler.run_due(), POLL_TIMEOUT)
            if self._syncs_ready:
                if self._sync_tail.poll(wait) and self._pending:
                    self._emit_proven()
            else:
                self.stopping.wait(wait)

    def _open_syncs(self) -> None:
        """Read the offset syncs to their end once; until then nothing is translated.

        Once they are read, checkpoints are emitted (and group offsets synced).
        """
        tail = self._sync_tail
        self._syncs_ready = tail.open(self.stopping.is_set)
        if not self._syncs_ready:
            if not self.stopping.is_set() and not self._told_no_syncs:
                log.info(
                    "flow %s: no offset syncs yet (%s on %s); checkpoints wait for them",
                    self.flow.name,
                    tail.topic,
                    tail.cluster_alias,
                )
                self._told_no_syncs = True
            return
        s, scheduler = self.rules.settings, self._scheduler
        scheduler.remove(OPEN_SYNCS)
        scheduler.add(
            "emitting checkpoints", self._emit_checkpoints, s.period("emit.checkpoints") or 60
        )
        sync_every = s.period("sync.group.offsets")
        if sync_every:
            # The first sync is one interval after the part started, as if it had waited
            # for the syncs all along.
            first = max(self._started + sync_every - time.monotonic(), 0.0)
            scheduler.add(
                "syncing group offsets", self._sync_group_offsets, sync_every, delay=first
            )

    # -- groups ----------------------------------------------------------------

    def _find_groups(self) -> None:
        self.groups = self._checkpointed_groups()

    def _checkpointed_groups(self) -> set[str]:
        """Groups passing the group filter with offsets on a topic passing the topic filter."""
        rules, flow = self.rules, self.flow
        try:
            listed = list_groups(self._source_admin, self.admin_timeout)
        except (KafkaException, TimeoutError) as exc:
            log.warning("flow %s: listing groups on %s failed: %s", flow.name, flow.source, exc)
            return self.groups
        names = [g for g in listed if rules.group_filter.should_replicate_group(g)]
        offsets = self._source_offsets(names)
        if offsets is None:
            return self.groups
        found = {
            group
            for group, committed in offsets.items()
            if should_checkpoint_group(
                rules.group_filter, rules.topic_filter, group, (t for t, _p in committed)
            )
        }
        # A group whose offsets could not be read this time stays as it was.
        found |= self.groups.intersection(names).difference(offsets)
        if found != self.groups:
            log.info(
                "flow %s: checkpointing %d consumer groups (%d new, %d gone)",
                flow.name,
                len(found),
                len(found - self.groups),
                len(self.groups - found),
            )
        return found

    def _source_offsets(
        self, groups: list[str]
    ) -> dict[str, dict[tuple[str, int], CommittedOffset]] | None:
        """The groups' committed offsets on the source, in the topics the flow replicates.

        Groups that cannot be read are left out (logged); None when the source's topics
        cannot be listed.
        """
        flow = self.flow
        try:
            replicated = topic_partitions(
                self._source_admin,
                self.rules.topic_filter.should_replicate_topic,
                self.admin_timeout,
            )
        except KafkaException as exc:
            log.warning("flow %s: listing topics on %s failed: %s", flow.name, flow.source, exc)
            return None
        return read_committed(
            self.source.librdkafka("consumer"),
            {group: replicated for group in groups},
            flow.source,
            self.admin_timeout,
        )

    # -- checkpoints -----------------------------------------------------------

    def _emit_checkpoints(self) -> None:
        if not self.groups:
            return
        listed_at = time.time()
        offsets = self._source_offsets(sorted(self.groups))
        if offsets is None:
            return
        self._offsets = offsets
        emitted: list[tuple[Checkpoint, Translation]] = []
        for group, committed in offsets.items():
            for cp, found in translate_group(group, committed, self.rules, self.syncs):
                key = (group, cp.topic, cp.partition)
                last = self.store.get(group, cp.topic, cp.partition)
                if is_newer(cp, last):
                    self._pending.setdefault(key, listed_at)
                    emitted.append((cp, found))
                elif (
                    last is not None
                    and last.upstream_offset == cp.upstream_offset
                    and last.downstream_offset == cp.downstream_offset
                ):
                    # Already on the target; exact now if the syncs prove it.
                    if found.exact:
                        self._observe(key, listed_at)
                else:
                    self._pending.setdefault(key, listed_at)
        if emitted:
            self._write(emitted, int(listed_at * 1000))

    def _emit_proven(self) -> None:
        """New offset syncs arrived: write the checkpoints they now prove exact."""
        proven = proven_by_new_syncs(
            self._offsets, list(self._pending), self.rules, self.syncs, self.store
        )
        if proven:
            self._write(proven, int(time.time() * 1000))

    def _write(self, checkpoints: list[tuple[Checkpoint, Translation]], timestamp_ms: int) -> None:
        failures: list[str] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                failures.append(err.str())

        for cp, _found in checkpoints:
            self._producer.produce(
                self.checkpoints_topic,
                cp.encode_value(),
                cp.encode_key(),
                0,
                on_delivery=on_delivery,
                timestamp=timestamp_ms,
            )
        remaining = self._producer.flush(WRITE_TIMEOUT)
        if failures or remaining:
            raise RuntimeError(
                f"writing checkpoints to {self.checkpoints_topic} on {self.flow.target} failed: "
                f"{failures[0] if failures else f'{remaining} not acknowledged in time'}"
            )
        acked = time.time()
        sensors = self.mm2_latency
        for cp, found in checkpoints:
            self.store.add(cp)
            if sensors is not None:
                key = (cp.consumer_group_id, cp.topic, cp.partition)
                sensor = sensors.get(key)
                if sensor is None:
                    sensor = sensors[key] = Sensor(acked)
                sensor.record(max(acked - timestamp_ms / 1000, 0.0), acked)
            if found.exact:
                self._observe((cp.consumer_group_id, cp.topic, cp.partition), acked)
        log.debug("flow %s: wrote %d checkpoints", self.flow.name, len(checkpoints))

    def _observe(self, key: tuple[str, str, int], now: float) -> None:
        first_seen = self._pending.pop(key, None)
        if first_seen is not None:
            self._latency.labels(self.flow.source, self.flow.target, key[0]).observe(
                max(now - first_seen, 0.0)
            )

    # -- group offset sync -----------------------------------------------------

    def _sync_group_offsets(self) -> None:
        """Commit checkpoints to idle groups on the target, only moving them forward."""
        flow = self.flow
        candidates = sorted(g for g in self.groups if self.store.groups.get(g))
        activity = describe_groups(
            self.target.librdkafka("admin"), candidates, flow.target, self.admin_timeout
        )
        idle = [g for g in candidates if g in activity and activity[g].idle]
        current = read_committed(
            self.target.librdkafka("consumer"),
            {group: self.store.of_group(group) for group in idle},
            flow.target,
            self.admin_timeout,
        )
        for group in idle:
            if group not in current:
                continue
            target_offsets = {key: c.offset for key, c in current[group].items()}
            wanted = offsets_to_sync(self.store.of_group(group), target_offsets)
            if not wanted:
                continue
            try:
                commit_group_offsets(
                    self.target.librdkafka("consumer"),
                    group,
                    _committed(wanted),
                    self.admin_timeout,
                )
            except (KafkaException, TimeoutError) as exc:
                # A consumer joined since the group was described: its position wins.
                log.warning(
                    "flow %s: syncing offsets of group %s on %s failed: %s",
                    flow.name,
                    group,
                    flow.target,
                    exc,
                )
                continue
            log.info(
                "flow %s: synced %d offsets of group %s to %s",
                flow.name,
                len(wanted),
                group,
                flow.target,
            )


def _committed(
    checkpoints: Mapping[tuple[str, int], Checkpoint],
) -> dict[tuple[str, int], CommittedOffset]:
    """The target offsets of checkpoints, as a group commits them."""
    return {
        key: CommittedOffset(cp.downstream_offset, cp.metadata) for key, cp in checkpoints.items()
    }
