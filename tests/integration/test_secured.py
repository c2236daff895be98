"""Replication between secured clusters configured from an MM2 file with sasl.jaas.config.

D and E run SASL_PLAINTEXT with SCRAM-SHA-512 and the StandardAuthorizer; F runs
SASL_SSL with a CA and broker certificate this module makes with `openssl`.
Passwords must appear nowhere: not in the daemon's log, errors or /metrics.

Exactly-once into a secured target needs, beyond at-least-once, the TransactionalId
ACL for mm2py's ids (pattern PREFIXED ``<cluster.group.prefix>-``, WRITE and DESCRIBE):
a principal with that and no wildcard id copies exactly once. Without it,
``exactly.once.support = required`` refuses to start naming the key, and ``requested``
copies at-least-once: tests/integration/test_exactly_once_check.py.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from mm2py.dev.launcher import LocalCluster, TlsFiles
from mm2py.kafka import clients
from tests.conftest import Clusters
from tests.daemon_harness import mm2_properties, running_daemon
from tests.integration.test_sync import SCRAM, secured_properties
from tests.kafka_helpers import (
    RECENT_MS,
    create_topic,
    end_offsets,
    end_transaction,
    produce,
    read_all,
    topic_names,
    wait_until,
)

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(folder: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA: (certificate, key) in PEM."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        "-subj", f"/CN={name}", "-keyout", "ca.key", "-out", "ca.pem",
        cwd=folder,
    )  # fmt: skip
    return folder / "ca.pem", folder / "ca.key"


def make_tls_files(folder: Path) -> TlsFiles:
    """A test CA and a broker certificate for 127.0.0.1 signed by it (unencrypted PKCS#8 key)."""
    ca, ca_key = make_ca(folder, "mm2py test CA")
    (folder / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
        "-keyout", "broker.key", "-out", "broker.csr",
        cwd=folder,
    )  # fmt: skip
    _openssl(
        "x509", "-req", "-in", "broker.csr", "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-days", "2", "-extfile", "san.cnf", "-out", "broker.pem",
        cwd=folder,
    )  # fmt: skip
    keystore = folder / "keystore.pem"
    keystore.write_text((folder / "broker.key").read_text() + (folder / "broker.pem").read_text())
    return TlsFiles(keystore, ca)


@pytest.fixture(scope="module")
def tls_cluster(
    clusters: Clusters, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """Cluster F with a SASL_SSL listener and a CA made here; stopped after the module."""
    files = make_tls_files(tmp_path_factory.mktemp("tls"))
    kafka = clusters.kafka
    kafka.down(["F"])  # it may run with the files of an earlier session
    cluster = kafka.up(["F"], tls={"F": files})[0]
    try:
        yield cluster
    finally:
        kafka.down(["F"])


def _copy_and_check_secrets(
    source: LocalCluster, target: LocalCluster, config: Path, topic: str, secrets: list[str]
) -> None:
    sent = [
        (0, f"k{i}".encode(), f"v{i}".encode(), [("h", b"x")], RECENT_MS + i) for i in range(50)
    ]
    produce(source, topic, sent)
    remote = f"{source.alias}.{topic}"
    with running_daemon(config) as daemon:
        copied = wait_until(
            lambda: (
                read_all(target, remote, expected=50) if remote in topic_names(target) else None
            ),
            timeout=60,
            what=f"records in {remote} on {target.alias}",
        )
        assert [r.content() for r in copied] == [r.content() for r in read_all(source, topic)]
        exposed = daemon.log() + daemon.metrics()
    assert "mm2py_records_total" in exposed
    for secret in secrets:
        assert secret not in exposed


def test_scram_clusters_replicate_from_a_jaas_config(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    create_topic(d, unique)
    config = tmp_path / "mm2.properties"
    config.write_text(secured_properties(d, e, unique))
    _copy_and_check_secrets(d, e, config, unique, [d.users["admin"], e.users["admin"]])


def test_tls_source_replicates_with_the_test_ca(
    clusters: Clusters, tls_cluster: LocalCluster, unique: str, tmp_path: Path
) -> None:
    f, e = tls_cluster, clusters["E"]
    assert f.client_properties()["security.protocol"] == "SASL_SSL"
    create_topic(f, unique)
    config = tmp_path / "mm2.properties"
    assert f.tls is not None
    config.write_text(
        secured_properties(
            f,
            e,
            unique,
            **{"F.ssl.truststore.type": "PEM", "F.ssl.truststore.location": str(f.tls.ca)},
        )
    )
    _copy_and_check_secrets(f, e, config, unique, [f.users["admin"], e.users["admin"]])


@pytest.mark.parametrize("case", ["wrong-password", "unknown-ca"])
def test_a_refused_login_or_certificate_is_a_clear_error_naming_the_cluster(
    clusters: Clusters,
    tls_cluster: LocalCluster,
    unique: str,
    tmp_path: Path,
    case: str,
) -> None:
    e = clusters["E"]
    wrong = f"not-the-password-{uuid.uuid4().hex}"
    source = tls_cluster if case == "unknown-ca" else clusters["D"]
    alias = source.alias
    extra = {
        f"{alias}.security.protocol": source.security_protocol,
        f"{alias}.sasl.mechanism": "SCRAM-SHA-512",
        f"{alias}.sasl.jaas.config": (
            f'{SCRAM} required username="alice" password="{wrong}";'
            if case == "wrong-password"
            else f'{SCRAM} required username="alice" password="{source.users["alice"]}";'
        ),
        "E.security.protocol": "SASL_PLAINTEXT",
        "E.sasl.mechanism": "SCRAM-SHA-512",
        "E.sasl.jaas.config": f'{SCRAM} required username="admin" password="{e.users["admin"]}";',
    }
    if case == "unknown-ca":
        other_ca, _key = make_ca(tmp_path / "other", "some other CA")
        extra[f"{alias}.ssl.truststore.type"] = "PEM"
        extra[f"{alias}.ssl.truststore.location"] = str(other_ca)
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(source, e, unique, **extra))
    with running_daemon(config) as daemon:
        code = daemon.proc.wait(30)  # exits: not a hang
        log = daemon.log()
    assert code == 1
    if case == "wrong-password":
        message = (
            "mm2py: cluster D: authentication failed (SASL SCRAM-SHA-512 as user alice): "
            "check sasl.jaas.config"
        )
    else:
        message = "mm2py: cluster F: TLS handshake failed ("
    assert message in log
    assert "Traceback" not in log
    for secret in (wrong, source.users["alice"], e.users["admin"]):
        assert secret not in log


def _scram_user(admin: Any, user: str, password: str | None) -> None:
    """Create or change (`password`) or delete (None) a SCRAM-SHA-512 user."""
    change = (
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        if password is not None
        else UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
    )
    admin.alter_user_scram_credentials([change])[user].result(30)


def _allow_all(user: str) -> list[AclBinding]:
    return [
        AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            f"User:{user}",
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        )
        for kind, name in (
            (ResourceType.TOPIC, "*"),
            (ResourceType.GROUP, "*"),
            (ResourceType.BROKER, "kafka-cluster"),
            (ResourceType.TRANSACTIONAL_ID, "*"),
        )
    ]


def test_a_login_refused_while_running_fails_the_source_part_naming_the_cluster(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    user = f"rotating-{uuid.uuid4().hex[:8]}"
    first, second = f"first-{uuid.uuid4().hex}", f"second-{uuid.uuid4().hex}"
    admin = clients.admin_client(d.client_properties())
    _scram_user(admin, user, first)
    acls = _allow_all(user)
    for future in admin.create_acls(acls).values():
        future.result(30)
    try:
        create_topic(d, unique)
        produce(d, unique, [(0, None, b"before")])
        config = tmp_path / "mm2.properties"
        settings = {
            "sync.topic.acls.enabled": "false",
            "D.sasl.jaas.config": f'{SCRAM} required username="{user}" password="{first}";',
            "E.sasl.jaas.config": (
                f'{SCRAM} required username="admin" password="{e.users["admin"]}";'
            ),
        }
        for alias in ("D", "E"):
            settings[f"{alias}.security.protocol"] = "SASL_PLAINTEXT"
            settings[f"{alias}.sasl.mechanism"] = "SCRAM-SHA-512"
        config.write_text(mm2_properties(d, e, unique, **settings))
        remote = f"D.{unique}"
        with running_daemon(config) as daemon:
            wait_until(
                lambda: remote in topic_names(e) and read_all(e, remote, expected=1),
                timeout=60,
                what=f"the first record in {remote} on E",
            )
            # The password changes on D; the daemon learns it when it connects again.
            _scram_user(admin, user, second)
            clusters.restart("D")

            def source_failed() -> dict[str, Any] | None:
                status = json.loads(daemon.status("D->E"))
                source = next(p for p in status["parts"] if p["part"] == "source")
                return source if source["state"] == "FAILED" else None

            failed = wait_until(source_failed, timeout=90, what="the source part FAILED")
            message = (
                f"cluster D: authentication failed (SASL SCRAM-SHA-512 as user {user}): "
                "check sasl.jaas.config"
            )
            assert message in failed["trace"]
            exposed = daemon.log() + daemon.metrics() + daemon.status("D->E")
            assert message in daemon.log()
        for secret in (first, second, d.users["admin"], e.users["admin"]):
            assert secret not in exposed
    finally:
        admin = clients.admin_client(d.client_properties())
        filters = [
            AclBindingFilter(
                a.restype,
                a.name,
                a.resource_pattern_type,
                a.principal,
                a.host,
                a.operation,
                a.permission_type,
            )
            for a in acls
        ]
        for future in admin.delete_acls(filters).values():
            future.result(30)
        _scram_user(admin, user, None)


# ---------------------------------------------------------------- exactly-once


def _exactly_once_acls(user: str, prefix: str) -> list[AclBinding]:
    """What an mm2py principal on the target needs to copy (any topic or group, the
    cluster), and the one TransactionalId ACL exactly-once adds: PREFIXED `<prefix>-`,
    WRITE and DESCRIBE (no wildcard id)."""
    principal = f"User:{user}"
    return [
        AclBinding(
            kind,
            name,
            ResourcePatternType.LITERAL,
            principal,
            "*",
            AclOperation.ALL,
            AclPermissionType.ALLOW,
        )
        for kind, name in (
            (ResourceType.TOPIC, "*"),
            (ResourceType.GROUP, "*"),
            (ResourceType.BROKER, "kafka-cluster"),
        )
    ] + [
        AclBinding(
            ResourceType.TRANSACTIONAL_ID,
            f"{prefix}-",
            ResourcePatternType.PREFIXED,
            principal,
            "*",
            operation,
            AclPermissionType.ALLOW,
        )
        for operation in (AclOperation.WRITE, AclOperation.DESCRIBE)
    ]


def _drop(admin: Any, acls: list[AclBinding]) -> None:
    filters = [
        AclBindingFilter(
            a.restype,
            a.name,
            a.resource_pattern_type,
            a.principal,
            a.host,
            a.operation,
            a.permission_type,
        )
        for a in acls
    ]
    for future in admin.delete_acls(filters).values():
        future.result(30)


def _exactly_once_config(
    d: LocalCluster, e: LocalCluster, topic: str, user: str, password: str, prefix: str
) -> str:
    """D -> E, E logged in as `user`, exactly-once required into E."""
    settings = {
        "cluster.group.prefix": prefix,
        "E.exactly.once.source.support": "enabled",
        "exactly.once.support": "required",
        "sync.topic.acls.enabled": "false",
        "D.sasl.jaas.config": f'{SCRAM} required username="admin" password="{d.users["admin"]}";',
        "E.sasl.jaas.config": f'{SCRAM} required username="{user}" password="{password}";',
    }
    for alias in ("D", "E"):
        settings[f"{alias}.security.protocol"] = "SASL_PLAINTEXT"
        settings[f"{alias}.sasl.mechanism"] = "SCRAM-SHA-512"
    return mm2_properties(d, e, topic, **settings)


def _produce_with_aborts(d: LocalCluster, topic: str) -> int:
    """Ten transactions of ten records into `topic` on D, every third aborted, then ten
    plain records; return how many are committed."""
    producer = Producer(dict(d.client_properties(), **{"transactional.id": f"tx-{topic}"}))
    producer.init_transactions(30)
    committed = 0
    for batch in range(10):
        producer.begin_transaction()
        for i in range(10):
            n = batch * 10 + i
            producer.produce(topic, value=f"v{n}".encode(), partition=0, timestamp=RECENT_MS + n)
        end_transaction(producer, commit=batch % 3 != 1)
        if batch % 3 != 1:
            committed += 10
    plain: list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes | None]], int]]
    plain = [(0, None, f"v{100 + i}".encode(), [], RECENT_MS + 100 + i) for i in range(10)]
    return committed + produce(d, topic, plain)


def test_exactly_once_into_a_secured_target_with_the_transactional_id_prefix_acl(
    clusters: Clusters, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    user, password = f"eos-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    prefix = f"mm2py-eos-{uuid.uuid4().hex[:8]}"
    admin = clients.admin_client(e.client_properties())
    _scram_user(admin, user, password)
    acls = _exactly_once_acls(user, prefix)
    for future in admin.create_acls(acls).values():
        future.result(30)
    try:
        create_topic(d, unique)
        committed = _produce_with_aborts(d, unique)
        config = tmp_path / "mm2.properties"
        config.write_text(_exactly_once_config(d, e, unique, user, password, prefix))
        remote = f"D.{unique}"
        with running_daemon(config) as daemon:
            copied = wait_until(
                lambda: (
                    read_all(e, remote, expected=committed) if remote in topic_names(e) else None
                ),
                timeout=90,
                what=f"{committed} committed records in {remote} on E",
            )
            # read_committed on both sides: every committed record once, none aborted.
            assert len(copied) == committed
            assert [r.content() for r in read_all(e, remote)] == [
                r.content() for r in read_all(d, unique)
            ]
            # Written in transactions: their commit markers sit between the records.
            assert sum(end_offsets(e, remote).values()) > committed
            assert daemon.stop()[0] == 0
            log = daemon.log()
        assert "D->E copies exactly-once (exactly.once.support = required)" in log
        for secret in (password, d.users["admin"], e.users["admin"]):
            assert secret not in log
    finally:
        _drop(admin, acls)
        _scram_user(admin, user, None)
