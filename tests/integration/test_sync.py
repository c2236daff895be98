"""Topic config sync and topic ACL sync against real clusters (MM2's rules)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourcePatternType,
    ResourceType,
)

from mm2py.compat.topic_configs import SOURCE_TOPIC
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from tests.conftest import Clusters
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import create_topic, produce, read_all, topic_names, wait_until

pytestmark = pytest.mark.integration

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


def _topic_configs(cluster: LocalCluster, topic: str) -> dict[str, tuple[str | None, int]]:
    """name -> (value, source) of a topic's configs."""
    admin = clients.admin_client(cluster.client_properties())
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: (e.value, int(e.source)) for name, e in entries.items()}


def _overrides(cluster: LocalCluster, topic: str) -> dict[str, str | None]:
    """The configs set on the topic itself."""
    configs = _topic_configs(cluster, topic)
    return {name: value for name, (value, source) in configs.items() if source == SOURCE_TOPIC}


def _alter(cluster: LocalCluster, topic: str, set_: dict[str, str], delete: list[str]) -> None:
    ops = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in set_.items()]
    ops += [ConfigEntry(k, None, incremental_operation=AlterConfigOpType.DELETE) for k in delete]
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=ops)
    admin = clients.admin_client(cluster.client_properties())
    admin.incremental_alter_configs([resource])[resource].result(timeout=30)


def _config(tmp_path: Path, a: LocalCluster, b: LocalCluster, topics: str, **extra: str) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(a, b, topics, **extra))
    return path


def test_remote_topics_are_created_with_the_source_configs(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(
        cluster_a,
        unique,
        partitions=2,
        config={
            "retention.ms": "86400000",
            "cleanup.policy": "compact,delete",
            "max.message.bytes": "2000000",
            "min.insync.replicas": "1",  # in MM2's config.properties.exclude
        },
    )
    produce(cluster_a, unique, [(0, b"k", b"v")])
    # The periodic sync is off: whatever the remote topic has, it was created with.
    path = _config(
        tmp_path, cluster_a, cluster_b, unique, **{"sync.topic.configs.enabled": "false"}
    )
    with running_daemon(path):
        wait_until(lambda: read_all(cluster_b, f"A.{unique}"), timeout=60, what="the copy")
        overrides = _overrides(cluster_b, f"A.{unique}")
    assert overrides == {
        "retention.ms": "86400000",
        "cleanup.policy": "compact,delete",
        "max.message.bytes": "2000000",
    }


def test_source_config_changes_reach_the_remote_topic_within_the_interval(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    remote = f"A.{unique}"
    create_topic(cluster_a, unique, config={"retention.ms": "86400000", "segment.ms": "7200000"})
    path = _config(
        tmp_path,
        cluster_a,
        cluster_b,
        unique,
        **{
            "sync.topic.configs.interval.seconds": "1",
            # A has no authorizer: MM2 logs that once and skips ACL sync.
            "sync.topic.acls.enabled": "true",
            "sync.topic.acls.interval.seconds": "1",
        },
    )
    with running_daemon(path) as daemon:
        wait_until(
            lambda: (
                _overrides(cluster_b, remote).get("segment.ms") == "7200000"
                if remote in topic_names(cluster_b)
                else None
            ),
            timeout=60,
            what="the remote topic with its configs",
        )
        # A config set by hand on the remote topic only is not the source's: removed.
        _alter(cluster_b, remote, {"flush.ms": "1000"}, [])
        _alter(cluster_a, unique, {"retention.ms": "3600000"}, ["segment.ms"])
        changed = time.monotonic()
        wait_until(
            lambda: _overrides(cluster_b, remote) == {"retention.ms": "3600000"},
            timeout=15,
            interval=0.05,
            what="retention.ms changed and segment.ms, flush.ms removed on the remote topic",
        )
        took = time.monotonic() - changed
        print(f"config change reached the target in {took:.2f}s (interval 1s)")
        # The daemon logs the change once the target has answered, so the broker can
        # show it before the line is written (a fresh clone's CI read the log first).
        synced = f"synced configs of {remote} on B: set retention.ms=3600000"
        wait_until(lambda: synced in daemon.log(), timeout=10, what="the sync's log line")
        log = daemon.log()
    assert log.count("cluster A has no ACL authorizer, so no topic ACLs are synced") == 1


def _acl(topic: str, principal: str, op: str, perm: str = "ALLOW", host: str = "*") -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        topic,
        ResourcePatternType.LITERAL,
        principal,
        host,
        AclOperation[op],
        AclPermissionType[perm],
    )


def _topic_acls(cluster: LocalCluster, topic: str) -> set[tuple[str, str, str, str, str]]:
    """(pattern type, principal, host, operation, permission) of the ACLs naming `topic`."""
    admin = clients.admin_client(cluster.client_properties())
    found = admin.describe_acls(
        AclBindingFilter(
            ResourceType.TOPIC,
            topic,
            ResourcePatternType.ANY,
            None,  # type: ignore[arg-type]
            None,  # type: ignore[arg-type]
            AclOperation.ANY,
            AclPermissionType.ANY,
        )
    ).result(timeout=30)
    return {
        (
            b.resource_pattern_type.name,
            b.principal,
            b.host,
            b.operation.name,
            b.permission_type.name,
        )
        for b in found
    }


def secured_properties(
    source: LocalCluster, target: LocalCluster, topics: str, **extra: str
) -> str:
    """An MM2 file for two SCRAM clusters, credentials in MM2's sasl.jaas.config form."""
    settings: dict[str, str] = {}
    for cluster in (source, target):
        password = cluster.users["admin"]
        settings[f"{cluster.alias}.security.protocol"] = cluster.security_protocol
        settings[f"{cluster.alias}.sasl.mechanism"] = "SCRAM-SHA-512"
        settings[f"{cluster.alias}.sasl.jaas.config"] = (
            f'{SCRAM} required username="admin" password="{password}";'
        )
    return mm2_properties(source, target, topics, **settings, **extra)


def test_topic_acls_are_copied_by_mm2s_rules(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    other = f"{unique}-other"
    for topic in (unique, other):
        create_topic(d, topic)
    admin = clients.admin_client(d.client_properties())
    bindings = [
        _acl(unique, "User:alice", "READ"),
        _acl(unique, "User:alice", "WRITE"),  # ALLOW WRITE: never copied
        _acl(unique, "User:bob", "ALL"),  # ALLOW ALL: copied as ALLOW READ
        _acl(unique, "User:mallory", "DESCRIBE", "DENY", host="10.0.0.1"),  # DENY: as is
        AclBinding(
            ResourceType.TOPIC,
            unique,
            ResourcePatternType.PREFIXED,
            "User:carol",
            "*",
            AclOperation.READ,
            AclPermissionType.ALLOW,
        ),  # not LITERAL: not copied
        _acl(other, "User:alice", "READ"),  # not a replicated topic
    ]
    for future in admin.create_acls(bindings).values():
        future.result(timeout=30)
    path = tmp_path / "mm2.properties"
    path.write_text(
        secured_properties(
            d,
            e,
            unique,
            **{"sync.topic.acls.enabled": "true", "sync.topic.acls.interval.seconds": "1"},
        )
    )
    expected = {
        ("LITERAL", "User:alice", "*", "READ", "ALLOW"),
        ("LITERAL", "User:bob", "*", "READ", "ALLOW"),
        ("LITERAL", "User:mallory", "10.0.0.1", "DESCRIBE", "DENY"),
    }
    # `mm2py plan` lists exactly the ACLs the run then creates (issue 25).
    planned = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "plan", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (flow,) = json.loads(planned.stdout)["flows"]
    assert {
        ("LITERAL", a["principal"], a["host"], a["operation"], a["permission"])
        for a in flow["acls"]
        if a["topic"] == f"D.{unique}"
    } == expected
    with running_daemon(path) as daemon:
        wait_until(lambda: f"D.{unique}" in topic_names(e), timeout=60, what=f"D.{unique} on E")
        created = time.monotonic()
        wait_until(
            lambda: _topic_acls(e, f"D.{unique}") == expected,
            timeout=30,
            interval=0.1,
            what="the remote topic's ACLs",
        )
        print(f"ACLs on the remote topic {time.monotonic() - created:.2f}s after it appeared")
        # A later ACL on the source follows within the interval.
        admin.create_acls([_acl(unique, "User:dave", "DESCRIBE")])
        wait_until(
            lambda: (
                ("LITERAL", "User:dave", "*", "DESCRIBE", "ALLOW") in _topic_acls(e, f"D.{unique}")
            ),
            timeout=15,
            what="a new source ACL on the remote topic",
        )
        log = daemon.log()
    assert not _topic_acls(e, f"D.{other}")
    assert not any(acl[0] == "PREFIXED" for acl in _topic_acls(e, f"D.{unique}"))
    assert "synced ACL to E: ALLOW READ for User:bob from * on topic D." in log
