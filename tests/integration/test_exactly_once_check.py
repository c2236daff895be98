"""The start-up check of exactly-once against a secured target (E: SCRAM + StandardAuthorizer).

mm2py's user on E may do everything at-least-once needs; whether it may write the
flow's transactional ids (TransactionalId, PREFIXED `<cluster.group.prefix>-`, WRITE and
DESCRIBE) decides: required and refused exits 2 before anything is written, naming the
key; requested and refused copies at-least-once with one warning; allowed passes.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
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

from mm2py.config import load_config
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from mm2py.replication.exactly_once import check_transactions
from tests.conftest import Clusters
from tests.daemon_harness import mm2_properties, running_daemon
from tests.kafka_helpers import RECENT_MS, create_topic, produce, read_all, topic_names, wait_until

pytestmark = pytest.mark.integration

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"


@dataclass
class MirrorUser:
    """A SCRAM user of the target with what at-least-once needs, and a prefix of its own."""

    name: str
    password: str
    prefix: str
    admin: Any

    def transaction_acls(self) -> list[AclBinding]:
        """The ACLs exactly-once adds: TransactionalId `<prefix>-`, PREFIXED."""
        return [
            AclBinding(
                ResourceType.TRANSACTIONAL_ID,
                f"{self.prefix}-",
                ResourcePatternType.PREFIXED,
                f"User:{self.name}",
                "*",
                operation,
                AclPermissionType.ALLOW,
            )
            for operation in (AclOperation.WRITE, AclOperation.DESCRIBE)
        ]

    def allow_transactions(self) -> None:
        _create(self.admin, self.transaction_acls())


def _create(admin: Any, bindings: list[AclBinding]) -> None:
    for future in admin.create_acls(bindings).values():
        future.result(30)


def _delete(admin: Any, bindings: list[AclBinding]) -> None:
    filters = [
        AclBindingFilter(
            b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
            b.permission_type,
        )
        for b in bindings
    ]  # fmt: skip
    for future in admin.delete_acls(filters).values():
        future.result(30)


def _scram(admin: Any, user: str, password: str | None) -> None:
    change = (
        UserScramCredentialUpsertion(
            user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), password.encode()
        )
        if password is not None
        else UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)
    )
    admin.alter_user_scram_credentials([change])[user].result(30)


@pytest.fixture
def mirror_user(clusters: Clusters) -> Iterator[MirrorUser]:
    e = clusters["E"]
    admin = clients.admin_client(e.client_properties())
    suffix = uuid.uuid4().hex[:8]
    user = MirrorUser(f"mirror-{suffix}", f"pw-{uuid.uuid4().hex}", f"eos-{suffix}", admin)
    _scram(admin, user.name, user.password)
    # Everything at-least-once needs: topics, groups, the cluster (topic creation,
    # idempotent writes); no TransactionalId.
    base = [
        AclBinding(
            kind, name, ResourcePatternType.LITERAL, f"User:{user.name}", "*",
            AclOperation.ALL, AclPermissionType.ALLOW,
        )
        for kind, name in (
            (ResourceType.TOPIC, "*"),
            (ResourceType.GROUP, "*"),
            (ResourceType.BROKER, "kafka-cluster"),
        )
    ]  # fmt: skip
    _create(admin, base)
    try:
        yield user
    finally:
        _delete(admin, base + user.transaction_acls())
        _scram(admin, user.name, None)


def _config(
    tmp_path: Path, d: LocalCluster, e: LocalCluster, topic: str, user: MirrorUser, support: str
) -> Path:
    settings = {
        "cluster.group.prefix": user.prefix,
        "sync.topic.acls.enabled": "false",
        "E.exactly.once.source.support": "enabled",
        "D->E.exactly.once.support": support,
        "D.sasl.jaas.config": (f'{SCRAM} required username="admin" password="{d.users["admin"]}";'),
        "E.sasl.jaas.config": (
            f'{SCRAM} required username="{user.name}" password="{user.password}";'
        ),
    }
    for alias in ("D", "E"):
        settings[f"{alias}.security.protocol"] = "SASL_PLAINTEXT"
        settings[f"{alias}.sasl.mechanism"] = "SCRAM-SHA-512"
    path = tmp_path / "mm2.properties"
    path.write_text(mm2_properties(d, e, topic, **settings))
    return path


def _refused(user: MirrorUser) -> str:
    return (
        f"cluster E refuses the transactional id {user.prefix}-D->E-probe"
        f" (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant User:{user.name} WRITE and"
        f" DESCRIBE on TransactionalId prefix '{user.prefix}-' (pattern PREFIXED)"
    )


def test_the_check_says_what_is_missing_and_passes_once_it_is_granted(
    clusters: Clusters, mirror_user: MirrorUser, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    config = load_config(_config(tmp_path, d, e, unique, mirror_user, "required"))
    flow = config.flow("D", "E")
    assert flow.settings.exactly_once == "required"
    target = config.cluster("E")

    found = check_transactions(flow, target, mirror_user.prefix)
    assert found is not None and found.certain and found.reason == _refused(mirror_user)
    mirror_user.allow_transactions()
    # ACLs reach the authorizer of the (single) broker at once; allow a moment anyway.
    wait_until(
        lambda: check_transactions(flow, target, mirror_user.prefix) is None,
        timeout=30,
        what="the check to pass with the TransactionalId ACLs",
    )
    # ... and `mm2py run` starts, saying how the flow copies.
    with running_daemon(config.path) as daemon:
        wait_until(
            lambda: (
                "D->E copies exactly-once (D->E.exactly.once.support = required)" in daemon.log()
            ),
            timeout=60,
            what="the daemon to start in exactly-once mode",
        )
        assert daemon.proc.poll() is None, daemon.log()


def test_required_and_refused_exits_2_naming_the_key_and_writes_nothing(
    clusters: Clusters, mirror_user: MirrorUser, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    create_topic(d, unique)
    produce(d, unique, [(0, None, b"x", [], RECENT_MS)])
    config = _config(tmp_path, d, e, unique, mirror_user, "required")

    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "run", str(config), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    # Log lines of the load (keys MM2's file has and mm2py ignores) come first; the error
    # is one line.
    lines = [ln for ln in done.stderr.strip().splitlines() if ln.startswith("mm2py")]
    assert "Traceback" not in done.stderr
    assert lines == [
        f"mm2py: {config}: D->E.exactly.once.support: required, but D->E cannot copy"
        f" exactly-once: {_refused(mirror_user)}; or set D->E.exactly.once.support ="
        " requested to copy at-least-once"
    ], done.stderr
    output = done.stderr + done.stdout
    for secret in (mirror_user.password, d.users["admin"]):
        assert secret not in output
    assert {t for t in topic_names(e) if unique in t} == set()


def test_requested_and_refused_copies_at_least_once_with_one_warning(
    clusters: Clusters, mirror_user: MirrorUser, unique: str, tmp_path: Path
) -> None:
    d, e = clusters["D"], clusters["E"]
    create_topic(d, unique)
    sent = [(0, f"k{i}".encode(), f"v{i}".encode(), [], RECENT_MS + i) for i in range(20)]
    produce(d, unique, sent)
    config = _config(tmp_path, d, e, unique, mirror_user, "requested")
    remote = f"D.{unique}"

    with running_daemon(config) as daemon:
        copied = wait_until(
            lambda: read_all(e, remote, expected=20) if remote in topic_names(e) else None,
            timeout=90,
            what=f"the records in {remote} on E",
        )
        log = daemon.log()
    assert [r.content() for r in copied] == [r.content() for r in read_all(d, unique)]
    warning = (
        f"{config}: D->E.exactly.once.support: D->E copies at-least-once, not exactly-once:"
        f" {_refused(mirror_user)}"
    )
    assert log.count(warning) == 1
    assert "copies exactly-once" not in log
    for secret in (mirror_user.password, d.users["admin"]):
        assert secret not in log


def test_taking_over_from_mm2_without_the_acl_to_fence_it_says_which_to_grant(
    clusters: Clusters, mirror_user: MirrorUser, unique: str, tmp_path: Path
) -> None:
    """MM2 ran D->E (its config topic is on E): task 0 fences MM2's transactional ids
    (D-mm2-MirrorSourceConnector-<n>), which mm2py's user may not write here. The flow
    copies on, and the warning names the ACL that would let it fence them."""
    d, e = clusters["D"], clusters["E"]
    mirror_user.allow_transactions()
    create_topic(d, unique)
    produce(d, unique, [(0, f"k{i}".encode(), b"v", [], RECENT_MS + i) for i in range(10)])
    mm2_configs = "mm2-configs.D.internal"
    create_topic(e, mm2_configs, config={"cleanup.policy": "compact"})
    config = _config(tmp_path, d, e, unique, mirror_user, "required")
    remote = f"D.{unique}"
    try:
        with running_daemon(config) as daemon:
            wait_until(
                lambda: read_all(e, remote, expected=10) if remote in topic_names(e) else None,
                timeout=90,
                what=f"the records in {remote} on E",
            )
            log = daemon.log()
    finally:
        admin = clients.admin_client(e.client_properties())
        admin.delete_topics([mm2_configs])[mm2_configs].result(30)
    assert (
        "flow D->E: could not fence MirrorMaker 2's tasks: cluster E refuses the"
        " transactional id D-mm2-MirrorSourceConnector-0"
        f" (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant User:{mirror_user.name} WRITE and"
        " DESCRIBE on TransactionalId prefix 'D-mm2-' (pattern PREFIXED); a transaction MM2"
        " left open is aborted by cluster E only after its transaction.timeout.ms"
    ) in log, log
    assert mirror_user.password not in log
