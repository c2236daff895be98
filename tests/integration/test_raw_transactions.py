"""Transactions of raw batches (mm2py.kafka.raw_transactions) against a real broker with
Kafka's defaults: what a committed transaction wrote is what read_committed readers see,
record for record; an aborted one shows to read_uncommitted readers only; a second holder
of the transactional id fences the first, whose transaction then commits nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka.raw_clients import FetchSession, ProducerFenced
from mm2py.kafka.raw_transactions import (
    RawTransactionalClients,
    Record,
    TransactionalProduceSession,
)
from tests.kafka_helpers import RECENT_MS, create_topic, end_offsets, read_all

pytestmark = pytest.mark.integration

TIMEOUT_MS = 60_000


def _clients(cluster: LocalCluster, tid: str) -> RawTransactionalClients:
    props = cluster.client_properties()
    return RawTransactionalClients(
        FetchSession.like_consumer(props),
        TransactionalProduceSession(props, tid, transaction_timeout_ms=TIMEOUT_MS),
        f"test-{tid}",
    )


@pytest.fixture
def writer(cluster_b: LocalCluster, unique: str) -> Iterator[RawTransactionalClients]:
    with _clients(cluster_b, f"{unique}-tid") as clients:
        yield clients


def _records(tag: str, count: int) -> list[Record]:
    return [
        (
            f"{tag}-k{i}".encode(),
            None if i == 2 else f"{tag}-v{i}".encode() * (i + 1),
            RECENT_MS + i,
            [("h", f"{i}".encode()), ("empty", None)],
        )
        for i in range(count)
    ]


def _contents(records: list[Record], partition: int) -> list[tuple[object, ...]]:
    return [(partition, k, v, tuple(h), ts) for k, v, ts, h in records]


def test_a_committed_transaction_shows_every_record_as_produced(
    cluster_b: LocalCluster, writer: RawTransactionalClients, unique: str
) -> None:
    create_topic(cluster_b, unique, partitions=2)
    first, second = _records("a", 5), _records("b", 3)
    writer.begin()
    # Two partitions in one call: added to the transaction together, produced together.
    assert writer.produce_records({(unique, 0): first, (unique, 1): second}) == {
        (unique, 0): [0, 1, 2, 3, 4],
        (unique, 1): [0, 1, 2],
    }
    writer.end(commit=True)
    # A second transaction on the same partitions goes on after the commit marker.
    writer.begin()
    assert writer.produce_records({(unique, 0): _records("c", 1)}) == {(unique, 0): [6]}
    writer.end(commit=True)

    seen = read_all(cluster_b, unique, expected=9)
    assert [r.content() for r in seen if r.partition == 0] == _contents(first + _records("c", 1), 0)
    assert [r.content() for r in seen if r.partition == 1] == _contents(second, 1)


def test_an_aborted_transaction_shows_to_read_uncommitted_readers_only(
    cluster_b: LocalCluster, writer: RawTransactionalClients, unique: str
) -> None:
    create_topic(cluster_b, unique)
    writer.begin()
    writer.produce_records({(unique, 0): _records("gone", 4)})
    writer.end(commit=False)
    writer.begin()
    writer.produce_records({(unique, 0): _records("kept", 2)})
    writer.end(commit=True)

    assert end_offsets(cluster_b, unique) == {0: 8}  # 4 + abort marker + 2 + commit marker
    assert [r.content() for r in read_all(cluster_b, unique)] == _contents(_records("kept", 2), 0)
    uncommitted = read_all(cluster_b, unique, isolation="read_uncommitted")
    assert [r.content() for r in uncommitted] == _contents(
        _records("gone", 4) + _records("kept", 2), 0
    )


def test_a_second_holder_of_the_id_fences_the_first(cluster_b: LocalCluster, unique: str) -> None:
    create_topic(cluster_b, unique)
    tid = f"{unique}-{uuid.uuid4().hex[:6]}"
    with _clients(cluster_b, tid) as zombie:
        zombie.begin()
        zombie.produce_records({(unique, 0): _records("zombie", 3)})
        with _clients(cluster_b, tid) as successor:
            # Taking the id over aborts the zombie's open transaction ...
            successor.begin()
            successor.produce_records({(unique, 0): _records("successor", 2)})
            # ... and nothing the zombie sends or commits after is taken.
            with pytest.raises(ProducerFenced, match=f"transactional id {tid}.*fenced"):
                zombie.produce_records({(unique, 0): _records("late", 1)})
            with pytest.raises(ProducerFenced):
                zombie.end(commit=True)
            successor.end(commit=True)

    assert [r.content() for r in read_all(cluster_b, unique)] == _contents(
        _records("successor", 2), 0
    )
