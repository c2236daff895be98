"""Interchangeability with the real MirrorMaker 2: each continues where the other stopped.

Both read and write progress in `mm2-offsets.A.internal` on B, so a flow that
MM2 half replicated is finished by mm2py with no gap and no re-copy, and the
other way round — on the very same mm2.properties file.

The exactly-once hand-overs run MM2 with ``B.exactly.once.source.support = enabled``
(its records and progress in one transaction) while a producer keeps writing to A,
plain records and transactions of which every third is aborted: a read_committed
reader of the remote topic must see exactly the committed source records, in order.
"""

from __future__ import annotations

import signal
from collections import defaultdict
from pathlib import Path
from typing import Literal

import pytest

from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import (
    RealMirrorMaker,
    exactly_once_settings,
    mm2_properties,
    render_properties,
)
from mm2py.replication.exactly_once import mirrormaker2_transactional_id, transactional_id
from tests.daemon_harness import running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    LiveProducer,
    Rec,
    Transactions,
    create_topic,
    end_offsets,
    produce,
    read_all,
    transaction_timeout_ms,
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


# ------------------------------------------------- exactly-once, under live traffic


# Live traffic on A, in rounds: a transaction of three records a partition (every third
# aborted), then one plain record a partition from an idempotent producer.
LIVE_RATE = 100.0
LIVE_TRANSACTIONS = Transactions(every=1, per_partition=3)


def _committed_count(cluster: LocalCluster, topic: str) -> int:
    try:
        return len(read_all(cluster, topic))  # read_committed, up to the stable offset
    except Exception:  # not created yet
        return 0


def _committed_per_partition(cluster: LocalCluster, topic: str) -> dict[int, int]:
    counts = dict.fromkeys(range(PARTITIONS), 0)
    for rec in read_all(cluster, topic):  # read_committed, up to each stable offset
        counts[rec.partition] += 1
    return counts


def _assert_exactly_once_copy(a: LocalCluster, b: LocalCluster, topic: str) -> None:
    """Once production stopped: B's remote topic, read read_committed, has every committed
    record of A's topic exactly once, in order per partition (nothing aborted)."""
    remote = f"A.{topic}"
    source = read_all(a, topic)
    wait_until(
        lambda: _committed_count(b, remote) >= len(source),
        timeout=120,
        interval=1.0,
        what=f"{len(source)} committed records in {remote}",
    )
    copied = read_all(b, remote)
    values = [r.value for r in copied]
    repeated = len(values) - len(set(values))
    assert repeated == 0, f"{repeated} records twice in {remote} (read_committed)"
    assert len(copied) == len(source)
    assert _per_partition(copied) == _per_partition(source)


Mode = Literal["at-least-once", "exactly-once"]


def _eos_configs(
    tmp_path: Path,
    a: LocalCluster,
    b: LocalCluster,
    topic: str,
    mm2py_mode: Mode,
    **extra: str,
) -> tuple[Path, Path]:
    """(MM2's file, mm2py's file): MM2's asks for exactly-once; mm2py runs the very same
    file in exactly-once mode, else that file without the exactly-once keys. `extra`
    keys go into both."""
    eos = exactly_once_settings("A", "B")
    props = mm2_properties(
        "A", a.bootstrap_servers, "B", b.bootstrap_servers, topic, **eos, **extra
    )
    mm2 = tmp_path / "mm2-eos.properties"
    mm2.write_text(render_properties(props))
    if mm2py_mode == "exactly-once":
        return mm2, mm2
    off = ("B.exactly.once.source.support", "exactly.once.support")
    plain = {k: v for k, v in props.items() if k not in off}
    mine = tmp_path / "mm2py.properties"
    mine.write_text(render_properties(plain))
    return mm2, mine


MM2PY_MODES: list[Mode] = ["at-least-once", "exactly-once"]
# MM2 copies in transactions: its source task's producer (Connect's id for it,
# <worker group>-<connector>-<task>, the id mm2py fences when it takes the flow over)
# is transactional.
MM2_TRANSACTIONAL = f"transactional.id = {mirrormaker2_transactional_id('A', 0)}"


@pytest.mark.parametrize("mm2py_mode", MM2PY_MODES)
def test_mm2py_continues_where_mirrormaker2_in_exactly_once_mode_stopped(
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
    mm2py_mode: Mode,
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    mm2_config, mm2py_config = _eos_configs(tmp_path, cluster_a, cluster_b, unique, mm2py_mode)
    remote = f"A.{unique}"
    with LiveProducer(cluster_a, {unique: PARTITIONS}, LIVE_RATE, LIVE_TRANSACTIONS) as producer:
        producer.wait_committed(200)
        with RealMirrorMaker(mm2_config, tmp_path / "mm2") as mm2:
            mm2.wait_replicating(unique)
            mm2.wait_for_log(MM2_TRANSACTIONAL, timeout=5)
            wait_until(lambda: _committed_count(cluster_b, remote) >= 200, timeout=90)
            mm2.stop()
        handed_over = _committed_count(cluster_b, remote)
        with running_daemon(mm2py_config) as daemon:
            wait_until(
                lambda: _committed_count(cluster_b, remote) >= handed_over + 200,
                timeout=90,
                what="mm2py copying after MM2",
            )
            producer.stop()
            assert producer.aborted > 0
            _assert_exactly_once_copy(cluster_a, cluster_b, unique)
            assert daemon.stop()[0] == 0


@pytest.mark.parametrize("mm2py_mode", MM2PY_MODES)
def test_mirrormaker2_in_exactly_once_mode_continues_where_mm2py_stopped(
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
    mm2py_mode: Mode,
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    mm2_config, mm2py_config = _eos_configs(tmp_path, cluster_a, cluster_b, unique, mm2py_mode)
    remote = f"A.{unique}"
    with LiveProducer(cluster_a, {unique: PARTITIONS}, LIVE_RATE, LIVE_TRANSACTIONS) as producer:
        producer.wait_committed(200)
        with running_daemon(mm2py_config) as daemon:
            wait_until(
                lambda: _committed_count(cluster_b, remote) >= 200,
                timeout=90,
                what="mm2py copying",
            )
            assert daemon.stop()[0] == 0
        handed_over = _committed_count(cluster_b, remote)
        with RealMirrorMaker(mm2_config, tmp_path / "mm2") as mm2:
            mm2.wait_replicating(unique)
            mm2.wait_for_log(MM2_TRANSACTIONAL, timeout=5)
            wait_until(
                lambda: _committed_count(cluster_b, remote) >= handed_over + 200,
                timeout=90,
                what="MM2 copying after mm2py",
            )
            producer.stop()
            assert producer.aborted > 0
            _assert_exactly_once_copy(cluster_a, cluster_b, unique)


# A writer killed mid-transaction leaves it open, and read_committed readers of the
# remote topic wait at it until it ends. mm2py fences MM2's tasks when it takes a flow
# over from MM2 (mm2py.parts.source), which aborts it at once. MM2 does not know
# mm2py's transactional ids: after mm2py is killed, the brokers abort its open
# transaction after its transaction.timeout.ms (Connect's 60 s unless the target's
# producer settings say otherwise). The test of MM2 after mm2py sets 10 s for both, as
# MM2 takes it (B.producer.transaction.timeout.ms), and checks mm2py's.
SHORT_TRANSACTION_TIMEOUT_MS = 10_000
AFTER_KILL_TIMEOUT = 150
# MM2's transactions in the test of mm2py after MM2: one every 5 s, so that one is open
# when MM2 is killed (MM2's default, a transaction per poll, commits within milliseconds:
# the kill would rarely find one open), and ten minutes before the brokers abort it, far
# beyond that test's 90 s, so that only the fencing can end it. MM2's dedicated mode
# gives its connectors the flow's keys (A->B.), not top-level ones like these.
LONG_TRANSACTIONS = {
    "A->B.transaction.boundary": "interval",
    "A->B.transaction.boundary.interval.ms": "5000",
    "B.producer.transaction.timeout.ms": "600000",
}


def test_mm2py_in_exactly_once_mode_continues_after_mirrormaker2_is_killed(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    config, _same = _eos_configs(
        tmp_path, cluster_a, cluster_b, unique, "exactly-once", **LONG_TRANSACTIONS
    )
    remote = f"A.{unique}"
    with LiveProducer(cluster_a, {unique: PARTITIONS}, LIVE_RATE, LIVE_TRANSACTIONS) as producer:
        producer.wait_committed(200)
        with RealMirrorMaker(config, tmp_path / "mm2") as mm2:
            mm2.wait_replicating(unique)
            mm2.wait_for_log(MM2_TRANSACTIONAL, timeout=5)
            mm2.wait_for_log("transaction.timeout.ms = 600000", timeout=5)
            wait_until(lambda: _committed_count(cluster_b, remote) >= 200, timeout=90)
            mm2.kill()  # SIGKILL while copying: a transaction open, progress in it
        handed_over = _committed_per_partition(cluster_b, remote)
        with running_daemon(config) as daemon:
            # Each partition: one the open transaction wrote to shows nothing past it
            # until the transaction ends.
            wait_until(
                lambda: all(
                    count >= handed_over[p] + 50
                    for p, count in _committed_per_partition(cluster_b, remote).items()
                ),
                timeout=90,
                interval=1.0,
                what="mm2py copying to every partition after MM2 was killed (its open"
                " transaction fenced)",
            )
            producer.stop()
            _assert_exactly_once_copy(cluster_a, cluster_b, unique)
            assert daemon.stop()[0] == 0


def test_mirrormaker2_in_exactly_once_mode_continues_after_mm2py_is_killed(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    timeout = {"B.producer.transaction.timeout.ms": str(SHORT_TRANSACTION_TIMEOUT_MS)}
    config, _same = _eos_configs(tmp_path, cluster_a, cluster_b, unique, "exactly-once", **timeout)
    flow = load_config(config).flow("A", "B")
    tid = transactional_id(flow.settings.cluster_group_prefix, "A", "B", 0)
    remote = f"A.{unique}"
    with LiveProducer(cluster_a, {unique: PARTITIONS}, LIVE_RATE, LIVE_TRANSACTIONS) as producer:
        producer.wait_committed(200)
        with running_daemon(config) as daemon:
            wait_until(
                lambda: _committed_count(cluster_b, remote) >= 200,
                timeout=90,
                what="mm2py copying",
            )
            assert transaction_timeout_ms(cluster_b, tid) == SHORT_TRANSACTION_TIMEOUT_MS
            daemon.stop(signal.SIGKILL)  # its task processes die with it
        handed_over = _committed_count(cluster_b, remote)
        with RealMirrorMaker(config, tmp_path / "mm2") as mm2:
            mm2.wait_replicating(unique)
            wait_until(
                lambda: _committed_count(cluster_b, remote) >= handed_over + 200,
                timeout=AFTER_KILL_TIMEOUT,
                interval=1.0,
                what="MM2 copying after mm2py was killed",
            )
            producer.stop()
            _assert_exactly_once_copy(cluster_a, cluster_b, unique)
