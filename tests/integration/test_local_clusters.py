"""The local clusters are real Kafka: records round-trip, SCRAM and ACLs are enforced."""

from __future__ import annotations

import errno
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)

from mm2py.dev import class_archive, jars
from mm2py.dev.launcher import (
    LOG_TAIL_LINES,
    PORT_OFFSET_VARIABLE,
    LocalCluster,
    LocalClusterError,
    LocalKafka,
    broker_port,
)
from mm2py.kafka import clients
from tests.kafka_helpers import RECENT_MS, create_topic, produce, read_all, wait_until

pytestmark = pytest.mark.integration


def test_records_round_trip_with_headers_and_timestamps(
    cluster_a: LocalCluster, unique: str
) -> None:
    create_topic(cluster_a, unique, partitions=3)
    sent = [
        (
            p,
            f"k{i}".encode(),
            f"v{i}".encode(),
            [("h", b"\x00\xff"), ("h", None)],
            RECENT_MS + i,
        )
        for i in range(30)
        for p in [i % 3]
    ]
    produce(cluster_a, unique, sent)
    got = read_all(cluster_a, unique, expected=30)
    assert sorted((r.partition, r.key, r.value, r.headers, r.timestamp) for r in got) == sorted(
        (p, k, v, tuple(h), ts) for p, k, v, h, ts in sent
    )


def test_scram_cluster_enforces_acls_created_through_admin_api(
    secured_cluster: LocalCluster, unique: str
) -> None:
    create_topic(secured_cluster, unique)
    admin = clients.admin_client(secured_cluster.client_properties("admin"))
    binding = AclBinding(
        ResourceType.TOPIC,
        unique,
        ResourcePatternType.LITERAL,
        "User:alice",
        "*",
        AclOperation.WRITE,
        AclPermissionType.ALLOW,
    )
    admin.create_acls([binding])[binding].result(timeout=30)

    acl_filter = AclBindingFilter(
        ResourceType.TOPIC,
        unique,
        ResourcePatternType.LITERAL,
        None,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )

    def described() -> list[tuple[str, AclOperation, AclPermissionType]]:
        bindings = admin.describe_acls(acl_filter).result(timeout=30)
        return [(b.principal, b.operation, b.permission_type) for b in bindings]

    # The controller commits the ACL; the broker answers from its metadata a moment later.
    wanted = [("User:alice", AclOperation.WRITE, AclPermissionType.ALLOW)]
    wait_until(lambda: described() or None, timeout=30, what="the ACL described")
    assert described() == wanted

    # alice may write; bob, with no ACL, is refused by the authorizer.
    assert produce(secured_cluster, unique, [(0, b"k", b"by-alice")], user="alice") == 1
    with pytest.raises(KafkaException, match=r"(?i)authoriz"):
        produce(
            secured_cluster,
            unique,
            [(0, b"k", b"by-bob")],
            user="bob",
            overrides={"message.timeout.ms": 5000},
        )
    assert [r.value for r in read_all(secured_cluster, unique, expected=1)] == [b"by-alice"]


def test_wrong_password_is_refused(secured_cluster: LocalCluster) -> None:
    props = dict(secured_cluster.client_properties("alice"), **{"sasl.password": "wrong"})
    assert clients.describe_cluster(props, timeout=3) is False
    assert clients.describe_cluster(secured_cluster.client_properties("alice"), timeout=5) is True


def test_cli_status_lists_running_clusters(
    cluster_a: LocalCluster, cluster_b: LocalCluster
) -> None:
    from tests.conftest import clusters_state_dir

    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "local", "status", "--dir", str(clusters_state_dir())],
        capture_output=True,
        text=True,
        check=True,
    )
    assert f"A  127.0.0.1:{broker_port('A')}  running" in done.stdout
    assert f"B  127.0.0.1:{broker_port('B')}  running" in done.stdout


def _bind_beside_the_sessions_clusters(
    client: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bind `client` to cluster C's controller port under the first port offset of 7, 17,
    ..., 97 (beside the session's clusters, which move by 100s) where that port is free,
    and set that offset. Being in the ephemeral range, a given one may be another
    connection's local port at the moment: in a fresh clone's run, 7's was."""
    for offset in range(7, 100, 10):
        monkeypatch.setenv(PORT_OFFSET_VARIABLE, str(offset))
        try:
            client.bind(("127.0.0.1", broker_port("C") + 1))
            return
        except OSError as error:
            if error.errno != errno.EADDRINUSE:
                raise
    pytest.fail("cluster C's controller port is in use under every port offset 7, 17, ..., 97")


def test_a_broker_that_cannot_start_keeps_its_folder_and_shows_its_log(
    cluster_a: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What made C fail to start mid-session: a client socket that the kernel had given
    # a listener port (C's and up lie in the ephemeral range). Here a client socket
    # connected to A holds the would-be broker's controller port, as such a socket would.
    kafka = LocalKafka(tmp_path / "state")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as client:
        # Closed with a reset, not left in TIME_WAIT: the port is free again for a rerun.
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        _bind_beside_the_sessions_clusters(client, monkeypatch)
        client.connect(("127.0.0.1", cluster_a.port))
        with pytest.raises(LocalClusterError) as failed:
            kafka.up(["C"], timeout=60)
    message = str(failed.value)
    home = tmp_path / "state" / "C"
    assert f"its folder {home} is kept" in message
    assert "Address already in use" in message  # the first ERROR line, the cause
    shown = message.split("The end of its log:\n", 1)[1].splitlines()
    # The file's name, the first error with its exception's message and "...", then
    # the log's last lines.
    log_lines = (home / "logs" / "server.log").read_text().splitlines()
    assert shown[0] == f"({home / 'logs' / 'server.log'})"
    assert "] ERROR " in shown[1]
    assert "..." in shown and shown.index("...") <= 5
    assert shown[shown.index("...") + 1 :] == log_lines[-LOG_TAIL_LINES:], shown
    assert (home / "logs").is_dir() and (home / "server.properties").exists()
    kafka.down(["C"], keep_logs_in=tmp_path / "kept")
    assert not home.exists() and (tmp_path / "kept" / "C" / "stdout.log").exists()


def test_a_broker_has_kafkas_heap_maps_the_jars_class_archive_and_takes_the_added_jvm_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `make test` builds the archive first (`mm2py local fetch`); a JVM maps an archive
    # only when it accepts it (its own build, the same jars), else it starts without.
    # The tests' JVM options (MM2PY_JVM_OPTIONS, set by tests/conftest.py) come after
    # Kafka's own, and the JVM still accepts the archive with them. The heap is
    # kafka-server-start.sh's, 1 GiB committed at start, as the JVM itself reports it.
    archive = class_archive.ensure()
    assert archive == jars.class_archive() and archive.stat().st_size > 10 << 20
    monkeypatch.setenv(PORT_OFFSET_VARIABLE, "8")  # beside the session's clusters
    kafka = LocalKafka(tmp_path / "state")
    kafka.up(["A"], timeout=60)
    try:
        pid = kafka.pid("A")
        assert pid is not None
        args = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        assert f"-XX:SharedArchiveFile={archive}" in args
        kafkas_last = args.index(jars.KAFKA_JVM_OPTIONS[-1])
        assert all(args.index(o) > kafkas_last for o in jars.extra_jvm_options())
        assert str(archive) in Path(f"/proc/{pid}/maps").read_text()
        flags = subprocess.run(
            ["jcmd", str(pid), "VM.flags"], capture_output=True, text=True, check=True
        ).stdout.split()
        assert {"-XX:InitialHeapSize=1073741824", "-XX:MaxHeapSize=1073741824"} <= set(flags)
    finally:
        kafka.down(["A"])
