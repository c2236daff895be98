"""The real MirrorMaker 2 runs from our runner, and writes its progress the way formats.py reads it.

This pins the Connect offsets format (`mm2-offsets.<source>.internal`) against MM2
4.1.1 itself: key bytes, placement in the 25-partition topic, and the value meaning
"last source offset copied".
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mm2py.compat.formats import (
    DEFAULT_OFFSET_STORAGE_PARTITIONS,
    SOURCE_CONNECTOR_NAME,
    SourceProgressKey,
    decode_progress_value,
    partition_for_key,
)
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import RealMirrorMaker, mm2_properties, replicating_pattern
from tests.kafka_helpers import (
    RECENT_MS,
    Rec,
    create_topic,
    end_offsets,
    produce,
    read_all,
    wait_until,
)

PARTITIONS = 2
PER_PARTITION = 100


def _progress(cluster: LocalCluster, topic: str) -> dict[int, Rec]:
    """The latest record of `topic`'s source progress per source partition (compaction view)."""
    latest: dict[int, Rec] = {}
    for rec in read_all(cluster, "mm2-offsets.A.internal"):
        try:
            key = SourceProgressKey.decode(rec.key)
        except ValueError:
            continue  # other connectors' offsets share the topic
        if key.topic == topic:
            latest[key.partition] = rec
    return latest


def _copied(cluster: LocalCluster, remote: str) -> int:
    try:
        return sum(end_offsets(cluster, remote).values())
    except Exception:  # the remote topic does not exist until MM2 creates it
        return 0


@pytest.mark.parametrize(
    ("topic", "partitions", "expected"),
    [
        ("t", "[t-0]", True),
        ("t", "[u-1, t-0]", True),
        ("t", "[t-3, u-0]", True),
        ("t", "[xt-0, tx-1]", False),
        ("t", "[t-x-0]", False),  # partition 0 of topic "t-x", not of "t"
        ("t-x", "[t-x-0]", True),
        ("a.b", "[axb-0]", False),
    ],
)
def test_replicating_pattern_names_the_topic(topic: str, partitions: str, expected: bool) -> None:
    line = (
        "[2026-01-01 00:00:00,000] INFO task-thread-MirrorSourceConnector-0 replicating "
        f"1 topic-partitions A->B: {partitions}. (org.apache.kafka.connect.mirror.MirrorSourceTask)"
    )
    assert bool(replicating_pattern(topic).search(line)) is expected
    assert replicating_pattern().search(line)


@pytest.mark.integration
def test_real_mm2_replicates_and_commits_progress(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    topic, remote = unique, f"A.{unique}"
    create_topic(cluster_a, topic, partitions=PARTITIONS)
    produce(
        cluster_a,
        topic,
        [
            (p, f"k{p}-{i}".encode(), f"v{p}-{i}".encode(), [("h", f"{i}".encode())], RECENT_MS + i)
            for p in range(PARTITIONS)
            for i in range(PER_PARTITION)
        ],
    )
    total = PARTITIONS * PER_PARTITION
    props = mm2_properties(
        "A", cluster_a.bootstrap_servers, "B", cluster_b.bootstrap_servers, topic
    )

    with RealMirrorMaker(props, tmp_path / "mm2") as mm2:
        mm2.wait_replicating(topic, timeout=120)
        wait_until(lambda: _copied(cluster_b, remote) >= total, 60, what=f"{total} on {remote}")
        exit_status = mm2.stop()  # graceful: MM2 commits the tasks' offsets on the way out

    assert exit_status is not None
    source = read_all(cluster_a, topic, expected=total)
    copied = read_all(cluster_b, remote, expected=total)
    assert sorted(r.content() for r in copied) == sorted(r.content() for r in source)
    assert len(copied) == total

    progress = _progress(cluster_b, topic)
    assert {p: decode_progress_value(r.value) for p, r in progress.items()} == {
        p: PER_PARTITION - 1 for p in range(PARTITIONS)
    }
    for p, rec in progress.items():
        key = SourceProgressKey(SOURCE_CONNECTOR_NAME, "A", topic, p)
        assert rec.key == key.encode()  # byte for byte what mm2py writes
        assert rec.value == b'{"offset":%d}' % (PER_PARTITION - 1)
        assert rec.partition == partition_for_key(key.encode(), DEFAULT_OFFSET_STORAGE_PARTITIONS)
