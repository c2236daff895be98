"""Exactly-once replication against real brokers: records and progress commit together.

A live producer writes numbered records into A (plain ones, and transactions of which
some abort) while `mm2py run` with ``B.exactly.once.source.support = enabled`` is
killed with -9 at random moments and started again. A read_committed reader of the
remote topic must then see every committed source record exactly once, in the
source's order per partition, and every offset sync must name a committed copy (no
sync points at a record of a transaction that was aborted by a kill).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import signal
import time
from bisect import bisect_left
from collections import defaultdict
from pathlib import Path

import pytest

from mm2py.compat.formats import OffsetSync, is_position_sync
from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka.internal_topics import read_offset_syncs
from mm2py.replication.exactly_once import transactional_id
from tests.daemon_harness import mm2_properties, running_daemon
from tests.integration.test_cluster import _running_tasks, _tasks_of, _wait_tasks
from tests.kafka_helpers import (
    SYNCS_TOPIC,
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

EXACTLY_ONCE = {"B.exactly.once.source.support": "enabled"}
PARTITIONS = 4
# How a fenced producer's failure shows in the log (librdkafka's words).
_FENCED = re.compile(r"fenced|old epoch", re.IGNORECASE)
# Live traffic on A: 20 plain records every 10 ms, and a transaction every third round, a
# third of them aborted.
RATE = 2000.0
TRAFFIC = Transactions(every=3)


def _by_partition(records: list[Rec]) -> dict[int, list[bytes | None]]:
    out: dict[int, list[bytes | None]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[rec.partition].append(rec.value)
    return out


def test_kill_9_while_copying_leaves_every_record_once_and_syncs_on_committed_copies(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, unique: str
) -> None:
    topic = f"eos-{unique}"
    create_topic(cluster_a, topic, PARTITIONS)
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(
            cluster_a,
            cluster_b,
            topic,
            **{"tasks.max": "2", "transaction.boundary.interval.ms": "50", **EXACTLY_ONCE},
        )
    )
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    moments = random.Random(seed)
    with LiveProducer(cluster_a, {topic: PARTITIONS}, RATE, TRAFFIC):
        # Three kills, each at a random moment of copying: once the node's copy loops have
        # the topic's partitions, then 1-4 s on. Counted from the node's REST API
        # answering instead (four kills 3-8 s on, until 2026-11-29), three kills of four
        # came before the node had a task: a node started after a kill -9 gets its tasks
        # only once the dead one's group session (10 s) has expired.
        for _ in range(3):
            with running_daemon(config) as node:
                _wait_tasks([node], 2, partitions=PARTITIONS)
                time.sleep(moments.uniform(1.0, 4.0))
                assert node.proc.poll() is None, node.report()
                assert node.status_json("A->B")["delivery"] == "exactly-once"
                node.proc.send_signal(signal.SIGKILL)
                node.proc.wait(10)
        time.sleep(2)
    held, copies = _copy_exactly(cluster_a, cluster_b, config, topic)
    assert b"aborted" not in b"".join(r.value or b"" for r in held)
    # Every sync names a committed copy of its source record; a position's (the source
    # consumer's, past markers and aborted records) names one past the committed copy of
    # the last record before it.
    by_offset_a = {(r.partition, r.offset): r.value for r in held}
    by_offset_b = {(r.partition, r.offset): r.value for r in copies}
    syncs = [
        (OffsetSync.decode(r.key, r.value), is_position_sync(list(r.headers)))
        for r in read_all(cluster_a, SYNCS_TOPIC)
    ]
    ours = [(s, position) for s, position in syncs if s.topic == topic]
    assert ours, "no offset sync was written"
    for sync, position in ours:
        where = f"sync {sync}"
        upstream, downstream = sync.upstream_offset, sync.downstream_offset
        if position:
            upstream = max(o for p, o in by_offset_a if p == sync.partition and o < upstream)
            downstream -= 1
            where = f"position {where}, last record before it at {upstream}"
        assert (sync.partition, downstream) in by_offset_b, f"{where}: no committed copy there"
        assert (
            by_offset_b[(sync.partition, downstream)] == by_offset_a[(sync.partition, upstream)]
        ), where
    # And translation through them never points past a record's copy; exact ones at it
    # (for a consumer: nothing visible in between).
    store = read_offset_syncs(cluster_a.client_properties(), "A", SYNCS_TOPIC)
    assert store is not None
    copies = {(p, value): offset for (p, offset), value in by_offset_b.items()}
    visible: dict[int, list[int]] = defaultdict(list)  # per partition, offsets in order
    for p, offset in sorted(by_offset_b):
        visible[p].append(offset)
    exact = 0
    for (p, offset), value in by_offset_a.items():
        found = store.translation(topic, p, offset)
        if found is None:
            continue
        copy = copies[(p, value)]
        where = f"{topic}-{p} offset {offset}: {found}, copy at {copy}"
        assert found.downstream <= copy, where
        if found.exact:
            # Exact: a read_committed consumer that seeks there reads this copy first.
            # Mostly it is the copy's own offset. Where a position sync (P, d + 1) is
            # the last word on P (the node was killed after the commit that copied P's
            # record, before that commit's syncs were sent), d + 1 is the previous
            # transaction's commit marker, which no consumer sees (seen: 3126, copy
            # at 3127).
            first_visible = visible[p][bisect_left(visible[p], found.downstream)]
            assert first_visible == copy, where
            exact += 1
    print(f"{exact} of {len(by_offset_a)} offsets translate exactly")


def _copy_exactly(
    cluster_a: LocalCluster, cluster_b: LocalCluster, config: Path, topic: str
) -> tuple[list[Rec], list[Rec]]:
    """Run a node until every committed record of `topic` is on B, then check that a
    read_committed reader sees each exactly once, in order, per partition. Returns what
    A holds and the copies on B, as read for the check."""
    remote = f"A.{topic}"
    held = read_all(cluster_a, topic)
    source = _by_partition(held)
    total = sum(len(v) for v in source.values())
    with running_daemon(config) as node:
        # Each probe reads the whole remote topic (tens of thousands of records).
        wait_until(
            lambda: len(read_all(cluster_b, remote)) >= total,
            timeout=90,
            interval=1.0,
            what=f"{total} committed records on B",
        )
        time.sleep(1)  # anything copied twice would show now
        node.stop()
    copies = read_all(cluster_b, remote)  # all the node wrote
    copied = _by_partition(copies)
    for p in range(PARTITIONS):
        assert copied[p] == source[p], (
            f"{remote}-{p}: {len(copied[p])} records for {len(source[p])} "
            f"({len(copied[p]) - len(set(copied[p]))} repeated)"
        )
    return held, copies


def test_a_node_stopped_past_its_session_is_fenced_and_commits_nothing_after(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, unique: str
) -> None:
    """SIGSTOP of a node and its task processes (a paused VM) for longer than its group
    session: its task moves and the new owner fences it; woken up, the zombie's task
    fails to write and commits nothing."""
    topic = f"zombie-{unique}"
    create_topic(cluster_a, topic, PARTITIONS)
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(
            cluster_a,
            cluster_b,
            topic,
            **{"tasks.max": "2", "transaction.boundary.interval.ms": "50", **EXACTLY_ONCE},
        )
    )
    with (
        LiveProducer(cluster_a, {topic: PARTITIONS}, RATE, TRAFFIC),
        running_daemon(config) as zombie,
    ):
        _wait_tasks([zombie], 2)
        with running_daemon(config) as other:
            running = _wait_tasks([zombie, other], 2, partitions=PARTITIONS)
            moved = _tasks_of(running, zombie)
            # Stopped before its task process had written (its copy loop not yet started,
            # until 2026-11-29), the zombie learnt of its lost session before it wrote
            # anything: it stopped its task, fenced by nobody. So it stops while it writes.
            ours = {
                int(name.rsplit("-", 1)[1])
                for task in moved
                for name in running[task][1]["partitions"]
            }
            before = end_offsets(cluster_b, f"A.{topic}")
            wait_until(
                lambda: all(end_offsets(cluster_b, f"A.{topic}")[p] > before[p] for p in ours),
                timeout=30,
                what=f"the zombie's task {moved} writing partitions {sorted(ours)} on B",
            )
            tasks = zombie.task_pids()
            for pid in [zombie.proc.pid, *tasks]:
                os.kill(pid, signal.SIGSTOP)
            try:
                wait_until(
                    lambda: _tasks_of(_running_tasks([other]), other) == {0, 1},
                    timeout=45,
                    what=f"task {moved} moved to the other node",
                )
                time.sleep(2)  # the new owner copies and commits
                # A paused VM wakes as a whole, and then the node may stop its task before
                # the task's next write: correct, but not the case tested (a fresh clone's
                # run failed so on 2026-12-06, the node's "tasks lost" 2 ms after the
                # wake, and the task ended with nothing written). So the task processes
                # go on alone until their next write is fenced, and the node after.
                for pid in tasks:
                    os.kill(pid, signal.SIGCONT)
                wait_until(
                    lambda: _FENCED.search(zombie.log()),
                    timeout=30,
                    what="the zombie's task fenced",
                )
            finally:
                for pid in [*tasks, zombie.proc.pid]:
                    with contextlib.suppress(ProcessLookupError):  # a task that has ended
                        os.kill(pid, signal.SIGCONT)
            time.sleep(3)
    _copy_exactly(cluster_a, cluster_b, config, topic)


def test_a_smaller_tasks_max_fences_the_tasks_it_has_no_more(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, unique: str
) -> None:
    """Killed with -9, a node of tasks.max 4 leaves transactions open under the ids of
    tasks 0-3; restarted with tasks.max 2, its tasks fence ids 2 and 3 too: read_committed
    readers get every record well before the brokers' transaction timeout (60 s) would
    have aborted those transactions."""
    topic = f"retask-{unique}"
    create_topic(cluster_a, topic, PARTITIONS)
    common = {
        "transaction.boundary.interval.ms": "50",
        "cluster.group.prefix": f"eos-{unique}",
        **EXACTLY_ONCE,
    }
    four, two = tmp_path / "four.properties", tmp_path / "two.properties"
    four.write_text(mm2_properties(cluster_a, cluster_b, topic, **common, **{"tasks.max": "4"}))
    two.write_text(mm2_properties(cluster_a, cluster_b, topic, **common, **{"tasks.max": "2"}))
    with LiveProducer(cluster_a, {topic: PARTITIONS}, RATE, TRAFFIC), running_daemon(four) as node:
        _wait_tasks([node], 4, partitions=PARTITIONS)
        time.sleep(3)
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(10)
    source = _by_partition(read_all(cluster_a, topic))
    total = sum(len(v) for v in source.values())
    with running_daemon(two) as node:
        started = time.monotonic()
        wait_until(
            lambda: len(read_all(cluster_b, f"A.{topic}")) >= total,
            timeout=40,
            what=f"{total} committed records on B",
        )
        print(f"caught up {time.monotonic() - started:.1f} s after the start")
        # Ids 2 and 3 (other tests' flows on these clusters may have had more tasks).
        # The catch-up can be over before the node has logged anything: where every record
        # was committed before the kill, B holds them all at once (a fresh clone's run,
        # 2026-12-07: the log held only the config's lines). So wait for the fencing.
        pattern = re.compile(r"fencing the transactional ids (.*) \(tasks of an earlier")
        fenced = wait_until(
            lambda: pattern.search(node.log()), timeout=30, what="the node to fence the old ids"
        )
        ids = fenced[1].split(", ")
        assert {f"eos-{unique}-A->B-2", f"eos-{unique}-A->B-3"} <= set(ids), ids
        node.stop()
    _copy_exactly(cluster_a, cluster_b, two, topic)


@pytest.mark.parametrize("copy_mode", ["auto", "record"])
def test_the_target_producers_transaction_timeout_is_the_one_the_coordinator_holds(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, unique: str, copy_mode: str
) -> None:
    """``B.producer.transaction.timeout.ms``, which MM2 gives its tasks' producers, is
    the timeout of mm2py's transactions too (the batch copier's own InitProducerId and
    librdkafka's): a transaction a killed task left open is aborted after it."""
    create_topic(cluster_a, unique, partitions=1)
    config = tmp_path / "mm2.properties"
    settings = {
        **EXACTLY_ONCE,
        "B.producer.transaction.timeout.ms": "15000",
        "replication.copy.mode": copy_mode,
    }
    config.write_text(mm2_properties(cluster_a, cluster_b, unique, **settings))
    flow = load_config(config).flow("A", "B")
    tid = transactional_id(flow.settings.cluster_group_prefix, "A", "B", 0)
    produce(cluster_a, unique, [(0, None, b"one"), (0, None, b"two")])
    with running_daemon(config) as daemon:
        read_all(cluster_b, f"A.{unique}", expected=2, timeout=60)
        assert transaction_timeout_ms(cluster_b, tid) == 15_000
        assert daemon.status_json("A->B")["copier"] == (
            "record" if copy_mode == "record" else "batch"
        )
        assert "transaction.timeout.ms is not used" not in daemon.log()
