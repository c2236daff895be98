"""`mm2py verify` against real clusters: equal copies despite transaction markers and aborted
records (target offsets differ), then a record produced by hand into the remote topic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    wait_until,
)

pytestmark = pytest.mark.integration


def _verify(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "mm2py.cli", "verify", str(config)]
    return subprocess.run(
        [*command, "--source", "A", "--target", "B", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _transactions(cluster: LocalCluster, topic: str, unique: str) -> None:
    """An aborted and a committed transaction on partition 0: markers and aborted records."""
    producer: Producer = clients.producer(
        cluster.client_properties(), {"transactional.id": f"tx-{unique}"}
    )
    producer.init_transactions(30)
    for commit in (False, True):
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, f"tx-{commit}-{i}".encode(), b"k", partition=0)
        end_transaction(producer, commit)


def test_verify_proves_equal_copies_and_catches_a_corrupted_target(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    remote = f"A.{unique}"
    records = [
        (
            i % 2,
            f"k{i}".encode() if i % 5 else None,
            f"v{i}".encode(),
            [("h", b"x")],
            RECENT_MS + i,
        )
        for i in range(200)
    ]
    produce(cluster_a, unique, records)
    _transactions(cluster_a, unique, unique)
    produce(cluster_a, unique, [(0, b"after", b"tx", [], RECENT_MS + 1_000)])
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(cluster_a, cluster_b, unique))
    with running_daemon(config):
        # 100 + 5 committed + 1 on partition 0, 100 on partition 1.
        wait_until(
            lambda: (
                end_offsets(cluster_b, remote) == {0: 106, 1: 100}
                if _exists(cluster_b, remote)
                else None
            ),
            timeout=60,
            what="every committed record copied",
        )
        # The source has 5 aborted records and 2 markers more: offsets differ.
        assert end_offsets(cluster_a, unique) == {0: 113, 1: 100}

        ok = _verify(config, "--topics", unique)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        rows = [line.split() for line in ok.stdout.splitlines()]
        assert [unique, remote, "0", "106", "106"] == rows[1][:5] and rows[1][-1] == "match"
        assert [unique, remote, "1", "100", "100"] == rows[2][:5] and rows[2][-1] == "match"
        assert "flow A->B: 2 partitions, all match" in ok.stdout

        # Retention on the source (records before offset 40 of partition 1 deleted): the
        # offset syncs place the source's first record on the target.
        admin = clients.admin_client(cluster_a.client_properties())
        futures = admin.delete_records([TopicPartition(unique, 1, 40)])
        for future in futures.values():
            future.result(timeout=30)
        aligned = _verify(config, "--topics", unique, "--json")
        assert aligned.returncode == 0, aligned.stdout + aligned.stderr
        p1 = json.loads(aligned.stdout)["partitions"][1]
        assert (p1["status"], p1["source_start"], p1["target_start"]) == ("match", 40, 40)
        assert (p1["source_records"], p1["target_records"], p1["compared"]) == (60, 60, 60)

        # A record produced by hand into the remote topic, then more copied after it.
        produce(cluster_b, remote, [(1, b"forged", b"not from A", [], RECENT_MS + 2_000)])
        produce(cluster_a, unique, [(1, b"late", b"v", [], RECENT_MS + 3_000)])
        wait_until(lambda: end_offsets(cluster_b, remote)[1] == 102, what="the late record copied")
        bad = _verify(config, "--topics", f"A\\.{unique}", "--json")  # the remote name works too
    assert bad.returncode == 1, bad.stdout + bad.stderr
    report = json.loads(bad.stdout)
    assert report["ok"] is False and report["flow"] == "A->B"
    by_partition = {p["partition"]: p for p in report["partitions"]}
    assert by_partition[0]["status"] == "match"
    forged = by_partition[1]
    assert forged["status"] == "mismatch" and forged["ok"] is False
    assert (forged["source_records"], forged["target_records"]) == (61, 62)
    assert forged["first_difference"] == {"index": 60, "source_offset": 100, "target_offset": 100}
    assert forged["source_digest"] != forged["target_digest"]


def _exists(cluster: LocalCluster, topic: str) -> bool:
    admin = clients.admin_client(cluster.client_properties())
    return topic in admin.list_topics(timeout=10).topics


def test_verify_usage_errors_exit_2(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path
) -> None:
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(cluster_a, cluster_b, "x"))
    unknown = _verify(config, "--topics", "x")
    assert unknown.returncode == 1  # a run that compared nothing proves nothing
    assert "no replicated topic matched" in unknown.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "mm2py.cli",
            "verify",
            str(config),
            "--source",
            "A",
            "--target",
            "Z",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "unknown cluster 'Z'" in bad.stderr
    regex = _verify(config, "--topics", "(")
    assert regex.returncode == 2 and "--topics" in regex.stderr
