"""translate-offsets' report (mm2py.tools.translate): rows, reasons, text and JSON, no broker."""

from __future__ import annotations

import json
from typing import Any

from mm2py.compat.flow import FlowRules
from mm2py.compat.formats import Checkpoint, OffsetSync
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.compat.policy import DefaultReplicationPolicy, IdentityReplicationPolicy
from mm2py.config import FlowConfig
from mm2py.config.models import FlowSettings
from mm2py.tools.translate import (
    SourceView,
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


def test_checkpoints_alone_give_rows_and_a_note_that_the_source_was_not_read() -> None:
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
    assert {r.status for r in report.rows} == {"ok"}
    assert report.rows[0].source_topic == "orders"
    assert report.rows[0].metadata == "meta"
    assert report.problems == []
    assert report.notes and "cluster A does not answer" in report.notes[0]
    assert report.complete


def test_every_committed_partition_is_reported_with_why_it_is_not_translated() -> None:
    view = SourceView(
        committed={
            ("orders", 0): 10,  # checkpointed, current
            ("orders", 1): 60,  # checkpointed at 50: the group moved on since
            ("orders", 2): 5,  # before the oldest sync
            ("orders", 3): 7,  # no syncs at all
            ("orders", 4): 70,  # synced, but no checkpoint yet
            ("mm2-offset-syncs.B.internal", 0): 3,  # internal: never replicated
        },
        syncs=_syncs(("orders", 2, 100, 0), ("orders", 4, 0, 0)),
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
    stale = rows[("orders", 1)]
    assert (stale.status, stale.downstream_offset, stale.committed_on_source) == ("stale", 40, 60)
    assert "committed 60" in (stale.reason or "")
    assert rows[("orders", 2)].status == "untranslated"
    assert "older than the oldest offset sync (100)" in (rows[("orders", 2)].reason or "")
    assert "no offset syncs for orders-3" in (rows[("orders", 3)].reason or "")
    assert "not checkpointed yet" in (rows[("orders", 4)].reason or "")
    internal = rows[("mm2-offset-syncs.B.internal", 0)]
    assert "not replicated by A->B" in (internal.reason or "")
    assert all(r.downstream_offset is None for r in report.rows if r.status == "untranslated")
    assert not report.complete


def test_unreadable_offset_syncs_are_named_as_the_reason() -> None:
    view = SourceView({("orders", 0): 1}, None, "mm2-offset-syncs.B.internal does not exist on A")
    (row,) = build_report(_rules(), "g", {}, NOW_MS, view).rows
    assert row.status == "untranslated"
    assert "mm2-offset-syncs.B.internal does not exist on A" in (row.reason or "")


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


def test_a_rewind_on_the_source_and_a_dropped_partition_are_stale() -> None:
    cps = _checkpoints(("A.orders", 0, 50, 50, 1), ("A.orders", 1, 5, 5, 1))
    report = build_report(_rules(), "g", cps, NOW_MS, SourceView({("orders", 0): 20}))
    first, second = report.rows
    assert (first.status, "rewound to 20" in (first.reason or "")) == ("stale", True)
    assert (second.status, "no committed offset" in (second.reason or "")) == ("stale", True)
    assert report.complete  # stale is translated: a failover re-reads, it loses nothing


def test_source_topic_of_inverts_checkpoint_naming() -> None:
    default = DefaultReplicationPolicy()
    assert source_topic_of(default, "A.orders", "A", "B") == "orders"
    # On A, B.orders came from B; its checkpoint names the original, orders.
    assert source_topic_of(default, "orders", "A", "B") == "B.orders"
    assert source_topic_of(default, "A.C.orders", "A", "B") == "C.orders"
    identity = IdentityReplicationPolicy(source_cluster_alias="A")
    assert source_topic_of(identity, "orders", "A", "B") == "orders"


def test_text_table() -> None:
    view = SourceView({("orders", 0): 10, ("orders", 1): 3}, _syncs())
    report = build_report(_rules(), "g", _checkpoints(("A.orders", 0, 10, 9, 2.5)), NOW_MS, view)
    report.applied = 1
    assert format_text(report).splitlines() == [
        "group g: A -> B (checkpoints in A.checkpoints.internal on B)",
        "TOPIC     PARTITION  UPSTREAM  DOWNSTREAM  AGE   STATUS        NOTE",
        "A.orders  0          10        9           2.5s  ok",
        "A.orders  1          -         -           -     untranslated  no offset syncs for "
        "orders-1: none of its records has been replicated yet",
        "1 of 2 partitions translated; 1 offsets applied",
    ]


def test_json_has_every_row_and_the_verdict() -> None:
    report = build_report(
        _rules(), "g", _checkpoints(("A.orders", 0, 10, 9, 2)), NOW_MS, SourceView({})
    )
    data = json.loads(format_json(report))
    assert data["complete"] is True
    assert data["rows"] == [
        {
            "topic": "A.orders",
            "source_topic": "orders",
            "partition": 0,
            "status": "stale",
            "upstream_offset": 10,
            "downstream_offset": 9,
            "checkpoint_age_seconds": 2.0,
            "metadata": "meta",
            "committed_on_source": None,
            "reason": "the group has no committed offset here on A",
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


def test_the_offset_syncs_confirm_a_checkpoint_or_say_a_better_one_is_coming() -> None:
    cps = _checkpoints(("A.t", 0, 50, 1, 1), ("A.t", 1, 50, 40, 1), ("A.t", 2, 50, 50, 1))
    view = SourceView(
        {("t", 0): 50, ("t", 1): 50, ("t", 2): 50},
        _syncs(("t", 0, 0, 0), ("t", 1, 0, 0), ("t", 1, 60, 60), ("t", 2, 0, 0), ("t", 2, 49, 49)),
    )
    first, second, third = build_report(_rules(), "g", cps, NOW_MS, view).rows
    # Written while the replicator was behind the group: safe, not yet exact.
    assert (first.status, "not exact yet" in (first.reason or "")) == ("stale", True)
    assert (second.status, "now translate to 50" in (second.reason or "")) == ("stale", True)
    assert (third.status, third.reason) == ("ok", None)
