"""The CPU of the batch copier's round, on the raw clients (asyncio and aiokafka's
connections) against the same round on two blocking sockets: what a copy path without
the event loop would save.

A steady producer (bench.replication's `start_steady`, as in its latency runs: 5,000
records/s of 1 KiB) sends to a topic of `--partitions` partitions on A. Then each system
copies what comes, round after round, to a topic on B, for `--seconds` s after a 5 s
warm-up, `--repeat` times, the systems alternating, after a
run of the raw clients that is not measured (`--settle` s, while the new brokers' JIT
compiles):

- ``raw-clients``: the batch copier's round (mm2py.replication.batch_copier) on
  `RawCopyClients`: `fetch` (the prefetched answer, caught up as the copier's is), then
  `split_batches`, `classify`, `merge_small`, and `produce` of the PASS batches with the
  next Fetch sent first.
- ``blocking-sockets``: the same round on two blocking sockets, one to A's broker and one
  to B's: the prefetched answer read, the same batch code, `rewrite_for_produce`, the
  next Fetch sent, one Produce per batch slot sent and each answer read; the bodies are
  mm2py.kafka.wire's. It has no retries, no metadata, no fetch session (every Fetch is
  full) and one broker a cluster: it sizes a round, it is not a copier.

Prints one JSON line per system and run: rounds a second, CPU of the copying thread per
round (user and system, from ``/proc/<pid>/task/<tid>/stat``), its share of a core, its
CPU-s per million records copied, batches per round, and the 1-minute load before; then
one summary line with the medians and their ratios.

    python -m bench.copy_round [--seconds 20] [--repeat 2] [--partitions 8] [--settle 60]

Clusters as bench.replication's (``MM2PY_LOCAL_PORT_OFFSET`` moves them; fresh ones are
removed at the end).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import struct
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from bench.processes import this_thread_cpu
from bench.replication import bench_clusters, start_steady
from bench.topics import create_topic, end_offsets
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients, wire
from mm2py.kafka.raw_clients import (
    READ_COMMITTED,
    BatchRejected,
    FetchSession,
    IdempotentProduceSession,
    OffsetOutOfRange,
    RawCopyClients,
)
from mm2py.kafka.record_batches import (
    AbortedTransaction,
    Decision,
    RecordBatch,
    classify,
    merge_small,
    next_sequence,
    rewrite_for_produce,
    split_batches,
)

TP = tuple[str, int]
WARM_UP_S = 5.0
INIT_RETRIES = 60
FETCH_KEY, PRODUCE_KEY, INIT_PRODUCER_ID_KEY = 1, 0, 22
FETCH_VERSION, PRODUCE_VERSION = 11, 7
CLIENT_ID = b"mm2py-bench-round"
_HEADER = struct.Struct(">ihhih")  # size, api key, version, correlation id, client id length
_I32 = struct.Struct(">i")


def _passing(
    answers: Mapping[TP, tuple[int, bytes, list[AbortedTransaction]]],
) -> tuple[dict[TP, list[RecordBatch]], dict[TP, int]]:
    """The copier's batch code over one round's answers (partition: position, records,
    aborted): each partition's PASS batches and where it goes on."""
    passing: dict[TP, list[RecordBatch]] = {}
    ends: dict[TP, int] = {}
    for tp, (position, records, aborted) in answers.items():
        items = merge_small(classify(split_batches(records).batches, position, aborted))
        if items:
            passing[tp] = [i.batch for i in items if i.decision is Decision.PASS]
            ends[tp] = items[-1].batch.header.last_offset + 1
    return passing, ends


class RawClientsRound:
    """The batch copier's round on `RawCopyClients`."""

    def __init__(self, source: str, target: str, positions: dict[TP, int], remote: str) -> None:
        self.positions = positions
        self.remote = remote
        self.raw = RawCopyClients(
            FetchSession.like_consumer({"bootstrap.servers": source}),
            IdempotentProduceSession({"bootstrap.servers": target}),
            "bench",
        )
        self.raw.open()

    def __call__(self) -> tuple[int, int]:
        answers = {}
        for tp, result in self.raw.fetch(self.positions).items():
            if isinstance(result, OffsetOutOfRange):
                raise result
            answers[tp] = (result.position, result.records, result.aborted)
        passing, ends = _passing(answers)
        ahead = self.positions | ends
        batches = {(self.remote, tp[1]): v for tp, v in passing.items() if v}
        for tp, outcome in self.raw.produce(batches, prefetch=ahead).items():
            if isinstance(outcome, BatchRejected):
                raise RuntimeError(f"produce to {tp[0]}-{tp[1]}: {outcome}")
        self.positions.update(ends)
        return sum(len(v) for v in batches.values()), _records(batches)

    def close(self) -> None:
        self.raw.close()


class _Link:
    """One blocking connection to a broker: requests written whole, answers read in order."""

    def __init__(self, bootstrap: str) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation = 0
        self.buffer = bytearray()

    def send(self, key: int, version: int, body: bytes) -> None:
        self.correlation += 1
        size = _HEADER.size - 4 + len(CLIENT_ID) + len(body)
        head = _HEADER.pack(size, key, version, self.correlation, len(CLIENT_ID))
        self.sock.sendall(head + CLIENT_ID + body)

    def answer(self) -> memoryview:
        """The next answer's body, past its correlation id."""
        while True:
            if len(self.buffer) >= 4:
                (size,) = _I32.unpack_from(self.buffer)
                if len(self.buffer) >= 4 + size:
                    frame = bytes(self.buffer[4 : 4 + size])
                    del self.buffer[: 4 + size]
                    return memoryview(frame)[4:]
            chunk = self.sock.recv(1 << 18)
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


class BlockingSocketsRound:
    """The same round on two blocking sockets (see the module)."""

    def __init__(self, source: str, target: str, positions: dict[TP, int], remote: str) -> None:
        self.positions = positions
        self.remote = remote
        self.fetch_link = _Link(source)
        self.produce_link = _Link(target)
        self.producer_id, self.epoch = self._init_producer_id()
        self.sequences: dict[int, int] = {}
        self._send_fetch()

    def _init_producer_id(self) -> tuple[int, int]:
        for _ in range(INIT_RETRIES):
            # InitProducerId v0: no transactional id, no transaction timeout
            self.produce_link.send(INIT_PRODUCER_ID_KEY, 0, struct.pack(">hi", -1, 0))
            _, error, producer_id, epoch = struct.unpack_from(">ihqh", self.produce_link.answer())
            if error == 0:
                return producer_id, epoch
            time.sleep(0.5)
        raise RuntimeError(f"InitProducerId on B failed: error {error}")

    def _send_fetch(self) -> None:
        by_topic: dict[str, list[tuple[int, int, int]]] = {}
        for (topic, partition), position in self.positions.items():
            by_topic.setdefault(topic, []).append((partition, position, 1 << 20))
        body = wire.encode_fetch(
            max_wait_ms=500,
            min_bytes=1,
            max_bytes=16 << 20,
            isolation_level=READ_COMMITTED,
            session_id=0,
            session_epoch=-1,
            topics=list(by_topic.items()),
            forgotten=[],
        )
        self.fetch_link.send(FETCH_KEY, FETCH_VERSION, body)

    def __call__(self) -> tuple[int, int]:
        answer = wire.decode_fetch_answer(self.fetch_link.answer())
        answers = {}
        for topic, partitions in answer.topics:
            for number, code, _high, _stable, _start, aborted, _replica, records in partitions:
                tp = (str(topic), int(number))  # type: ignore[call-overload]
                if code:
                    raise RuntimeError(f"fetch of {tp}: error {code}")
                answers[tp] = (
                    self.positions[tp],
                    bytes(records or b""),  # type: ignore[call-overload]
                    [AbortedTransaction(int(p), int(o)) for p, o in aborted or ()],  # type: ignore[attr-defined]
                )
        passing, ends = _passing(answers)
        self.positions.update(ends)
        self._send_fetch()
        payloads: dict[int, list[bytes]] = {}
        for (_, partition), batches in passing.items():
            sequence = self.sequences.get(partition, 0)
            out = payloads.setdefault(partition, [])
            for batch in batches:
                out.append(
                    bytes(rewrite_for_produce(batch, self.producer_id, self.epoch, sequence, False))
                )
                sequence = next_sequence(sequence, batch.header.record_count)
            self.sequences[partition] = sequence
        slots = max((len(v) for v in payloads.values()), default=0)
        for slot in range(slots):
            entries = [(p, v[slot]) for p, v in payloads.items() if len(v) > slot]
            body = wire.encode_produce(None, -1, 30_000, [(self.remote, entries)])
            self.produce_link.send(PRODUCE_KEY, PRODUCE_VERSION, body)
        for _ in range(slots):
            for topic, partitions in wire.decode_produce_answer(self.produce_link.answer()).topics:
                for partition in partitions:
                    if partition[1]:
                        raise RuntimeError(
                            f"produce to {topic}-{partition[0]}: error {partition[1]}"
                        )
        return sum(len(v) for v in payloads.values()), _records(passing)

    def close(self) -> None:
        self.fetch_link.close()
        self.produce_link.close()


def _records(batches: Mapping[Any, list[RecordBatch]]) -> int:
    return sum(b.header.record_count for v in batches.values() for b in v)


SYSTEMS: dict[str, Callable[[str, str, dict[TP, int], str], Any]] = {
    "raw-clients": RawClientsRound,
    "blocking-sockets": BlockingSocketsRound,
}


def _leaders_known(cluster: LocalCluster, topics: list[str], partitions: int) -> None:
    """Wait until every partition of `topics` has a leader (the sockets' round has no
    retries)."""
    admin = clients.admin_client(cluster.client_properties())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        listed = admin.list_topics(timeout=10).topics
        if all(
            t in listed
            and len(listed[t].partitions) == partitions
            and all(p.leader >= 0 for p in listed[t].partitions.values())
            for t in topics
        ):
            return
        time.sleep(0.2)
    raise RuntimeError(f"topics {topics} on {cluster.alias} have no leaders after 30 s")


def measure(
    system: str,
    source: LocalCluster,
    target: LocalCluster,
    args: argparse.Namespace,
    remote: str,
    run: int,
) -> dict[str, Any]:
    load = os.getloadavg()[0]
    positions = {(args.topic, p): end for p, end in end_offsets(source, args.topic).items()}
    copy = SYSTEMS[system](source.bootstrap_servers, target.bootstrap_servers, positions, remote)
    try:
        until = time.monotonic() + WARM_UP_S
        while time.monotonic() < until:
            copy()
        rounds = batches = records = 0
        user0, system0 = this_thread_cpu()
        start = time.monotonic()
        while time.monotonic() - start < args.seconds:
            b, r = copy()
            rounds, batches, records = rounds + 1, batches + b, records + r
        wall = time.monotonic() - start
        user1, system1 = this_thread_cpu()
    finally:
        copy.close()
    cpu = (user1 - user0) + (system1 - system0)
    return {
        "system": system,
        "run": run,
        "rounds_per_s": round(rounds / wall, 1),
        "cpu_us_per_round": round(cpu / rounds * 1e6, 1),
        "user_us_per_round": round((user1 - user0) / rounds * 1e6, 1),
        "system_us_per_round": round((system1 - system0) / rounds * 1e6, 1),
        "core_share": round(cpu / wall, 3),
        "cpu_s_per_m_records": round(cpu / records * 1e6, 1) if records else None,
        "batches_per_round": round(batches / rounds, 2),
        "records": records,
        "load_1m_before": round(load, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.copy_round", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--topic", default="bench-round-source")
    parser.add_argument("--settle", type=float, default=60.0)
    args = parser.parse_args(argv)
    clusters, started = bench_clusters()
    source, target = clusters["A"], clusters["B"]
    producer = None
    try:
        create_topic(source, args.topic, args.partitions)
        producer = start_steady(source, args.topic)
        # Each system and run copies to a topic of its own, made before any is measured.
        remotes = {
            (system, run): f"bench-round-{system}-{run}"
            for system in SYSTEMS
            for run in range(-1, args.repeat)
        }
        for remote in remotes.values():
            create_topic(target, remote, args.partitions)
        _leaders_known(target, list(remotes.values()), args.partitions)
        # The brokers' JIT compiles while they are new: a run of the raw clients first,
        # not measured (`--settle` s).
        settle = argparse.Namespace(**{**vars(args), "seconds": args.settle})
        measure("raw-clients", source, target, settle, remotes["raw-clients", -1], -1)
        lines = []
        for run in range(args.repeat):
            for system in SYSTEMS:
                line = measure(system, source, target, args, remotes[system, run], run)
                print(json.dumps(line), flush=True)
                lines.append(line)
        medians = {
            system: statistics.median(
                line["cpu_s_per_m_records"] for line in lines if line["system"] == system
            )
            for system in SYSTEMS
        }
        rounds = {
            system: statistics.median(
                line["cpu_us_per_round"] for line in lines if line["system"] == system
            )
            for system in SYSTEMS
        }
        print(
            json.dumps(
                {
                    "system": "summary",
                    "median_cpu_s_per_m_records": medians,
                    "median_cpu_us_per_round": rounds,
                    "raw_clients_vs_sockets_per_record": round(
                        medians["raw-clients"] / medians["blocking-sockets"], 2
                    ),
                    "raw_clients_vs_sockets_per_round": round(
                        rounds["raw-clients"] / rounds["blocking-sockets"], 2
                    ),
                }
            )
        )
    finally:
        if producer is not None:
            producer.terminate()
            producer.communicate()
        if started is not None:
            started.down(["A", "B"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
