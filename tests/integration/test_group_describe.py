"""Describing groups over Kafka's protocol (mm2py.kafka.group_describe) and committing a
group's offsets (mm2py.kafka.groups.commit_group_offsets) on a real cluster: what each
protocol's groups look like, and that a restarting coordinator crashes nothing
(librdkafka's DescribeConsumerGroups aborted a node while the target's broker restarted).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException

from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.kafka.group_describe import GroupMember, describe_groups
from mm2py.kafka.groups import CommittedOffset, commit_group_offsets, read_committed
from mm2py.kafka.groups import describe_groups as group_activity
from tests.conftest import Clusters
from tests.kafka_helpers import commit_offsets, create_topic, wait_until

pytestmark = pytest.mark.integration


def _members(cluster: LocalCluster, group: str, protocol: str, topic: str) -> list[Any]:
    consumers = []
    for i in range(2):
        consumer = clients.consumer(
            cluster.client_properties(),
            {"group.id": group, "group.protocol": protocol, "client.id": f"{group}-{i}"},
        )
        consumer.subscribe([topic])
        consumers.append(consumer)
    return consumers


@pytest.mark.timeout(120)
def test_groups_of_both_protocols_with_their_members_and_what_each_owns(
    cluster_a: LocalCluster, unique: str
) -> None:
    topic = f"{unique}-t"
    create_topic(cluster_a, topic, partitions=3)
    classic, consumer, empty = f"{unique}-classic", f"{unique}-consumer", f"{unique}-empty"
    commit_offsets(cluster_a, empty, {(topic, 0): 5})
    members = _members(cluster_a, classic, "classic", topic)
    members += _members(cluster_a, consumer, "consumer", topic)
    props = cluster_a.client_properties()
    asked = [classic, consumer, empty, f"{unique}-absent"]
    try:

        def settled() -> bool:
            for member in members:
                member.poll(0.05)
            found = describe_groups(props, asked[:2], timeout=10).groups
            return all(
                g in found
                and found[g].state == "Stable"
                and len(found[g].members) == 2
                and sum(len(m.assignment) for m in found[g].members) == 3
                for g in asked[:2]
            )

        wait_until(settled, timeout=60, what="both groups stable, 3 partitions owned")
        described = describe_groups(props, asked, timeout=10)
    finally:
        for member in members:
            member.close()

    assert described.failures == {}
    for group in (classic, consumer):
        desc = described.groups[group]
        assert not desc.idle
        assert sorted(m.client_id for m in desc.members) == [f"{group}-0", f"{group}-1"]
        owned = sorted(tp for m in desc.members for tp in m.assignment)
        assert owned == [(topic, 0), (topic, 1), (topic, 2)]
        assert all(isinstance(m, GroupMember) and m.member_id for m in desc.members)
    assert described.groups[empty].state == "Empty" and described.groups[empty].idle
    assert described.groups[empty].members == ()
    assert described.groups[f"{unique}-absent"].state == "Dead"
    assert described.groups[f"{unique}-absent"].idle


def test_a_cluster_that_does_not_answer_names_every_group_asked() -> None:
    described = describe_groups({"bootstrap.servers": "127.0.0.1:1"}, ["g1", "g2"], timeout=2)
    assert described.groups == {}
    assert sorted(described.failures) == ["g1", "g2"]
    assert all("cannot connect" in why for why in described.failures.values())


@pytest.mark.timeout(120)
def test_offsets_are_committed_to_an_idle_group_and_refused_while_it_has_members(
    cluster_a: LocalCluster, unique: str
) -> None:
    topic = f"{unique}-t"
    create_topic(cluster_a, topic, partitions=2)
    group = f"{unique}-g"
    props = cluster_a.client_properties()
    commit_group_offsets(
        props, group, {(topic, 0): CommittedOffset(3, "m"), (topic, 1): CommittedOffset(4)}, 30
    )
    read = read_committed(props, {group: [(topic, 0), (topic, 1)]}, "A", timeout=30)
    assert read[group] == {(topic, 0): CommittedOffset(3, "m"), (topic, 1): CommittedOffset(4)}

    members = _members(cluster_a, group, "classic", topic)
    try:

        def active() -> bool:
            for member in members:
                member.poll(0.05)
            found = group_activity(props, [group], "A", timeout=10)
            return group in found and not found[group].idle

        wait_until(active, timeout=60, what="the group active")
        with pytest.raises(KafkaException):
            commit_group_offsets(props, group, {(topic, 0): CommittedOffset(9)}, 30)
    finally:
        for member in members:
            member.close()
    read = read_committed(props, {group: [(topic, 0)]}, "A", timeout=30)
    assert read[group][(topic, 0)].offset != 9


# A process that describes a group and commits its offsets in a loop until told to stop
# (a file), then prints how many rounds after the last restart found the group Empty and
# committed; the first such round also leaves a file (<flag>.found) for the test to wait on.
_WORKER = """
import json, sys
from pathlib import Path
from confluent_kafka import KafkaException
from mm2py.kafka.groups import CommittedOffset, commit_group_offsets, describe_groups
props, topic, group, flag = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
right = 0
while not flag.exists():
    found = describe_groups(props, [group], "A", timeout=3)
    try:
        commit_group_offsets(props, group, {(topic, 0): CommittedOffset(7)}, timeout=3)
        committed = True
    except KafkaException:
        committed = False
    resumed = Path(str(flag) + ".resumed").exists()
    if resumed and committed and group in found and found[group].idle:
        right += 1
        Path(str(flag) + ".found").touch()
print(right)
"""


@pytest.mark.timeout(240)
def test_describing_and_committing_survive_restarts_of_the_coordinator(
    clusters: Clusters, cluster_a: LocalCluster, tmp_path: Path, unique: str
) -> None:
    topic = f"{unique}-t"
    create_topic(cluster_a, topic)
    group = f"{unique}-g"
    commit_offsets(cluster_a, group, {(topic, 0): 1})
    flag = tmp_path / "stop"
    props = json.dumps({**cluster_a.client_properties(), "log_level": "0"})
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, props, topic, group, str(flag)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for _ in range(2):
            time.sleep(2)
            clusters.restart("A")
            assert worker.poll() is None, f"the worker died (exit {worker.returncode})"
        Path(str(flag) + ".resumed").touch()
        found = Path(str(flag) + ".found")
        wait_until(
            lambda: found.exists() or worker.poll() is not None,
            timeout=30,
            what="a round that describes and commits after the restarts",
        )
    finally:
        flag.touch()
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, f"the worker died (exit {worker.returncode})"
    assert int(out.strip()) > 0, "no round described and committed after the restarts"
