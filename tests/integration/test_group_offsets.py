"""Reading consumer groups' committed offsets (mm2py.kafka.groups.read_committed) on real
clusters: what is read, what is left out, and that a paused coordinator crashes nothing
(librdkafka's admin ListConsumerGroupOffsets killed the process there)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka.groups import CommittedOffset, read_committed
from tests.conftest import Clusters
from tests.kafka_helpers import commit_offsets, create_topic, wait_until

pytestmark = pytest.mark.integration


def test_committed_offsets_with_their_metadata_only_where_a_group_committed(
    cluster_a: LocalCluster, unique: str
) -> None:
    topic = f"{unique}-t"
    create_topic(cluster_a, topic, partitions=3)
    commit_offsets(cluster_a, f"{unique}-g1", {(topic, 0): 5, (topic, 2): 9}, metadata="m0")
    commit_offsets(cluster_a, f"{unique}-g2", {(topic, 1): 4})
    every = [(topic, p) for p in range(3)]

    read = read_committed(
        cluster_a.client_properties(),
        {
            f"{unique}-g1": every,
            f"{unique}-g2": [(topic, 0), (topic, 1)],
            f"{unique}-never": every,
            f"{unique}-nothing-asked": [],
        },
        "A",
        timeout=30,
    )

    assert read == {
        f"{unique}-g1": {
            (topic, 0): CommittedOffset(5, "m0"),
            (topic, 2): CommittedOffset(9, "m0"),
        },
        f"{unique}-g2": {(topic, 1): CommittedOffset(4)},
        f"{unique}-never": {},
        f"{unique}-nothing-asked": {},
    }


def test_a_group_that_cannot_be_read_is_left_out_and_named(
    caplog: pytest.LogCaptureFixture, unique: str
) -> None:
    nowhere = {"bootstrap.servers": "127.0.0.1:1", "log_level": "0"}
    read = read_committed(nowhere, {f"{unique}-g": [("t", 0)]}, "X", timeout=2)
    assert read == {}
    assert f"reading offsets of group {unique}-g on cluster X" in caplog.text


# A process reading the offsets of a few groups in a loop until told to stop (a file),
# then printing how many reads after the last pause found the committed offset; the
# first such read also leaves a file (<flag>.found), for the test to wait on.
_READER = """
import json, sys, time
from pathlib import Path
from mm2py.kafka.groups import CommittedOffset, read_committed
props, topic, groups = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3:-1]
flag = Path(sys.argv[-1])
right = 0
while not flag.exists():
    read = read_committed(props, {g: [(topic, 0)] for g in groups}, "A", timeout=3)
    resumed = Path(str(flag) + ".resumed").exists()
    if resumed and all(read.get(g) == {(topic, 0): CommittedOffset(7)} for g in groups):
        right += 1
        Path(str(flag) + ".found").touch()
print(right)
"""


@pytest.mark.timeout(180)
def test_reading_offsets_survives_pauses_of_the_coordinator(
    clusters: Clusters, cluster_a: LocalCluster, tmp_path: Path, unique: str
) -> None:
    topic = f"{unique}-t"
    create_topic(cluster_a, topic)
    groups = [f"{unique}-g{i}" for i in range(10)]
    for group in groups:
        commit_offsets(cluster_a, group, {(topic, 0): 7})
    flag = tmp_path / "stop"
    props = json.dumps(cluster_a.client_properties())
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER, props, topic, *groups, str(flag)],
        stdout=subprocess.PIPE,
        text=True,
    )
    broker = clusters.kafka.pid("A")
    assert broker is not None
    try:
        for _ in range(3):
            time.sleep(2)
            os.kill(broker, signal.SIGSTOP)
            try:
                time.sleep(8)
            finally:
                os.kill(broker, signal.SIGCONT)
            assert reader.poll() is None, f"the reader died (exit {reader.returncode})"
        Path(str(flag) + ".resumed").touch()
        found = Path(str(flag) + ".found")
        wait_until(
            lambda: found.exists() or reader.poll() is not None,
            timeout=5,  # as long as the reader was given before it was told to stop
            what="a read that finds the committed offsets after the pauses",
        )
    finally:
        flag.touch()
        out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0, f"the reader died (exit {reader.returncode})"
    assert int(out.strip()) > 0, "no read found the committed offsets after the pauses"
