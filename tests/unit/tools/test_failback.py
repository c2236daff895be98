"""Failback's pure part (mm2py.tools.failback): returning topics, positions translated back
through the other flow's offset syncs, the divergent tail. No broker."""

from __future__ import annotations

import json
from typing import Any

from mm2py.compat.formats import Checkpoint, OffsetSync
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.config import FlowConfig
from mm2py.config.models import FlowSettings
from mm2py.config.rules import FlowRules
from mm2py.tools.failback import Diverged, divergent_tail, returning_topics, translate_back
from mm2py.tools.failover import FailoverResult
from mm2py.tools.translate import NOT_EXACT, OK, UNTRANSLATED, SourceView, build_report

NOW_MS = 1_700_000_100_000


def _rules(source: str, target: str, **settings: Any) -> FlowRules:
    flow = FlowConfig(source=source, target=target, enabled=True, settings=FlowSettings(**settings))
    return FlowRules(flow)


def _syncs(*syncs: tuple[str, int, int, int]) -> OffsetSyncStore:
    store = OffsetSyncStore()
    store.add_all(OffsetSync(*sync) for sync in syncs)
    return store


def test_returning_topics_are_the_copies_the_other_flow_made() -> None:
    back = _rules("A", "B", topics="orders.*")  # A->B, for the failback B->A
    on_b = {"A.orders": 2, "A.other": 1, "orders": 3, "C.orders": 1, "A.heartbeats": 1}
    assert returning_topics(back, on_b) == {"A.orders": "orders", "A.heartbeats": "heartbeats"}


def _failback_report(committed: dict[tuple[str, int], int]) -> Any:
    """What translate-offsets gives for group g on B->A: untranslated rows for A.orders."""
    return build_report(_rules("B", "A"), "g", {}, NOW_MS, SourceView(committed, OffsetSyncStore()))


def test_positions_on_a_returning_topic_go_back_exact_where_the_syncs_prove_it() -> None:
    report = _failback_report({("A.orders", 0): 150, ("A.orders", 1): 80, ("A.orders", 2): 40})
    assert [r.status for r in report.rows] == [UNTRANSLATED] * 3
    # A->B copied partition 0 contiguously (0..199 at 0..199); partition 1 has a
    # transaction's marker at target 50 (records 50.. at 51..), synced up to 99 -> 100;
    # partition 2 only synced at 0 and at 60: 40 is past what they prove.
    syncs = _syncs(
        ("orders", 0, 0, 0),
        ("orders", 0, 199, 199),
        ("orders", 1, 0, 0),
        ("orders", 1, 50, 51),
        ("orders", 1, 99, 100),
        ("orders", 2, 0, 0),
    )
    back = _rules("A", "B")
    translate_back(report, back, {"A.orders": "orders"}, syncs)
    rows = [
        (r.topic, r.partition, r.upstream_offset, r.downstream_offset, r.status)
        for r in report.rows
    ]
    assert rows == [
        ("orders", 0, 150, 150, OK),
        ("orders", 1, 80, 79, OK),
        ("orders", 2, 40, 1, NOT_EXACT),
    ]
    assert report.rows[2].reason is not None and "not proven" in report.rows[2].reason
    assert not report.exact
    assert report.notes[-1] == (
        "A.orders on B goes back to orders on A, translated through the offset syncs of A->B "
        "(no checkpoint is written for it)"
    )


def test_without_syncs_a_returning_position_is_untranslated_and_says_why() -> None:
    report = _failback_report({("A.orders", 0): 150})
    translate_back(report, _rules("A", "B"), {"A.orders": "orders"}, None, "it timed out")
    (row,) = report.rows
    assert (row.topic, row.status, row.downstream_offset) == ("orders", UNTRANSLATED, None)
    assert row.reason is not None and "it timed out" in row.reason
    report = _failback_report({("A.orders", 0): 150})
    translate_back(report, _rules("A", "B"), {"A.orders": "orders"}, _syncs(("x", 0, 0, 0)))
    assert report.rows[0].status == UNTRANSLATED
    assert "no offset sync of A->B covers A.orders-0 offset 150" in str(report.rows[0].reason)


def test_the_divergent_tail_starts_after_the_last_record_copied() -> None:
    back = _rules("A", "B")
    ends = {("orders", 0): 420, ("orders", 1): 50, ("orders", 2): 30, ("heartbeats", 0): 9}
    # Progress says 299 copied on partition 0; its newest sync says so too. Partition 1:
    # the progress lags the newest sync (49 copied: nothing diverged). Partition 2: a
    # position sync (every record before 28 copied, 28..29 markers or aborted).
    progress = {("orders", 0): 299, ("orders", 1): 40, ("orders", 2): 20}
    syncs = _syncs(("orders", 0, 0, 0), ("orders", 0, 299, 299), ("orders", 1, 49, 49))
    syncs.add(OffsetSync("orders", 2, 28, 26), position=True)
    assert divergent_tail(back, ends, progress, syncs) == [
        Diverged("orders", 0, 120, 300, 419),
        Diverged("orders", 2, 2, 28, 29),
    ]
    # Nothing copied at all: everything A has diverged.
    assert divergent_tail(back, {("new", 0): 5}, {}, syncs) == [Diverged("new", 0, 5, 0, 4)]


def test_the_divergent_tail_as_text_and_json() -> None:
    result = FailoverResult("B", "A", dry_run=True, mode="diverged", ok=True)
    result.diverged = [Diverged("orders", 0, 120, 300, 419), Diverged("orders", 2, 2, 28, 29)]
    assert result.to_text() == (
        "divergent tail: 122 records of A that A -> B never copied to B\n"
        "  orders-0: 120 records, offsets 300 to 419\n"
        "  orders-2: 2 records, offsets 28 to 29\n"
    )
    shown = json.loads(result.to_json())
    assert (shown["mode"], shown["ok"], "groups" in shown) == ("diverged", True, False)
    assert shown["diverged"][0] == {
        "topic": "orders",
        "partition": 0,
        "records": 120,
        "first_offset": 300,
        "last_offset": 419,
    }


def test_a_checkpoint_of_a_returning_topic_is_decided_by_the_syncs() -> None:
    # A checkpoint for A.orders -> orders that some other writer left, at a wrong offset.
    checkpoint = Checkpoint("g", "orders", 0, 150, 120, "meta")
    report = build_report(
        _rules("B", "A"),
        "g",
        {("orders", 0): (checkpoint, NOW_MS - 5000)},
        NOW_MS,
        SourceView({("A.orders", 0): 150}, OffsetSyncStore()),
    )
    assert report.rows[0].checkpoint_age_seconds == 5.0
    syncs = _syncs(("orders", 0, 0, 0), ("orders", 0, 199, 199))
    translate_back(report, _rules("A", "B"), {"A.orders": "orders"}, syncs)
    (row,) = report.rows
    assert (row.status, row.downstream_offset, row.checkpoint_age_seconds) == (OK, 150, None)
