"""Batch pass-through against real brokers (issue 29's first layer, not yet in the daemon):
fetch a source partition's batches raw from A, classify them, rewrite the PASS ones and
produce them with the idempotent raw producer to B, then read both with confluent-kafka at
read_committed. Brokers and topics run with Kafka's defaults unless a test names a setting.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.raw_partition import (
    Fetched,
    IdempotentRawProducer,
    RawFetcher,
    RawPartitionError,
)
from mm2py.kafka.record_batches import (
    Classified,
    Compression,
    Decision,
    Placement,
    Reason,
    RecordBatch,
    classify,
    split_batches,
)
from tests.conftest import Clusters
from tests.kafka_helpers import (
    RECENT_MS,
    Rec,
    create_topic,
    end_offsets,
    end_transaction,
    read_all,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 2


@dataclass
class Copy:
    """What copying one partition did."""

    classified: list[Classified] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    # the source batch of each placement, as fetched (a copy of its bytes)
    passed: list[bytes] = field(default_factory=list)


def fetch_all(fetcher: RawFetcher, end: int) -> list[tuple[Fetched, list[Classified]]]:
    """Every fetch of a partition from 0 to `end`, each with its batches classified."""
    out: list[tuple[Fetched, list[Classified]]] = []
    position = 0
    while position < end:
        fetched = fetcher.fetch(position)
        split = split_batches(fetched.records)
        assert split.batches, f"no whole batch at {position} ({split.truncated} bytes cut)"
        out.append((fetched, classify(split.batches, position, fetched.aborted)))
        position = split.batches[-1].header.last_offset + 1
    return out


def copy_partition(
    source: LocalCluster, target: LocalCluster, topic: str, partition: int, end: int
) -> Copy:
    """Copy the PASS batches of `topic`-`partition` from A to B (no RECORDS batch is
    expected here: the record copier is not part of this layer)."""
    copy = Copy()
    with (
        RawFetcher(source.client_properties(), topic, partition, max_bytes=64 * 1024) as fetcher,
        IdempotentRawProducer(target.client_properties(), topic, partition) as producer,
    ):
        for _fetched, classified in fetch_all(fetcher, end):
            copy.classified += classified
            assert not [c for c in classified if c.decision is Decision.RECORDS], classified
            passing = [c.batch for c in classified if c.decision is Decision.PASS]
            for batch, base in zip(passing, producer.produce(passing), strict=True):
                copy.placements.append(
                    Placement(batch.header.base_offset, batch.header.record_count, base)
                )
                copy.passed.append(bytes(batch.data))
    return copy


def produce_all(
    cluster: LocalCluster,
    topic: str,
    settings: dict[str, Any],
    base: int,
    partitions: int = PARTITIONS,
) -> None:
    """80 records with keys, headers and timestamps over the partitions, flushed in two
    rounds (one batch a partition each)."""
    producer = clients.producer(cluster.client_properties(), {"linger.ms": 20, **settings})
    for round_ in range(2):
        for i in range(40 * round_, 40 * round_ + 40):
            n = base + i
            producer.produce(
                topic,
                key=f"key-{n}".encode(),
                value=(f"value {n} " * 20).encode(),  # compressible
                headers=[("h", f"{n}".encode()), ("empty", b""), ("null", None)],
                timestamp=RECENT_MS + n,
                partition=i % partitions,
            )
        producer.flush(30)


def interleaved_transactions(cluster: LocalCluster, topic: str) -> None:
    """Producer X commits and producer Y aborts, their batches interleaved in each partition."""
    txns = []
    for name in ("x", "y"):
        producer = clients.producer(
            cluster.client_properties(),
            {"transactional.id": f"{topic}-{name}", "linger.ms": 5, "compression.type": "lz4"},
        )
        producer.init_transactions(30)
        producer.begin_transaction()
        txns.append(producer)
    for round_ in range(2):
        for name, producer in zip(("x", "y"), txns, strict=True):
            for i in range(10):
                producer.produce(
                    topic,
                    key=f"{name}-{round_}-{i}".encode(),
                    value=f"txn {name} {round_} {i}".encode(),
                    headers=[("txn", name.encode())],
                    timestamp=RECENT_MS + 10_000 + i,
                    partition=i % PARTITIONS,
                )
            producer.flush(30)
    end_transaction(txns[1], commit=False)
    end_transaction(txns[0], commit=True)


def by_offset(records: list[Rec]) -> dict[tuple[int, int], Rec]:
    return {(r.partition, r.offset): r for r in records}


def test_batches_pass_through_with_records_unchanged(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str
) -> None:
    topic = unique
    create_topic(cluster_a, topic, PARTITIONS)
    create_topic(cluster_b, topic, PARTITIONS)
    produce_all(cluster_a, topic, {"compression.type": "zstd"}, 0)
    produce_all(cluster_a, topic, {"compression.type": "lz4"}, 1000)
    produce_all(cluster_a, topic, {"compression.type": "none"}, 2000)
    interleaved_transactions(cluster_a, topic)
    produce_all(cluster_a, topic, {"compression.type": "zstd", "enable.idempotence": True}, 3000)
    ends = end_offsets(cluster_a, topic)

    copies = {p: copy_partition(cluster_a, cluster_b, topic, p, ends[p]) for p in range(PARTITIONS)}

    source = read_all(cluster_a, topic)
    target = read_all(cluster_b, topic, expected=len(source))
    # keys, values, headers, timestamps, partitions and order, as a read_committed reader sees
    assert len(source) == 4 * 80 + 20
    for p in range(PARTITIONS):
        assert [r.content() for r in target if r.partition == p] == [
            r.content() for r in source if r.partition == p
        ]
    # each record of a passed batch is at the batch's target base offset + its delta
    sources, targets = by_offset(source), by_offset(target)
    for p, copy in copies.items():
        for placement in copy.placements:
            for offset in range(placement.source_base_offset, placement.source_last_offset + 1):
                assert (
                    targets[(p, placement.target_offset(offset))].content()
                    == sources[(p, offset)].content()
                )
    # what the classification saw, in both partitions
    for copy in copies.values():
        reasons = [c.reason for c in copy.classified]
        assert set(reasons) == {Reason.WHOLE, Reason.CONTROL, Reason.ABORTED}
        assert reasons.count(Reason.CONTROL) == 2  # X's COMMIT and Y's ABORT markers
        assert reasons.count(Reason.ABORTED) == 2  # Y's two batches
        codecs = {c.batch.header.compression for c in copy.classified if c.reason is Reason.WHOLE}
        assert codecs == {Compression.ZSTD, Compression.LZ4, Compression.NONE}


def test_compressed_batches_arrive_byte_for_byte(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str
) -> None:
    """Apart from the header fields a producer sets, the target stores the source's bytes:
    the broker neither decompresses nor recompresses a batch for a topic whose
    compression.type is Kafka's default (`producer`)."""
    topic = unique
    create_topic(cluster_a, topic, PARTITIONS)
    create_topic(cluster_b, topic, PARTITIONS)
    produce_all(cluster_a, topic, {"compression.type": "zstd"}, 0)
    produce_all(cluster_a, topic, {"compression.type": "lz4"}, 1000)
    ends = end_offsets(cluster_a, topic)
    for p in range(PARTITIONS):
        copy = copy_partition(cluster_a, cluster_b, topic, p, ends[p])
        with RawFetcher(cluster_b.client_properties(), topic, p) as fetcher:
            stored: list[RecordBatch] = [
                c.batch for _, classified in fetch_all(fetcher, ends[p]) for c in classified
            ]
        assert len(stored) == len(copy.passed) == 4
        for placement, sent, landed in zip(copy.placements, copy.passed, stored, strict=True):
            original = split_batches(sent).batches[0]
            assert landed.header.compression in (Compression.ZSTD, Compression.LZ4)
            assert landed.header.compression is original.header.compression
            assert bytes(landed.payload) == bytes(original.payload)
            assert landed.header.base_offset == placement.target_base_offset
            same = ("last_offset_delta", "base_timestamp", "max_timestamp", "record_count")
            for name in same:
                assert getattr(landed.header, name) == getattr(original.header, name), name
            assert landed.crc_valid()


# Compaction must have run before the test can see its gaps. Kafka's cleaner only cleans
# closed segments whose dirty ratio is at least min.cleanable.dirty.ratio (default 0.5,
# default segments close after 7 days): segment.ms=1000 closes a segment at the first
# append a second after it opened, and min.cleanable.dirty.ratio=0.01 cleans it at once.
# The cleaner looks every log.cleaner.backoff.ms (15 s, Kafka's default, kept).
COMPACT_NOW = {
    "cleanup.policy": "compact",
    "segment.ms": "1000",
    "min.cleanable.dirty.ratio": "0.01",
}


def test_compacted_batches_go_record_by_record(cluster_a: LocalCluster, unique: str) -> None:
    topic = unique
    create_topic(cluster_a, topic, 1, COMPACT_NOW)
    producer = clients.producer(cluster_a.client_properties(), {"linger.ms": 50})

    def batch_of(keys: list[str], value: bytes | None) -> None:
        for key in keys:
            producer.produce(topic, key=key.encode(), value=value, partition=0)
        producer.flush(30)

    keys = [f"k{i}" for i in range(10)]
    batch_of(keys, b"first")  # offsets 0-9: compaction takes k1, k3, k5, k7 and k9 out
    batch_of(["k1", "k3", "k5", "k7"], b"second")  # 10-13
    batch_of(["k9"], None)  # 14: a tombstone, which gets a delete horizon when cleaned

    def cleaned() -> list[Reason] | None:
        batch_of(["roll"], b"x")  # the append that closes the segment
        with RawFetcher(cluster_a.client_properties(), topic, 0) as fetcher:
            fetched = fetcher.fetch(0)
        reasons = [c.reason for c in classify(split_batches(fetched.records).batches, 0, [])]
        return reasons if Reason.OFFSET_GAPS in reasons else None

    reasons = wait_until(cleaned, timeout=90, interval=2, what="the cleaner to compact")
    assert reasons[0] is Reason.OFFSET_GAPS  # 0-9, five records left
    assert Reason.DELETE_HORIZON in reasons  # the tombstone's batch
    assert all(r.decision is not Decision.DROP for r in reasons)


def test_fetch_in_the_middle_of_a_batch(cluster_a: LocalCluster, unique: str) -> None:
    topic = unique
    create_topic(cluster_a, topic, 1)
    produce_all(cluster_a, topic, {"compression.type": "zstd"}, 0, partitions=1)  # 2 batches
    with RawFetcher(cluster_a.client_properties(), topic, 0) as fetcher:
        whole = fetcher.fetch(0)
        first = split_batches(whole.records).batches[0].header
        middle = fetcher.fetch(first.base_offset + 3)
    classified = classify(split_batches(middle.records).batches, first.base_offset + 3, [])
    assert classified[0].batch.header.base_offset == first.base_offset
    assert classified[0].reason is Reason.STARTS_BEFORE_POSITION
    assert classified[1].reason is Reason.WHOLE
    assert whole.high_watermark == whole.last_stable_offset == 80


def test_log_append_time_batches_go_record_by_record(cluster_a: LocalCluster, unique: str) -> None:
    # a reader sees the append time for every record of such a batch, which the records
    # themselves do not carry: the topic setting under test
    create_topic(cluster_a, unique, 1, {"message.timestamp.type": "LogAppendTime"})
    produce_all(cluster_a, unique, {"compression.type": "zstd"}, 0, partitions=1)
    with RawFetcher(cluster_a.client_properties(), unique, 0) as fetcher:
        fetched = fetcher.fetch(0)
    classified = classify(split_batches(fetched.records).batches, 0, fetched.aborted)
    assert [c.reason for c in classified] == [Reason.LOG_APPEND_TIME] * 2
    assert all(c.batch.header.max_timestamp > RECENT_MS + 80 for c in classified)


def test_a_broker_restart_is_retried_and_sequences_go_on(
    clusters: Clusters, cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str
) -> None:
    topic = unique
    create_topic(cluster_a, topic, 1)
    create_topic(cluster_b, topic, 1)
    produce_all(cluster_a, topic, {"compression.type": "zstd"}, 0, partitions=1)
    produce_all(cluster_a, topic, {"compression.type": "lz4"}, 1000, partitions=1)
    with (
        RawFetcher(cluster_a.client_properties(), topic, 0) as fetcher,
        IdempotentRawProducer(cluster_b.client_properties(), topic, 0) as producer,
    ):
        batches = [c.batch for _, cs in fetch_all(fetcher, 160) for c in cs]
        assert len(batches) == 4
        assert producer.produce(batches[:2]) == [0, 40]
        clusters.kafka.stop("B")
        # B is down when the produce starts: it retries (connection refused, then metadata
        # again) until B is back, and goes on with its sequence (B restored the producer's
        # state from its log)
        restart = threading.Timer(3.0, clusters.kafka.start, args=("B",))
        restart.start()
        try:
            assert producer.produce(batches[2:]) == [80, 120]
        finally:
            restart.join()
    source = read_all(cluster_a, topic)
    target = read_all(cluster_b, topic, expected=len(source))
    assert [r.content() for r in target] == [r.content() for r in source]


def test_errors_name_the_partition_and_what_to_do(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str
) -> None:
    create_topic(cluster_a, unique, 1)
    produce_all(cluster_a, unique, {"compression.type": "zstd"}, 0, partitions=1)
    props = cluster_a.client_properties()
    with RawFetcher(props, unique, 0) as fetcher:
        with pytest.raises(RawPartitionError, match=rf"{unique}-0 on .*out of range"):
            fetcher.fetch(10_000)
        batches = split_batches(fetcher.fetch(0).records).batches
    with (
        RawFetcher(props, unique, 5, retry_timeout=2) as missing,
        pytest.raises(RawPartitionError, match=rf"{unique}-5 on .*no such partition"),
    ):
        missing.fetch(0)
    # a target topic that takes smaller batches than the source wrote: the setting under test
    create_topic(cluster_b, unique, 1, {"max.message.bytes": "200"})
    with (
        IdempotentRawProducer(cluster_b.client_properties(), unique, 0) as producer,
        pytest.raises(RawPartitionError, match=r"MessageSizeTooLarge.*max\.message\.bytes"),
    ):
        producer.produce(batches[:1])


def test_a_fetch_cut_by_its_size_limit_leaves_the_tail_for_the_next(
    cluster_a: LocalCluster, unique: str
) -> None:
    create_topic(cluster_a, unique, 1)
    produce_all(cluster_a, unique, {"compression.type": "none"}, 0, partitions=1)  # 2 batches
    props = cluster_a.client_properties()
    with RawFetcher(props, unique, 0) as fetcher:
        first = split_batches(fetcher.fetch(0).records).batches[0].header
    # the broker cuts its answer at the byte limit, inside the second batch
    with RawFetcher(props, unique, 0, max_bytes=first.size + 100) as fetcher:
        split = split_batches(fetcher.fetch(0).records)
        assert [b.header.base_offset for b in split.batches] == [0]
        assert split.truncated == 100
        rest = split_batches(fetcher.fetch(first.last_offset + 1).records)
    assert [b.header.base_offset for b in rest.batches] == [first.last_offset + 1]
    assert rest.truncated == 0
