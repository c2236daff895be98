"""The daemon passing the source's batches through as they are (issue 29: at-least-once and
exactly-once in the default mode, auto, or with ``replication.copy.mode = batch``),
against real brokers.

Four source topics: zstd-compressed, uncompressed, transactional with aborted transactions
(lz4, two producers interleaved), and LogAppendTime (zstd: every batch goes record by record
through the record path). The proof: a read_committed reader sees the same keys, values,
headers, timestamps and order on both sides; every source offset, and the end offset past
the last marker, translates through the offset syncs exactly to its copy; and
`mm2py translate-offsets` gives a group's exact offsets on the target.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from mm2py.dev.launcher import LocalCluster
from mm2py.dev.processes import process_tree
from mm2py.kafka import clients
from mm2py.kafka.internal_topics import read_offset_syncs
from mm2py.replication.progress import ProgressStore
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import (
    RECENT_MS,
    SYNCS_TOPIC,
    Rec,
    commit_offsets,
    create_topic,
    end_offsets,
    end_transaction,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2
RECORDS = 3000
_COORDINATOR_NOT_READY = (
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
)


def _produce(
    cluster: LocalCluster,
    topic: str,
    compression: str,
    count: int = RECORDS,
    partitions: Sequence[int] = tuple(range(PARTITIONS)),
) -> None:
    """Records with keys, headers (one empty, one null) and distinct timestamps, round
    robin over `partitions`."""
    producer = clients.producer(
        cluster.client_properties(),
        # batches of about 70 records: many per partition
        {"linger.ms": 20, "compression.type": compression, "batch.size": 16384},
    )
    for n in range(count):
        producer.produce(
            topic,
            key=f"k{n}".encode() if n % 3 else None,
            value=f"{compression} record {n} ".encode() * 8,
            headers=[("n", f"{n}".encode()), ("empty", b""), ("null", None)],
            timestamp=RECENT_MS + n,
            partition=partitions[n % len(partitions)],
        )
        if n % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def _transactions(cluster: LocalCluster, topic: str) -> None:
    """Producer x commits, producer y aborts every other transaction; batches interleave."""
    producers = []
    for name in ("x", "y"):
        producer = clients.producer(
            cluster.client_properties(),
            {"transactional.id": f"{topic}-{name}", "linger.ms": 5, "compression.type": "lz4"},
        )
        producer.init_transactions(30)
        producers.append(producer)
    for round_ in range(6):
        for producer in producers:
            producer.begin_transaction()
        for i in range(40):
            for name, producer in zip(("x", "y"), producers, strict=True):
                producer.produce(
                    topic,
                    key=f"{name}-{round_}-{i}".encode(),
                    value=f"txn {name} {round_} {i}".encode(),
                    headers=[("round", f"{round_}".encode())],
                    timestamp=RECENT_MS + round_ * 100 + i,
                    partition=i % PARTITIONS,
                )
            if i % 10 == 9:
                for producer in producers:
                    producer.flush(30)  # a batch per producer, interleaved in the log
        end_transaction(producers[0], commit=True)
        end_transaction(producers[1], commit=round_ % 2 == 0)


def _by_partition(recs: list[Rec]) -> dict[int, list[Rec]]:
    out: dict[int, list[Rec]] = {}
    for rec in recs:
        out.setdefault(rec.partition, []).append(rec)
    return out


def _copied(a: LocalCluster, b: LocalCluster, topic: str, after: int = -1) -> bool:
    """Whether B holds every record of `topic` read from A (read_committed) after `after`."""
    source = [r for r in read_all(a, topic) if r.offset > after]
    return len(read_all(b, f"A.{topic}")) >= len(source) > 0


def _check_exact(
    a: LocalCluster,
    b: LocalCluster,
    topic: str,
    after: int = -1,
    partitions: Sequence[int] = tuple(range(PARTITIONS)),
    exactly_once: bool = False,
) -> None:
    """Same records in the same order (those after source offset `after`) in `partitions`
    (the ones with records); every offset and the end translate exactly: to the target's
    end, or exactly-once to the offset after the last copy (the target's end is past its
    commit marker)."""
    source = _by_partition([r for r in read_all(a, topic) if r.offset > after])
    target = _by_partition(read_all(b, f"A.{topic}"))
    assert sorted(source) == sorted(target) == sorted(partitions), topic
    store = read_offset_syncs(a.client_properties(), "A", SYNCS_TOPIC)
    assert store is not None
    ends_a, ends_b = end_offsets(a, topic), end_offsets(b, f"A.{topic}")
    for p in partitions:
        assert [r.content() for r in source[p]] == [r.content() for r in target[p]], (topic, p)
        for src, copy in zip(source[p], target[p], strict=True):
            translation = store.translation(topic, p, src.offset)
            assert translation is not None and translation.exact, (topic, p, src.offset)
            assert translation.downstream == copy.offset, (topic, p, src.offset, translation)
        # A group that read everything (past the last marker) lands at the target's end.
        end = store.translation(topic, p, ends_a[p])
        end_b = target[p][-1].offset + 1 if exactly_once else ends_b[p]
        assert end is not None and end.exact and end.downstream == end_b, (topic, p, end)


def _commit(cluster: LocalCluster, group: str, offsets: dict[tuple[str, int], int]) -> bool:
    """Commit, False while the group coordinator is not ready yet (fresh clusters)."""
    try:
        commit_offsets(cluster, group, offsets)
    except KafkaException as exc:
        if exc.args[0].code() not in _COORDINATOR_NOT_READY:
            raise
        return False
    return True


def _translate(config: Path, group: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "mm2py.cli", "translate-offsets", str(config)]
    cmd += ["--source", "A", "--target", "B", "--group", group, "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(
    "exactly_once", [pytest.param(False, id="at-least-once"), pytest.param(True, id="exactly-once")]
)
def test_batch_mode_copies_batches_identically_with_exact_syncs(
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
    exactly_once: bool,
) -> None:
    topics = {
        "zstd": f"{unique}-zstd",
        "none": f"{unique}-none",
        "txn": f"{unique}-txn",
        "append": f"{unique}-append",
    }
    for kind, topic in topics.items():
        config = {"message.timestamp.type": "LogAppendTime"} if kind == "append" else None
        create_topic(cluster_a, topic, partitions=PARTITIONS, config=config)
    _produce(cluster_a, topics["zstd"], "zstd")
    _produce(cluster_a, topics["none"], "none")
    _produce(cluster_a, topics["append"], "zstd", count=300)
    _transactions(cluster_a, topics["txn"])
    group = f"{unique}-g"
    # The group at the first and the last offset of the transactional topic: 0 and its
    # end, past the last commit marker.
    ends = end_offsets(cluster_a, topics["txn"])
    wait_until(
        lambda: _commit(cluster_a, group, {(topics["txn"], 0): 0, (topics["txn"], 1): ends[1]}),
        what=f"{group}'s offsets committed on A",
    )
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(
            cluster_a,
            cluster_b,
            f"{unique}-.*",
            # No replication.copy.mode: the default, auto, passes batches through.
            groups=f"{unique}-.*",
            **({"B.exactly.once.source.support": "enabled"} if exactly_once else {}),
        )
    )
    with running_daemon(config) as daemon:
        for topic in topics.values():
            wait_until(
                lambda topic=topic: _copied(cluster_a, cluster_b, topic),
                timeout=120,
                interval=1.0,
                what=f"every record of {topic} on B",
            )
        # The sync of the position past the last marker is written after the records'.
        for topic in topics.values():
            wait_until(
                lambda topic=topic: _exact_now(
                    cluster_a, cluster_b, topic, exactly_once=exactly_once
                ),
                timeout=30,
                interval=1.0,
                what=f"{topic}'s offsets translating exactly",
            )
        done = wait_until(
            lambda: _translated(config, group), timeout=60, interval=2.0, what="translate-offsets"
        )
        metrics = daemon.metrics()
        assert daemon.stop()[0] == 0
        log_text = daemon.log()
    assert "flow A->B copies record batches as they are (replication.copy.mode = auto)" in (
        log_text
    )
    assert "now copying batches of" in log_text
    # Passed as they are, markers and aborted batches dropped, LogAppendTime batches (and
    # nothing else) record by record.
    reasons = dict(
        word.split("=")
        for word in log_text.split("batches by reason since the start: ")[1].split("\n")[0].split()
    )
    assert all(int(reasons[r]) > 0 for r in ("whole", "control", "aborted", "log_append_time"))
    assert {r for r, n in reasons.items() if n != "0"} == {
        "whole",
        "control",
        "aborted",
        "log_append_time",
    }, reasons
    # mm2py_batches_total counts the same, as of the scrape (before the log's count).
    for reason, logged in reasons.items():
        line = f'mm2py_batches_total{{reason="{reason}",source="A",target="B"}} '
        scraped = float(metrics.split(line, 1)[1].split("\n", 1)[0])
        assert scraped <= int(logged) and (scraped > 0) == (logged != "0"), (reason, scraped)
    remote = f"A.{topics['txn']}"
    ends_b = end_offsets(cluster_b, remote)
    if exactly_once:  # past the last copy, before the target's commit marker
        ends_b = {
            p: recs[-1].offset + 1 for p, recs in _by_partition(read_all(cluster_b, remote)).items()
        }
    rows = [(r["topic"], r["partition"], r["downstream_offset"]) for r in done["rows"]]
    assert rows == [(remote, 0, 0), (remote, 1, ends_b[1])]
    if exactly_once:
        assert "A->B copies exactly-once (" in log_text
    for topic in topics.values():
        copied = len(read_all(cluster_a, topic))
        line = f'mm2py_records_total{{source="A",target="B",topic="A.{topic}"}} {copied}.0'
        assert line in metrics, (line, [m for m in metrics.splitlines() if topic in m][:5])


def _exact_now(
    a: LocalCluster,
    b: LocalCluster,
    topic: str,
    after: int = -1,
    partitions: Sequence[int] = tuple(range(PARTITIONS)),
    exactly_once: bool = False,
) -> bool:
    try:
        _check_exact(a, b, topic, after, partitions, exactly_once)
    except AssertionError as exc:
        print(f"not exact yet: {exc}")
        return False
    return True


def _translated(config: Path, group: str) -> dict[str, object] | None:
    done = _translate(config, group)
    if done.returncode != 0:
        print(done.stdout, done.stderr)
        return None
    report: dict[str, object] = json.loads(done.stdout)
    return report


def _reasons(log_text: str) -> dict[str, int]:
    """The batch copier's last count of batches by reason, from the daemon's log."""
    line = log_text.rsplit("batches by reason since the start: ", 1)[1].split("\n")[0]
    return {word.split("=")[0]: int(word.split("=")[1]) for word in line.split()}


def test_batch_mode_resumes_from_progress_inside_a_zstd_batch(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    """Progress left inside a batch (by MM2 or the record copier): that batch goes record
    by record from the next offset (librdkafka decodes its zstd), the rest as it is."""
    create_topic(cluster_a, unique, partitions=PARTITIONS)
    _produce(cluster_a, unique, "zstd")
    last_copied = 10  # inside each partition's first batch
    store = ProgressStore(cluster_b.client_properties(), "B", "A", "mm2-offsets.A.internal", 1)
    try:
        store.submit({(unique, p): last_copied for p in range(PARTITIONS)}, lambda *_: None)
        assert store.flush(30)
    finally:
        store.close()
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(cluster_a, cluster_b, unique, **{"replication.copy.mode": "batch"})
    )
    with running_daemon(config) as daemon:
        wait_until(
            lambda: _copied(cluster_a, cluster_b, unique, last_copied),
            timeout=120,
            interval=1.0,
            what=f"the records of {unique} after offset {last_copied} on B",
        )
        wait_until(
            lambda: _exact_now(cluster_a, cluster_b, unique, last_copied),
            timeout=30,
            interval=1.0,
            what=f"{unique}'s offsets translating exactly",
        )
        assert daemon.stop()[0] == 0
        reasons = _reasons(daemon.log())
    copies = read_all(cluster_b, f"A.{unique}")
    assert len(copies) == RECORDS - PARTITIONS * (last_copied + 1)
    assert reasons["starts_before_position"] == PARTITIONS and reasons["whole"] > 0, reasons


MANY = 40
BUSY = (0, 13, 26, 39)  # the partitions with records at first; the others idle
LATER = (5, 20, 33)  # idle partitions that get records while the copier runs


def _threads(pid: int) -> int:
    """The threads of `pid` and its descendants now."""
    total = 0
    for member in process_tree(pid):
        with contextlib.suppress(FileNotFoundError):
            total += len(os.listdir(f"/proc/{member}/task"))
    return total


def _steady_threads(pid: int, samples: int = 10, interval: float = 0.5) -> int:
    """The fewest threads `_threads` sees in `samples` looks `interval` apart: the threads
    that stay. A count at one moment also holds what periodic work runs then (a spare
    task process starting, an admin client of topic discovery, a group description's
    loop); two fresh-clone runs on 2026-11-28 counted 16 and 39 such threads. A thread
    per partition would be there in every look."""
    fewest = _threads(pid)
    for _ in range(samples - 1):
        time.sleep(interval)
        fewest = min(fewest, _threads(pid))
    return fewest


def test_batch_mode_copies_a_few_busy_partitions_among_many_idle_ones(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    """One round fetches all 40 partitions: records of the 4 busy ones, and later of 3
    that were idle, arrive identically with exact syncs while the rest stay idle; and
    adding the 40 partitions to a copier of one adds no thread per partition (the raw
    clients of every partition share one event-loop thread)."""
    one, many = f"{unique}-one", f"{unique}-many"
    create_topic(cluster_a, one, partitions=1)
    _produce(cluster_a, one, "zstd", count=200, partitions=(0,))
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(cluster_a, cluster_b, f"{unique}-.*", **{"replication.copy.mode": "batch"})
    )
    with running_daemon(config) as daemon:
        wait_until(
            lambda: _exact_now(cluster_a, cluster_b, one, partitions=(0,)),
            timeout=120,
            interval=1.0,
            what=f"{one} on B, translating exactly",
        )
        threads_one = _steady_threads(daemon.proc.pid)
        create_topic(cluster_a, many, partitions=MANY)
        _produce(cluster_a, many, "zstd", count=800, partitions=BUSY)
        wait_until(
            lambda: _exact_now(cluster_a, cluster_b, many, partitions=BUSY),
            timeout=120,
            interval=1.0,
            what=f"the busy partitions of {many} on B, translating exactly",
        )
        _produce(cluster_a, many, "lz4", count=300, partitions=LATER)
        wait_until(
            lambda: _exact_now(cluster_a, cluster_b, many, partitions=sorted(BUSY + LATER)),
            timeout=60,
            interval=1.0,
            what=f"the records produced later into idle partitions of {many} on B",
        )
        threads_many = _steady_threads(daemon.proc.pid)
        metrics = daemon.metrics()
        assert daemon.stop()[0] == 0
        log_text = daemon.log()
    assert len(read_all(cluster_b, f"A.{many}")) == 1100
    assert end_offsets(cluster_b, f"A.{many}") == end_offsets(cluster_a, many)
    line = f'mm2py_records_total{{source="A",target="B",topic="A.{many}"}} 1100.0'
    assert line in metrics, [m for m in metrics.splitlines() if many in m][:5]
    assert _reasons(log_text)["whole"] > 0
    print(f"threads: {threads_one} copying 1 partition, {threads_many} copying {MANY + 1}")
    # A raw fetcher and producer per partition made 80 threads for these 40 partitions.
    assert threads_many - threads_one < MANY // 4, (threads_one, threads_many)
