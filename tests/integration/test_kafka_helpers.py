"""The tests' own Kafka helpers (tests/kafka_helpers.py), where a test's outcome rests on
their behaviour against a real cluster."""

from __future__ import annotations

import threading

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.kafka_helpers import Rec, create_topic, produce, read_all

pytestmark = pytest.mark.integration


def test_read_all_waits_for_a_topic_created_after_it_started(
    cluster_a: LocalCluster, unique: str
) -> None:
    """A daemon just started creates its remote topics after the test starts reading
    them (test_docker read nothing for 90 s when the container was slower than the
    `docker run` of a second one)."""
    found: list[Rec] = []
    reader = threading.Thread(
        target=lambda: found.extend(read_all(cluster_a, unique, expected=3, timeout=30))
    )
    reader.start()
    reader.join(1.0)  # it asked for the topic before it existed
    assert reader.is_alive()
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(0, b"k0", b"v0"), (1, b"k1", b"v1"), (1, b"k2", b"v2")])
    reader.join(40)
    assert sorted((r.partition, r.value) for r in found) == [(0, b"v0"), (1, b"v1"), (1, b"v2")]
