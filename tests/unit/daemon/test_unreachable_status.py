"""UNREACHABLE in status and health: parts, lag, the table, and restarts when it answers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from mm2py.config import ConfigError, FlowConfig, load_config
from mm2py.daemon.supervisor import Daemon, Supervised, build_reachability
from mm2py.runtime.part import FlowPart
from mm2py.runtime.reachability import Reachability
from mm2py.runtime.status import (
    FlowStatus,
    PartStatus,
    TopicStatus,
    flow_state,
    format_status,
    health,
)
from tests.unit.daemon.conftest import offline_daemon

REASON = "cluster B (127.0.0.1:29092) since 12:03:04"


def test_an_unreachable_part_makes_health_fail_naming_the_cluster() -> None:
    parts = [
        PartStatus(part="source", state="UNREACHABLE", restarts=2, unreachable=[REASON]),
        PartStatus(part="checkpoint", state="RUNNING", restarts=0),
    ]
    assert flow_state(parts) == "UNREACHABLE"
    failed = [*parts, PartStatus(part="sync", state="FAILED", restarts=1, trace="x")]
    assert flow_state(failed) == "FAILED"
    paused = [*parts, PartStatus(part="sync", state="PAUSED", restarts=0)]
    assert flow_state(paused) == "UNREACHABLE"
    flow = FlowStatus(
        name="A->B",
        source="A",
        target="B",
        replicating=True,
        delivery="at-least-once",
        state=flow_state(parts),
        parts=parts,
        topics=[TopicStatus(topic="A.t", partitions=1, records=5, lag_records=None)],
        lag_records=None,
    )
    report = health([flow])
    assert not report.ready
    assert report.problems == [f"flow A->B: source part UNREACHABLE: {REASON}"]
    table = format_status([flow], report)
    assert f"  flow A->B: source part UNREACHABLE: {REASON}" in table
    assert "A->B  UNREACHABLE  lag unknown" in table
    (source_row,) = [line for line in table.splitlines() if line.startswith("  source ")]
    assert source_row.split()[:3] == ["source", "UNREACHABLE", "2"] and REASON in source_row
    (topic_row,) = [line for line in table.splitlines() if line.startswith("  A.t ")]
    assert topic_row.split()[:4] == ["A.t", "1", "5", "unknown"]
    # What `mm2py status` parses back from the REST answer.
    assert FlowStatus.model_validate_json(flow.model_dump_json()) == flow


class Waiting(FlowPart):
    """Fails its first run (as when the target does not answer); later runs work."""

    name = "source"

    def __init__(self, daemon: Daemon, flow: FlowConfig) -> None:
        config = daemon.config
        super().__init__(flow, config.cluster("A"), config.cluster("B"), daemon.metrics)
        self.runs = 0
        self.second_run = threading.Event()

    def run(self) -> None:
        self.runs += 1
        if self.runs == 1:
            raise TimeoutError("no answer from cluster B")
        self.second_run.set()
        self.stopping.wait()


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def daemon(tmp_path: Path) -> Daemon:
    return offline_daemon(tmp_path, "A->B.cluster.unreachable.grace.ms = 3000\n")


def test_the_grace_of_a_cluster_is_the_shortest_of_its_flows(daemon: Daemon) -> None:
    assert daemon.flows[0].settings.unreachable_grace == 3.0
    reach = build_reachability(daemon.config, [sup.part for sup in daemon.parts])
    assert sorted(reach.aliases) == ["A", "B"]
    assert reach.grace("A") == reach.grace("B") == 3.0


def test_a_part_failed_in_an_outage_shows_unreachable_and_restarts_when_it_answers(
    daemon: Daemon,
) -> None:
    clock = FakeClock()
    daemon.reachability = Reachability(
        {"A": "127.0.0.1:1", "B": "127.0.0.1:2"}, {"A": 3.0, "B": 3.0}, clock=clock
    )
    part = Waiting(daemon, daemon.flows[0])
    part.reachability = daemon.reachability
    sup = Supervised(part)
    daemon.parts = [sup]
    daemon.reachability.failed("B")
    clock.now += 3
    part.start()
    part._thread.join(5)  # type: ignore[union-attr]
    daemon._supervise()  # the failure: restart in 1 s by the backoff ...
    sup.restart_at = time.monotonic() + 3600  # ... made long, as after many failures
    shown = daemon._part_status(sup)
    assert shown.state == "UNREACHABLE" and shown.unreachable[0].startswith(
        "cluster B (127.0.0.1:2) since "
    )
    assert "no answer from cluster B" in (shown.trace or "")
    status = daemon.flow_status("A->B")
    assert status.state == "UNREACHABLE" and status.lag_records is None
    assert not daemon.health().ready
    daemon._supervise()
    assert not part.running  # still unreachable: the backoff stands
    daemon.reachability.succeeded("B")
    daemon._supervise()  # answered: restarted at once, not after the backoff
    assert part.second_run.wait(5)
    assert daemon._part_status(sup).state == "RUNNING"
    status = daemon.flow_status("A->B")
    assert status.state == "RUNNING" and status.lag_records == 0
    assert daemon.health().ready
    part.stop()


def test_transport_errors_of_a_parts_clients_count_against_their_cluster(
    daemon: Daemon,
) -> None:
    clock = FakeClock()
    daemon.reachability = Reachability(
        {"A": "127.0.0.1:1", "B": "127.0.0.1:2"}, {"A": 3.0, "B": 3.0}, clock=clock
    )
    part = Waiting(daemon, daemon.flows[0])
    part.reachability = daemon.reachability
    assert part.clusters() == ("A", "B")
    part.note_client_error("A", KafkaError(KafkaError._TRANSPORT))
    part.note_client_error("B", KafkaError(KafkaError._MSG_TIMED_OUT))
    clock.now += 3
    assert [o.alias for o in daemon.reachability.outages(part.clusters())] == ["A"]


def test_the_grace_is_30_s_by_default_and_at_least_a_second(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    base = "clusters = A, B\nA.bootstrap.servers = a:1\nB.bootstrap.servers = b:1\n"
    path.write_text(base)
    assert load_config(path).flow("A", "B").settings.unreachable_grace == 30.0
    path.write_text(base + "cluster.unreachable.grace.ms = 10\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert "cluster.unreachable.grace.ms" in str(raised.value)
    assert "at least 1000" in str(raised.value)
