"""Failback: groups back to the cluster their topics came from, and the divergent tail.

After a failover A->B, `mm2py failover --source B --target A` moves groups back. Their
positions on *returning* topics (``A.orders`` on B, a copy of A's ``orders``) have no
checkpoints (B->A never copies them: a cycle), so this module translates the group's
offset on B through A->B's offset syncs read the other way
(`compat.offsets.PartitionSyncs.upstream_position`).

Invariants:
- a row is ``ok`` only when the syncs prove the position exact; otherwise ``not exact
  yet`` at or before the group's position, or ``untranslated``: a failback is all or
  nothing, like a failover;
- the divergent tail (``--diverged``) is, per partition of A's own copied topics, from
  the next offset A->B would copy to A's end offset now; it is read with A->B stopped.
Design: docs/design/failback.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.offsets import OffsetSyncStore
from mm2py.config import ConfigError, FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.clients import error_text
from mm2py.kafka.internal_topics import read_offset_syncs
from mm2py.kafka.reader import ReaderError
from mm2py.kafka.topics import TopicAdminError, list_offsets, partition_counts
from mm2py.replication.progress import ProgressStore
from mm2py.tools.plan import selected_group_offsets
from mm2py.tools.translate import NOT_EXACT, OK, UNTRANSLATED, Report, Status


class FailbackError(Mm2pyError):
    """What a failback needs could not be read; says which cluster and topic (exit 1)."""


@dataclass(frozen=True)
class Diverged:
    """Records of one partition of the target's own topic that the source never got."""

    topic: str  # the topic on the cluster failed back to (A's own name)
    partition: int
    records: int
    first_offset: int
    last_offset: int


# ------------------------------------------------------------------ pure part


def returning_topics(back: FlowRules, source_topics: Mapping[str, int]) -> dict[str, str]:
    """Returning topics among `source_topics` (the failback's source, B): remote topic on
    B -> the topic on A it is a copy of, by the back flow A->B's rules."""
    flow, policy = back.flow, back.policy
    found = {}
    for topic in source_topics:
        upstream = policy.upstream_topic(topic)
        if (
            policy.topic_source(topic) == flow.source
            and upstream is not None
            and upstream != topic
            and back.remote_topic(upstream) == topic
            and back.should_replicate(upstream)
        ):
            found[topic] = upstream
    return found


def translate_back(
    report: Report,
    back: FlowRules,
    returning: Mapping[str, str],
    syncs: OffsetSyncStore | None,
    syncs_problem: str | None = None,
) -> None:
    """Replace the report's rows of returning topics by their translation through the back
    flow's offset syncs (the module's contract). `syncs` None: they could not be read."""
    name = back.flow.name
    back_to: dict[str, str] = {}
    for i, row in enumerate(report.rows):
        original = returning.get(row.source_topic)
        if original is None or row.committed_on_source is None:
            continue
        back_to[row.source_topic] = original
        offset = row.committed_on_source
        where = f"{row.source_topic}-{row.partition} offset {offset} on {report.source}"
        found = syncs.upstream_position(original, row.partition, offset) if syncs else None
        status: Status = UNTRANSLATED
        downstream, reason = row.downstream_offset, None
        if syncs is None:
            reason = (
                f"the offset syncs of {name} could not be read "
                f"({syncs_problem or 'unknown reason'}); waits for them"
            )
        elif found is None:
            reason = (
                f"no offset sync of {name} covers {where} (the syncs topic was emptied or made "
                f"anew, or the copy's topic on {report.source} was): its position on "
                f"{original} is not known"
            )
        else:
            status, downstream = (OK if found.exact else NOT_EXACT), found.upstream
            if not found.exact:
                reason = (
                    f"not proven: the offset syncs of {name} do not prove which record of "
                    f"{original} the group read last ({where} is past the newest sync, or "
                    "between syncs compaction separated or MM2 wrote); "
                    f"{found.upstream} is at or before it: records would be read again"
                )
        report.rows[i] = replace(
            row,
            topic=original,
            checkpoint_age_seconds=None,  # not from a checkpoint
            status=status,
            upstream_offset=offset,
            downstream_offset=downstream,
            reason=reason,
        )
    report.notes += [
        f"{remote} on {report.source} goes back to {original} on {report.target}, "
        f"translated through the offset syncs of {name} (no checkpoint is written for it)"
        for remote, original in sorted(back_to.items())
    ]


def divergent_tail(
    back: FlowRules,
    ends: Mapping[tuple[str, int], int],
    progress: Mapping[tuple[str, int], int],
    syncs: OffsetSyncStore | None,
) -> list[Diverged]:
    """Per partition of `ends` (A's end offsets now), the records past the last one A->B
    copied: by its `progress` (last offset copied) and its newest offset sync."""
    found = []
    for (topic, partition), end in sorted(ends.items()):
        if back.policy.is_heartbeats_topic(topic):
            continue
        first = progress.get((topic, partition), -1) + 1
        known = syncs.partitions.get((topic, partition)) if syncs else None
        if known is not None and known.upstream:
            # A position sync is of the next offset to copy; a record's, of one copied.
            step = 0 if known.position[-1] else 1
            first = max(first, known.upstream[-1] + step)
        if end > first:
            found.append(Diverged(topic, partition, end - first, first, end - 1))
    return found


# ---------------------------------------------------------------- cluster I/O


def back_flow(config: MirrorConfig, flow: FlowConfig) -> FlowConfig | None:
    """The flow the other way (A->B for B->A), or None when the config has none."""
    try:
        return config.flow(flow.target, flow.source)
    except ConfigError:
        return None


def read_back_syncs(
    config: MirrorConfig, back: FlowRules
) -> tuple[OffsetSyncStore | None, str | None]:
    """The back flow's offset syncs, or None and why not."""
    flow = back.flow
    holder = config.cluster(back.offset_syncs_holder(flow.source, flow.target))
    try:
        syncs = read_offset_syncs(
            holder.librdkafka("consumer"), holder.alias, back.offset_syncs_topic
        )
    except ReaderError as exc:
        return None, str(exc)
    if syncs is None:
        return None, f"{back.offset_syncs_topic} does not exist on {holder.alias}"
    return syncs, None


def returning_groups(
    config: MirrorConfig,
    rules: FlowRules,
    source_admin: AdminClient,
    source_topics: Mapping[str, int],
    returning: Mapping[str, str],
) -> list[str]:
    """The source's groups (B's, by the flow's group filter) with committed offsets on a
    returning topic, sorted."""
    if not returning:
        return []
    partitions = [(t, p) for t in returning for p in range(source_topics[t])]
    offsets = selected_group_offsets(config, rules, source_admin, partitions, FailbackError)
    return sorted(g for g, committed in offsets.items() if committed)


def diverged(config: MirrorConfig, flow: FlowConfig) -> list[Diverged]:
    """The divergent tail of the failback `flow` (B->A): see the module docstring."""
    back = back_flow(config, flow)
    if back is None:
        raise FailbackError(
            f"the config has no flow {flow.target}->{flow.source}: the divergent tail is what "
            f"{flow.target} took in that that flow did not copy"
        )
    rules = FlowRules(back)
    admin = clients.admin_client(config.cluster(back.source).librdkafka("admin"))
    timeout = rules.settings.admin_timeout
    try:
        counts = partition_counts(admin, timeout)
        latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        specs = {
            TopicPartition(t, p): latest
            for t, n in counts.items()
            if rules.should_replicate(t)
            for p in range(n)
        }
        ends = list_offsets(admin, back.source, specs, timeout) if specs else {}
    except (KafkaException, TopicAdminError) as exc:
        text = error_text(exc) if isinstance(exc, KafkaException) else str(exc)
        raise FailbackError(
            f"cannot read the end offsets of cluster {back.source}: {text}"
        ) from None
    store = ProgressStore.of_flow(back, config.cluster(back.target).librdkafka("producer"))
    try:
        progress = store.load(past_open_transactions=True)
    except (ReaderError, TimeoutError, TopicAdminError) as exc:
        raise FailbackError(f"reading {back.offsets_topic} on {back.target}: {exc}") from None
    finally:
        store.close()
    syncs, problem = read_back_syncs(config, rules)
    if syncs is None:
        raise FailbackError(f"reading the offset syncs of {back.name}: {problem}")
    return divergent_tail(rules, ends, progress, syncs)
