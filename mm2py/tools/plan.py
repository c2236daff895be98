"""`mm2py plan`: what `mm2py run` would do with a config, read from the clusters.

For each selected flow: the topics it would copy (remote names, the rule that selected
each) and leave out (and why), the remote topics, configs and ACLs it would create or
change, the groups it would checkpoint, the schema subjects it would copy, the backlog
per partition; for every cluster, the internal topics `mm2py run` would create.

Invariants:
- it writes nothing anywhere (admin describes and lists; consumers that never join a
  group or commit);
- its decisions are the daemon's own functions (FlowRules, plan_remote_topics,
  config_changes, target_acls, should_checkpoint_group): the plan cannot disagree with
  the run;
- a cluster that cannot be read is a `PlanError` (exit 1) naming it.
Design: docs/design/tools.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.acls import missing_acls, target_acls
from mm2py.compat.filters import should_checkpoint_group
from mm2py.compat.policy import is_cycle
from mm2py.compat.schema_framing import remote_subject, topic_subjects
from mm2py.compat.topic_configs import ConfigPropertyFilter, config_changes, creation_configs
from mm2py.config import FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.access import ClusterAccessError, check_cluster_access
from mm2py.kafka.clients import error_text
from mm2py.kafka.configs import describe_topic_configs
from mm2py.kafka.groups import CommittedOffset, list_groups, read_committed
from mm2py.kafka.topics import TopicAdminError, list_offsets, partition_counts
from mm2py.parts.sync import describe_topic_acls, has_authorizer
from mm2py.replication.progress import ProgressStore
from mm2py.replication.remote_topics import plan_remote_topics
from mm2py.replication.schemas import registry_client
from mm2py.runtime.assignment import tasks_topic

SAMPLE_RECORDS = 200  # per topic, for the backlog's bytes
SAMPLE_SECONDS = 2.0


class PlanError(Mm2pyError):
    """A cluster could not be read; names it (exit 1)."""


@dataclass(frozen=True)
class CopiedTopic:
    topic: str
    remote: str
    rule: str  # "topics" or "heartbeats"
    partitions: int


@dataclass(frozen=True)
class LeftOut:
    topic: str
    reason: str  # "topics.exclude", "internal", "cycle", "no match"


@dataclass(frozen=True)
class RemoteTopic:
    remote: str
    action: str  # "create" or "grow"
    partitions: int
    replication_factor: int | None = None  # on create
    configs: dict[str, str] = field(default_factory=dict)  # on create: synced configs
    from_partitions: int | None = None  # on grow


@dataclass(frozen=True)
class ConfigUpdate:
    remote: str
    set: dict[str, str]
    delete: list[str]


@dataclass(frozen=True)
class PlannedAcl:
    topic: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass(frozen=True)
class Backlog:
    topic: str
    partition: int
    start: int  # first offset to copy (after the recorded progress, or the log start)
    end: int
    records: int  # offsets start..end (transaction markers and aborted records count)
    from_progress: bool


@dataclass(frozen=True)
class PlannedSubject:
    subject: str  # in the source's registry
    remote_subject: str  # in the target's
    versions: int  # every one is copied, in order
    on_target: bool  # the target has a subject of that name (equal versions are reused)


@dataclass(frozen=True)
class InternalTopic:
    cluster: str
    topic: str
    partitions: int
    replication_factor: int
    purpose: str


@dataclass
class FlowPlan:
    flow: str
    copied: list[CopiedTopic] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    remote_topics: list[RemoteTopic] = field(default_factory=list)
    config_updates: list[ConfigUpdate] = field(default_factory=list)
    acls: list[PlannedAcl] = field(default_factory=list)
    acls_note: str | None = None  # why no ACL is planned, when not synced
    groups: list[str] = field(default_factory=list)
    group_offsets_synced: bool = False
    subjects: list[PlannedSubject] | None = None  # None: schema.registry.sync off
    backlog: list[Backlog] = field(default_factory=list)
    backlog_bytes: int | None = None  # key + value bytes, estimated from a sample
    backlog_bytes_by_topic: dict[str, int] = field(default_factory=dict)


@dataclass
class Plan:
    flows: list[FlowPlan]
    internal_topics: list[InternalTopic]


# -- pure decisions ------------------------------------------------------------------


def topic_choice(rules: FlowRules, topic: str) -> str | None:
    """The rule that selects `topic` for copying, or None (see `left_out_reason`)."""
    if not rules.should_replicate(topic):
        return None
    return "topics" if rules.topic_filter.should_replicate_topic(topic) else "heartbeats"


def left_out_reason(rules: FlowRules, topic: str) -> str:
    """Why a topic the flow does not copy is left out (MM2's checks, in its order)."""
    policy = rules.policy
    if policy.is_internal_topic(topic):
        return "internal"
    if is_cycle(policy, topic, rules.flow.target):
        return "cycle"
    if rules.topic_filter.rejection(topic) == "exclude":
        return "topics.exclude"
    return "no match"


def internal_topics(
    flows: Sequence[FlowConfig], heartbeat_flows: Sequence[FlowConfig]
) -> list[InternalTopic]:
    """Every internal topic `mm2py run` with these flows uses, by cluster (pure)."""
    wanted: dict[tuple[str, str], InternalTopic] = {}

    def add(cluster: str, topic: str, partitions: int, rf: int, purpose: str) -> None:
        wanted.setdefault((cluster, topic), InternalTopic(cluster, topic, partitions, rf, purpose))

    for flow in flows:
        s, rules = flow.settings, FlowRules(flow)
        add(
            flow.target,
            flow.offsets_topic,
            s.offset_storage_partitions,
            s.offset_storage_replication_factor,
            f"{flow.name}: progress (MM2's offsets topic)",
        )
        if s.emit_offset_syncs_enabled:
            where = rules.offset_syncs_holder(flow.source, flow.target)
            rf = s.offset_syncs_topic_replication_factor
            add(where, rules.offset_syncs_topic, 1, rf, f"{flow.name}: offset syncs")
        if s.period("emit.checkpoints") is not None:
            add(
                flow.target,
                rules.policy.checkpoints_topic(flow.source),
                1,
                s.checkpoints_topic_replication_factor,
                f"{flow.name}: checkpoints",
            )
        add(
            flow.target,
            tasks_topic(flow.source, s.tasks_max),
            s.tasks_max,
            s.offset_storage_replication_factor,
            f"{flow.name}: tasks of the node group",
        )
    copying = {f.name for f in flows}
    for flow in heartbeat_flows:
        s = flow.settings
        add(
            flow.target,
            FlowRules(flow).policy.heartbeats_topic(),
            1,
            s.heartbeats_topic_replication_factor,
            "heartbeats",
        )
        if flow.name not in copying:
            add(
                flow.target,
                tasks_topic(flow.source, 1),
                1,
                s.offset_storage_replication_factor,
                f"{flow.name}: heartbeats only, its node group",
            )
    return sorted(wanted.values(), key=lambda t: (t.cluster, t.topic))


# -- reading the clusters ---------------------------------------------------------------


class _Reader:
    """Admin clients per cluster, and the one error for a cluster that does not answer."""

    def __init__(self, config: MirrorConfig) -> None:
        self.config = config
        self._admins: dict[str, AdminClient] = {}
        self._counts: dict[str, dict[str, int]] = {}

    def admin(self, alias: str) -> AdminClient:
        if alias not in self._admins:
            self._admins[alias] = clients.admin_client(
                self.config.cluster(alias).librdkafka("admin")
            )
        return self._admins[alias]

    def topics(self, alias: str, timeout: float) -> dict[str, int]:
        if alias not in self._counts:
            try:
                self._counts[alias] = partition_counts(self.admin(alias), timeout)
            except KafkaException as exc:
                raise PlanError(
                    f"cannot list the topics of cluster {alias}: {error_text(exc)}; is "
                    f"{alias}.bootstrap.servers right and the cluster up?"
                ) from None
        return self._counts[alias]


def make_plan(config: MirrorConfig, target_clusters: Sequence[str] | None = None) -> Plan:
    """The plan of every flow `mm2py run --clusters target_clusters` would run."""
    flows = config.enabled_flows(target_clusters)
    heartbeat_flows = config.heartbeat_flows(target_clusters)
    aliases = {a for f in [*flows, *heartbeat_flows] for a in (f.source, f.target)}
    try:
        check_cluster_access(config, aliases)
    except ClusterAccessError as exc:
        raise PlanError(str(exc)) from None
    reader = _Reader(config)
    plans = [_flow_plan(reader, flow) for flow in flows]
    internal = [
        t
        for t in internal_topics(flows, heartbeat_flows)
        if t.topic not in reader.topics(t.cluster, _timeout(config, t.cluster, flows))
    ]
    return Plan(plans, internal)


def _timeout(config: MirrorConfig, alias: str, flows: Sequence[FlowConfig]) -> float:
    for flow in flows:
        if alias in (flow.source, flow.target):
            return flow.settings.admin_timeout
    return 30.0


def _flow_plan(reader: _Reader, flow: FlowConfig) -> FlowPlan:
    rules = FlowRules(flow)
    s = rules.settings
    timeout = s.admin_timeout
    plan = FlowPlan(flow.name)
    source_topics = reader.topics(flow.source, timeout)
    target_topics = reader.topics(flow.target, timeout)
    for topic, partitions in sorted(source_topics.items()):
        rule = topic_choice(rules, topic)
        if rule is None:
            plan.left_out.append(LeftOut(topic, left_out_reason(rules, topic)))
        else:
            plan.copied.append(CopiedTopic(topic, rules.remote_topic(topic), rule, partitions))
    copied = {c.topic: c for c in plan.copied}
    remote_plan = plan_remote_topics({c.remote: c.partitions for c in plan.copied}, target_topics)
    source_of = {c.remote: c.topic for c in plan.copied}
    prop_filter = ConfigPropertyFilter(s.config_properties_exclude)
    needed = [source_of[r] for r in remote_plan.create]
    existing = [c for c in plan.copied if c.remote in target_topics]
    if s.period("sync.topic.configs") is not None:
        needed += [c.topic for c in existing]
    source_configs = describe_topic_configs(reader.admin(flow.source), flow.source, needed, timeout)
    _no_unreadable(source_configs.unreadable)
    for remote, partitions in sorted(remote_plan.create.items()):
        found = source_configs.found[source_of[remote]]
        plan.remote_topics.append(
            RemoteTopic(
                remote,
                "create",
                partitions,
                s.replication_factor,
                creation_configs(found, prop_filter),
            )
        )
    for remote, partitions in sorted(remote_plan.grow.items()):
        plan.remote_topics.append(
            RemoteTopic(remote, "grow", partitions, from_partitions=target_topics[remote])
        )
    if s.period("sync.topic.configs") is not None and existing:
        target_configs = describe_topic_configs(
            reader.admin(flow.target), flow.target, [c.remote for c in existing], timeout
        )
        _no_unreadable(target_configs.unreadable)
        for c in existing:
            changes = config_changes(
                source_configs.found[c.topic], target_configs.found[c.remote], prop_filter
            )
            if changes:
                plan.config_updates.append(
                    ConfigUpdate(c.remote, dict(changes.set), sorted(changes.delete))
                )
    _plan_acls(reader, rules, plan)
    _plan_groups(reader, rules, plan, copied)
    if s.schema_registry_sync_enabled:
        plan.subjects = _plan_subjects(reader.config, flow, plan.copied)
    _plan_backlog(reader, flow, plan, copied)
    return plan


def _no_unreadable(unreadable: Mapping[str, str]) -> None:
    if unreadable:
        raise PlanError(next(iter(unreadable.values())))


def _plan_acls(reader: _Reader, rules: FlowRules, plan: FlowPlan) -> None:
    flow, timeout = rules.flow, rules.settings.admin_timeout
    if rules.settings.period("sync.topic.acls") is None:
        plan.acls_note = "sync.topic.acls.enabled = false"
        return
    found: dict[str, list[Any]] = {}
    for alias in (flow.source, flow.target):
        try:
            found[alias] = describe_topic_acls(reader.admin(alias), timeout)
        except KafkaException as exc:
            first = exc.args[0] if exc.args else None
            if isinstance(first, KafkaError) and first.code() == KafkaError.SECURITY_DISABLED:
                plan.acls_note = f"cluster {alias} has no authorizer"
                return
            raise PlanError(
                f"cannot list the topic ACLs of cluster {alias}: {error_text(exc)}"
            ) from None
        # librdkafka reports "no authorizer" as an empty answer; the broker tells.
        if not found[alias] and has_authorizer(reader.admin(alias), timeout) is False:
            plan.acls_note = f"cluster {alias} has no authorizer"
            return
    wanted = target_acls(found[flow.source], rules.should_replicate, rules.remote_topic)
    plan.acls = [
        PlannedAcl(a.topic, a.principal, a.host, a.operation, a.permission)
        for a in missing_acls(wanted, found[flow.target])
    ]


def _plan_groups(
    reader: _Reader, rules: FlowRules, plan: FlowPlan, copied: Mapping[str, CopiedTopic]
) -> None:
    s = rules.settings
    if s.period("emit.checkpoints") is None:
        return
    plan.groups = checkpointed_groups(
        reader.config,
        rules,
        reader.admin(rules.flow.source),
        reader.topics(rules.flow.source, s.admin_timeout),
    )
    plan.group_offsets_synced = s.period("sync.group.offsets") is not None


def selected_group_offsets(
    config: MirrorConfig,
    rules: FlowRules,
    source_admin: AdminClient,
    partitions: Sequence[tuple[str, int]],
    error: type[Mm2pyError],
) -> dict[str, dict[tuple[str, int], CommittedOffset]]:
    """The committed offsets on `partitions` of the source's groups that the flow's group
    filter selects (raises `error`, naming the cluster, when its groups cannot be listed)."""
    flow, s = rules.flow, rules.settings
    try:
        listed = list_groups(source_admin, s.admin_timeout)
    except KafkaException as exc:
        raise error(
            f"cannot list the consumer groups of cluster {flow.source}: {error_text(exc)}"
        ) from None
    names = [g for g in listed if rules.group_filter.should_replicate_group(g)]
    return read_committed(
        config.cluster(flow.source).librdkafka("consumer"),
        {g: list(partitions) for g in names},
        flow.source,
        s.admin_timeout,
    )


def checkpointed_groups(
    config: MirrorConfig,
    rules: FlowRules,
    source_admin: AdminClient,
    source_topics: Mapping[str, int],
) -> list[str]:
    """The source's groups the checkpoint part picks up (as it decides), sorted."""
    partitions = [
        (t, p)
        for t, n in source_topics.items()
        if rules.topic_filter.should_replicate_topic(t)
        for p in range(n)
    ]
    offsets = selected_group_offsets(config, rules, source_admin, partitions, PlanError)
    return sorted(
        g
        for g, committed in offsets.items()
        if should_checkpoint_group(
            rules.group_filter, rules.topic_filter, g, (t for t, _p in committed)
        )
    )


def _plan_subjects(
    config: MirrorConfig, flow: FlowConfig, copied: Sequence[CopiedTopic]
) -> list[PlannedSubject]:
    """The TopicNameStrategy subjects of the copied topics that the source's registry
    has, as the copy loop copies them (mm2py.replication.schemas)."""
    found: dict[str, list[str]] = {}
    for alias in (flow.source, flow.target):
        client = registry_client(config.cluster(alias))
        try:
            found[alias] = list(client.get_subjects())
        except Exception as exc:  # the client raises its own error types and httpx's
            raise PlanError(
                f"cannot list the subjects of cluster {alias}'s schema registry "
                f"({type(exc).__name__}); is {alias}.schema.registry.url right?"
            ) from None
        finally:
            client.close()
    source = set(found[flow.source])
    target = set(found[flow.target])
    planned = []
    source_client = registry_client(config.cluster(flow.source))
    try:
        for c in copied:
            for subject in topic_subjects(c.topic):
                if subject not in source:
                    continue
                remote = remote_subject(subject, c.topic, c.remote)
                versions = len(source_client.get_versions(subject))
                planned.append(PlannedSubject(subject, remote, versions, remote in target))
    finally:
        source_client.close()
    return planned


def _plan_backlog(
    reader: _Reader, flow: FlowConfig, plan: FlowPlan, copied: Mapping[str, CopiedTopic]
) -> None:
    if not copied:
        return
    s = flow.settings
    progress: dict[tuple[str, int], int] = {}
    if flow.offsets_topic in reader.topics(flow.target, s.admin_timeout):
        progress = _read_progress(reader.config, flow)
    tps = [TopicPartition(t, p) for t, c in copied.items() for p in range(c.partitions)]
    admin = reader.admin(flow.source)
    try:
        earliest: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
        latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        starts = list_offsets(admin, flow.source, {tp: earliest for tp in tps}, s.admin_timeout)
        ends = list_offsets(admin, flow.source, {tp: latest for tp in tps}, s.admin_timeout)
    except TopicAdminError as exc:
        raise PlanError(str(exc)) from None
    for tp in tps:
        key = (tp.topic, tp.partition)
        done = progress.get(key)
        start = max(starts[key], done + 1) if done is not None else starts[key]
        end = ends[key]
        plan.backlog.append(
            Backlog(tp.topic, tp.partition, start, end, max(end - start, 0), done is not None)
        )
    plan.backlog_bytes_by_topic = _estimate_bytes(reader.config, flow, plan.backlog)
    plan.backlog_bytes = sum(plan.backlog_bytes_by_topic.values())


def _read_progress(config: MirrorConfig, flow: FlowConfig) -> dict[tuple[str, int], int]:
    """The progress recorded on the target (read only: the topic exists already)."""
    store = ProgressStore.of_flow(flow, config.cluster(flow.target).librdkafka("producer"))
    try:
        return dict(store.load())
    except (TimeoutError, RuntimeError) as exc:
        raise PlanError(f"reading {flow.offsets_topic} on cluster {flow.target}: {exc}") from None
    finally:
        store.close()


def _estimate_bytes(
    config: MirrorConfig, flow: FlowConfig, backlog: Sequence[Backlog]
) -> dict[str, int]:
    """Bytes of key + value in the backlog: per topic, up to SAMPLE_RECORDS records read
    from the start of each partition's backlog at once, their average times the topic's
    backlog (exact when the sample holds every record)."""
    consumer = clients.consumer(
        config.cluster(flow.source).librdkafka("consumer"),
        {"isolation.level": "read_committed", "enable.partition.eof": True},
    )
    total: dict[str, int] = {}
    try:
        by_topic: dict[str, list[Backlog]] = {}
        for b in backlog:
            if b.records:
                by_topic.setdefault(b.topic, []).append(b)
        for topic, parts in by_topic.items():
            consumer.assign([TopicPartition(topic, b.partition, b.start) for b in parts])
            sizes: list[int] = []
            open_partitions = {b.partition for b in parts}
            deadline = time.monotonic() + SAMPLE_SECONDS
            while open_partitions and len(sizes) < SAMPLE_RECORDS:
                if time.monotonic() >= deadline:
                    break
                for msg in consumer.consume(SAMPLE_RECORDS - len(sizes), 0.2):
                    error = msg.error()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            open_partitions.discard(msg.partition())
                        continue
                    key, value = msg.key(), msg.value()
                    sizes.append((len(key) if key else 0) + (len(value) if value else 0))
            if not open_partitions:
                total[topic] = sum(sizes)  # every record read
            elif sizes:
                total[topic] = round(sum(sizes) / len(sizes) * sum(b.records for b in parts))
    finally:
        consumer.close()
    return total


# -- output -------------------------------------------------------------------------------


def plan_json(plan: Plan) -> str:
    return json.dumps(asdict(plan), indent=2, sort_keys=False) + "\n"


def format_plan(plan: Plan) -> str:
    out: list[str] = []
    for f in plan.flows:
        out.append(f"flow {f.flow}")
        out.append(f"  copies {len(f.copied)} topics:")
        out += [
            f"    {c.topic} -> {c.remote} ({c.partitions} partitions; {c.rule})" for c in f.copied
        ]
        if f.left_out:
            out.append(f"  leaves out {len(f.left_out)} topics:")
            out += [f"    {t.topic} ({t.reason})" for t in f.left_out]
        for r in f.remote_topics:
            if r.action == "create":
                configs = ", ".join(f"{k}={v}" for k, v in sorted(r.configs.items())) or "none"
                out.append(
                    f"  creates {r.remote}: {r.partitions} partitions, replication factor "
                    f"{r.replication_factor}, configs: {configs}"
                )
            else:
                out.append(f"  grows {r.remote}: {r.from_partitions} -> {r.partitions} partitions")
        for u in f.config_updates:
            changes = [f"{k}={v}" for k, v in sorted(u.set.items())]
            changes += [f"{k} (back to the target's default)" for k in u.delete]
            out.append(f"  changes the configs of {u.remote}: {', '.join(changes)}")
        if f.acls:
            out.append(f"  creates {len(f.acls)} ACLs:")
            out += [
                f"    {a.permission} {a.operation} on topic {a.topic} for {a.principal} "
                f"from {a.host}"
                for a in f.acls
            ]
        elif f.acls_note:
            out.append(f"  creates no ACLs: {f.acls_note}")
        else:
            out.append("  creates no ACLs (the target has every one already)")
        if f.subjects is not None:
            out.append(f"  copies {len(f.subjects)} schema registry subjects:")
            out += [
                f"    {sub.subject} -> {sub.remote_subject} ({sub.versions} versions"
                + (
                    "; the target has that subject: equal versions are reused)"
                    if sub.on_target
                    else ")"
                )
                for sub in f.subjects
            ]
        synced = " and syncs their offsets" if f.group_offsets_synced else ""
        out.append(f"  checkpoints {len(f.groups)} groups{synced}: {', '.join(f.groups) or '-'}")
        records = sum(b.records for b in f.backlog)
        estimate = f", about {f.backlog_bytes:,} bytes" if f.backlog_bytes else ""
        out.append(f"  backlog: {records:,} offsets to copy{estimate}")
        out += [
            f"    {b.topic}-{b.partition}: [{b.start}, {b.end}) "
            f"{'after its recorded progress' if b.from_progress else 'from the log start'}"
            for b in f.backlog
            if b.records
        ]
    if plan.internal_topics:
        out.append("internal topics to create:")
        out += [
            f"  on {t.cluster}: {t.topic} ({t.partitions} partitions, replication factor "
            f"{t.replication_factor}; {t.purpose})"
            for t in plan.internal_topics
        ]
    else:
        out.append("internal topics to create: none (all exist)")
    return "\n".join(out) + "\n"
