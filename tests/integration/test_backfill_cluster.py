"""`mm2py backfill` on a Spark standalone cluster: a master and two workers, each its own
process, whose executors have neither mm2py nor confluent-kafka (issue 26).

Nothing tells the backfill where Python is: it ships its own packed Python with the job
(`spark.archives`), as it would to machines it has never seen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import IsolationLevel, KafkaException

from mm2py.backfill import submit
from mm2py.backfill.environment import packed_environment
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.spark import LocalSpark, spark_home, worker_environment
from tests.daemon_harness import running_daemon
from tests.integration.test_backfill import (
    BACKFILL_TIMEOUT,
    _by_partition,
    _config,
    _expected_translations,
    _latest_offsets,
    _progress,
    _syncs,
    _transactions,
)
from tests.kafka_helpers import (
    awkward_records,
    create_topic,
    end_offsets,
    produce,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

# With the workers frozen, how long a commit sent just before has to write its markers.
SETTLE_FROZEN = 2.0
# How long the workers copy between two frozen looks for an open transaction.
RUN_BETWEEN_FREEZES = 0.5


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSpark]:
    cluster = LocalSpark(tmp_path_factory.mktemp("spark"), workers=2, cores=1, memory="1g")
    # What the executors would start by themselves cannot run the copy.
    for module in ("mm2py", "confluent_kafka"):
        found = subprocess.run(
            ["python3", "-c", f"import {module}"],
            env=worker_environment(),
            cwd=cluster.folder,
            capture_output=True,
            check=False,
        )
        assert found.returncode != 0, f"the workers' python3 imports {module}: not a bare cluster"
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _cluster_backfill(
    spark: LocalSpark, config: Path, topic: str, *args: str
) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYTHONPATH")}
    command = [
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
        spark.master_url,
        "--topics",
        topic,
        *args,
    ]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
    )


def _next_at_or_after(offsets: list[int], position: int | None) -> int | None:
    """The first of the (ascending) record offsets at or after `position`."""
    if position is None:
        return None
    return next((o for o in offsets if o >= position), None)


def _finished(proc: subprocess.Popen[str]) -> str:
    out, err = proc.communicate(timeout=BACKFILL_TIMEOUT * 2)
    assert proc.returncode == 0, err[-3000:]
    return out


def test_the_packed_python_runs_on_its_own(tmp_path: Path) -> None:
    archive = packed_environment()
    assert packed_environment() == archive  # built once, then reused
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "environment", filter="tar")
    probe = (
        "import json, sys, confluent_kafka, mm2py.backfill.copier\n"
        "maps = [l.split()[-1] for l in open('/proc/self/maps') if 'libpython' in l]\n"
        "print(json.dumps([sys.prefix, sys.path, confluent_kafka.__file__, maps]))"
    )
    done = subprocess.run(
        ["./environment/bin/python", "-c", probe],
        env={"PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    prefix, path, kafka_module, libpython = json.loads(done.stdout)
    # Everything it imports comes from the archive, its libpython included.
    inside = str(tmp_path / "environment")
    assert prefix == inside
    assert all(p.startswith(inside) for p in path if p)
    assert kafka_module.startswith(inside)
    assert libpython and all(p.startswith(inside) for p in libpython)


def test_cluster_backfill_copies_exactly_and_the_daemon_continues(
    spark: LocalSpark,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
) -> None:
    create_topic(cluster_a, unique, partitions=3)
    sent = awkward_records(600, partitions=3)  # keys, nulls, headers, timestamps
    produce(cluster_a, unique, sent[:300])
    _transactions(cluster_a, unique, f"tx-{unique}", "AbC")  # markers and aborted records
    produce(cluster_a, unique, sent[300:])
    ends = end_offsets(cluster_a, unique)
    config = _config(tmp_path, cluster_a, cluster_b, unique)

    out = _finished(_cluster_backfill(spark, config, unique, "--range-records", "70"))

    source = read_all(cluster_a, unique)
    copies = read_all(cluster_b, f"A.{unique}")
    assert _by_partition(copies) == _by_partition(source)
    assert len(copies) == 600 + 10
    assert "610 records" in out
    assert _progress(cluster_b, unique) == {p: end - 1 for p, end in ends.items()}
    store = _syncs(cluster_a, unique)
    for p in range(3):
        mine = [r for r in source if r.partition == p]
        theirs = [r for r in copies if r.partition == p]
        expected = _expected_translations(mine, theirs)
        # A consumer of the copy at the translated offset reads the copy of the first
        # record at or after n next. (The translation may be a transaction marker's
        # offset just before it: a range's transaction on a busy executor commits more
        # than once, and such a marker takes a target offset; the consumer skips it.)
        offsets = [r.offset for r in theirs]
        resumes = {n: _next_at_or_after(offsets, store.translate(unique, p, n)) for n in expected}
        assert resumes == expected
    # The executors ran the Python the backfill shipped, unpacked in their work folders.
    assert list(spark.folder.glob("worker*/app-*/*/environment/bin/python"))

    produce(cluster_a, unique, [(i % 3, f"k{i}".encode(), f"{i}".encode()) for i in range(300)])
    with running_daemon(config):
        wait_until(
            lambda: len(read_all(cluster_b, f"A.{unique}")) >= 910,
            timeout=60,
            what="the daemon copying what came after the backfill",
        )
        # No record twice, none missing, in order, across the hand-over.
        assert _by_partition(read_all(cluster_b, f"A.{unique}")) == _by_partition(
            read_all(cluster_a, unique)
        )


def test_spark_submit_runs_the_backfill_on_the_cluster(
    spark: LocalSpark,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, f"k{i}".encode(), f"{i}".encode()) for i in range(400)])
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    # The driver is this Python (it has mm2py); the executors get nothing but the job.
    env = dict(worker_environment(), PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [
            str(spark_home() / "bin" / "spark-submit"),
            "--master",
            spark.master_url,
            submit.__file__,
            str(config),
            "--source",
            "A",
            "--target",
            "B",
            "--topics",
            unique,
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=BACKFILL_TIMEOUT * 2,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "400 records" in done.stdout
    assert _by_partition(read_all(cluster_b, f"A.{unique}")) == _by_partition(
        read_all(cluster_a, unique)
    )


# Last in the module: it leaves the cluster with one worker.
def test_worker_killed_mid_copy_costs_no_record_twice_and_loses_none(
    spark: LocalSpark,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    total, range_records = 2 * 60_000, 30_000
    produce(
        cluster_a,
        unique,
        [(i % 2, f"k{i}".encode(), f"{i:08d}".encode() * 64) for i in range(total)],
        overrides={"linger.ms": 20, "batch.size": 1_000_000},
    )
    remote = f"A.{unique}"
    config = _config(tmp_path, cluster_a, cluster_b, unique)
    # One range at a time: the one busy worker's task owns whatever transaction is open.
    # With two at once, a task whose Python worker was still starting (18 s of a task's
    # 32 s in a fresh clone's CI run) stood beside one copying, and which of them held
    # the one open transaction could not be told: no look matched until the end.
    proc = _cluster_backfill(
        spark, config, unique, "--range-records", str(range_records), "--parallelism", "1"
    )

    def busy_worker() -> tuple[int] | None:
        """(i,) for worker i whose executor is inside a range's open transaction, or None."""
        assert proc.poll() is None, "the backfill ended before a worker could be killed"
        before = [spark.running_tasks(i) for i in range(spark.workers)]
        try:
            ends = _latest_offsets(cluster_b, remote, IsolationLevel.READ_UNCOMMITTED)
            stable = _latest_offsets(cluster_b, remote, IsolationLevel.READ_COMMITTED)
        except (KafkaException, KeyError):
            return None  # the remote topic is not there yet
        if [spark.running_tasks(i) for i in range(spark.workers)] != before:
            return None  # a task started or ended meanwhile: look again
        open_transactions = sum(1 for p in (0, 1) if ends.get(p, 0) > stable.get(p, 0))
        busy = [i for i, tasks in enumerate(before) if tasks]
        assert len(busy) <= 1, f"two ranges copying at once with --parallelism 1: {before}"
        if busy and open_transactions:
            return (busy[0],)
        return None

    reached_target = False

    def copying() -> bool:
        """Whether records of the backfill have reached the target, committed or not
        (once they have, they stay: asked no more)."""
        nonlocal reached_target
        if not reached_target:
            try:
                ends = _latest_offsets(cluster_b, remote, IsolationLevel.READ_UNCOMMITTED)
            except (KafkaException, KeyError):
                return False  # the remote topic is not there yet
            reached_target = sum(ends.values()) > 0
        return reached_target

    def frozen_in_a_transaction() -> tuple[int] | None:
        """`busy_worker` once every worker is frozen and a commit sent before had time to
        write its markers (a transaction seen open may be one committing, and then the
        kill would cost nothing; frozen, it stays open until the kill). The workers are
        frozen as soon as a worker runs a task and records have reached the target, not
        once a transaction is seen open: on a busy machine a range's transaction could
        open and commit between two looks, and the backfill end before one was seen (a
        fresh clone's CI run did). Not found, they run for RUN_BETWEEN_FREEZES before the
        next look, so the copy goes on between looks but cannot end unseen. Not before
        records reach the target: the first task's Python worker, still starting (up to
        18 s in a CI run), would run a fifth of the time, and the test took 48 s to find
        a transaction where the copy itself takes a few seconds."""
        assert proc.poll() is None, "the backfill ended before a worker could be killed"
        if not any(spark.running_tasks(i) for i in range(spark.workers)) or not copying():
            return None
        for i in range(spark.workers):
            spark.freeze_worker(i)
        time.sleep(SETTLE_FROZEN)
        found = busy_worker()
        if found is None:
            for i in range(spark.workers):
                spark.freeze_worker(i, frozen=False)
            time.sleep(RUN_BETWEEN_FREEZES)
        return found

    (victim,) = wait_until(
        frozen_in_a_transaction, timeout=180, interval=0.05, what="a worker copying"
    )
    spark.kill_worker(victim)
    for i in range(spark.workers):
        if i != victim:
            spark.freeze_worker(i, frozen=False)

    _finished(proc)

    assert _by_partition(read_all(cluster_b, remote, timeout=60)) == _by_partition(
        read_all(cluster_a, unique, timeout=60)
    )
    assert _progress(cluster_b, unique) == {0: total // 2 - 1, 1: total // 2 - 1}
    # The killed attempt's records are on the target, aborted: read_committed readers
    # never see them.
    assert len(read_all(cluster_b, remote, isolation="read_uncommitted", timeout=60)) > total
