"""Records deleted on the source before mm2py copied them, against real clusters.

`AdminClient.delete_records` stands for retention or a truncation: the deleted offsets
are counted in `mm2py_records_skipped_total`, named in one log line per partition and
episode, and shown in the REST status and `mm2py status`. Transaction markers and
aborted records, which the consumer also skips over, are never counted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer, TopicPartition

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import create_topic, end_transaction, produce, read_all, wait_until

pytestmark = pytest.mark.integration

FLOW_URL = "A-%3EB"


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topic: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(a, b, topic))
    return path


def _records(start: int, count: int) -> list[tuple[int, bytes, bytes]]:
    return [(0, f"k{i}".encode(), f"v{i}".encode()) for i in range(start, start + count)]


def _delete_before(cluster: LocalCluster, topic: str, offset: int) -> None:
    admin = clients.admin_client(cluster.client_properties())
    futures = admin.delete_records([TopicPartition(topic, 0, offset)])
    deleted = futures[TopicPartition(topic, 0, offset)].result(timeout=30)
    assert deleted.low_watermark == offset  # the new log start offset


def _call(daemon: RunningDaemon, method: str, path: str) -> Any:
    request = urllib.request.Request(f"http://{daemon.listen}{path}", method=method)
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())


def _topic(daemon: RunningDaemon, remote: str) -> dict[str, Any] | None:
    try:
        status = _call(daemon, "GET", f"/flows/{FLOW_URL}/status")
    except OSError:
        return None  # not listening yet
    return next((t for t in status["topics"] if t["topic"] == remote), None)


def _copied(daemon: RunningDaemon, remote: str, count: int) -> dict[str, Any]:
    return wait_until(
        lambda: (t := _topic(daemon, remote)) is not None and t["records"] >= count and t,
        timeout=60,
        what=f"{count} records copied to {remote}",
    )


def _skipped_metric(daemon: RunningDaemon, remote: str) -> float | None:
    pattern = (
        r'^mm2py_records_skipped_total\{reason="deleted_before_copy",source="A",target="B",'
        rf'topic="{re.escape(remote)}"\}} (\S+)$'
    )
    found = re.search(pattern, daemon.metrics(), re.MULTILINE)
    return float(found.group(1)) if found else None


def _deleted_lines(daemon: RunningDaemon) -> list[str]:
    return [line for line in daemon.log().splitlines() if "before they were copied" in line]


def test_records_deleted_while_mm2py_was_stopped_are_counted_and_named(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    remote = f"A.{unique}"
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    produce(cluster_a, unique, _records(0, 20))
    with running_daemon(config) as daemon:
        _copied(daemon, remote, 20)
        code, _took = daemon.stop()  # records its progress: offset 19
    assert code == 0

    produce(cluster_a, unique, _records(20, 80))
    _delete_before(cluster_a, unique, 60)
    with running_daemon(config) as daemon:
        topic = _copied(daemon, remote, 40)
        assert topic["skipped_records"] == 40
        assert _skipped_metric(daemon, remote) == 40.0
        expected = (
            f"flow A->B: A {unique}-0: offsets 20..59 (40 records) were deleted on cluster A "
            "before they were copied"
        )
        lines = _deleted_lines(daemon)
        assert len(lines) == 1 and lines[0].endswith(expected), lines
        assert "WARNING" in lines[0]
        print(lines[0])

        shown = subprocess.run(
            [sys.executable, "-m", "mm2py.cli", "status", "--url", f"http://{daemon.listen}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"  {remote}: 40 records were deleted on A before they were copied" in (
            shown.stdout
        ), shown.stdout + shown.stderr

    copied = read_all(cluster_b, remote)
    assert [r.value for r in copied] == [f"v{i}".encode() for i in [*range(20), *range(60, 100)]]


def test_records_deleted_while_a_flow_is_paused_are_counted_when_it_resumes(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    remote = f"A.{unique}"
    produce(cluster_a, unique, _records(0, 20))
    with running_daemon(_config(tmp_path, cluster_a, cluster_b, unique)) as daemon:
        _copied(daemon, remote, 20)
        _call(daemon, "PUT", f"/flows/{FLOW_URL}/pause")
        produce(cluster_a, unique, _records(20, 50))
        _delete_before(cluster_a, unique, 50)
        time.sleep(3)  # the loop measures lag (and sees the log start move) every second
        _call(daemon, "PUT", f"/flows/{FLOW_URL}/resume")
        topic = _copied(daemon, remote, 40)
        assert topic["skipped_records"] == 30
        assert _skipped_metric(daemon, remote) == 30.0
        lines = _deleted_lines(daemon)
        assert len(lines) == 1, lines
        assert lines[0].endswith(
            f"A {unique}-0: offsets 20..49 (30 records) were deleted on cluster A "
            "before they were copied"
        )
        print(lines[0])
    copied = read_all(cluster_b, remote)
    assert [r.value for r in copied] == [f"v{i}".encode() for i in [*range(20), *range(50, 70)]]


def test_transaction_markers_and_aborted_records_are_not_counted_as_skipped(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    remote = f"A.{unique}"
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    producer = Producer(dict(cluster_a.client_properties(), **{"transactional.id": f"tx-{unique}"}))
    producer.init_transactions(30)

    def transactions(*batches: tuple[str, bool]) -> None:
        for batch, commit in batches:
            producer.begin_transaction()
            for i in range(10):
                producer.produce(unique, value=f"{batch}{i}".encode(), partition=0)
            end_transaction(producer, commit)

    transactions(("a", True), ("b", False), ("c", True))
    with running_daemon(config) as daemon:
        _copied(daemon, remote, 20)
        assert daemon.stop()[0] == 0
    # Restarted after the last copied record, the next offsets are a commit marker, an
    # aborted transaction and its marker.
    transactions(("d", False), ("e", True))
    with running_daemon(config) as daemon:
        topic = _copied(daemon, remote, 10)
        assert topic["skipped_records"] == 0
        assert _skipped_metric(daemon, remote) == 0.0
        assert _deleted_lines(daemon) == []
    values = [r.value for r in read_all(cluster_b, remote)]
    assert values == [f"{b}{i}".encode() for b in "ace" for i in range(10)]
