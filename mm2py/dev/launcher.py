"""Real single-node Apache Kafka clusters (KRaft) on 127.0.0.1 for demos and tests.

Each cluster lives in `<state dir>/<alias>/`: its server.properties, data, log,
the PID of the JVM we started and, for secured clusters, the SCRAM users. `down`
only ever signals PIDs recorded there.

A cluster is plain (PLAINTEXT), secured (SASL_PLAINTEXT with SCRAM-SHA-512 and
the StandardAuthorizer) or secured over TLS (SASL_SSL, from PEM files the caller
makes: the broker's key and certificate chain, and the CA clients trust).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mm2py.cache import cache_root
from mm2py.dev.jars import java_command
from mm2py.errors import Mm2pyError
from mm2py.kafka.clients import describe_cluster

log = logging.getLogger(__name__)

# Fixed ports so configs/ and the docs (docs/local-clusters.md) can name them.
# F is above Linux's ephemeral range (32768-60999), so no client socket takes its port.
BROKER_PORTS = {
    "A": 19092,
    "B": 29092,
    "C": 39092,
    "D": 49092,
    "E": 59092,
    "F": 61092,
    "G": 62092,
}
# Shifts every port above, so that two sets of local clusters (say, two engineers'
# test runs on one machine) can run side by side, each with its own MM2PY_LOCAL_DIR.
PORT_OFFSET_VARIABLE = "MM2PY_LOCAL_PORT_OFFSET"
SCRAM_MECHANISM = "SCRAM-SHA-512"
SCRAM_USERS = ("admin", "alice", "bob")
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
# A broker's heap, as kafka-server-start.sh gives it (KAFKA_HEAP_OPTS="-Xmx1G -Xms1G"):
# all of it committed at start. With 512 MB and no -Xms, a broker's G1 ran concurrent
# marking cycles every few seconds under the latency benchmark's load, each with a
# remark pause (9-135 ms here) that every produce and fetch waited out.
BROKER_HEAP = "1g"


class LocalClusterError(Mm2pyError):
    """A local cluster could not be started, stopped or found."""


def broker_port(alias: str) -> int:
    """The local cluster's broker port (its controller listens on the next one)."""
    raw = os.environ.get(PORT_OFFSET_VARIABLE, "0")
    try:
        offset = int(raw)
    except ValueError:
        raise LocalClusterError(
            f"{PORT_OFFSET_VARIABLE}={raw!r} is not a whole number; unset it or give e.g. 200"
        ) from None
    return BROKER_PORTS[alias] + offset


def default_state_dir() -> Path:
    """Where `mm2py local` keeps its clusters unless --dir says otherwise."""
    return Path(os.environ.get("MM2PY_LOCAL_DIR", cache_root() / "local"))


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for a SASL_SSL listener."""

    keystore: Path  # the broker's private key (unencrypted PKCS#8) and certificate chain
    ca: Path  # the CA certificate that clients verify the broker with

    def as_json(self) -> dict[str, str]:
        return {"keystore": str(self.keystore), "ca": str(self.ca)}


@dataclass(frozen=True)
class LocalCluster:
    """One local cluster as recorded on disk."""

    alias: str
    port: int
    secure: bool
    home: Path
    users: dict[str, str] = field(default_factory=dict, repr=False)
    tls: TlsFiles | None = None
    # Broker settings beyond Kafka's defaults that one test needs (and names, with why).
    broker_settings: dict[str, str] = field(default_factory=dict)

    @property
    def security_protocol(self) -> str:
        if self.tls is not None:
            return "SASL_SSL"
        return "SASL_PLAINTEXT" if self.secure else "PLAINTEXT"

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def log_file(self) -> Path:
        return self.home / "logs" / "server.log"

    def client_properties(self, user: str = "admin") -> dict[str, str]:
        """Connection settings (librdkafka names) for `user` on this cluster."""
        props = {"bootstrap.servers": self.bootstrap_servers}
        if self.secure:
            props.update(
                {
                    "security.protocol": self.security_protocol,
                    "sasl.mechanism": SCRAM_MECHANISM,
                    "sasl.username": user,
                    "sasl.password": self.users[user],
                }
            )
        if self.tls is not None:
            props["ssl.ca.location"] = str(self.tls.ca)
        return props


def server_properties(cluster: LocalCluster) -> str:
    """The broker+controller configuration of a local cluster (pure)."""
    port, cport = cluster.port, cluster.controller_port
    listener = cluster.security_protocol
    lines = [
        "process.roles=broker,controller",
        "node.id=1",
        f"controller.quorum.bootstrap.servers=127.0.0.1:{cport}",
        f"listeners={listener}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}",
        f"advertised.listeners={listener}://127.0.0.1:{port}",
        "controller.listener.names=CONTROLLER",
        f"inter.broker.listener.name={listener}",
        f"listener.security.protocol.map={listener}:{listener},CONTROLLER:PLAINTEXT",
        f"log.dirs={cluster.home / 'data'}",
        # Group, session and log settings are Kafka's defaults: what tests and the demo
        # show is what users of plain brokers get (a KIP-848 group's session is 45 s).
        # What differs, and why: one node holds every replica (replication factors 1);
        # the internal topics have 10 partitions, not 50, so a broker starts sooner;
        # a new group's first join does not wait 3 s (as Kafka's own shipped
        # config/server.properties sets it, "for development and testing"); and a topic
        # nobody created is an error rather than made with one partition, so a test
        # sees a component that relies on auto-creation fail.
        "num.partitions=1",
        "offsets.topic.replication.factor=1",
        "offsets.topic.num.partitions=10",
        "transaction.state.log.replication.factor=1",
        "transaction.state.log.min.isr=1",
        "transaction.state.log.num.partitions=10",
        "share.coordinator.state.topic.replication.factor=1",
        "share.coordinator.state.topic.min.isr=1",
        "group.initial.rebalance.delay.ms=0",
        "auto.create.topics.enable=false",
    ]
    if cluster.secure:
        admin_password = cluster.users["admin"]
        jaas = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="admin" password="{admin_password}";'
        )
        lines += [
            f"sasl.enabled.mechanisms={SCRAM_MECHANISM}",
            f"sasl.mechanism.inter.broker.protocol={SCRAM_MECHANISM}",
            f"listener.name.{listener.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config={jaas}",
            f"authorizer.class.name={STANDARD_AUTHORIZER}",
            "super.users=User:admin;User:ANONYMOUS",
            "allow.everyone.if.no.acl.found=false",
        ]
    if cluster.tls is not None:
        # Kafka reads PEM stores directly (KIP-651); the key must be unencrypted PKCS#8.
        lines += [
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={cluster.tls.keystore}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={cluster.tls.ca}",
            "ssl.client.auth=none",
        ]
    lines += [f"{key}={value}" for key, value in sorted(cluster.broker_settings.items())]
    return "\n".join(lines) + "\n"


class LocalKafka:
    """Starts, finds and stops the local clusters kept under one state folder."""

    def __init__(self, state_dir: Path | None = None, jvm_options: Sequence[str] = ()) -> None:
        """`jvm_options`: added to each broker's java command line."""
        self.state_dir = (state_dir or default_state_dir()).resolve()
        self.jvm_options = tuple(jvm_options)

    # -- what is recorded -------------------------------------------------

    def _home(self, alias: str) -> Path:
        return self.state_dir / alias

    def cluster(self, alias: str) -> LocalCluster:
        """The recorded cluster `alias` (it may or may not be running)."""
        meta = self._home(alias) / "cluster.json"
        if not meta.exists():
            raise LocalClusterError(f"no local cluster {alias!r} under {self.state_dir}")
        data = json.loads(meta.read_text())
        tls = data.get("tls")
        return LocalCluster(
            alias=alias,
            port=int(data["port"]),
            secure=bool(data["secure"]),
            home=self._home(alias),
            users=dict(data.get("users", {})),
            tls=TlsFiles(Path(tls["keystore"]), Path(tls["ca"])) if tls else None,
            broker_settings=dict(data.get("broker_settings", {})),
        )

    def known(self) -> list[LocalCluster]:
        """Every cluster recorded under the state folder."""
        if not self.state_dir.exists():
            return []
        homes = sorted(p for p in self.state_dir.iterdir() if (p / "cluster.json").exists())
        return [self.cluster(p.name) for p in homes]

    def pid(self, alias: str) -> int | None:
        """The PID of the running broker we started for `alias`, else None."""
        pid_file = self._home(alias) / "pid"
        if not pid_file.exists():
            return None
        pid = int(pid_file.read_text().strip())
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        # Guard against a recycled PID: it must be our broker for this folder.
        if b"kafka.Kafka" not in cmdline or str(self._home(alias)).encode() not in cmdline:
            return None
        return pid

    def is_running(self, alias: str) -> bool:
        return self.pid(alias) is not None

    # -- lifecycle ---------------------------------------------------------

    def up(
        self,
        aliases: Iterable[str],
        secure: Iterable[str] = (),
        timeout: float = 90.0,
        tls: Mapping[str, TlsFiles] | None = None,
        broker_settings: Mapping[str, Mapping[str, str]] | None = None,
    ) -> list[LocalCluster]:
        """Start the clusters that do not run yet and wait until all answer.

        Clusters in `secure` get SCRAM users and ACLs; those in `tls` as well, and
        their listener is SASL_SSL with the given PEM files. `broker_settings` adds
        broker properties to a cluster's server.properties.
        """
        aliases = list(aliases)
        # Before the first client connects: a client socket that took a listener port
        # (C's and up lie in Linux's ephemeral range) makes a later broker's bind fail.
        _reserve_ports(*all_ports())
        tls = dict(tls or {})
        secure_set = set(secure) | set(tls)
        settings = {alias: dict(values) for alias, values in (broker_settings or {}).items()}
        started: dict[str, subprocess.Popen[bytes]] = {}
        for alias in aliases:
            if alias not in BROKER_PORTS:
                raise LocalClusterError(
                    f"unknown local cluster alias {alias!r}; choose from {', '.join(BROKER_PORTS)}"
                )
            if self.is_running(alias):
                recorded = self.cluster(alias)
                if recorded.broker_settings != settings.get(alias, {}):
                    raise LocalClusterError(
                        f"cluster {alias} already runs with other broker settings "
                        f"({recorded.broker_settings or 'none'}); run `mm2py local down` first"
                    )
                if recorded.secure != (alias in secure_set) or recorded.tls != tls.get(alias):
                    want = (
                        "with these TLS files"
                        if alias in tls
                        else "secured"
                        if alias in secure_set
                        else "plain"
                    )
                    raise LocalClusterError(
                        f"cluster {alias} already runs but not {want}; run `mm2py local down` first"
                    )
                continue
            started[alias] = self._launch(
                alias, alias in secure_set, tls.get(alias), settings.get(alias, {})
            )
        deadline = time.monotonic() + timeout
        clusters = [self.cluster(a) for a in aliases]
        for cluster in clusters:
            self._wait_ready(cluster, deadline, started.get(cluster.alias))
        return clusters

    def _launch(
        self, alias: str, secure: bool, tls: TlsFiles | None, broker_settings: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        home = self._home(alias)
        shutil.rmtree(home, ignore_errors=True)
        (home / "logs").mkdir(parents=True)
        users = {u: secrets.token_urlsafe(12) for u in SCRAM_USERS} if secure else {}
        cluster = LocalCluster(alias, broker_port(alias), secure, home, users, tls, broker_settings)
        for port in (cluster.port, cluster.controller_port):
            if _port_open(port):
                raise LocalClusterError(
                    f"port {port} for cluster {alias} is taken by another process; "
                    "stop it or use `mm2py local down`"
                )
        meta: dict[str, object] = {
            "port": cluster.port,
            "secure": secure,
            "users": users,
            "broker_settings": broker_settings,
        }
        if tls is not None:
            meta["tls"] = tls.as_json()
        meta_file = home / "cluster.json"
        meta_file.write_text(json.dumps(meta, indent=2))
        meta_file.chmod(0o600)
        props = home / "server.properties"
        props.write_text(server_properties(cluster))
        props.chmod(0o600)
        self._format(cluster, props)
        return self._spawn(cluster)

    def _spawn(self, cluster: LocalCluster) -> subprocess.Popen[bytes]:
        logs = cluster.home / "logs"
        cmd = java_command(
            "kafka.Kafka",
            str(cluster.home / "server.properties"),
            heap=BROKER_HEAP,
            initial_heap=BROKER_HEAP,
            logs_dir=logs,
            gc_log=True,
            options=self.jvm_options,
        )
        with open(logs / "stdout.log", "ab") as out:
            proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (cluster.home / "pid").write_text(str(proc.pid))
        log.info(
            "started cluster %s (pid %d) on %s", cluster.alias, proc.pid, cluster.bootstrap_servers
        )
        return proc

    def _format(self, cluster: LocalCluster, props: Path) -> None:
        args = ["format", "-t", _cluster_id(), "-c", str(props), "--standalone"]
        for user, password in cluster.users.items():
            args += ["--add-scram", f"{SCRAM_MECHANISM}=[name={user},password={password}]"]
        # The SCRAM passwords go in an argument file, not on the process list.
        args_file = cluster.home / "format.args"
        try:
            done = subprocess.run(
                java_command(
                    "kafka.tools.StorageTool",
                    *args,
                    heap="256m",
                    logs_dir=cluster.home / "logs",
                    args_file=args_file,
                ),
                capture_output=True,
                text=True,
                check=False,
            )
        finally:
            args_file.unlink(missing_ok=True)
        if done.returncode != 0:
            raise LocalClusterError(
                f"formatting storage of cluster {cluster.alias} failed: {done.stdout}{done.stderr}"
            )

    def _wait_ready(
        self, cluster: LocalCluster, deadline: float, proc: subprocess.Popen[bytes] | None
    ) -> None:
        while True:
            # A just-forked child has not exec'd java yet, so ask the Popen when we have it.
            exited = proc.poll() is not None if proc else not self.is_running(cluster.alias)
            if exited:
                raise LocalClusterError(
                    f"broker of cluster {cluster.alias} exited during start; its folder "
                    f"{cluster.home} is kept. The end of its log:\n{log_tail(cluster)}"
                )
            if _port_open(cluster.port) and describe_cluster(cluster.client_properties()):
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"cluster {cluster.alias} did not answer describe-cluster in time; its "
                    f"folder {cluster.home} is kept. The end of its log:\n{log_tail(cluster)}"
                )
            time.sleep(0.2)

    def stop(self, alias: str, timeout: float = 20.0) -> None:
        """Stop the broker of `alias` but keep its data (for restart tests)."""
        pid = self.pid(alias)
        if pid is None:
            return
        os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while self.is_running(alias) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.is_running(alias):
            os.killpg(pid, signal.SIGKILL)
            while self.is_running(alias):
                time.sleep(0.05)
        _reap(pid)

    def start(self, alias: str, timeout: float = 60.0) -> LocalCluster:
        """Start a stopped cluster again on its existing data."""
        cluster = self.cluster(alias)
        proc = None if self.is_running(alias) else self._spawn(cluster)
        self._wait_ready(cluster, time.monotonic() + timeout, proc)
        return cluster

    def down(
        self, aliases: Iterable[str] | None = None, keep_logs_in: Path | None = None
    ) -> list[str]:
        """Stop the given (default: all recorded) clusters and delete their data.

        With `keep_logs_in`, each cluster's logs folder is moved there first, as
        `<keep_logs_in>/<alias>/` (a failed test run keeps what its brokers said)."""
        names = list(aliases) if aliases is not None else [c.alias for c in self.known()]
        for alias in names:
            self.stop(alias)
            logs = self._home(alias) / "logs"
            if keep_logs_in is not None and logs.is_dir():
                kept = keep_logs_in / alias
                shutil.rmtree(kept, ignore_errors=True)
                kept.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(logs, kept)
            shutil.rmtree(self._home(alias), ignore_errors=True)
        return names


LOG_TAIL_LINES = 20


CAUSE_LINES = 3  # at most, after the first ERROR line: the exception's message


def log_tail(cluster: LocalCluster, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of the broker's log, or of its stdout (where the JVM
    reports what fails before logging starts) when the log says nothing; and the log's
    first ERROR line with the exception message under it when the tail does not hold
    it (a broker that fails to start logs its shutdown after the cause)."""
    for path in (cluster.log_file, cluster.home / "logs" / "stdout.log"):
        try:
            text = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        if not text:
            continue
        tail = text[-lines:]
        at = next((i for i, line in enumerate(text) if "] ERROR " in line), None)
        cause: list[str] = []
        if at is not None and text[at] not in tail:
            # The ERROR line and the exception it logs on the lines after it (the
            # message names the cause, e.g. "Address already in use"), not the frames.
            cause = [text[at]]
            for line in text[at + 1 : at + 1 + CAUSE_LINES]:
                if line.startswith(("\tat ", "[")):
                    break
                cause.append(line)
            cause.append("...")
        return "\n".join([f"({path})", *cause, *tail])
    return f"(neither {cluster.log_file} nor stdout.log holds anything)"


def all_ports() -> list[int]:
    """Every local cluster's broker and controller ports (with the port offset)."""
    return [p for alias in BROKER_PORTS for p in (broker_port(alias), broker_port(alias) + 1)]


def _cluster_id() -> str:
    """A random KRaft cluster id (base64url of 16 random bytes, as Kafka's Uuid).

    Like Kafka's Uuid.randomUuid, never one that starts with "-": the storage
    tool would read it as an option.
    """
    import base64

    while True:
        cid = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


RESERVED_PORTS = Path("/proc/sys/net/ipv4/ip_local_reserved_ports")


def _reserve_ports(*ports: int) -> None:
    """Keep the kernel from handing our listener ports to outgoing connections.

    Ports 39092 and up fall inside Linux's ephemeral range (32768-60999): a
    client socket that happens to take one makes the broker's bind fail. As
    root we reserve them; elsewhere this is skipped and the rare clash remains.
    """
    try:
        current = RESERVED_PORTS.read_text().strip()
        wanted = [str(p) for p in ports if not _listed(p, current)]
        if wanted:
            RESERVED_PORTS.write_text(",".join(filter(None, [current, *wanted])))
    except OSError:
        log.debug("cannot reserve ports %s; continuing without", ports)


def _listed(port: int, ranges: str) -> bool:
    """Whether the kernel's list of ports ("19092-19093,29092") holds `port` (pure)."""
    for item in filter(None, ranges.split(",")):
        low, _, high = item.partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _reap(pid: int) -> None:
    """Collect the exit status if the broker was our child (avoids zombies)."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
