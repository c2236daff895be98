"""translate-offsets' report (mm2py.tools.translate): rows, reasons, text and JSON, no broker."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mm2py.compat.formats import Checkpoint, OffsetSync
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.compat.policy import DefaultReplicationPolicy, IdentityReplicationPolicy
from mm2py.config import FlowConfig, MirrorConfig, load_config
from mm2py.config.models import FlowSettings
from mm2py.config.rules import FlowRules
from mm2py.tools.translate import (
    SourceView,
    apply_offsets,
    build_report,
    format_age,
    format_json,
    format_text,
    source_topic_of,
)

NOW_MS = 1_700_000_100_000


def _rules(**settings: Any) -> FlowRules:
    flow = FlowConfig(source="A", target="B", enabled=True, settings=FlowSettings(**settings))
    return FlowRules(flow)


def _config(tmp_path: Path) -> MirrorConfig:
    path = tmp_path / "mm2.properties"
    # Port 9 (discard): nothing answers there; a test that reaches a cluster fails.
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = 127.0.0.1:9\nB.bootstrap.servers = 127.0.0.1:9\n"
        "A->B.enabled = true\n"
    )
    return load_config(path)


def _checkpoints(*cps: tuple[str, int, int, int, float]) -> dict[Any, tuple[Checkpoint, int]]:
    """(remote topic, partition, upstream, downstream, age in s) -> what load_checkpoints gives."""
    return {
        (topic, p): (Checkpoint("g", topic, p, up, down, "meta"), NOW_MS - int(age * 1000))
        for topic, p, up, down, age in cps
    }


def _syncs(*syncs: tuple[str, int, int, int]) -> OffsetSyncStore:
    store = OffsetSyncStore()
    store.add_all(OffsetSync(*sync) for sync in syncs)
    return store


def test_checkpoints_alone_are_not_proven_exact_and_say_what_they_wait_for() -> None:
    report = build_report(
        _rules(),
        "g",
        _checkpoints(("A.orders", 1, 50, 40, 3.25), ("A.orders", 0, 10, 9, 75)),
        NOW_MS,
        source_problem="cluster A does not answer",
    )
    assert [
        (r.topic, r.partition, r.upstream_offset, r.downstream_offset) for r in report.rows
    ] == [
        ("A.orders", 0, 10, 9),
        ("A.orders", 1, 50, 40),
    ]
    assert [r.checkpoint_age_seconds for r in report.rows] == [75.0, 3.25]
    # Neither the group's offsets nor the syncs were read: nothing proves a position.
    assert {r.status for r in report.rows} == {"not exact yet"}
    assert all(
        "A was not read (cluster A does not answer)" in (r.reason or "")
        and "waits for A to answer" in (r.reason or "")
        for r in report.rows
    )
    assert report.rows[0].source_topic == "orders"
    assert report.rows[0].metadata == "meta"
    assert report.problems == []
    assert report.notes and "cluster A does not answer" in report.notes[0]
    assert report.complete and not report.exact


def test_every_committed_partition_is_reported_with_why_it_is_not_translated() -> None:
    view = SourceView(
        committed={
            ("orders", 0): 10,  # checkpointed, current, proven by the syncs
            ("orders", 1): 60,  # checkpointed at 50: the group moved on since
            ("orders", 2): 5,  # before the oldest sync
            ("orders", 3): 7,  # no syncs at all
            ("orders", 4): 70,  # synced, but no checkpoint yet
            ("mm2-offset-syncs.B.internal", 0): 3,  # internal: never replicated
        },
        syncs=_syncs(("orders", 0, 10, 9), ("orders", 2, 100, 0), ("orders", 4, 0, 0)),
    )
    report = build_report(
        _rules(),
        "g",
        _checkpoints(("A.orders", 0, 10, 9, 1), ("A.orders", 1, 50, 40, 1)),
        NOW_MS,
        view,
    )
    rows = {(r.source_topic, r.partition): r for r in report.rows}
    assert len(rows) == 6
    assert rows[("orders", 0)].status == "ok"
    behind = rows[("orders", 1)]
    assert (behind.status, behind.downstream_offset, behind.committed_on_source) == (
        "not exact yet",
        40,
        60,
    )
    assert "committed 60 on A since; waits for the next checkpoint" in (behind.reason or "")
    assert rows[("orders", 2)].status == "untranslated"
    assert "older than the oldest offset sync (100)" in (rows[("orders", 2)].reason or "")
    assert "no offset syncs for orders-3" in (rows[("orders", 3)].reason or "")
    assert "not checkpointed yet" in (rows[("orders", 4)].reason or "")
    internal = rows[("mm2-offset-syncs.B.internal", 0)]
    assert "not replicated by A->B" in (internal.reason or "")
    assert all(r.downstream_offset is None for r in report.rows if r.status == "untranslated")
    assert not report.complete and not report.exact


def test_unreadable_offset_syncs_are_named_as_the_reason() -> None:
    problem = "mm2-offset-syncs.B.internal does not exist on A"
    view = SourceView({("orders", 0): 1}, None, problem)
    (row,) = build_report(_rules(), "g", {}, NOW_MS, view).rows
    assert row.status == "untranslated"
    assert problem in (row.reason or "")
    # A checkpoint the syncs cannot confirm is not proven exact, whatever it says.
    view = SourceView({("orders", 0): 1}, None, problem)
    report = build_report(_rules(), "g", _checkpoints(("A.orders", 0, 1, 1, 1)), NOW_MS, view)
    (row,) = report.rows
    assert row.status == "not exact yet"
    assert f"the offset syncs could not be read ({problem}); waits for them" in (row.reason or "")
    assert report.complete and not report.exact


def test_group_level_problems() -> None:
    rules = _rules(**{"groups.exclude": ["g"]})
    report = build_report(rules, "g", {}, NOW_MS, SourceView({}), checkpoints_topic_exists=False)
    assert any("A.checkpoints.internal on B does not exist" in p for p in report.problems)
    assert any("excluded by groups / groups.exclude" in p for p in report.problems)

    report = build_report(_rules(), "g", {}, NOW_MS, SourceView({}))
    assert report.problems == [
        "group g has no committed offsets on A and no checkpoints in A.checkpoints.internal on B"
    ]
    report = build_report(_rules(), "g", {}, NOW_MS, None, "cluster A does not answer")
    assert report.problems == ["no checkpoints for group g in A.checkpoints.internal on B"]
    assert not report.complete


def test_topic_selection_by_source_or_remote_name() -> None:
    cps = _checkpoints(("A.orders", 0, 1, 1, 1), ("A.users", 0, 2, 2, 1))
    view = SourceView({("orders", 0): 1, ("users", 0): 2, ("audit", 0): 3})
    for wanted in (["orders"], ["A.orders"]):
        report = build_report(_rules(), "g", cps, NOW_MS, view, topics=wanted)
        assert [r.topic for r in report.rows] == ["A.orders"]
    report = build_report(_rules(), "g", cps, NOW_MS, view, topics=["nope"])
    assert report.rows == []
    assert report.problems == ["no partition of group g belongs to --topic nope"]


def test_a_rewind_on_the_source_and_a_dropped_partition_are_not_exact() -> None:
    cps = _checkpoints(("A.orders", 0, 50, 50, 1), ("A.orders", 1, 5, 5, 1))
    syncs = _syncs(("orders", 0, 0, 0), ("orders", 1, 0, 0), ("orders", 1, 9, 9))
    report = build_report(_rules(), "g", cps, NOW_MS, SourceView({("orders", 0): 20}, syncs))
    first, second = report.rows
    assert first.status == "not exact yet"
    assert "rewound to 20 on A since; waits for the next checkpoint" in (first.reason or "")
    assert second.status == "not exact yet"
    assert "no committed offset for this partition on A" in (second.reason or "")
    assert report.complete and not report.exact


def test_source_topic_of_inverts_checkpoint_naming() -> None:
    default = DefaultReplicationPolicy()
    assert source_topic_of(default, "A.orders", "A", "B") == "orders"
    # On A, B.orders came from B; its checkpoint names the original, orders.
    assert source_topic_of(default, "orders", "A", "B") == "B.orders"
    assert source_topic_of(default, "A.C.orders", "A", "B") == "C.orders"
    identity = IdentityReplicationPolicy(source_cluster_alias="A")
    assert source_topic_of(identity, "orders", "A", "B") == "orders"


def test_text_table() -> None:
    view = SourceView({("orders", 0): 10, ("orders", 1): 3}, _syncs(("orders", 0, 10, 9)))
    report = build_report(_rules(), "g", _checkpoints(("A.orders", 0, 10, 9, 2.5)), NOW_MS, view)
    report.applied = 1
    assert format_text(report).splitlines() == [
        "group g: A -> B (checkpoints in A.checkpoints.internal on B)",
        "TOPIC     PARTITION  UPSTREAM  DOWNSTREAM  AGE   STATUS        NOTE",
        "A.orders  0          10        9           2.5s  ok",
        "A.orders  1          -         -           -     untranslated  no offset syncs for "
        "orders-1: none of its records has been replicated yet",
        "1 of 2 partitions translated, 1 exact; 1 offsets applied",
    ]


def test_json_has_every_row_and_the_verdict() -> None:
    report = build_report(
        _rules(), "g", _checkpoints(("A.orders", 0, 10, 9, 2)), NOW_MS, SourceView({})
    )
    data = json.loads(format_json(report))
    assert (data["complete"], data["exact"]) == (True, False)
    assert data["rows"] == [
        {
            "topic": "A.orders",
            "source_topic": "orders",
            "partition": 0,
            "status": "not exact yet",
            "upstream_offset": 10,
            "downstream_offset": 9,
            "checkpoint_age_seconds": 2.0,
            "metadata": "meta",
            "committed_on_source": None,
            "reason": "not proven: the group has no committed offset for this partition on A; "
            "waits for it to commit one there",
        }
    ]
    assert data["applied"] is None
    assert (data["source"], data["target"], data["group"]) == ("A", "B", "g")


def test_ages_read_at_a_glance() -> None:
    assert [format_age(s) for s in (None, 0.04, 59.9, 61, 3600 * 5 + 62, 86400 * 3 + 3600)] == [
        "-",
        "0.0s",
        "59.9s",
        "1m01s",
        "5h01m",
        "3d01h",
    ]


def test_only_a_checkpoint_the_offset_syncs_prove_exact_is_ok() -> None:
    cps = _checkpoints(
        ("A.t", 0, 50, 1, 1), ("A.t", 1, 50, 40, 1), ("A.t", 2, 50, 50, 1), ("A.t", 3, 50, 9, 1)
    )
    view = SourceView(
        {("t", 0): 50, ("t", 1): 50, ("t", 2): 50, ("t", 3): 50},
        _syncs(("t", 0, 0, 0), ("t", 1, 0, 0), ("t", 1, 60, 60), ("t", 2, 0, 0), ("t", 2, 49, 49)),
    )
    report = build_report(_rules(), "g", cps, NOW_MS, view)
    first, second, third, fourth = report.rows
    # Written while the replicator was behind the group: safe, not yet exact.
    assert first.status == "not exact yet"
    assert "do not prove where 50 is" in (first.reason or "")
    assert "waits for the replicator's sync" in (first.reason or "")
    assert second.status == "not exact yet"
    assert "now translate to 50; waits for the next checkpoint" in (second.reason or "")
    assert (third.status, third.reason) == ("ok", None)
    # No sync of t-3 at all (its syncs topic made anew): nothing proves the checkpoint.
    assert fourth.status == "not exact yet"
    assert "no offset sync covers t-3 offset 50" in (fourth.reason or "")
    assert report.complete and not report.exact


def test_issue_24_a_checkpoint_written_before_the_last_sync_is_not_exact_yet(
    tmp_path: Path,
) -> None:
    """The checkpoint (301 -> 251) was written while the syncs were (0 -> 0), (251 -> 250);
    (450 -> 449) then proves 301 -> 300: the row waits for the next checkpoint."""
    syncs = _syncs(("t", 0, 0, 0), ("t", 0, 251, 250))
    view = SourceView({("t", 0): 301}, syncs)
    cps = _checkpoints(("A.t", 0, 301, 251, 1))
    report = build_report(_rules(), "g", cps, NOW_MS, view)
    assert [r.status for r in report.rows] == ["not exact yet"]
    # --apply commits nothing (before any call to a cluster) and says why.
    assert apply_offsets(_config(tmp_path), report) == 0
    assert report.applied == 0
    assert "nothing applied: 1 partition(s) not proven exact yet" in report.notes[-1]
    assert "--accept-inexact" in report.notes[-1]
    syncs.add(OffsetSync("t", 0, 450, 449))
    (row,) = build_report(_rules(), "g", cps, NOW_MS, view).rows
    assert row.status == "not exact yet"
    assert "now translate to 300" in (row.reason or "")
    report = build_report(_rules(), "g", _checkpoints(("A.t", 0, 301, 300, 1)), NOW_MS, view)
    assert [r.status for r in report.rows] == ["ok"]
    assert report.exact
