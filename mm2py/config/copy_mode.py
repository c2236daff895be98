"""Which copier a flow gets (`replication.copy.mode`, issue 29), decided once, at load.

Contract (pure: a flow's resolved settings and its clusters' client properties in, a
choice out; no I/O):
- `record` gets the record copier.
- `batch` gets the batch copier (pass-through), or fails the load naming the first
  obstacle's key and what to do.
- `auto`, the default, gets the batch copier when nothing stands in its way, else the
  record copier, with the obstacle as the reason (`CopyChoice.reason`, logged at start).

Exactly-once is not an obstacle: the batch copier writes raw batches in transactions of
its own (mm2py.kafka.raw_transactions), and since its small batches go merged and a
commit's progress goes in one request its records are visible sooner than the record
copier's (docs/benchmarks.md).

An obstacle is a guarantee or a setting the batch copier cannot keep:
- schema-id translation (`schema.registry.sync.enabled` rewrites each record's value);
- `compression.type` set for the target's producer: passed-through batches keep the
  source's codec, where the record copier compresses as asked;
- a source consumer reading `read_uncommitted` (pass-through reads what `read_committed`
  readers see) or with `auto.offset.reset` other than `earliest` (pass-through starts a
  partition without progress at its log start);
- a connection the raw clients cannot make (`raw_connection_problem`): a security
  protocol or SASL mechanism other than PLAINTEXT, SSL, SASL PLAIN and SCRAM, or TLS
  material given inline (`ssl.*.pem`) or in a PKCS#12 keystore rather than in PEM files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from mm2py.config.models import ClientRole, ClusterConfig, FlowSettings

Copier = Literal["batch", "record"]

RAW_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
RAW_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# TLS material the raw clients cannot load: they read PEM files only.
_INLINE_TLS_KEYS = ("ssl.ca.pem", "ssl.certificate.pem", "ssl.key.pem", "ssl.keystore.location")


@dataclass(frozen=True)
class Obstacle:
    """What keeps a flow from the batch copier: the key (as the config file names it)
    and why."""

    key: str
    why: str


@dataclass(frozen=True)
class CopyChoice:
    """The copier a flow gets and, for the record copier under `auto`, why."""

    copier: Copier
    reason: str = ""


def raw_connection_problem(props: Mapping[str, str]) -> tuple[str, str] | None:
    """The (key, problem) that keeps the raw clients (mm2py.kafka.raw_clients) from
    connecting with these librdkafka properties, or None when they can."""
    protocol = props.get("security.protocol", "PLAINTEXT").strip().upper()
    if protocol not in RAW_PROTOCOLS:
        return "security.protocol", f"{protocol} is not one batch pass-through can use"
    if protocol.startswith("SASL"):
        key = "sasl.mechanism" if "sasl.mechanism" in props else "sasl.mechanisms"
        mechanism = props.get(key, "GSSAPI").strip().upper()
        if mechanism not in RAW_SASL_MECHANISMS:
            return key, f"{mechanism}: batch pass-through logs in with PLAIN or SCRAM only"
    if protocol.endswith("SSL"):
        for key in _INLINE_TLS_KEYS:
            if props.get(key):
                return key, "batch pass-through reads TLS material from PEM files only"
    return None


def choose(
    flow: str,
    settings: FlowSettings,
    source: ClusterConfig,
    target: ClusterConfig,
    shown: Mapping[str, str],
) -> CopyChoice:
    """The copier of `flow` (``A->B``) under its `replication.copy.mode`; `batch` with an
    obstacle raises `BatchRefused`. `shown` names the flow's keys as the file sets them
    (``A->B.schema.registry.sync.enabled``)."""
    mode = settings.replication_copy_mode
    if mode == "record":
        return CopyChoice("record")
    obstacle = batch_obstacle(settings, source, target, shown)
    if obstacle is not None and mode == "batch":
        raise BatchRefused(flow, obstacle)
    if obstacle is not None:
        return CopyChoice("record", f"{obstacle.key}: {obstacle.why}")
    return CopyChoice("batch")


class BatchRefused(Exception):
    """`replication.copy.mode = batch` on a flow whose guarantees it cannot keep."""

    def __init__(self, flow: str, obstacle: Obstacle) -> None:
        super().__init__(f"{flow}: {obstacle.key}: {obstacle.why}")
        self.flow = flow
        self.obstacle = obstacle


def batch_obstacle(
    settings: FlowSettings,
    source: ClusterConfig,
    target: ClusterConfig,
    shown: Mapping[str, str],
) -> Obstacle | None:
    """The first thing that keeps the flow from the batch copier, or None."""
    if settings.schema_registry_sync_enabled:
        key = "schema.registry.sync.enabled"
        return Obstacle(
            shown.get(key, key),
            "records get the target registry's schema ids, which batches as they are cannot",
        )
    produce = target.librdkafka("producer")
    for key in ("compression.type", "compression.codec"):
        if produce.get(key):
            return Obstacle(
                _named(target, "producer", key),
                "batches passed through keep the source's compression",
            )
    consume = source.librdkafka("consumer")
    if consume.get("isolation.level", "").strip().lower() == "read_uncommitted":
        return Obstacle(
            _named(source, "consumer", "isolation.level"),
            "batch pass-through copies what read_committed readers see",
        )
    reset = consume.get("auto.offset.reset", "earliest").strip().lower()
    if reset not in ("earliest", "smallest", "beginning"):
        return Obstacle(
            _named(source, "consumer", "auto.offset.reset"),
            "batch pass-through starts a partition without progress at its log start",
        )
    sides: tuple[tuple[ClusterConfig, ClientRole, dict[str, str]], ...] = (
        (source, "consumer", consume),
        (target, "producer", produce),
    )
    for cluster, role, props in sides:
        problem = raw_connection_problem(props)
        if problem is not None:
            return Obstacle(_named(cluster, role, problem[0]), problem[1])
    return None


def _named(cluster: ClusterConfig, role: ClientRole, key: str) -> str:
    """`key` as the config file sets it: for the role (``B.producer.key``) or the cluster."""
    if key in getattr(cluster, role):
        return f"{cluster.alias}.{role}.{key}"
    return f"{cluster.alias}.{key}"
