"""Session-wide real Kafka clusters, started through `mm2py local`'s launcher.

Clusters A, B and C are plain; D and E are secured (SASL_PLAINTEXT,
SCRAM-SHA-512, StandardAuthorizer). A cluster starts the first time a test asks
for it; clusters the session started are stopped at its end, pass or fail,
while clusters that were already running (e.g. `make demo`) are left alone.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster, LocalKafka, default_state_dir

SECURED = {"D", "E"}


class Clusters:
    """Lazily started local clusters, by alias."""

    def __init__(self, kafka: LocalKafka) -> None:
        self.kafka = kafka
        self.started: list[str] = []

    def __getitem__(self, alias: str) -> LocalCluster:
        if not self.kafka.is_running(alias):
            self.started.append(alias)
        secure = [alias] if alias in SECURED else []
        return self.kafka.up([alias], secure=secure)[0]

    def restart(self, alias: str) -> None:
        """Stop and start one broker on its data (a brief outage)."""
        self.kafka.stop(alias)
        self.kafka.start(alias)


def clusters_state_dir() -> Path:
    """Where the tests' clusters are recorded (the launcher's default folder)."""
    return Path(os.environ.get("MM2PY_TEST_CLUSTERS", default_state_dir()))


@pytest.fixture(scope="session")
def clusters() -> Iterator[Clusters]:
    handle = Clusters(LocalKafka(clusters_state_dir()))
    try:
        yield handle
    finally:
        handle.kafka.down(handle.started)


@pytest.fixture
def cluster_a(clusters: Clusters) -> LocalCluster:
    return clusters["A"]


@pytest.fixture
def cluster_b(clusters: Clusters) -> LocalCluster:
    return clusters["B"]


@pytest.fixture
def secured_cluster(clusters: Clusters) -> LocalCluster:
    return clusters["D"]


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name no other test (or earlier run) uses, for topics and groups."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"{base}-{uuid.uuid4().hex[:8]}"
