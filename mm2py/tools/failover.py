"""`mm2py failover`: move consumer groups from the source to the target.

`--planned` (the default; producers on the source stopped, the replicator running):
reads the source's end offsets, waits until the flow's progress covers them, waits until
translate-offsets proves every partition of the selected groups exact, and commits on
the target only then. `--disaster` reads only the target: commits each group's newest
checkpoint as it is (at or before its position) and says what was never copied.
`--diverged` writes nothing: it lists a failback's divergent tail.

Invariants: nothing is committed unless every selected group is exact (planned: all or
nothing); a selected group with members on the target refuses the whole command (exit 2);
a group's positions are never moved past a record it did not consume. Exit 0 when every
selected group-partition is done, 1 naming what is missing.
Design: docs/design/failover.md.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.config import FlowConfig, MirrorConfig
from mm2py.config.rules import FlowRules
from mm2py.errors import Mm2pyError
from mm2py.kafka import clients
from mm2py.kafka.clients import error_text
from mm2py.kafka.groups import describe_groups
from mm2py.kafka.internal_topics import load_checkpoints
from mm2py.kafka.reader import ReaderError
from mm2py.kafka.topics import TopicAdminError, list_offsets, partition_counts
from mm2py.replication.progress import ProgressStore
from mm2py.tools.failback import (
    Diverged,
    back_flow,
    diverged,
    read_back_syncs,
    returning_groups,
    returning_topics,
    translate_back,
)
from mm2py.tools.plan import checkpointed_groups
from mm2py.tools.translate import (
    ApplyRefused,
    Report,
    apply_offsets,
    format_text,
    gather,
    to_json,
)

POLL_INTERVAL = 1.0


class FailoverError(Mm2pyError):
    """The failover could not complete; says what is missing (exit 1)."""


@dataclass(frozen=True)
class NotCopied:
    """Records of a source partition the target never got (as far as recorded)."""

    topic: str  # the source topic
    partition: int
    records: int
    first_offset: int
    last_offset: int
    seen_at: str  # ISO-8601 UTC: when the replicator recorded the source's end


@dataclass
class FailoverResult:
    source: str
    target: str
    dry_run: bool
    mode: str = "planned"
    not_copied: list[NotCopied] | None = field(default_factory=list)  # --disaster; None: unknown
    not_copied_unknown: str = ""  # why not_copied is None
    diverged: list[Diverged] = field(default_factory=list)  # --diverged
    behind: dict[str, int] = field(default_factory=dict)  # "topic-partition" -> records not copied
    reports: list[Report] = field(default_factory=list)
    ok: bool = False
    missing: list[str] = field(default_factory=list)  # what kept it from ok

    def to_json(self) -> str:
        data: dict[str, Any] = {
            "mode": self.mode,
            "source": self.source,
            "target": self.target,
            "dry_run": self.dry_run,
            "ok": self.ok,
            "missing": self.missing,
            "groups": [to_json(r) for r in self.reports],
        }
        if self.mode == "diverged":
            del data["groups"]
            data["diverged"] = [asdict(d) for d in self.diverged]
        elif self.mode == "planned":
            data["not_copied_yet"] = self.behind
        else:
            if self.not_copied is None:
                data["not_copied"] = None
                data["not_copied_unknown"] = self.not_copied_unknown
            else:
                data["not_copied"] = [asdict(n) for n in self.not_copied]
        return json.dumps(data, indent=2) + "\n"

    def to_text(self) -> str:
        if self.mode == "diverged":
            return self._diverged_text()
        lines = [format_text(r) for r in self.reports]
        if self.behind:
            behind = ", ".join(f"{tp} ({n} records)" for tp, n in sorted(self.behind.items()))
            lines.append(f"not copied yet: {behind}\n")
        if self.mode == "disaster":
            lines += self._never_copied_text()
        verdict = (
            f"failover {self.source} -> {self.target}: "
            + ("dry run, nothing committed; " if self.dry_run else "")
            + (
                f"{len(self.reports)} groups {'would move' if self.dry_run else 'moved'}, "
                + ("every partition exact" if self.mode == "planned" else "at their checkpoints")
                if self.ok
                else "not done: " + "; ".join(self.missing)
            )
        )
        lines.append(verdict + "\n")
        return "".join(lines)

    def _never_copied_text(self) -> list[str]:
        if self.not_copied is None:
            return [f"never copied: not known: {self.not_copied_unknown}\n"]
        lost = sum(n.records for n in self.not_copied)
        return [f"never copied: {lost} records\n"] + [
            f"  {n.topic}-{n.partition}: {n.records} records, offsets {n.first_offset} to "
            f"{n.last_offset} (the source's end as seen at {n.seen_at})\n"
            for n in self.not_copied
        ]

    def _diverged_text(self) -> str:
        tail = sum(d.records for d in self.diverged)
        lines = [
            f"divergent tail: {tail} records of {self.target} that {self.target} -> "
            f"{self.source} never copied to {self.source}\n"
        ]
        lines += [
            f"  {d.topic}-{d.partition}: {d.records} records, offsets {d.first_offset} to "
            f"{d.last_offset}\n"
            for d in self.diverged
        ]
        return "".join(lines)


def planned_failover(
    config: MirrorConfig,
    flow: FlowConfig,
    groups: re.Pattern[str] | None,
    timeout: float,
    dry_run: bool,
    clock: Callable[[], float] = time.monotonic,
) -> FailoverResult:
    """Steps 1-5 of the module's contract; the result says what was done."""
    rules = FlowRules(flow)
    deadline = clock() + timeout
    result = FailoverResult(flow.source, flow.target, dry_run)
    source_admin = clients.admin_client(config.cluster(flow.source).librdkafka("admin"))
    try:
        counts = partition_counts(source_admin, rules.settings.admin_timeout)
    except KafkaException as exc:
        raise FailoverError(
            f"cannot list the topics of cluster {flow.source}: {error_text(exc)}; a planned "
            "failover needs the source"
        ) from None
    copied = {t: n for t, n in counts.items() if rules.should_replicate(t)}
    ends = _end_offsets(source_admin, flow, copied)
    back = back_flow(config, flow)
    back_rules = FlowRules(back) if back is not None else None
    returning = returning_topics(back_rules, counts) if back_rules is not None else {}
    # 2. Everything the source had is copied.
    while True:
        try:
            result.behind = _not_copied(config, flow, ends)
        except FailoverError:
            if clock() >= deadline:
                raise
            time.sleep(POLL_INTERVAL)  # e.g. a progress topic whose leader is not known yet
            continue
        if not result.behind or clock() >= deadline:
            break
        time.sleep(POLL_INTERVAL)
    # 3. Every selected group proven exact.
    candidates = set(checkpointed_groups(config, rules, source_admin, counts))
    candidates |= set(returning_groups(config, rules, source_admin, counts, returning))
    names = sorted(g for g in candidates if groups is None or groups.fullmatch(g))
    while True:
        result.reports = [gather(config, flow, g) for g in names]
        if back_rules is not None and returning:
            syncs, problem = read_back_syncs(config, back_rules)
            for report in result.reports:
                translate_back(report, back_rules, returning, syncs, problem)
        if all(r.exact for r in result.reports) or clock() >= deadline:
            break
        time.sleep(POLL_INTERVAL)
    if result.behind:
        result.missing.append(f"{len(result.behind)} partition(s) not copied to their end yet")
    waiting = [r.group for r in result.reports if not r.exact]
    if waiting:
        result.missing.append(f"group(s) not proven exact yet: {', '.join(waiting)}")
    if not names:
        result.missing.append(
            "no group to move (none of the flow's checkpointed groups matches --groups)"
        )
    if result.missing:
        return result
    # 4. No group in use on the target, checked for all before any commit.
    _refuse_active(config, flow, names)
    # 5. Commit.
    if not dry_run:
        for report in result.reports:
            try:
                apply_offsets(config, report)
            except KafkaException as exc:
                raise FailoverError(
                    f"committing the offsets of group {report.group} on {flow.target} failed: "
                    f"{error_text(exc)}; groups before it in the output were moved"
                ) from None
    result.ok = True
    return result


def _end_offsets(
    admin: Any, flow: FlowConfig, copied: dict[str, int]
) -> dict[tuple[str, int], int]:
    latest: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    specs = {TopicPartition(t, p): latest for t, n in copied.items() for p in range(n)}
    try:
        return list_offsets(admin, flow.source, specs, flow.settings.admin_timeout)
    except TopicAdminError as exc:
        raise FailoverError(str(exc)) from None


def _not_copied(
    config: MirrorConfig, flow: FlowConfig, ends: dict[tuple[str, int], int]
) -> dict[str, int]:
    """Partitions whose recorded progress is short of the end read at the start."""
    store = ProgressStore.of_flow(flow, config.cluster(flow.target).librdkafka("producer"))
    try:
        progress = store.load(past_open_transactions=True)
    except (ReaderError, TimeoutError, TopicAdminError) as exc:
        raise FailoverError(f"reading {flow.offsets_topic} on {flow.target}: {exc}") from None
    finally:
        store.close()
    behind: dict[str, int] = {}
    for (topic, partition), end in ends.items():
        done = progress.get((topic, partition), -1) + 1
        if done < end:
            behind[f"{topic}-{partition}"] = end - done
    return behind


def _refuse_active(config: MirrorConfig, flow: FlowConfig, groups: list[str]) -> None:
    target = config.cluster(flow.target).librdkafka("admin")
    found = describe_groups(target, groups, flow.target, flow.settings.admin_timeout)
    active = [
        f"{g} ({found[g].members} members)" for g in groups if g in found and not found[g].idle
    ]
    unknown = [g for g in groups if g not in found]
    if active:
        raise ApplyRefused(
            f"group(s) with active members on {flow.target}: {', '.join(active)}; stop their "
            "consumers there first. Nothing was committed"
        )
    if unknown:
        raise ApplyRefused(
            f"cannot tell whether group(s) {', '.join(unknown)} have members on {flow.target}; "
            "nothing was committed"
        )


def disaster_failover(
    config: MirrorConfig, flow: FlowConfig, groups: re.Pattern[str] | None, dry_run: bool
) -> FailoverResult:
    """The disaster contract of the module: the target only, nothing waited for."""
    rules = FlowRules(flow)
    result = FailoverResult(flow.source, flow.target, dry_run, mode="disaster")
    target = config.cluster(flow.target)
    try:
        loaded = load_checkpoints(
            target.librdkafka("consumer"),
            flow.target,
            rules.policy.checkpoints_topic(flow.source),
            keep=lambda cp: groups is None or groups.fullmatch(cp.consumer_group_id) is not None,
        )
    except ReaderError as exc:
        raise FailoverError(str(exc)) from None
    names = sorted({cp.consumer_group_id for cp, _ts in (loaded or {}).values()})
    result.reports = [gather(config, flow, g) for g in names]
    incomplete = [r.group for r in result.reports if not r.complete and r.rows]
    result.not_copied, result.not_copied_unknown = _never_copied(config, flow)
    if not names:
        result.missing.append("no group has checkpoints (matching --groups) on the target")
        return result
    _refuse_active(config, flow, names)
    if not dry_run:
        for report in result.reports:
            try:
                apply_offsets(config, report, accept_inexact=True)
            except KafkaException as exc:
                raise FailoverError(
                    f"committing the offsets of group {report.group} on {flow.target} failed: "
                    f"{error_text(exc)}; groups before it in the output were moved"
                ) from None
    if incomplete:
        result.missing.append(f"group(s) with untranslated partitions: {', '.join(incomplete)}")
    result.ok = not result.missing
    return result


def diverged_tail(config: MirrorConfig, flow: FlowConfig) -> FailoverResult:
    """`--diverged`: the divergent tail, nothing written."""
    result = FailoverResult(flow.source, flow.target, dry_run=True, mode="diverged")
    result.diverged = diverged(config, flow)
    result.ok = True
    return result


def _never_copied(config: MirrorConfig, flow: FlowConfig) -> tuple[list[NotCopied] | None, str]:
    """What the target never got, from the source ends recorded beside the progress; None
    and why when no end of the flow's topics is recorded (nothing is created on the
    target: a --dry-run writes nothing)."""
    target = config.cluster(flow.target)
    unknown = (
        f"no source end offsets of {flow.source}'s topics are recorded in {flow.offsets_topic} "
        f"on {flow.target} (mm2py's replicator records them every 10 s; MM2 does not)"
    )
    admin = clients.admin_client(target.librdkafka("admin"))
    try:
        if flow.offsets_topic not in partition_counts(admin, flow.settings.admin_timeout):
            return None, unknown
    except KafkaException as exc:
        raise FailoverError(f"listing the topics of {flow.target}: {error_text(exc)}") from None
    store = ProgressStore.of_flow(flow, target.librdkafka("producer"))
    ends: dict[tuple[str, int], tuple[int, int]] = {}
    try:
        progress = store.load(past_open_transactions=True, source_ends=ends)
    except (ReaderError, TimeoutError) as exc:
        raise FailoverError(f"reading {flow.offsets_topic} on {flow.target}: {exc}") from None
    finally:
        store.close()
    rules = FlowRules(flow)
    # Ends of other topics were recorded when the flow's topics were others.
    recorded = sorted((tp, end) for tp, end in ends.items() if rules.should_replicate(tp[0]))
    if not recorded:
        return None, unknown
    found = []
    for (topic, partition), (end, seen_at) in recorded:
        first = progress.get((topic, partition), -1) + 1
        if end > first:
            when = datetime.fromtimestamp(seen_at / 1000, UTC).isoformat(timespec="milliseconds")
            found.append(NotCopied(topic, partition, end - first, first, end - 1, when))
    return found, ""
