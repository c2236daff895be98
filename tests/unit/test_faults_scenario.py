"""The fault scenario's pure parts (tests/faults_scenario.py): its plan and its counts."""

from __future__ import annotations

from collections import Counter

from tests.faults_scenario import SUITE, Counts, count, plan, sequence_of


def test_a_copy_of_every_record_once_in_order_is_exact() -> None:
    counts = count(4, [0, 1, 2, 3])
    assert counts == Counts(4, 4, 0, 0, 0, 0)
    assert counts.exact


def test_a_replay_counts_as_duplicates_not_out_of_order() -> None:
    # Back to record 1 after record 3 (a restart from recorded progress), then on.
    assert count(5, [0, 1, 2, 3, 1, 2, 3, 4]) == Counts(5, 8, 0, 3, 0, 0)


def test_a_record_first_copied_after_a_later_one_is_out_of_order() -> None:
    counts = count(4, [0, 2, 1, 3])
    assert counts == Counts(4, 4, 0, 0, 1, 0)
    assert not counts.exact


def test_records_never_copied_are_lost() -> None:
    assert count(5, [0, 1, 4]) == Counts(5, 3, 2, 0, 0, 0)
    assert count(3, []) == Counts(3, 0, 3, 0, 0, 0)


def test_records_of_another_partition_or_never_produced_are_foreign() -> None:
    assert count(2, [0, None, 1, 2]) == Counts(2, 4, 0, 0, 0, 2)


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
