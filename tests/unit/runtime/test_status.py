"""The REST status models' pure helpers: quantiles, latency window, health, flow names, table."""

from __future__ import annotations

from mm2py.replication.stats import LATENCY_BUCKETS, Histogram
from mm2py.runtime.status import (
    FlowStatus,
    LatencyWindow,
    PartStatus,
    TopicStatus,
    flow_state,
    format_status,
    health,
    quantile,
    resolve_flow,
)


def _counts(*seconds: float) -> list[int]:
    h = Histogram()
    for s in seconds:
        h.observe(s)
    return h.counts


def test_quantile_interpolates_within_a_bucket_as_prometheus() -> None:
    assert quantile([0] * (len(LATENCY_BUCKETS) + 1), 0.5) is None
    # 0.01 < x <= 0.025 for all four: the median is half way into that bucket.
    q = quantile(_counts(0.02, 0.02, 0.02, 0.02), 0.5)
    assert q is not None and abs(q - 0.0175) < 1e-9
    assert quantile(_counts(0.02, 0.02, 0.02, 7200.0), 0.99) == LATENCY_BUCKETS[-1]
    assert quantile(_counts(0.0005), 0.5) == 0.0005


def test_latency_window_forgets_what_is_older_than_its_span() -> None:
    window = LatencyWindow(span=60, every=5)
    window.record(0.0, {"A.t": _counts(100.0)})  # slow records at the start
    for t in range(5, 130, 5):
        window.record(float(t), {"A.t": _counts(100.0)})
    now = _counts(100.0, 0.02, 0.02, 0.02)  # then only fast ones
    p50, p99 = window.quantiles({"A.t": now})["A.t"]
    assert p50 is not None and p50 < 0.03
    assert p99 is not None and p99 < 0.03


def test_latency_window_is_due_when_it_would_keep_a_snapshot() -> None:
    window = LatencyWindow(span=60, every=5)
    assert window.due(0.0)
    window.record(0.0, {"A.t": _counts(0.01)})
    assert not window.due(4.9)
    window.record(4.9, {"A.t": _counts(0.01, 100.0)})  # not kept
    assert window.due(5.0)
    # Measured from the snapshot at 0.0: only the slow record.
    p50, _p99 = window.quantiles({"A.t": _counts(0.01, 100.0)})["A.t"]
    assert p50 is not None and p50 > 60.0


def _flow(name: str, *parts: PartStatus, replicating: bool = True) -> FlowStatus:
    source, target = name.split("->")
    topics = [TopicStatus(topic=f"{source}.t", partitions=2, records=10, lag_records=3)]
    return FlowStatus(
        name=name,
        source=source,
        target=target,
        replicating=replicating,
        delivery="at-least-once",
        state=flow_state(parts),
        parts=list(parts),
        topics=topics,
        lag_records=3,
    )


def test_health_is_ready_only_when_every_replicating_flow_runs() -> None:
    running = PartStatus(part="source", state="RUNNING", restarts=0)
    assert health([_flow("A->B", running)]).ready
    paused = PartStatus(part="source", state="PAUSED", restarts=0)
    failed = PartStatus(part="checkpoint", state="FAILED", restarts=2, trace="Traceback\nBoom")
    stopped = PartStatus(
        part="source", state="RUNNING", restarts=0, failed_partitions={"A.t-0": "too large"}
    )
    assert flow_state([running, failed]) == "FAILED"
    assert flow_state([paused, running]) == "PAUSED"
    assert flow_state([stopped]) == "FAILED"
    report = health([_flow("A->B", paused), _flow("B->A", failed), _flow("A->C", stopped)])
    assert not report.ready
    assert report.problems == [
        "flow A->B: source part PAUSED",
        "flow B->A: checkpoint part FAILED",
        "flow A->C: partition A.t-0 stopped: too large",
    ]
    # A pair that only emits heartbeats is not an enabled flow.
    assert health([_flow("B->A", failed, replicating=False)]).ready


def test_flow_names_in_urls() -> None:
    assert resolve_flow("A->B", ["A->B", "B->A"]) == "A->B"
    assert resolve_flow("A-B", ["A->B", "B->A"]) == "A->B"
    assert resolve_flow("A-C", ["A->B"]) is None
    assert resolve_flow("x-y-z", ["x-y->z", "x->y-z"]) is None  # ambiguous: use A->B


def test_status_table_lists_parts_states_lag_and_latency() -> None:
    failed = PartStatus(part="checkpoint", state="FAILED", restarts=2, trace="Traceback\nBoom")
    flow = _flow("A->B", PartStatus(part="source", state="RUNNING", restarts=0), failed)
    flow.topics[0].latency_p50_seconds = 0.012
    flow.topics[0].latency_p99_seconds = 2.5
    text = format_status([flow], health([flow]))
    lines = text.splitlines()
    assert lines[0] == "health: NOT READY"
    assert "A->B  FAILED  lag 3 records  at-least-once, record copier" in text
    exactly = flow.model_copy(update={"delivery": "exactly-once"})
    assert "A->B  FAILED  lag 3 records  exactly-once" in format_status([exactly])
    assert any(ln.split() == ["checkpoint", "FAILED", "2", "Boom"] for ln in lines)
    assert any(ln.split() == ["A.t", "2", "10", "3", "12", "ms", "2.5", "s"] for ln in lines)


def test_standby_parts_are_healthy_and_a_joining_member_is_not() -> None:
    standby = PartStatus(part="checkpoint", state="STANDBY", restarts=0)
    joining = PartStatus(part="member", state="JOINING", restarts=0)
    running = PartStatus(part="member", state="RUNNING", restarts=0)
    assert flow_state([standby, running]) == "RUNNING"
    assert health([_flow("A->B", standby, running)]).ready
    assert flow_state([standby, joining]) == "JOINING"
    assert health([_flow("A->B", standby, joining)]).problems == ["flow A->B: member part JOINING"]
