"""The source part against real clusters: records, transactions, discovery, restarts, failures."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import NewPartitions

from mm2py.compat.formats import (
    OffsetSync,
    is_contiguous_sync,
    is_position_sync,
)
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from tests.conftest import Clusters
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import (
    SYNCS_TOPIC,
    Rec,
    awkward_records,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    read_all,
    recorded_progress,
    wait_until,
)

pytestmark = pytest.mark.integration


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topics: str, **extra: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(a, b, topics, **extra))
    return path


def _by_partition(records: list[Rec]) -> dict[int, list[tuple[object, ...]]]:
    out: dict[int, list[tuple[object, ...]]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[rec.partition].append(rec.content())
    return dict(out)


def _copied(b: LocalCluster, remote: str, count: int) -> list[Rec]:
    def probe() -> list[Rec] | None:
        try:
            topics = clients.admin_client(b.client_properties()).list_topics(timeout=10).topics
            if remote not in topics or sum(end_offsets(b, remote).values()) < count:
                return None
            return read_all(b, remote)
        except KafkaException:
            return None  # e.g. the broker is just restarting: ask again

    return wait_until(probe, timeout=60, what=f"{count} records in {remote}")


def test_records_are_copied_byte_equal_per_partition(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=3)
    sent = awkward_records(300, partitions=3)
    produce(cluster_a, unique, sent)
    # Per-partition series (off by default) so that each partition's count shows.
    config = _config(tmp_path, cluster_a, cluster_b, unique, **{"metrics.partition.labels": "true"})
    with running_daemon(config) as daemon:
        copied = _copied(cluster_b, f"A.{unique}", 300)
        assert _by_partition(copied) == _by_partition(read_all(cluster_a, unique))
        # The counter counts acknowledgements, which reach the daemon a moment after the
        # copies can be read on B.
        counted = (
            f'mm2py_records_total{{partition="0",source="A",target="B",topic="A.{unique}"}} 100.0'
        )
        metrics = wait_until(
            lambda: text if counted in (text := daemon.metrics()) else None,
            timeout=10,
            what=f"{counted!r} in /metrics",
        )
        assert "mm2py_replication_latency_seconds_bucket" in metrics
        labels = f'partition="2",source="A",target="B",topic="A.{unique}"'
        lag = f"mm2py_replication_lag_records{{{labels}}} 0.0"
        wait_until(lambda: lag in daemon.metrics(), what="lag back to 0")
        code, took = daemon.stop()
    assert code == 0 and took < 10


def test_aborted_transactions_are_not_copied(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    producer = Producer(dict(cluster_a.client_properties(), **{"transactional.id": f"tx-{unique}"}))
    producer.init_transactions(30)
    for batch, commit in (("a", True), ("b", False), ("c", True), ("d", False), ("e", True)):
        producer.begin_transaction()
        for i in range(10):
            producer.produce(unique, value=f"{batch}{i}".encode(), partition=0)
        end_transaction(producer, commit)
    with running_daemon(_config(tmp_path, cluster_a, cluster_b, unique)):
        copied = _copied(cluster_b, f"A.{unique}", 30)
        values = [r.value for r in copied]
        assert values == [f"{b}{i}".encode() for b in "ace" for i in range(10)]
        # Target offsets are dense even though the source has markers and aborted records.
        assert [r.offset for r in copied] == list(range(30))

        # The offset syncs give, for EVERY source offset (gaps included), the target
        # offset of the first copied record at or after it.
        source_offsets = [r.offset for r in read_all(cluster_a, unique)]
        end = source_offsets[-1] + 2  # past the last commit marker
        expected = {
            n: next((i for i, o in enumerate(source_offsets) if o >= n), len(source_offsets))
            for n in range(end + 1)
        }

        def translations() -> dict[int, int | None] | None:
            store = OffsetSyncStore()
            for rec in read_all(cluster_a, SYNCS_TOPIC):
                sync = OffsetSync.decode(rec.key, rec.value)
                if sync.topic == unique:
                    # Read as the checkpoint part reads them: only marked syncs are exact.
                    headers = list(rec.headers)
                    store.add(
                        sync,
                        contiguous=is_contiguous_sync(headers),
                        position=is_position_sync(headers),
                    )
            got = {n: store.translate(unique, 0, n) for n in range(end + 1)}
            # A group that read everything, at the end past the last marker: proven too.
            at_end = store.translation(unique, 0, end)
            return got if got == expected and at_end is not None and at_end.exact else None

        wait_until(translations, what="offset syncs that translate every offset exactly")


def test_new_topics_and_partitions_are_picked_up(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    first, second = f"{unique}-one", f"{unique}-two"
    create_topic(cluster_a, first, partitions=2)
    produce(cluster_a, first, [(i % 2, None, f"{i}".encode()) for i in range(20)])
    with running_daemon(_config(tmp_path, cluster_a, cluster_b, f"{unique}.*")):
        _copied(cluster_b, f"A.{first}", 20)
        create_topic(cluster_a, second, partitions=1)
        produce(cluster_a, second, [(0, None, b"x")] * 5)
        assert len(_copied(cluster_b, f"A.{second}", 5)) == 5

        admin = clients.admin_client(cluster_a.client_properties())
        admin.create_partitions([NewPartitions(first, 4)])[first].result(30)
        produce(cluster_a, first, [(p, None, f"new-{p}".encode()) for p in (2, 3)])
        copied = _copied(cluster_b, f"A.{first}", 22)
        assert len(end_offsets(cluster_b, f"A.{first}")) == 4
        assert {(r.partition, r.value) for r in copied if r.partition >= 2} == {
            (2, b"new-2"),
            (3, b"new-3"),
        }


def test_deleted_source_topic_is_let_go_and_a_recreated_one_is_copied(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    doomed, other = f"{unique}-doomed", f"{unique}-other"
    create_topic(cluster_a, doomed, partitions=2)
    create_topic(cluster_a, other)
    produce(cluster_a, doomed, [(i % 2, None, f"old-{i}".encode()) for i in range(10)])
    with running_daemon(_config(tmp_path, cluster_a, cluster_b, f"{unique}.*")) as daemon:
        _copied(cluster_b, f"A.{doomed}", 10)
        admin = clients.admin_client(cluster_a.client_properties())
        admin.delete_topics([doomed])[doomed].result(30)
        wait_until(
            lambda: f"topic {doomed} was deleted on cluster A" in daemon.log(),
            what="the deletion noticed",
        )
        # The flow goes on: other topics are copied, the remote topic and its records stay.
        produce(cluster_a, other, [(0, None, b"after")])
        assert [r.value for r in _copied(cluster_b, f"A.{other}", 1)] == [b"after"]
        assert len(read_all(cluster_b, f"A.{doomed}")) == 10
        # Created again under the same name (offsets from 0): copied from its start.
        create_topic(cluster_a, doomed, partitions=2)
        produce(cluster_a, doomed, [(i % 2, None, f"new-{i}".encode()) for i in range(4)])
        copied = _copied(cluster_b, f"A.{doomed}", 14)
        assert sorted(r.value for r in copied if r.value.startswith(b"new")) == [
            f"new-{i}".encode() for i in range(4)
        ]
        assert len(copied) == 14
        errors = [line for line in daemon.log().splitlines() if " ERROR " in line]
        assert errors == []
        status = json.loads(daemon.status("A->B"))
        assert status["state"] == "RUNNING"


def test_clean_restart_loses_nothing_and_copies_nothing_twice(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, None, f"{i}".encode()) for i in range(200)])
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    with running_daemon(config) as daemon:
        _copied(cluster_b, f"A.{unique}", 200)
        code, took = daemon.stop(signal.SIGINT)
        assert code == 0 and took < 10
    assert recorded_progress(cluster_b, "A", unique) == {0: 99, 1: 99}
    produce(cluster_a, unique, [(i % 2, None, f"{i}".encode()) for i in range(200, 400)])
    with running_daemon(config):
        copied = _copied(cluster_b, f"A.{unique}", 400)
    assert _by_partition(copied) == _by_partition(read_all(cluster_a, unique))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_nodes_whole_group_stops_it_cleanly(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path, sig: int
) -> None:
    # A Ctrl-C in a terminal, or systemd's stop, signals every process of the node's
    # group: its task processes (and the spare) too. They ignore it, and the node stops
    # its tasks, which record their progress before they exit, with no traceback.
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, None, f"{i}".encode()) for i in range(200)])
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    with running_daemon(config) as daemon:
        _copied(cluster_b, f"A.{unique}", 200)
        group = daemon.proc.pid
        code, took = daemon.stop(sig, group=True)
        assert code == 0 and took < 10
        wait_until(lambda: not _group_alive(group), timeout=10, what="the node's group to end")
        assert "Traceback" not in daemon.log()
    assert recorded_progress(cluster_b, "A", unique) == {0: 99, 1: 99}


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_kill_9_loses_nothing_and_duplicates_one_window(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    produce(cluster_a, unique, [(0, None, f"{i}".encode()) for i in range(20_000)])
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    with running_daemon(config) as daemon:
        wait_until(
            lambda: (
                sum(end_offsets(cluster_b, f"A.{unique}").values()) > 5000
                if f"A.{unique}"
                in clients.admin_client(cluster_b.client_properties())
                .list_topics(timeout=10)
                .topics
                else None
            ),
            what="copying under way",
        )
        daemon.stop(signal.SIGKILL)
    produce(cluster_a, unique, [(0, None, f"{i}".encode()) for i in range(20_000, 21_000)])
    with running_daemon(config):
        wait_until(
            lambda: (
                (read_all(cluster_b, f"A.{unique}") or [None])[-1] is not None
                and read_all(cluster_b, f"A.{unique}")[-1].value == b"20999"
            ),
            timeout=60,
            what="last record copied after restart",
        )
    values = [int(r.value or b"-1") for r in read_all(cluster_b, f"A.{unique}")]
    # The copy is the source with at most one re-copied window: source[:a] + source[b:],
    # b <= a (b == a when the kill came after progress covered all that was copied).
    restart_at = next(
        (i for i in range(1, len(values)) if values[i] != values[i - 1] + 1), len(values)
    )
    assert values[:restart_at] == list(range(restart_at))
    resumed = values[restart_at] if restart_at < len(values) else restart_at
    assert resumed <= restart_at
    assert values[restart_at:] == list(range(resumed, 21_000))


def test_target_broker_restart_is_survived(
    clusters: Clusters,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, None, f"{i}".encode()) for i in range(100)])
    with running_daemon(_config(tmp_path, cluster_a, cluster_b, unique)) as daemon:
        _copied(cluster_b, f"A.{unique}", 100)
        # Their progress recorded first: when B's restart outlasts the node's group
        # session (B is the group's coordinator; on a loaded machine it can take 35 s),
        # the task restarts from the recorded progress, and at-least-once delivery may
        # copy again what was copied after it. Here nothing was.
        wait_until(
            lambda: recorded_progress(cluster_b, "A", unique) == {0: 49, 1: 49},
            what="the progress of the first 100 records",
        )
        clusters.kafka.stop("B")
        produce(cluster_a, unique, [(i % 2, None, f"{i}".encode()) for i in range(100, 300)])
        clusters.kafka.start("B")
        copied = _copied(cluster_b, f"A.{unique}", 300)
        assert daemon.proc.poll() is None
    assert _by_partition(copied) == _by_partition(read_all(cluster_a, unique))


def test_oversized_record_stops_its_partition_with_a_clear_error(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    create_topic(cluster_b, f"A.{unique}", partitions=2, config={"max.message.bytes": "4096"})
    records = [(0, None, b"s" * 100)] * 5 + [(0, None, b"L" * 20_000)] + [(0, None, b"t")] * 5
    records += [(1, None, f"{i}".encode()) for i in range(50)]
    produce(cluster_a, unique, records)
    # Config sync would reset the remote topic's max.message.bytes to the source's.
    config = _config(
        tmp_path, cluster_a, cluster_b, unique, **{"sync.topic.configs.enabled": "false"}
    )
    with running_daemon(config) as daemon:
        copied = _copied(cluster_b, f"A.{unique}", 50)
        assert [r.value for r in copied if r.partition == 1] == [f"{i}".encode() for i in range(50)]
        wait_until(lambda: f"{unique}-0 offset 5" in daemon.log(), what="error naming the record")
        assert f"remote topic A.{unique}" in daemon.log()
        assert 'mm2py_errors_total{part="source",source="A",target="B"}' in daemon.metrics()
        assert all(r.value != b"L" * 20_000 for r in read_all(cluster_b, f"A.{unique}"))
        daemon.stop()
    assert recorded_progress(cluster_b, "A", unique).get(0, -1) < 5
