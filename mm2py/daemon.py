"""The replicator daemon: runs every enabled flow's parts, restarts failed ones, serves /metrics."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import FrameType

from confluent_kafka import KafkaError
from prometheus_client import start_http_server

from mm2py import clients
from mm2py.checkpoint import CheckpointPart
from mm2py.config import ClusterConfig, FlowConfig, MirrorConfig
from mm2py.heartbeat import HeartbeatPart
from mm2py.metrics import Metrics
from mm2py.parts import Part
from mm2py.source import SourcePart
from mm2py.sync import SyncPart

log = logging.getLogger(__name__)

SUPERVISE_INTERVAL = 0.5
MAX_BACKOFF = 60.0
STOP_TIMEOUT = 9.0


class ListenError(RuntimeError):
    """The daemon's HTTP address cannot be bound."""


class ClusterAccessError(RuntimeError):
    """A cluster refuses the configured credentials or certificate; retrying cannot help."""


def check_cluster_access(config: MirrorConfig, aliases: Iterable[str]) -> None:
    """Raise ClusterAccessError naming the cluster if a login or TLS handshake fails.

    All clusters are asked at once; unreachable ones pass (the parts retry them).
    """
    aliases = sorted(set(aliases))
    found: dict[str, KafkaError | None] = {}

    def ask(alias: str) -> None:
        found[alias] = clients.access_error(config.cluster(alias).librdkafka("admin"))

    askers = [threading.Thread(target=ask, args=(alias,), daemon=True) for alias in aliases]
    for t in askers:
        t.start()
    for t in askers:
        t.join()
    for alias in aliases:
        err = found.get(alias)
        if err is not None:
            raise ClusterAccessError(_access_problem(config.cluster(alias), err))


def _access_problem(cluster: ClusterConfig, err: KafkaError) -> str:
    """What failed and what to check, without any secret."""
    props = cluster.librdkafka("admin")
    if err.code() == KafkaError._SSL:
        return (
            f"cluster {cluster.alias}: TLS handshake failed ({err.str()}): check "
            f"{cluster.alias}.ssl.truststore.location (or ssl.ca.location) and the brokers' "
            "certificates"
        )
    mechanism = props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI"
    user = props.get("sasl.username")
    who = f" as user {user}" if user else ""
    return (
        f"cluster {cluster.alias}: authentication failed (SASL {mechanism}{who}): check "
        f"sasl.jaas.config (or {cluster.alias}.sasl.username and sasl.password)"
    )


def parse_listen(address: str) -> tuple[str, int]:
    """`host:port` -> (host, port); a bare port binds to 127.0.0.1."""
    host, _, port = address.rpartition(":")
    return (host or "127.0.0.1", int(port))


def select_flows(config: MirrorConfig, target_clusters: Sequence[str] | None) -> list[FlowConfig]:
    """The enabled flows whose target is in `target_clusters` (as MM2's --clusters)."""
    flows = config.enabled_flows()
    if target_clusters:
        flows = [f for f in flows if f.target in target_clusters]
    return flows


def select_heartbeat_flows(
    config: MirrorConfig, target_clusters: Sequence[str] | None
) -> list[FlowConfig]:
    """The pairs that emit heartbeats (replicating or not) whose target is in `target_clusters`."""
    flows = config.heartbeat_flows()
    if target_clusters:
        flows = [f for f in flows if f.target in target_clusters]
    return flows


def build_parts(
    config: MirrorConfig,
    flows: Sequence[FlowConfig],
    metrics: Metrics,
    heartbeat_flows: Sequence[FlowConfig] = (),
) -> list[Part]:
    """Every part of every selected flow, and a heartbeat part for every heartbeat pair."""
    parts: list[Part] = []
    for flow in flows:
        source, target = config.cluster(flow.source), config.cluster(flow.target)
        parts.append(SourcePart(flow, source, target, metrics))
        if flow.settings.period("emit.checkpoints") is not None:
            parts.append(CheckpointPart(flow, source, target, metrics))
        if SyncPart.wanted(flow):
            parts.append(SyncPart(flow, source, target, metrics))
    watched: set[str] = set()  # one heartbeat watcher per target cluster
    for flow in heartbeat_flows:
        target = config.cluster(flow.target)
        parts.append(HeartbeatPart(flow, target, metrics, watch=flow.target not in watched))
        watched.add(flow.target)
    return parts


@dataclass
class Supervised:
    """A part with its restart bookkeeping."""

    part: Part
    failures: int = 0
    restart_at: float | None = None
    last_error: str | None = field(default=None)


class Daemon:
    """Owns the parts of every selected flow for the lifetime of `mm2py run`."""

    def __init__(
        self,
        config: MirrorConfig,
        flows: Sequence[FlowConfig],
        listen: str,
        heartbeat_flows: Sequence[FlowConfig] | None = None,
    ) -> None:
        """`heartbeat_flows` defaults to every heartbeat pair (MM2 without --clusters)."""
        self.config = config
        self.flows = list(flows)
        self.listen = listen
        self.metrics = Metrics()
        self._stopping = threading.Event()
        if heartbeat_flows is None:
            heartbeat_flows = select_heartbeat_flows(config, None)
        self.parts = [
            Supervised(part)
            for part in build_parts(config, self.flows, self.metrics, heartbeat_flows)
        ]

    def request_stop(self, signum: int | None = None, _frame: FrameType | None = None) -> None:
        if signum is not None:
            log.info("received %s, stopping", signal.Signals(signum).name)
        self._stopping.set()

    def run(self) -> None:
        """Start everything, supervise until a stop is requested, then stop within 10 s."""
        check_cluster_access(
            self.config,
            {a for sup in self.parts for a in (sup.part.flow.source, sup.part.flow.target)},
        )
        host, port = parse_listen(self.listen)
        try:
            server, _thread = start_http_server(port, host, registry=self.metrics.registry)
        except OSError as exc:
            raise ListenError(
                f"cannot listen on {self.listen}: {exc.strerror}; "
                "is another mm2py running there? choose another address with --listen"
            ) from None
        log.info(
            "mm2py serving /metrics on http://%s:%d; flows: %s",
            host,
            port,
            ", ".join(f.name for f in self.flows) or "none",
        )
        for sup in self.parts:
            sup.part.start()
        try:
            while not self._stopping.wait(SUPERVISE_INTERVAL):
                self._supervise()
        finally:
            self._stop_parts()
            server.shutdown()

    def _supervise(self) -> None:
        now = time.monotonic()
        for sup in self.parts:
            part = sup.part
            if part.running:
                continue
            if sup.restart_at is None:
                sup.failures += 1
                sup.last_error = str(part.error) if part.error else "stopped"
                delay = min(2.0 ** (sup.failures - 1), MAX_BACKOFF)
                sup.restart_at = now + delay
                log.warning(
                    "flow %s: %s part stopped (%s); restarting in %.0fs",
                    part.flow.name,
                    part.name,
                    sup.last_error,
                    delay,
                )
            elif now >= sup.restart_at:
                sup.restart_at = None
                part.start()

    def _stop_parts(self) -> None:
        deadline = time.monotonic() + STOP_TIMEOUT
        stoppers = [
            threading.Thread(target=sup.part.stop, args=(STOP_TIMEOUT,)) for sup in self.parts
        ]
        for t in stoppers:
            t.start()
        for t in stoppers:
            t.join(max(deadline - time.monotonic(), 0.1))
        log.info("mm2py stopped")
