"""A flow's statistics on a node, fed by task processes that come, go and restart."""

from __future__ import annotations

import pytest

from mm2py.cluster.task import NodeStats, _errors_counted, changed_since
from mm2py.replication.stats import Extremes, PartitionStats, ReplicationStats
from mm2py.runtime.metrics import Metrics


def _stats(records: int, lag: int) -> PartitionStats:
    stats = PartitionStats(records=records, bytes=records * 10, lag=lag)
    stats.latency.observe(0.004)
    return stats


def test_reports_of_running_tasks_are_shown_as_they_come() -> None:
    node = NodeStats("A", "B")
    node.update(0, {("A.t", 0): _stats(5, 3)})
    node.update(1, {("A.t", 1): _stats(7, 1)})
    node.update(0, {("A.t", 0): _stats(9, 0)})
    assert {k: (s.records, s.lag) for k, s in node.partitions.items()} == {
        ("A.t", 0): (9, 0),
        ("A.t", 1): (7, 1),
    }
    assert node.by_topic()["A.t"].records == 16


def test_counts_never_go_back_when_a_task_restarts_or_moves_away() -> None:
    node = NodeStats("A", "B")
    node.update(0, {("A.t", 0): _stats(100, 4)})
    node.retire(0)  # the process ended: its counts stay, its lag is no longer known here
    retired = node.partitions[("A.t", 0)]
    assert (retired.records, retired.lag, sum(retired.latency.counts)) == (100, 0, 1)
    node.update(0, {("A.t", 0): _stats(20, 2)})  # a new process counts from 0 again
    again = node.partitions[("A.t", 0)]
    assert (again.records, again.bytes, again.lag) == (120, 1200, 2)
    assert sum(again.latency.counts) == 2


def test_batches_by_reason_add_up_over_tasks_and_never_go_back() -> None:
    node = NodeStats("A", "B")
    assert node.batches is None  # no task passes batches through: no series
    node.update_batches(0, {"whole": 10, "aborted": 0})
    node.update_batches(1, {"whole": 5, "aborted": 2})
    assert node.batches == {"whole": 15, "aborted": 2}
    node.retire(0)
    node.update_batches(0, {"whole": 1, "aborted": 0})  # a new process counts from 0 again
    assert node.batches == {"whole": 16, "aborted": 2}


def test_mm2s_windows_stay_the_current_tasks_when_counts_continue() -> None:
    node = NodeStats("A", "B", mm2_names=True)
    first = ReplicationStats("A", "B", mm2_names=True)
    stats = first.partition("A.t", 0)
    stats.records, stats.bytes = 1000, 10000
    stats.latency.observe(0.5)
    node.update(0, {("A.t", 0): stats})
    node.retire(0)
    second = ReplicationStats("A", "B", mm2_names=True)  # the task again, counting from 0
    again = second.partition("A.t", 0)
    again.records, again.bytes = 30, 300
    again.latency.observe(0.002)
    node.update(0, {("A.t", 0): again})
    shown = node.partitions[("A.t", 0)]
    assert (shown.records, shown.bytes) == (1030, 10300)
    assert sum(shown.latency.counts) == 2
    assert isinstance(shown.latency, Extremes) and shown.meters is not None
    now = shown.meters.start + 10
    # Rates and the window's average count this task's records only, not the earlier 1000.
    assert shown.meters.rates(shown.records, shown.bytes, now) == again.meters.rates(30, 300, now)  # type: ignore[union-attr]
    assert shown.latency.measure(now).avg == pytest.approx(0.002)


def test_a_report_carries_only_the_partitions_that_changed_and_the_node_keeps_the_rest() -> None:
    task = ReplicationStats("A", "B")
    for p in range(3):
        task.partition("A.t", p).records = 10
    sent: dict[tuple[str, int], tuple[object, ...]] = {}
    node = NodeStats("A", "B")
    node.update(0, changed_since(task.partitions, sent))
    assert len(node.partitions) == 3
    assert changed_since(task.partitions, sent) == {}  # idle: an empty report
    task.partition("A.t", 1).lag = 4  # a gauge alone changes too
    task.partition("A.t", 2).records = 11
    changed = changed_since(task.partitions, sent)
    assert sorted(changed) == [("A.t", 1), ("A.t", 2)]
    node.update(0, changed)
    node.update(0, {})
    shown = {k: (s.records, s.lag) for k, s in node.partitions.items()}
    assert shown == {("A.t", 0): (10, 0), ("A.t", 1): (10, 4), ("A.t", 2): (11, 0)}


def test_mm2s_window_turning_is_a_change_to_report() -> None:
    task = ReplicationStats("A", "B", mm2_names=True)
    stats = task.partition("A.t", 0)
    sent: dict[tuple[str, int], tuple[object, ...]] = {}
    changed_since(task.partitions, sent)
    assert stats.meters is not None
    stats.roll(stats.meters.start + 31)  # no record, but the window turned
    assert list(changed_since(task.partitions, sent)) == [("A.t", 0)]


def test_a_tasks_partitions_are_all_it_reported_until_it_is_retired() -> None:
    node = NodeStats("A", "B")
    node.update(0, {("A.t", 0): _stats(1, 0), ("A.t", 2): _stats(1, 0)})
    node.update(0, {})  # an idle report
    node.update(0, {("A.t", 2): _stats(2, 0)})
    assert node.task_partitions(0) == [("A.t", 0), ("A.t", 2)]
    node.retire(0)
    assert node.task_partitions(0) == []


def test_a_task_reports_its_part_s_errors_whatever_else_the_registry_holds() -> None:
    metrics = Metrics()
    stats = ReplicationStats("A", "B")
    metrics.replication.add(stats)
    stats.partition("A.t", 0).records = 5
    labels = {"source": "A", "target": "B", "part": "source"}
    assert _errors_counted(metrics, labels) == 0.0
    metrics.errors.labels("A", "B", "source").inc(3)
    metrics.errors.labels("A", "B", "sync").inc()
    assert _errors_counted(metrics, labels) == 3.0
    assert _errors_counted(metrics, labels) == metrics.registry.get_sample_value(
        "mm2py_errors_total", labels
    )
