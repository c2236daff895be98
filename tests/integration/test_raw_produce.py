"""The batch copier's IdempotentProduceSession against a real broker, on topics just
created: the leader refuses their first batches ("not leader") until it has taken up the
partitions, and holds no state for the producer there yet, so it would take a later
batch of a window alone. Every batch lands once, in order, where the session says."""

from __future__ import annotations

import asyncio

import pytest
from confluent_kafka.admin import NewTopic

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.raw_clients import BatchRejected, IdempotentProduceSession
from tests.kafka_helpers import read_all
from tests.unit.kafka.test_raw_partition import batches

pytestmark = pytest.mark.integration

# Created at once, produced to at once: more partitions for the leader to take up
# while the first window is out (the race showed 5 times in 5 with 64 partitions).
TOPICS = 4
PARTITIONS = 8
BATCHES = 5  # a window of each partition, 3 records each


def test_batches_to_topics_just_created_land_once_each_in_order(
    cluster_b: LocalCluster, unique: str
) -> None:
    topics = [f"{unique}-{n}" for n in range(TOPICS)]
    admin = clients.admin_client(cluster_b.client_properties())
    created = admin.create_topics([NewTopic(t, PARTITIONS, 1) for t in topics])
    for future in created.values():
        future.result(timeout=30)
    sent = batches(BATCHES)
    asked = {(t, p): sent for t in topics for p in range(PARTITIONS)}

    async def produce() -> dict[tuple[str, int], list[int] | BatchRejected]:
        session = IdempotentProduceSession(cluster_b.client_properties())
        await session.open()
        try:
            return await session.produce(asked)
        finally:
            await session.close()

    # before the fix: OutOfOrderSequenceNumber, a partition's first batch resent after
    # its second had landed alone at offset 0
    got = asyncio.run(produce())
    assert got == {tp: [0, 3, 6, 9, 12] for tp in asked}
    keys = [f"k{i}-{j}".encode() for i in range(BATCHES) for j in range(3)]
    for topic in topics:
        records = read_all(cluster_b, topic)
        for p in range(PARTITIONS):
            mine = [r for r in records if r.partition == p]
            assert [r.offset for r in mine] == list(range(len(keys))), (topic, p)
            assert [r.key for r in mine] == keys, (topic, p)  # each once, in order
