"""The fault scenario's pure parts (tests/faults_scenario.py): its plan, its flows, its
config and its counts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from mm2py.config.loader import load_config
from mm2py.dev.launcher import LocalCluster
from tests.faults_scenario import (
    SUITE,
    TASKS,
    Copy,
    Counts,
    _config,
    copies,
    count,
    plan,
    sequence_of,
    source_faults,
)


def test_a_copy_of_every_record_once_in_order_is_exact() -> None:
    counts = count(range(4), [0, 1, 2, 3])
    assert counts == Counts(4, 4, 0, 0, 0, 0)
    assert counts.exact


def test_a_replay_counts_as_duplicates_not_out_of_order() -> None:
    # Back to record 1 after record 3 (a restart from recorded progress), then on.
    assert count(range(5), [0, 1, 2, 3, 1, 2, 3, 4]) == Counts(5, 8, 0, 3, 0, 0)


def test_a_record_first_copied_after_a_later_one_is_out_of_order() -> None:
    counts = count(range(4), [0, 2, 1, 3])
    assert counts == Counts(4, 4, 0, 0, 1, 0)
    assert not counts.exact


def test_records_never_copied_are_lost() -> None:
    assert count(range(5), [0, 1, 4]) == Counts(5, 3, 2, 0, 0, 0)
    assert count(range(3), []) == Counts(3, 0, 3, 0, 0, 0)


def test_records_of_another_partition_or_never_produced_are_foreign() -> None:
    assert count(range(2), [0, None, 1, 2]) == Counts(2, 4, 0, 0, 0, 2)


def test_copies_are_counted_against_what_the_source_holds() -> None:
    # The source lost records 2 and 3 after acknowledging them: copying the rest once
    # each is exact; a copy of a record the source never held is foreign.
    assert count([0, 1, 4, 5], [0, 1, 4, 5]).exact
    assert count([0, 1, 4, 5], [0, 1, 2, 4, 5]) == Counts(4, 5, 0, 0, 0, 1)
    assert count([0, 1, 4, 5], [0, 4, 5]) == Counts(4, 3, 1, 0, 0, 0)


def test_a_record_the_source_holds_twice_needs_two_copies() -> None:
    # As after an idempotent producer's epoch bump that sent record 2 again.
    assert count([0, 1, 2, 2, 3], [0, 1, 2, 2, 3]).exact
    assert count([0, 1, 2, 2, 3], [0, 1, 2, 3]) == Counts(5, 4, 1, 0, 0, 0)
    assert count([0, 1, 2, 2, 3], [0, 1, 2, 2, 2, 3]) == Counts(5, 6, 0, 1, 0, 0)
    # A source that holds 3 before 2: copies in the source's order are in order.
    assert count([0, 1, 3, 2], [0, 1, 3, 2]).exact
    assert count([0, 1, 3, 2], [0, 1, 2, 3]) == Counts(4, 4, 0, 0, 1, 0)


def test_where_the_source_breaks_its_producers_guarantee_is_named() -> None:
    acknowledged = {n: 100 + n for n in range(10)}
    assert source_faults(list(range(10)), acknowledged) == []
    assert source_faults([0, 1, 5, 6, 9], acknowledged) == [
        "lacks records 2..4 (acknowledged at offsets 102..104)",
        "lacks records 7..8 (acknowledged at offsets 107..108)",
    ]
    assert source_faults([*range(10), 9], acknowledged) == ["holds record 9 2 times"]
    assert source_faults([0, 2, 1, *range(3, 10)], acknowledged) == [
        "holds 1 records after later ones, from record 1"
    ]


def test_a_source_that_holds_records_never_acknowledged_is_refused() -> None:
    with pytest.raises(ValueError, match="holds 1 records never acknowledged, from 12"):
        source_faults([0, 1, 12], {n: n for n in range(10)})


def test_counts_add_up_field_by_field() -> None:
    assert Counts(1, 2, 3, 4, 5, 6) + Counts(10, 20, 30, 40, 50, 60) == Counts(
        11, 22, 33, 44, 55, 66
    )


def test_a_value_carries_its_partition_and_sequence() -> None:
    assert sequence_of(3, b"3:17") == 17
    assert sequence_of(2, b"3:17") is None
    assert sequence_of(3, b"garbage") is None
    assert sequence_of(3, None) is None


def test_the_plan_has_every_fault_once_and_ten_node_kills_the_same_for_a_seed() -> None:
    faults = plan(7)
    assert plan(7) == faults
    assert plan(8) != faults
    assert Counter(f.kind for f in faults) == {
        "kill-node": 10,
        "kill-target-broker": 1,
        "stop-source-broker": 1,
        "zombie-node": 1,
    }
    assert all(2.0 <= f.gap_s <= 8.0 for f in faults)
    assert all(0.0 <= f.down_s <= 2.0 for f in faults if f.kind != "stop-source-broker")
    assert [f.down_s for f in faults if f.kind == "stop-source-broker"] == [20.0]
    assert {f.node for f in faults if f.kind == "kill-node"} <= {0, 1, 2}


def test_the_suites_plan_has_every_fault_once_four_node_kills_closer_together() -> None:
    faults = plan(7, SUITE)
    assert Counter(f.kind for f in faults) == {
        "kill-node": 4,
        "kill-target-broker": 1,
        "stop-source-broker": 1,
        "zombie-node": 1,
    }
    assert all(2.0 <= f.gap_s <= 4.0 for f in faults)
    assert [f.down_s for f in faults if f.kind == "stop-source-broker"] == [12.0]


def test_each_further_copier_copies_a_topic_of_its_own_from_another_alias_of_a() -> None:
    assert copies("t", [None, "record"]) == [Copy("A", "t", None), Copy("A1", "t-1", "record")]
    assert [c.remote for c in copies("t", [None, "record"])] == ["A.t", "A1.t-1"]
    assert copies("t", [None]) == [Copy("A", "t", None)]


def test_the_config_runs_one_flow_per_copier_and_nothing_else(tmp_path: Path) -> None:
    a = LocalCluster("A", 19092, False, tmp_path / "A")
    b = LocalCluster("B", 19192, False, tmp_path / "B")
    flows = copies("t", [None, "record"])
    config = load_config(_config(tmp_path, a, b, flows, "exactly-once"))
    enabled = {f.name: f for f in config.flows if f.enabled}
    assert sorted(enabled) == ["A->B", "A1->B"]
    # The aliases of A are one cluster; each flow copies only its own topic.
    assert config.clusters["A1"].bootstrap_servers == a.bootstrap_servers
    assert enabled["A->B"].settings.topics == ["t"]
    assert enabled["A1->B"].settings.topics == ["t-1"]
    assert enabled["A->B"].settings.replication_copy_mode == "auto"
    assert enabled["A1->B"].settings.replication_copy_mode == "record"
    assert all(f.settings.tasks_max == TASKS for f in enabled.values())
    # No heartbeats between the aliases of A or back from B.
    emitting = {f.name for f in config.flows if f.heartbeats_enabled}
    assert emitting == {"A->B", "A1->B"}
