"""Clusters that do not answer: UNREACHABLE after the grace, /health 503 with the reason,
ready again when the cluster is back, nothing lost; librdkafka's connection errors folded.

The stop/start test stops cluster C (not A or B, which other test files use meanwhile)
and always starts it again.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from mm2py.dev import mirrormaker
from mm2py.kafka import clients
from tests.conftest import Clusters
from tests.daemon_harness import RunningDaemon, free_port, mm2_properties, running_daemon
from tests.kafka_helpers import Rec, create_topic, produce, read_all, wait_until

pytestmark = pytest.mark.integration

GRACE_MS = "3000"


def _get(daemon: RunningDaemon, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://{daemon.listen}{path}", timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _contents(records: list[Rec]) -> set[tuple[int, bytes | None, bytes | None]]:
    return {(r.partition, r.key, r.value) for r in records}


class HealthLog:
    """/health answers with the seconds since `start`, for the report and assertions."""

    def __init__(self, daemon: RunningDaemon) -> None:
        self.daemon = daemon
        self.start = time.monotonic()
        self.seen: list[tuple[float, int, list[str]]] = []

    def poll(self) -> tuple[int, list[str]]:
        code, body = _get(self.daemon, "/health")
        problems = list(body["problems"])
        if not self.seen or (self.seen[-1][1], self.seen[-1][2]) != (code, problems):
            self.seen.append((round(time.monotonic() - self.start, 1), code, problems))
        return code, problems

    def until(self, wanted: re.Pattern[str] | None, timeout: float, what: str) -> list[str]:
        """Poll until 503 with a problem matching `wanted` (or 200 when None)."""

        def probe() -> list[str] | None:
            code, problems = self.poll()
            if wanted is None:
                return ["ready"] if code == 200 else None
            hit = code == 503 and any(wanted.search(p) for p in problems)
            return problems if hit else None

        return wait_until(probe, timeout=timeout, interval=0.5, what=what)

    def report(self) -> str:
        return "\n".join(f"  t={t:5.1f}s  {code}  {problems}" for t, code, problems in self.seen)


def _flow_status(daemon: RunningDaemon, flow: str) -> dict[str, Any]:
    code, body = _get(daemon, f"/flows/{flow.replace('>', '%3E')}/status")
    assert code == 200, body
    return dict(body)


def _loud_connection_failures(log: str, address: str) -> int:
    """Lines (WARNING or above: DEBUG is not shown) about failed connections to `address`."""
    return sum(1 for line in log.splitlines() if f"Connect to ipv4#{address} failed" in line)


def test_clusters_unreachable_from_the_start(tmp_path: Path) -> None:
    a_addr, b_addr = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    props = mirrormaker.mm2_properties(
        "A", a_addr, "B", b_addr, "t.*", **{"cluster.unreachable.grace.ms": GRACE_MS}
    )
    config = tmp_path / "mm2.properties"
    config.write_text(mirrormaker.render_properties(props))
    with running_daemon(config) as daemon:
        daemon.wait_serving()
        health = HealthLog(daemon)
        # No task can be had while B (the group's cluster) does not answer: the node's
        # member part is the flow's part here.
        reason = re.compile(
            rf"^flow A->B: member part UNREACHABLE: cluster A \({a_addr}\) since "
            rf"\d\d:\d\d:\d\d; cluster B \({b_addr}\) since \d\d:\d\d:\d\d$"
        )
        health.until(reason, timeout=30, what="503 naming both clusters")
        # It stays so: no ready answer while nothing can be replicated, even as the
        # parts fail and are restarted.
        until = time.monotonic() + 12
        while time.monotonic() < until:
            code, problems = health.poll()
            assert code == 503 and any(reason.search(p) for p in problems), health.report()
            time.sleep(0.5)
        print(f"\n/health, clusters unreachable from the start:\n{health.report()}")
        status = _flow_status(daemon, "A->B")
        assert status["state"] == "UNREACHABLE" and status["lag_records"] is None
        metrics = daemon.metrics()
        assert 'mm2py_cluster_reachable{cluster="A"} 0.0' in metrics
        assert 'mm2py_cluster_reachable{cluster="B"} 0.0' in metrics
        log = daemon.log()
        for alias, addr in (("A", a_addr), ("B", b_addr)):
            assert log.count(f"cluster {alias} ({addr}) is unreachable: no answer since") == 1
            # Dozens of attempts a second, one line a minute (the test runs under one).
            assert _loud_connection_failures(log, addr) == 1, log


def test_the_probe_is_answered_without_creating_its_topic(clusters: Clusters) -> None:
    """The probe's Metadata request names one topic: answered with the cluster's ID and
    brokers, and the name refused as invalid (a broker validates a name before it would
    auto-create a topic; these brokers do not auto-create any)."""
    a = clusters["A"]
    admin = clients.admin_client(a.client_properties())
    answer = clients.cluster_answers(admin, 10)
    assert answer.cluster_id and answer.brokers
    assert answer.topics[clients.PROBE_TOPIC].error.code() == KafkaError.TOPIC_EXCEPTION
    assert clients.PROBE_TOPIC not in admin.list_topics(timeout=10).topics


@pytest.fixture
def cluster_c(clusters: Clusters) -> Iterator[Any]:
    cluster = clusters["C"]
    try:
        yield cluster
    finally:
        clusters.kafka.start("C")  # never leave it stopped


def test_target_stopped_and_started_again(
    clusters: Clusters, cluster_c: Any, unique: str, tmp_path: Path
) -> None:
    a, c = clusters["A"], cluster_c
    create_topic(a, unique, partitions=2)
    remote = f"A.{unique}"
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(a, c, unique, **{"cluster.unreachable.grace.ms": GRACE_MS}))
    first = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(100)]
    second = [(i % 2, f"k{i}".encode(), f"v{i}".encode()) for i in range(100, 300)]
    produce(a, unique, first)
    with running_daemon(config) as daemon:
        daemon.wait_serving()
        health = HealthLog(daemon)
        health.until(None, timeout=60, what="ready before the outage")
        wait_until(  # heartbeats topics on A are copied too: count the test's topic only
            lambda: any(
                t["topic"] == remote and t["records"] == 100
                for t in _flow_status(daemon, "A->C")["topics"]
            ),
            timeout=60,
            what="the first 100 records copied",
        )
        stopped_at = time.monotonic() - health.start
        clusters.kafka.stop("C")
        produce(a, unique, second)  # while the target is down
        reason = re.compile(
            rf"^flow A->C: source part UNREACHABLE: cluster C \({c.bootstrap_servers}\) "
            r"since \d\d:\d\d:\d\d$"
        )
        health.until(reason, timeout=30, what="503 naming cluster C")
        status = _flow_status(daemon, "A->C")
        assert status["state"] == "UNREACHABLE" and status["lag_records"] is None
        assert all(t["lag_records"] is None for t in status["topics"])
        assert 'mm2py_cluster_reachable{cluster="C"} 0.0' in daemon.metrics()
        started_at = time.monotonic() - health.start
        clusters.kafka.start("C")
        answered_at = time.monotonic() - health.start
        health.until(None, timeout=90, what="ready again after cluster C is back")
        want = {(p, k, v) for p, k, v in first + second}

        # At-least-once: records in flight at the outage may be copied twice, so what
        # is awaited is every record, not a count of them (300 records, two of them
        # copies, would leave one out).
        def every_record() -> list[Rec] | None:
            got = read_all(c, remote)
            return got if _contents(got) >= want else None

        copied = wait_until(
            every_record,
            timeout=90,
            what="all 300 records on C",
        )
        print(
            f"\n/health, target stopped at t={stopped_at:.1f}s, started at "
            f"t={started_at:.1f}s, answering at t={answered_at:.1f}s:\n{health.report()}"
        )
        assert _contents(copied) == want  # nothing lost, nothing else
        print(f"records on the target: {len(copied)} for {len(want)} produced")
        assert 'mm2py_cluster_reachable{cluster="C"} 1.0' in daemon.metrics()
        log = daemon.log()
        addr = re.escape(c.bootstrap_servers)
        assert len(re.findall(rf"cluster C \({addr}\) is unreachable: no answer since", log)) == 1
        assert len(re.findall(rf"cluster C \({addr}\) is reachable again, after", log)) == 1
