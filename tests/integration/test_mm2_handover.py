"""Interchangeability with the real MirrorMaker 2: each continues where the other stopped.

Both read and write progress in `mm2-offsets.A.internal` on B, so a flow that
MM2 half replicated is finished by mm2py with no gap and no re-copy, and the
other way round — on the very same mm2.properties file.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import RealMirrorMaker, mm2_properties, render_properties
from tests.daemon_harness import running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    Rec,
    create_topic,
    end_offsets,
    produce,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
HALF = 300


def _per_partition(records: list[Rec]) -> dict[int, list[tuple[object, ...]]]:
    out: dict[int, list[tuple[object, ...]]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[rec.partition].append(rec.content())
    return dict(out)


def _count(cluster: LocalCluster, topic: str) -> int:
    try:
        return sum(end_offsets(cluster, topic).values())
    except Exception:  # not created yet
        return 0


def _batch(
    start: int,
) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]], int]]:
    return [
        (
            i % PARTITIONS,
            f"k{i}".encode(),
            f"v{i}".encode(),
            [("n", str(i).encode())],
            RECENT_MS + i,
        )
        for i in range(start, start + HALF)
    ]


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topic: str) -> Path:
    path = tmp_path / "mm2.properties"
    props = mm2_properties("A", a.bootstrap_servers, "B", b.bootstrap_servers, topic)
    path.write_text(render_properties(props))
    return path


def _assert_exact_copy(a: LocalCluster, b: LocalCluster, topic: str) -> None:
    remote = f"A.{topic}"
    wait_until(lambda: _count(b, remote) >= 2 * HALF, timeout=90, what=f"{2 * HALF} in {remote}")
    copied = read_all(b, remote)
    assert len(copied) == 2 * HALF  # nothing copied twice
    assert _per_partition(copied) == _per_partition(read_all(a, topic))  # nothing missing


def test_mm2py_continues_where_mirrormaker2_stopped(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    produce(cluster_a, unique, _batch(0))
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    with RealMirrorMaker(config, tmp_path / "mm2") as mm2:
        wait_until(lambda: _count(cluster_b, f"A.{unique}") >= HALF, timeout=120, what="MM2 copy")
        mm2.stop()
    produce(cluster_a, unique, _batch(HALF))
    with running_daemon(config) as daemon:
        _assert_exact_copy(cluster_a, cluster_b, unique)
        assert daemon.stop()[0] == 0


def test_mirrormaker2_continues_where_mm2py_stopped(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    produce(cluster_a, unique, _batch(0))
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    with running_daemon(config) as daemon:
        wait_until(lambda: _count(cluster_b, f"A.{unique}") >= HALF, what="mm2py copy")
        assert daemon.stop()[0] == 0
    produce(cluster_a, unique, _batch(HALF))
    with RealMirrorMaker(config, tmp_path / "mm2"):
        _assert_exact_copy(cluster_a, cluster_b, unique)
