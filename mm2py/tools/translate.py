"""`mm2py translate-offsets`: a group's positions on the target, from the checkpoints.

Positions come from ``<source>.checkpoints.internal`` on the target only (so it works on
a pair real MM2 replicated); when the source answers, its committed offsets and the
offset syncs are read too, and every partition the group consumes is a row: ``ok``,
``not exact yet`` (with what it waits for) or ``untranslated`` (with why).

Invariants:
- ``ok`` only when the source's committed offset is the checkpoint's and the syncs
  translate it exactly to the checkpoint's target offset;
- `--apply` commits only a report whose every row is ``ok``; with `accept_inexact` each
  checkpoint as it is (at or before the group's position), never one ahead of a group
  rewound since; nothing is left out silently.
The first half of the module is pure (rows, reasons, text, JSON); the second does I/O.
Design: docs/design/tools.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final, Literal

from confluent_kafka import KafkaException

from mm2py.compat.formats import Checkpoint
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.compat.policy import ReplicationPolicy, checkpoint_topic
from mm2py.config import ConfigError, FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import UsageError
from mm2py.kafka import clients
from mm2py.kafka.groups import (
    CommittedOffset,
    commit_group_offsets,
    describe_groups,
    read_committed,
)
from mm2py.kafka.internal_topics import load_checkpoints, read_offset_syncs
from mm2py.kafka.reader import ReaderError
from mm2py.kafka.topics import topic_partitions

Status = Literal["ok", "not exact yet", "untranslated"]

OK: Final = "ok"
NOT_EXACT: Final = "not exact yet"
UNTRANSLATED: Final = "untranslated"

# ------------------------------------------------------------------ pure part


@dataclass(frozen=True)
class PartitionRow:
    """One remote topic partition of the group."""

    topic: str  # the remote topic, on the target
    source_topic: str
    partition: int
    status: Status
    upstream_offset: int | None = None  # the checkpoint's source offset
    downstream_offset: int | None = None  # ... translated for the target
    checkpoint_age_seconds: float | None = None
    metadata: str | None = None
    committed_on_source: int | None = None  # the group's offset on the source now, if read
    reason: str | None = None

    @property
    def translated(self) -> bool:
        return self.downstream_offset is not None


@dataclass
class Report:
    """Everything translate-offsets found out about one group on one flow."""

    source: str
    target: str
    group: str
    checkpoints_topic: str
    rows: list[PartitionRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the group as a whole
    notes: list[str] = field(default_factory=list)  # worth knowing, not failures
    applied: int | None = None  # offsets committed with --apply

    @property
    def complete(self) -> bool:
        """Every partition translated and nothing wrong with the group."""
        return not self.problems and all(row.translated for row in self.rows)

    @property
    def exact(self) -> bool:
        """Every partition at a position proven exact (``ok``), and nothing wrong with the
        group: what --apply commits, and exit status 0."""
        return not self.problems and all(row.status == OK for row in self.rows)


@dataclass(frozen=True)
class SourceView:
    """What the source cluster says about the group (when it answers)."""

    committed: Mapping[tuple[str, int], int]  # (source topic, partition) -> offset
    syncs: OffsetSyncStore | None = None  # None: not read or not there
    syncs_problem: str | None = None


def source_topic_of(policy: ReplicationPolicy, remote: str, source: str, target: str) -> str:
    """The source topic a checkpoint's remote topic stands for (inverse of checkpoint_topic)."""
    if policy.topic_source(remote) == source:
        return policy.upstream_topic(remote) or remote
    # A topic that came from the target to the source is checkpointed under its
    # original name (MirrorCheckpointTask.renameTopicPartition).
    return policy.format_remote_topic(target, remote)


def build_report(
    rules: FlowRules,
    group: str,
    checkpoints: Mapping[tuple[str, int], tuple[Checkpoint, int]],
    now_ms: int,
    source_view: SourceView | None = None,
    source_problem: str | None = None,
    topics: Sequence[str] = (),
    checkpoints_topic_exists: bool = True,
) -> Report:
    """Rows for every checkpointed partition and every partition the group committed on.

    `checkpoints` maps (remote topic, partition) to (checkpoint, record timestamp in
    ms). `source_view` is None when the source was not read, with `source_problem`
    saying why. `topics` keeps only these topics (source or remote names).
    """
    flow = rules.flow
    cp_topic = rules.policy.checkpoints_topic(flow.source)
    report = Report(flow.source, flow.target, group, cp_topic)
    wanted = set(topics)

    def keep(source_topic: str, remote: str) -> bool:
        return not wanted or source_topic in wanted or remote in wanted

    committed = dict(source_view.committed) if source_view else {}
    remote_of = {
        t: checkpoint_topic(rules.policy, t, flow.source, flow.target) for t, _p in committed
    }
    seen: set[tuple[str, int]] = set()
    for (remote, partition), (cp, ts) in sorted(checkpoints.items()):
        source_topic = source_topic_of(rules.policy, remote, flow.source, flow.target)
        if not keep(source_topic, remote):
            continue
        seen.add((source_topic, partition))
        now_offset = committed.get((source_topic, partition))
        reason = _not_exact(rules, cp, source_topic, now_offset, source_view, source_problem)
        status: Status = OK if reason is None else NOT_EXACT
        report.rows.append(
            PartitionRow(
                remote,
                source_topic,
                partition,
                status,
                cp.upstream_offset,
                cp.downstream_offset,
                max(now_ms - ts, 0) / 1000.0,
                cp.metadata,
                now_offset,
                reason,
            )
        )
    if source_view is not None:
        for (source_topic, partition), offset in sorted(committed.items()):
            remote = remote_of[source_topic]
            if (source_topic, partition) in seen or not keep(source_topic, remote):
                continue
            report.rows.append(
                PartitionRow(
                    remote,
                    source_topic,
                    partition,
                    UNTRANSLATED,
                    committed_on_source=offset,
                    reason=_why_untranslated(rules, source_view, source_topic, partition, offset),
                )
            )
        report.rows.sort(key=lambda r: (r.topic, r.partition))
    filtered = bool(wanted) and bool(checkpoints or committed)
    _group_findings(
        report, rules, group, source_view, source_problem, checkpoints_topic_exists, filtered
    )
    if not report.rows and filtered:
        report.problems.append(
            f"no partition of group {group} belongs to --topic {', '.join(sorted(wanted))}"
        )
    return report


def _not_exact(
    rules: FlowRules,
    cp: Checkpoint,
    source_topic: str,
    now_offset: int | None,
    view: SourceView | None,
    source_problem: str | None,
) -> str | None:
    """Why checkpoint `cp` is not proven to be the group's exact position now, naming
    what it waits for; None when it is (see the module docstring)."""
    flow, s = rules.flow, rules.settings
    next_checkpoint = f"the next checkpoint (every {s.emit_checkpoints_interval_seconds}s)"
    if view is None:
        return (
            f"not proven: {flow.source} was not read ({source_problem or 'skipped'}), so "
            "neither the group's offset there nor the offset syncs are known; waits for "
            f"{flow.source} to answer"
        )
    if now_offset is None:
        return (
            f"not proven: the group has no committed offset for this partition on "
            f"{flow.source}; waits for it to commit one there"
        )
    if now_offset > cp.upstream_offset:
        return f"the group has committed {now_offset} on {flow.source} since; waits for " + (
            next_checkpoint
        )
    if now_offset < cp.upstream_offset:
        return f"the group was rewound to {now_offset} on {flow.source} since; waits for " + (
            next_checkpoint
        )
    if view.syncs is None:
        why = view.syncs_problem or "unknown reason"
        return f"not proven: the offset syncs could not be read ({why}); waits for them"
    found = view.syncs.translation(source_topic, cp.partition, cp.upstream_offset)
    if found is None:
        return (
            f"not proven: no offset sync covers {source_topic}-{cp.partition} offset "
            f"{cp.upstream_offset} (the offset syncs topic was emptied or made anew); waits "
            "for syncs that do"
        )
    if not found.exact:
        return (
            f"not proven: the offset syncs do not prove where {cp.upstream_offset} is (the "
            "replicator has not synced its copy up to there yet, or the syncs around it were "
            "written by MM2 or compacted away); waits for the replicator's sync, then for "
            + next_checkpoint
        )
    if found.downstream != cp.downstream_offset:
        return f"the offset syncs now translate to {found.downstream}; waits for " + (
            next_checkpoint
        )
    return None


def _why_untranslated(
    rules: FlowRules, view: SourceView, topic: str, partition: int, offset: int
) -> str:
    flow, s = rules.flow, rules.settings
    if not rules.should_replicate(topic):
        return (
            f"{topic} is not replicated by {flow.name} (topics, topics.exclude, "
            "internal topic or cycle)"
        )
    if view.syncs is None:
        return "no checkpoint, and the offset syncs could not be read: " + (
            view.syncs_problem or "unknown reason"
        )
    syncs = view.syncs.partitions.get((topic, partition))
    first = syncs.first_upstream if syncs else None
    if first is None:
        return (
            f"no offset syncs for {topic}-{partition}: none of its records has been replicated yet"
        )
    if offset < first:
        return (
            f"committed offset {offset} is older than the oldest offset sync ({first}): "
            "those records were not replicated, or their offset syncs are gone"
        )
    return (
        f"not checkpointed yet: checkpoints are written every "
        f"{s.emit_checkpoints_interval_seconds}s by the checkpoint part of {flow.name}"
    )


def _group_findings(
    report: Report,
    rules: FlowRules,
    group: str,
    view: SourceView | None,
    source_problem: str | None,
    topic_exists: bool,
    filtered: bool,
) -> None:
    flow = rules.flow
    where = f"{report.checkpoints_topic} on {flow.target}"
    if not topic_exists:
        report.problems.append(
            f"{where} does not exist: no checkpoint was ever written for {flow.name}"
        )
    if not rules.group_filter.should_replicate_group(group):
        report.problems.append(
            f"group {group} is excluded by groups / groups.exclude of {flow.name}: "
            "no checkpoints are written for it"
        )
    if view is None:
        report.notes.append(
            f"{flow.source} not read ({source_problem or 'skipped'}): partitions without a "
            "checkpoint cannot be listed, and checkpoints are not compared with the group's "
            "current offsets"
        )
    if not report.rows and topic_exists and not filtered:
        if view is not None and not view.committed:
            report.problems.append(
                f"group {group} has no committed offsets on {flow.source} and no checkpoints "
                f"in {where}"
            )
        else:
            report.problems.append(f"no checkpoints for group {group} in {where}")


def format_age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def format_text(report: Report) -> str:
    """A table for people: one line per remote topic partition, then problems and notes."""

    def cell(value: int | None) -> str:
        return "-" if value is None else str(value)

    header = ("TOPIC", "PARTITION", "UPSTREAM", "DOWNSTREAM", "AGE", "STATUS", "NOTE")
    table = [
        (
            row.topic,
            str(row.partition),
            cell(row.upstream_offset),
            cell(row.downstream_offset),
            format_age(row.checkpoint_age_seconds),
            row.status,
            row.reason or "",
        )
        for row in report.rows
    ]
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header) - 1)]
    lines = [
        f"group {report.group}: {report.source} -> {report.target} "
        f"(checkpoints in {report.checkpoints_topic} on {report.target})"
    ]
    for line in [header, *table] if table else []:
        cells = [c.ljust(w) for c, w in zip(line[:-1], widths, strict=True)]
        lines.append("  ".join([*cells, line[-1]]).rstrip())
    lines += [f"problem: {p}" for p in report.problems]
    lines += [f"note: {n}" for n in report.notes]
    translated = sum(1 for row in report.rows if row.translated)
    exact = sum(1 for row in report.rows if row.status == OK)
    lines.append(
        f"{translated} of {len(report.rows)} partitions translated, {exact} exact"
        + ("" if report.applied is None else f"; {report.applied} offsets applied")
    )
    return "\n".join(lines) + "\n"


def to_json(report: Report) -> dict[str, Any]:
    """The report as plain JSON values (stable keys, for scripts)."""
    data = asdict(report)
    data["complete"] = report.complete
    data["exact"] = report.exact
    return data


def format_json(report: Report) -> str:
    return json.dumps(to_json(report), indent=2) + "\n"


# ---------------------------------------------------------------- cluster I/O


class ApplyRefused(UsageError):
    """--apply would change the offsets of a group that has members on the target."""


def gather(
    config: MirrorConfig,
    flow: FlowConfig,
    group: str,
    topics: Sequence[str] = (),
    now: Callable[[], float] = time.time,
) -> Report:
    """Read the checkpoints (and the source, if it answers) and build the report.

    Raises ReaderError when the checkpoints cannot be read (ReaderTimeout, a
    TimeoutError, when that takes too long).
    """
    rules = FlowRules(flow)
    target = config.cluster(flow.target)
    cp_topic = rules.policy.checkpoints_topic(flow.source)
    loaded = load_checkpoints(
        target.librdkafka("consumer"),
        flow.target,
        cp_topic,
        keep=lambda cp: cp.consumer_group_id == group,
    )
    checkpoints = {(cp.topic, cp.partition): (cp, ts) for (cp, ts) in (loaded or {}).values()}
    view, problem = _read_source(config, rules, group)
    return build_report(
        rules,
        group,
        checkpoints,
        int(now() * 1000),
        view,
        problem,
        topics,
        loaded is not None,
    )


def _read_source(
    config: MirrorConfig, rules: FlowRules, group: str
) -> tuple[SourceView | None, str | None]:
    flow = rules.flow
    source = config.cluster(flow.source)
    if not clients.describe_cluster(source.librdkafka("admin"), timeout=5):
        return None, f"cluster {flow.source} does not answer"
    admin = clients.admin_client(source.librdkafka("admin"))
    timeout = rules.settings.admin_timeout
    try:
        every = topic_partitions(admin, timeout=timeout)
    except KafkaException as exc:
        return None, f"the topics of {flow.source} could not be listed: {clients.error_text(exc)}"
    offsets = read_committed(source.librdkafka("consumer"), {group: every}, flow.source, timeout)
    if group not in offsets:
        return None, f"the offsets of group {group} could not be read"
    committed = {key: c.offset for key, c in offsets[group].items()}
    syncs: OffsetSyncStore | None = None
    syncs_problem = None
    # The syncs confirm checkpoints and explain missing ones.
    if committed:
        holder = rules.offset_syncs_holder(source, config.cluster(flow.target))
        try:
            syncs = read_offset_syncs(
                holder.librdkafka("consumer"), holder.alias, rules.offset_syncs_topic
            )
            if syncs is None:
                syncs_problem = f"{rules.offset_syncs_topic} does not exist on {holder.alias}"
        except ReaderError as exc:
            syncs_problem = str(exc)
    return SourceView(committed, syncs, syncs_problem), None


def apply_offsets(config: MirrorConfig, report: Report, accept_inexact: bool = False) -> int:
    """Commit the translated offsets to the group on the target; return how many.

    Only a report whose every row is proven exact (`Report.exact`) is committed; else
    nothing is, and a note says why. With `accept_inexact` the checkpoints are committed
    as they are, proven or not, except one ahead of a group rewound since (the group
    would skip records). Raises ApplyRefused when the group has members on the target
    (their positions would be overwritten under them), KafkaException when the commit
    fails.
    """
    if not report.exact and not accept_inexact:
        waiting = sum(1 for row in report.rows if row.status != OK)
        report.applied = 0
        report.notes.append(
            "nothing applied: "
            + (f"{waiting} partition(s) not proven exact yet" if waiting else "see the problems")
            + "; run it again once every partition is ok, or add --accept-inexact to commit "
            "the checkpoints as they are (records may be read twice)"
        )
        return 0
    target = config.cluster(report.target)
    timeout = config.flow(report.source, report.target).settings.admin_timeout
    found = describe_groups(target.librdkafka("admin"), [report.group], report.target, timeout)
    activity = found.get(report.group)
    if activity is None:
        raise ApplyRefused(
            f"cannot tell whether group {report.group} has members on {report.target}: "
            "describing it failed (see the log); nothing applied"
        )
    if not activity.idle:
        raise ApplyRefused(
            f"group {report.group} has {activity.members} active member(s) on {report.target} "
            f"(state {activity.state}); stop its consumers there first: --apply only sets the "
            "offsets of a group without members"
        )
    offsets = {
        (row.topic, row.partition): CommittedOffset(row.downstream_offset, row.metadata or "")
        for row in report.rows
        if row.downstream_offset is not None and not _ahead_of_group(row)
    }
    commit_group_offsets(target.librdkafka("consumer"), report.group, offsets, timeout)
    report.applied = len(offsets)
    return len(offsets)


def _ahead_of_group(row: PartitionRow) -> bool:
    """The checkpoint is past the group's offset on the source (rewound since)."""
    return (
        row.committed_on_source is not None
        and row.upstream_offset is not None
        and row.committed_on_source < row.upstream_offset
    )


def check_aliases(config: MirrorConfig, source: str, target: str) -> FlowConfig:
    """The flow source->target; ConfigError naming the bad option otherwise."""
    for option, alias in (("--source", source), ("--target", target)):
        if alias not in config.clusters:
            known = ", ".join(config.clusters)
            raise ConfigError(config.path, option, f"unknown cluster {alias!r}; known: {known}")
    if source == target:
        raise ConfigError(config.path, "--target", "must differ from --source")
    return config.flow(source, target)
