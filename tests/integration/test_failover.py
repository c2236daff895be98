"""Proof by failover: a group that moves from A to B with translated offsets sees every
record once — none twice, none missed — in every case exact translation must cover.

Each case produces numbered records to A, lets a consumer group read part of them
there and commit, fails the group over to B with `mm2py translate-offsets --apply`
(which reads only the checkpoints on B), and reads the rest on B. The scenario
code is replicator-agnostic: bench/failover_mm2.py runs the same cases against the
real MirrorMaker 2 and prints its duplicates and gaps.

mm2py runs every case in both modes: at-least-once, and exactly-once
(``B.exactly.once.source.support = enabled``, ``exactly.once.support = required``),
where B holds aborted attempts and transaction markers between the records and the
failed-over group reads B read_committed: the offset syncs must describe committed
records only for translation to stay exact.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition

from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.tools.translate import gather
from tests.conftest import Clusters
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import (
    READ_TO_END,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

# --------------------------------------------------------------------- scenario

SETTLE = 5.0


@dataclass
class Outcome:
    """What a failover gave: the verdict is duplicates == gaps == 0."""

    case: str
    consumed_on_a: int
    expected_on_b: int
    read_on_b: int = 0
    duplicates: int = 0
    gaps: int = 0
    translated: bool = True  # every partition had a checkpoint at the group's offset
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        extra = "" if self.translated else " (no checkpoint at the group's offset)"
        return (
            f"{self.case:<14} consumed on A {self.consumed_on_a:>6}, expected on B "
            f"{self.expected_on_b:>6}, read on B {self.read_on_b:>6}: "
            f"duplicates {self.duplicates}, gaps {self.gaps}{extra}"
        )


def numbered(start: int, count: int, partitions: int = 1) -> list[tuple[int, bytes, bytes]]:
    """Records whose value is their number; keyed so compaction keeps them apart."""
    return [
        (n % partitions, f"k{n}".encode(), str(n).encode()) for n in range(start, start + count)
    ]


def produce_transactions(a: LocalCluster, topic: str, batches: int, size: int) -> set[bytes]:
    """Every third transaction aborted; return the committed values."""
    producer = Producer(dict(a.client_properties(), **{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    committed: set[bytes] = set()
    n = 0
    for batch in range(batches):
        producer.begin_transaction()
        values = [str(n + i).encode() for i in range(size)]
        n += size
        for value in values:
            producer.produce(topic, value=value, partition=0)
        end_transaction(producer, commit=batch % 3 != 1)
        if batch % 3 != 1:
            committed.update(values)
    return committed


def consume_and_commit(
    a: LocalCluster, topic: str, group: str, count: int | None = None, seconds: float = 0.0
) -> tuple[list[bytes], dict[int, int]]:
    """Read `count` records (or for `seconds`) as `group` on A, commit, leave the group."""
    consumer = clients.consumer(
        a.client_properties(),
        {
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        },
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    positions: dict[int, int] = {}
    # Joining the group and the first fetch take a few seconds on a busy machine; the
    # `seconds` of reading start with the first record.
    deadline = time.monotonic() + 60
    started = None
    try:
        while (count is None or len(values) < count) and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error() is not None:
                continue
            if started is None and seconds:
                started = time.monotonic()
                deadline = started + seconds
            values.append(msg.value() or b"")
            positions[msg.partition() or 0] = (msg.offset() or 0) + 1
        assert count is None or len(values) == count, f"read {len(values)} of {count} on A"
        consumer.commit(
            offsets=[TopicPartition(topic, p, o) for p, o in positions.items()],
            asynchronous=False,
        )
    finally:
        consumer.close()
    return values, positions


def wait_copied(
    b: LocalCluster,
    remote: str,
    counts: dict[int, int],
    timeout: float = 60,
    transactional: bool = False,
) -> None:
    """Until the remote topic holds `counts` records per partition. An at-least-once
    target is dense (its end offset counts its records); a `transactional` one has
    markers (and aborted attempts) between them, so its committed records are counted."""

    def probe() -> bool:
        try:
            ends = end_offsets(b, remote)
        except Exception:  # not created yet
            return False
        if not all(ends.get(p, 0) >= n for p, n in counts.items()):
            return False
        if not transactional:
            return True
        copied: dict[int, int] = {}
        for rec in read_all(b, remote):  # read_committed, up to the stable offset
            copied[rec.partition] = copied.get(rec.partition, 0) + 1
        return all(copied.get(p, 0) >= n for p, n in counts.items())

    wait_until(probe, timeout=timeout, what=f"{counts} records in {remote}")


def fail_over(r: Replicator, group: str, topic: str, positions: dict[int, int]) -> bool:
    """Wait for checkpoints at the group's offsets, then `translate-offsets --apply`.

    With `r.exact`, wait until translate-offsets confirms every partition (status ok);
    otherwise (real MM2) only until the checkpoints reach the group's offsets, and
    apply whatever is there after `r.checkpoint_timeout`. Returns whether they did.
    """
    config, exact, timeout = r.config, r.exact, r.checkpoint_timeout
    mirror = load_config(config)
    flow = mirror.flow("A", "B")

    # Without an exactness check (MM2), take the checkpoints once they have stayed the
    # same for SETTLE seconds: MM2's best translation, not its first.
    last: dict[int, int | None] = {}
    since = [time.monotonic()]

    def ready() -> bool:
        try:
            report = gather(mirror, flow, group, [topic])
        except (KafkaException, TimeoutError):
            return False  # e.g. a broker restarting under another test: ask again
        rows = {r.partition: r for r in report.rows if r.translated}
        reached = all(
            p in rows and rows[p].upstream_offset == o and (rows[p].status == "ok" or not exact)
            for p, o in positions.items()
        )
        if exact or not reached:
            return reached
        now = {p: rows[p].downstream_offset for p in positions}
        if now != last:
            last.clear()
            last.update(now)
            since[0] = time.monotonic()
        return time.monotonic() - since[0] >= SETTLE

    try:
        wait_until(ready, timeout=timeout, interval=0.5, what=f"checkpoints of {group}")
        reached = True
    except AssertionError:
        if exact:
            raise
        reached = bool(last)
    cmd = [sys.executable, "-m", "mm2py.cli", "translate-offsets", str(config)]
    cmd += ["--source", "A", "--target", "B", "--group", group, "--topic", topic]
    # MM2's checkpoints are not proven exact: they are committed as they are when asked.
    apply = ["--apply", "--json"] if exact else ["--apply", "--accept-inexact", "--json"]
    done = subprocess.run([*cmd, *apply], capture_output=True, text=True)
    assert done.returncode in (0, 1), done.stderr
    if reached:
        assert json.loads(done.stdout)["applied"] == len(positions)
    return reached


def read_rest_on_b(
    b: LocalCluster, remote: str, group: str, expected: set[bytes], timeout: float = 60
) -> list[bytes]:
    """Read as `group` on B from its committed offsets until every expected value came
    and every partition is at its end (so that duplicates before them are seen too)."""
    consumer = clients.consumer(
        b.client_properties(),
        {
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            **READ_TO_END,  # its end known at once (kafka_helpers.READ_TO_END)
            # What an exactly-once target promises: once each, to read_committed readers.
            "isolation.level": "read_committed",
        },
    )
    consumer.subscribe([remote])
    values: list[bytes] = []
    missing = set(expected)
    at_end: set[int] = set()
    quiet_since = time.monotonic()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            msgs = consumer.consume(5000, 0.2)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(msg.partition() or 0)
                    continue
                at_end.discard(msg.partition() or 0)
                value = msg.value() or b""
                values.append(value)
                missing.discard(value)
                quiet_since = time.monotonic()
            assigned = {tp.partition for tp in consumer.assignment()}
            if not missing and assigned and at_end >= assigned:
                break
            if missing == set() and time.monotonic() - quiet_since > 5:
                break
    finally:
        consumer.close()
    return values


def score(case: str, consumed: list[bytes], valid: set[bytes], read: list[bytes]) -> Outcome:
    """Duplicates: records read on B that A already delivered, or read twice on B."""
    rest = valid - set(consumed)
    seen = set(read)
    return Outcome(
        case,
        len(consumed),
        len(rest),
        len(read),
        duplicates=len(read) - len(seen) + len(seen & set(consumed)),
        gaps=len(rest - seen),
    )


def run_config(tmp: Path, a: LocalCluster, b: LocalCluster, prefix: str, **extra: str) -> Path:
    path = tmp / f"{prefix}.properties"
    path.write_text(mm2_properties(a, b, f"{prefix}-.*", groups=f"{prefix}-.*", **extra))
    return path


# Each case below takes a `Replicator`-shaped fixture: a config path on which a
# replicator (mm2py here, real MM2 in the bench) is running, and the clusters.


@dataclass
class Replicator:
    a: LocalCluster
    b: LocalCluster
    config: Path
    prefix: str
    exact: bool = True  # mm2py: wait for exact checkpoints; MM2: take what comes
    checkpoint_timeout: float = 30.0
    transactional: bool = False  # copies in transactions: B is not dense

    def names(self, case: str) -> tuple[str, str, str]:
        topic = f"{self.prefix}-{case}"
        return topic, f"A.{topic}", f"{topic}-group"


def case_head(r: Replicator) -> Outcome:
    """Live traffic: the group reads at the head, fails over while producing goes on."""
    topic, remote, group = r.names("head")
    partitions = 3
    create_topic(r.a, topic, partitions=partitions)
    stop = threading.Event()
    produced = [0]

    def traffic() -> None:
        producer = clients.producer(r.a.client_properties(), {"linger.ms": 5})
        while not stop.is_set():
            for p, k, v in numbered(produced[0], 100, partitions):
                producer.produce(topic, value=v, key=k, partition=p)
            produced[0] += 100
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(30)

    thread = threading.Thread(target=traffic, daemon=True)
    thread.start()
    try:
        wait_until(lambda: produced[0] >= 1000, what="traffic")
        consumed, positions = consume_and_commit(r.a, topic, group, seconds=2.0)
        reached = fail_over(r, group, topic, positions)
        time.sleep(1.0)  # traffic keeps flowing after the failover
    finally:
        stop.set()
        thread.join(30)
    valid = {str(n).encode() for n in range(produced[0])}
    read = read_rest_on_b(r.b, remote, group, valid - set(consumed))
    out = score("head", consumed, valid, read)
    out.translated = reached
    return out


def case_far_behind(r: Replicator) -> Outcome:
    """The group committed at 10 of 100,000 records."""
    topic, remote, group = r.names("far-behind")
    create_topic(r.a, topic)
    total = 100_000
    produce(r.a, topic, numbered(0, total), overrides={"linger.ms": 20})
    consumed, positions = consume_and_commit(r.a, topic, group, count=10)
    wait_copied(r.b, remote, {0: total}, transactional=r.transactional)
    reached = fail_over(r, group, topic, positions)
    valid = {str(n).encode() for n in range(total)}
    out = score(
        "far-behind", consumed, valid, read_rest_on_b(r.b, remote, group, valid - set(consumed))
    )
    out.translated = reached
    return out


def case_idle(r: Replicator) -> Outcome:
    """The topic went quiet; the group read all of it; records come again after failover."""
    topic, remote, group = r.names("idle")
    create_topic(r.a, topic)
    produce(r.a, topic, numbered(0, 1000))
    wait_copied(r.b, remote, {0: 1000}, transactional=r.transactional)
    time.sleep(2.0)  # idle: nothing produced, nothing copied
    consumed, positions = consume_and_commit(r.a, topic, group, count=1000)
    reached = fail_over(r, group, topic, positions)
    produce(r.a, topic, numbered(1000, 100))
    valid = {str(n).encode() for n in range(1100)}
    out = score("idle", consumed, valid, read_rest_on_b(r.b, remote, group, valid - set(consumed)))
    out.translated = reached
    return out


def case_transactional(r: Replicator) -> Outcome:
    """Aborted transactions and markers leave gaps on A that B does not have."""
    topic, remote, group = r.names("transactional")
    create_topic(r.a, topic)
    valid = produce_transactions(r.a, topic, batches=30, size=10)
    wait_copied(r.b, remote, {0: len(valid)}, transactional=r.transactional)
    consumed, positions = consume_and_commit(r.a, topic, group, count=95)
    reached = fail_over(r, group, topic, positions)
    read = read_rest_on_b(r.b, remote, group, valid - set(consumed))
    out = score("transactional", consumed, valid, read)
    out.translated = reached
    return out


COMPACTED_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": "100",
    "min.cleanable.dirty.ratio": "0.001",
    "min.compaction.lag.ms": "0",
    "delete.retention.ms": "100",
}


def start_compaction(a: LocalCluster, topic: str) -> None:
    """A compacted topic whose keys repeat, with a closed segment for the cleaner."""
    create_topic(a, topic, config=COMPACTED_CONFIG)
    produce(a, topic, [(0, f"k{n % 50}".encode(), str(n).encode()) for n in range(500)])
    time.sleep(0.2)  # past segment.ms: the next record rolls the segment
    produce(a, topic, [(0, b"roll", b"roll-start")])


def wait_compacted(a: LocalCluster, topic: str, timeout: float = 60) -> set[bytes]:
    """Until the broker's cleaner removed old records (every 15 s); return the survivors."""
    rolls = iter(range(1_000_000))

    def compacted() -> set[bytes] | None:
        survivors = read_all(a, topic)
        if len(survivors) < 400:
            return {r.value or b"" for r in survivors}
        produce(a, topic, [(0, b"roll", f"roll-{next(rolls)}".encode())])
        return None

    return wait_until(compacted, timeout=timeout, interval=1.0, what=f"compaction of {topic}")


def compact_on_a(a: LocalCluster, topic: str, timeout: float = 60) -> set[bytes]:
    start_compaction(a, topic)
    return wait_compacted(a, topic, timeout)


def case_compacted(r: Replicator) -> Outcome:
    """Compacted on A before it was copied: its offsets have gaps, B's have none."""
    topic, remote, group = r.names("compacted")
    wait_copied(r.b, remote, {0: len(read_all(r.a, topic))}, transactional=r.transactional)
    consumed, positions = consume_and_commit(r.a, topic, group, count=20)
    reached = fail_over(r, group, topic, positions)
    valid = {r.value or b"" for r in read_all(r.a, topic)}
    read = read_rest_on_b(r.b, remote, group, valid - set(consumed))
    out = score("compacted", consumed, valid, read)
    out.translated = reached
    return out


def case_restart(r: Replicator, start: Callable[[], AbstractContextManager[Any]]) -> Outcome:
    """Half copied, the replicator restarted; the group commits right after the restart,
    at an offset only the syncs written before the restart translate."""
    topic, remote, group = r.names("restart")
    create_topic(r.a, topic)
    produce(r.a, topic, numbered(0, 500))
    with start():
        wait_copied(r.b, remote, {0: 500}, transactional=r.transactional)
        time.sleep(1.5)  # the replicator syncs and records its progress
    produce(r.a, topic, numbered(500, 500))
    with start():
        consumed, positions = consume_and_commit(r.a, topic, group, count=300)
        wait_copied(r.b, remote, {0: 1000}, transactional=r.transactional)
        reached = fail_over(r, group, topic, positions)
    valid = {str(n).encode() for n in range(1000)}
    out = score(
        "restart", consumed, valid, read_rest_on_b(r.b, remote, group, valid - set(consumed))
    )
    out.translated = reached
    return out


@contextmanager
def mm2py_daemon(config: Path) -> Iterator[RunningDaemon]:
    """`mm2py run`, stopped gracefully at the end."""
    with running_daemon(config) as daemon:
        yield daemon
        assert daemon.stop()[0] == 0


# ------------------------------------------------------------------------ tests

Mode = Literal["at-least-once", "exactly-once"]
MODES: list[Mode] = ["at-least-once", "exactly-once"]
# mm2py's exactly-once keys (MM2's): `required`, so that a config mm2py could not run
# exactly once fails the test instead of passing at-least-once.
EXACTLY_ONCE = {"B.exactly.once.source.support": "enabled", "exactly.once.support": "required"}


def mode_config(tmp: Path, a: LocalCluster, b: LocalCluster, prefix: str, mode: Mode) -> Path:
    return run_config(tmp, a, b, prefix, **(EXACTLY_ONCE if mode == "exactly-once" else {}))


def mode_replicator(
    a: LocalCluster, b: LocalCluster, config: Path, prefix: str, mode: Mode
) -> Replicator:
    return Replicator(a, b, config, prefix, transactional=mode == "exactly-once")


@pytest.fixture(scope="module", params=MODES)
def replicated(
    request: pytest.FixtureRequest, clusters: Clusters, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replicator, RunningDaemon]]:
    """One mm2py daemon per mode for the cases that need no restart of their own."""
    mode: Mode = request.param
    a, b = clusters["A"], clusters["B"]
    prefix = f"failover-{uuid.uuid4().hex[:8]}"
    config = mode_config(tmp_path_factory.mktemp("failover"), a, b, prefix, mode)
    with mm2py_daemon(config) as daemon:
        yield mode_replicator(a, b, config, prefix, mode), daemon


def _assert_exact(out: Outcome) -> None:
    print(out.line())
    assert out.translated
    assert (out.duplicates, out.gaps) == (0, 0), out.line()
    assert out.read_on_b == out.expected_on_b


def test_failover_at_the_head_under_live_traffic(
    replicated: tuple[Replicator, RunningDaemon],
) -> None:
    _assert_exact(case_head(replicated[0]))


def test_failover_of_a_group_far_behind(replicated: tuple[Replicator, RunningDaemon]) -> None:
    out = case_far_behind(replicated[0])
    _assert_exact(out)
    assert out.read_on_b == 99_990


def test_failover_on_an_idle_topic(replicated: tuple[Replicator, RunningDaemon]) -> None:
    _assert_exact(case_idle(replicated[0]))


def test_failover_on_a_transactional_topic(replicated: tuple[Replicator, RunningDaemon]) -> None:
    _assert_exact(case_transactional(replicated[0]))


@pytest.mark.parametrize("mode", MODES)
def test_failover_right_after_the_replicator_restarts(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, mode: Mode
) -> None:
    prefix = f"failover-r-{uuid.uuid4().hex[:8]}"
    config = mode_config(tmp_path, cluster_a, cluster_b, prefix, mode)
    replicator = mode_replicator(cluster_a, cluster_b, config, prefix, mode)
    _assert_exact(case_restart(replicator, lambda: mm2py_daemon(config)))


def _compacted_prefix(base: str, mode: Mode) -> str:
    # Neither prefix starts the other: each mode's daemon copies only its own topic.
    return f"{base}-{'eos' if mode == 'exactly-once' else 'alo'}"


@pytest.fixture(scope="module", autouse=True)
def compacting(clusters: Clusters) -> str:
    """Starts compacting a topic per mode on A first thing, as the broker's cleaner takes
    its time; the compacted case comes last and finds it done. Returns the base prefix."""
    base = f"failover-c-{uuid.uuid4().hex[:8]}"
    for mode in MODES:
        start_compaction(clusters["A"], f"{_compacted_prefix(base, mode)}-compacted")
    return base


@pytest.mark.parametrize("mode", MODES)
def test_failover_on_a_topic_compacted_before_it_was_copied(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, compacting: str, mode: Mode
) -> None:
    prefix = _compacted_prefix(compacting, mode)
    wait_compacted(cluster_a, f"{prefix}-compacted")
    config = mode_config(tmp_path, cluster_a, cluster_b, prefix, mode)
    with mm2py_daemon(config):
        _assert_exact(case_compacted(mode_replicator(cluster_a, cluster_b, config, prefix, mode)))
