"""`mm2py backfill` against real clusters: byte-equal copies, offset syncs, hand-over, resuming."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType
from confluent_kafka.admin._listoffsets import OffsetSpec

from mm2py.compat.formats import OffsetSync, is_contiguous_sync
from mm2py.compat.offsets import OffsetSyncStore
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.processes import kill_tree
from mm2py.kafka import clients
from mm2py.replication.progress import ProgressStore
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    SYNCS_TOPIC,
    Rec,
    awkward_records,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

BACKFILL_TIMEOUT = 150


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topics: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(a, b, topics))
    return path


def _backfill_command(config: Path, *args: str) -> list[str]:
    # The configs name one topic; --topics leaves out `heartbeats`, which the flow
    # would copy too and which other tests' daemons write to concurrently.
    topic = re.search(r"^topics=(.*)$", config.read_text(), re.MULTILINE)
    assert topic is not None
    return [
        sys.executable,
        "-m",
        "mm2py.cli",
        "backfill",
        str(config),
        "--source",
        "A",
        "--target",
        "B",
        "--master",
        "local[2]",
        "--topics",
        topic[1].replace("\\", ""),
        *args,
    ]


def _backfill(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        _backfill_command(config, *args),
        capture_output=True,
        text=True,
        timeout=BACKFILL_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _by_partition(records: Sequence[Rec]) -> dict[int, list[tuple[object, ...]]]:
    out: dict[int, list[tuple[object, ...]]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[rec.partition].append(rec.content())
    return dict(out)


def _progress(b: LocalCluster, topic: str) -> dict[int, int]:
    """Partition -> last copied offset, as recorded in mm2-offsets.A.internal on B."""
    store = ProgressStore(b.client_properties(), "B", "A", "mm2-offsets.A.internal", 1)
    try:
        return {p: offset for (t, p), offset in store.load().items() if t == topic}
    finally:
        store.close()


def _syncs(a: LocalCluster, topic: str) -> OffsetSyncStore:
    store = OffsetSyncStore()
    for rec in read_all(a, SYNCS_TOPIC):
        sync = OffsetSync.decode(rec.key, rec.value)
        if sync.topic == topic:
            # Unmarked syncs would not translate exactly: this checks the backfill marks them.
            store.add(sync, contiguous=is_contiguous_sync(list(rec.headers)))
    return store


def _expected_translations(source: Sequence[Rec], copies: Sequence[Rec]) -> dict[int, int]:
    """For every source offset up to the last record: the target offset of the first
    copied record at or after it (the copies pair with the source records in order)."""
    assert [r.content() for r in source] == [r.content() for r in copies]
    expected: dict[int, int] = {}
    n = 0
    for rec, copy in zip(source, copies, strict=True):
        while n <= rec.offset:
            expected[n] = copy.offset
            n += 1
    return expected


def _latest_offsets(cluster: LocalCluster, topic: str, isolation: IsolationLevel) -> dict[int, int]:
    admin = clients.admin_client(cluster.client_properties())
    latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
    partitions = admin.list_topics(topic, timeout=10).topics[topic].partitions
    futures = admin.list_offsets(
        {TopicPartition(topic, p): latest for p in partitions}, isolation_level=isolation
    )
    return {tp.partition: f.result(timeout=30).offset for tp, f in futures.items()}


def _transactions(cluster: LocalCluster, topic: str, txn_id: str, batches: str) -> None:
    """One transaction per letter into partition 0: upper case commits, lower case aborts."""
    producer = Producer(dict(cluster.client_properties(), **{"transactional.id": txn_id}))
    producer.init_transactions(30)
    for batch in batches:
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, value=f"{batch}{i}".encode(), partition=0)
        end_transaction(producer, commit=batch.isupper())


def test_backfill_copies_byte_equal_with_exact_offset_syncs_and_progress(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=3)
    sent = awkward_records(300, partitions=3)
    produce(cluster_a, unique, sent[:150])
    _transactions(cluster_a, unique, f"tx-{unique}", "AbCdE")  # markers and aborted records
    produce(cluster_a, unique, sent[150:])
    ends = end_offsets(cluster_a, unique)

    done = _backfill(_config(tmp_path, cluster_a, cluster_b, unique), "--range-records", "40")

    source = read_all(cluster_a, unique)
    copies = read_all(cluster_b, f"A.{unique}")
    assert _by_partition(copies) == _by_partition(source)
    assert len(copies) == 300 + 15  # the aborted transactions stay behind
    # Partition 0 has 100 records + 25 transactional + 5 markers = 130 offsets: 4 ranges.
    assert "315 records" in done.stdout and "10 ranges of 3 partitions" in done.stdout
    # The daemon continues at the end offsets the backfill started with.
    assert _progress(cluster_b, unique) == {p: end - 1 for p, end in ends.items()}
    # Every source offset translates to the copy of the first record at or after it.
    store = _syncs(cluster_a, unique)
    for p in range(3):
        mine = [r for r in source if r.partition == p]
        theirs = [r for r in copies if r.partition == p]
        expected = _expected_translations(mine, theirs)
        assert {n: store.translate(unique, p, n) for n in expected} == expected


def test_daemon_continues_after_the_backfill_without_gap_or_duplicate(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, f"k{i}".encode(), f"{i}".encode()) for i in range(300)])
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    _backfill(config, "--range-records", "60")
    assert len(read_all(cluster_b, f"A.{unique}")) == 300

    # More history arrives; the daemon takes over where the backfill stopped.
    produce(
        cluster_a, unique, [(i % 2, f"k{i}".encode(), f"{i}".encode()) for i in range(300, 500)]
    )
    _transactions(cluster_a, unique, f"tx-{unique}", "aB")
    with running_daemon(config):
        wait_until(
            lambda: len(read_all(cluster_b, f"A.{unique}")) >= 505,
            timeout=60,
            what="the daemon copying what came after the backfill",
        )
        source = read_all(cluster_a, unique)
        copies = read_all(cluster_b, f"A.{unique}")
        # No record twice, none missing, in order, across the hand-over.
        assert _by_partition(copies) == _by_partition(source)

        def translations_exact() -> bool:
            store = _syncs(cluster_a, unique)
            for p in range(2):
                mine = [r for r in source if r.partition == p]
                theirs = [r for r in copies if r.partition == p]
                expected = _expected_translations(mine, theirs)
                if {n: store.translate(unique, p, n) for n in expected} != expected:
                    return False
            return True

        wait_until(translations_exact, what="offset syncs exact across the hand-over")


def _duplicated_once(got: list[tuple[object, ...]], want: list[tuple[object, ...]]) -> int:
    """0 if `got` equals `want`, else the length of the one stretch copied twice,
    back to back (`got` = want[:cut] + want[resumed:] with resumed < cut)."""
    if got == want:
        return 0
    cut = next(i for i, (x, y) in enumerate(zip(got, want, strict=False)) if x != y)
    resumed = want.index(got[cut])
    assert got[:cut] == want[:cut] and got[cut:] == want[resumed:]
    return cut - resumed


def test_failed_range_leaves_only_aborted_records_and_the_rerun_copies_the_rest(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique)
    records = [(0, None, f"{i:06d}".encode() * 16) for i in range(30_000)]
    records[25_000] = (0, None, b"x" * 50_000)  # too large for the remote topic
    produce(cluster_a, unique, records)
    remote = f"A.{unique}"
    create_topic(cluster_b, remote, config={"max.message.bytes": "20000"})
    config = tmp_path / "mm2.properties"
    # Batches small enough for the remote topic; only the large record is refused.
    config.write_text(
        mm2_properties(cluster_a, cluster_b, unique, **{"B.producer.batch.size": "15000"})
    )
    command = _backfill_command(config, "--range-records", "10000", "--parallelism", "1")

    failed = subprocess.run(
        command, capture_output=True, text=True, timeout=BACKFILL_TIMEOUT, check=False
    )
    assert failed.returncode == 1
    assert f"{unique}-0 [20000, 30000) (range 3/3)" in failed.stderr
    assert f"A.{unique} [0] with 1 message(s) failed: Broker: Message size too large" in (
        failed.stderr
    )
    # Two ranges committed and recorded; the third left aborted records only, and no
    # open transaction holds read_committed consumers back.
    assert _progress(cluster_b, unique) == {0: 19_999}
    assert len(read_all(cluster_b, remote)) == 20_000
    assert len(read_all(cluster_b, remote, isolation="read_uncommitted")) >= 20_000
    wait_until(
        lambda: (
            _latest_offsets(cluster_b, remote, IsolationLevel.READ_COMMITTED)
            == _latest_offsets(cluster_b, remote, IsolationLevel.READ_UNCOMMITTED)
        ),
        what="the failed range's transaction aborted (its markers written)",
    )

    admin = clients.admin_client(cluster_b.client_properties())
    resource = ConfigResource(ResourceType.TOPIC, remote)
    resource.add_incremental_config(
        ConfigEntry("max.message.bytes", "100000", incremental_operation=AlterConfigOpType.SET)
    )
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)
    done = _backfill(config, "--range-records", "10000")

    assert "backfill A->B: 10,000 records" in done.stdout  # only the third range
    assert _by_partition(read_all(cluster_b, remote)) == _by_partition(read_all(cluster_a, unique))
    assert _progress(cluster_b, unique) == {0: 29_999}


def test_killed_backfill_runs_again_without_copying_completed_ranges(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    # Eight ranges, each half of its time inside the window the kill waits for: a
    # range committed and the next one's transaction begun (one range is ~0.1 s here).
    total, range_records = 2 * 80_000, 20_000
    produce(
        cluster_a,
        unique,
        [(i % 2, None, f"{i:08d}".encode() * 128) for i in range(total)],
        overrides={"linger.ms": 20, "batch.size": 1_000_000},
    )
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    remote = f"A.{unique}"
    command = _backfill_command(config, "--range-records", str(range_records), "--parallelism", "1")
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def range_begun() -> bool:
            assert proc.poll() is None, "the backfill ended before it could be killed midway"
            try:
                ends = _latest_offsets(cluster_b, remote, IsolationLevel.READ_UNCOMMITTED)
                stable = _latest_offsets(cluster_b, remote, IsolationLevel.READ_COMMITTED)
            except (KafkaException, KeyError):
                return False  # the remote topic is not there yet
            # A range committed and the next one's transaction begun.
            return any(stable.values()) and any(
                0 < ends[p] - stable[p] < range_records // 2 for p in ends
            )

        wait_until(range_begun, timeout=90, interval=0.02, what="a range half copied")
    finally:
        kill_tree(proc.pid)
        proc.wait(30)
    recorded = _progress(cluster_b, unique)
    covered = sum(p + 1 for p in recorded.values())
    assert 0 < covered < total

    done = _backfill(config, "--range-records", str(range_records))

    # The second run copies exactly what the recorded progress did not cover.
    assert f"backfill A->B: {total - covered:,} records" in done.stdout
    source = _by_partition(read_all(cluster_a, unique))
    copies = _by_partition(read_all(cluster_b, remote, timeout=60))
    for p, want in source.items():
        # Equal, unless the kill fell between a commit and its progress record: then
        # that one transaction (at most a range) is on the target twice.
        assert _duplicated_once(copies[p], want) <= range_records


def test_from_and_until_select_records_by_timestamp(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    start = RECENT_MS  # on a whole second
    produce(
        cluster_a,
        unique,
        [(i % 2, None, f"{i}".encode(), [], start + i * 1000) for i in range(100)],
    )
    record_20 = datetime.fromtimestamp((start + 20_000) / 1000, UTC)
    done = _backfill(
        _config(tmp_path, cluster_a, cluster_b, unique),
        "--from",
        record_20.strftime("%Y-%m-%dT%H:%M:%SZ"),  # ISO-8601, as users write it
        "--until",
        str(start + 70_000),  # record 70, not copied
    )
    copies = read_all(cluster_b, f"A.{unique}")
    assert sorted(int(r.value or b"") for r in copies) == list(range(20, 70))
    assert all(r.timestamp == start + int(r.value or b"") * 1000 for r in copies)
    assert "50 records" in done.stdout
    # Record 70 is offset 35 of partition 0 and of partition 1: the daemon continues there.
    assert _progress(cluster_b, unique) == {0: 34, 1: 34}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "last tuesday"], "--from/--until: 'last tuesday' is not 'earliest'"),
        (["--topics", "("], "--topics: invalid regular expression"),
        (["--range-records", "0"], "must be at least 1"),
    ],
)
def test_usage_errors_exit_2_with_one_line(
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    tmp_path: Path,
    args: list[str],
    message: str,
) -> None:
    config = _config(tmp_path, cluster_a, cluster_b, "anything")
    done = subprocess.run(
        _backfill_command(config, *args), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert message in done.stderr
