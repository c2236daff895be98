"""The real Apache Kafka MirrorMaker 2, run in dedicated mode from the cached jars.

For compatibility tests (does mm2py resume from MM2's progress and vice versa?) and
benchmarks: runs ``org.apache.kafka.connect.mirror.MirrorMaker <mm2.properties>`` as a
child process, its log in ``<work_dir>/server.log``.

Invariants:
- `RealMirrorMaker.wait_replicating` returns once MM2's source task logs that it
  replicates the given topic's partitions (not a restarted MM2's previous config);
- a graceful stop (SIGTERM) commits the source tasks' offsets (in exactly-once mode, the
  open transaction); SIGKILL loses what was not flushed;
- one MM2 per (target, worker group) at a time on a machine: a file lock makes
  concurrent runs take turns, since two would share one Connect group and its topics.
What MM2 creates and how long it takes, measured: docs/design/dev-tools.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from mm2py.cache import cache_root
from mm2py.config.properties import decode, parse_properties
from mm2py.dev.jars import spawn_java, stop_java

log = logging.getLogger(__name__)

MAIN_CLASS: Final = "org.apache.kafka.connect.mirror.MirrorMaker"
# MirrorSourceTask.start logs this once its partitions are assigned and seeked.
REPLICATING_PATTERN: Final = re.compile(
    r"task-thread-MirrorSourceConnector-\d+ replicating \d+ topic-partitions"
)


def replicating_pattern(topic: str | None = None) -> re.Pattern[str]:
    """The log line saying a MirrorSourceTask replicates a partition of `topic` (or any)."""
    if topic is None:
        return REPLICATING_PATTERN
    # The line ends with Java's List.toString of the task's partitions: [t-0, t-1].
    partition = r" [^:\n]*: \[(?:[^\]\n]*? )?" + re.escape(topic) + r"-\d+[,\]]"
    return re.compile(REPLICATING_PATTERN.pattern + partition)


class MirrorMakerError(RuntimeError):
    """The real MirrorMaker 2 could not be started or exited unexpectedly."""


def mm2_properties(
    source_alias: str,
    source_bootstrap: str,
    target_alias: str,
    target_bootstrap: str,
    topics_regex: str,
    **overrides: str,
) -> dict[str, str]:
    """A minimal dedicated-mode config replicating `topics_regex` one way, source to target.

    Tuned for single-node local clusters: every replication factor is 1, refresh and
    emit intervals are short and Connect flushes progress every second. The reverse
    flow is off, heartbeats included (otherwise MM2 still starts a second herder that
    writes heartbeats and its own worker topics into the source cluster). Keys with
    dots or arrows go in as ``**{"A->B.sync.group.offsets.enabled": "true"}``; an
    override with the value ``""`` removes the key.
    """
    src, tgt = source_alias, target_alias
    props = {
        "clusters": f"{src}, {tgt}",
        f"{src}.bootstrap.servers": source_bootstrap,
        f"{tgt}.bootstrap.servers": target_bootstrap,
        f"{src}->{tgt}.enabled": "true",
        f"{tgt}->{src}.enabled": "false",
        f"{tgt}->{src}.emit.heartbeats.enabled": "false",
        "topics": topics_regex,
        # Single-node clusters: MM2's defaults (2 for remote topics, 3 for its own and
        # Connect's internal topics) cannot be met by one broker.
        "replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "offset.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        # Short intervals so tests see new topics, groups and checkpoints quickly.
        "refresh.topics.interval.seconds": "1",
        "refresh.groups.interval.seconds": "1",
        "emit.checkpoints.interval.seconds": "1",
        "emit.heartbeats.interval.seconds": "1",
        "sync.group.offsets.interval.seconds": "1",
        "sync.topic.configs.interval.seconds": "1",
        # The local plain clusters have no authorizer; describing ACLs would fail.
        "sync.topic.acls.enabled": "false",
        # Worker settings come only from the target cluster's prefix
        # (MirrorMakerConfig.workerConfig): flush progress every second.
        f"{tgt}.offset.flush.interval.ms": "1000",
        # Skip Connect's reflective plugin scans (one for the config and one per herder,
        # seconds each: docs/benchmarks.md); every plugin MM2 needs has a ServiceLoader
        # manifest.
        "plugin.discovery": "service_load",
        f"{tgt}.plugin.discovery": "service_load",
    }
    for key, value in overrides.items():
        if value == "":
            props.pop(key, None)
        else:
            props[key] = value
    return props


def exactly_once_settings(
    source_alias: str, target_alias: str, rest_port: int | None = None
) -> dict[str, str]:
    """The keys that make MM2 copy `source_alias` -> `target_alias` exactly once (KIP-618),
    as overrides for :func:`mm2_properties`; mm2py reads the same keys in the same file.

    - ``<target>.exactly.once.source.support = enabled``: a worker key, so it takes the
      target cluster's prefix (MirrorMakerConfig.workerConfig). The herder then writes
      records and their source offsets (``mm2-offsets.<source>.internal``) in one
      transaction per task, transactional id ``<source>-mm2-MirrorSourceConnector-<task>``,
      and fences the previous task generation before starting a new one.
    - ``exactly.once.support = required`` (global): mm2py refuses to start rather than
      copy at-least-once. MM2's dedicated mode drops a global key its connector configs
      do not define (MirrorMakerConfig.connectorBaseConfig), so its connectors log
      ``exactly.once.support = requested``; its source task's transactional id in its
      log is what shows it copies exactly once.
    - ``<source>.consumer.isolation.level = read_committed``: MirrorSourceConnector
      declares exactly-once support only for a read_committed source consumer; Java's
      default (read_uncommitted) would copy aborted source records, and commit them.
    - ``dedicated.mode.enable.internal.rest = true`` with a ``listeners`` URL (KIP-710):
      the zombie fencing a follower asks of the leader goes over Connect's internal REST
      API, which dedicated mode otherwise does not start. One node fences locally, but
      this is the documented setup. mm2py serves its own REST API on that listener unless
      given ``--listen``.
    """
    port = rest_port if rest_port is not None else _free_port()
    return {
        f"{target_alias}.exactly.once.source.support": "enabled",
        "exactly.once.support": "required",
        f"{source_alias}.consumer.isolation.level": "read_committed",
        "dedicated.mode.enable.internal.rest": "true",
        "listeners": f"http://127.0.0.1:{port}",
    }


def _free_port() -> int:
    # mm2py.dev.connect has one too, but it imports this module.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def render_properties(props: Mapping[str, str]) -> str:
    """`props` as a Java .properties file that ``Properties.load`` reads back unchanged."""
    lines = ["# written by mm2py.dev.mirrormaker"]
    for key, value in props.items():
        lines.append(f"{_escape(key, is_key=True)}={_escape(value, is_key=False)}")
    return "\n".join(lines) + "\n"


def _escape(text: str, *, is_key: bool) -> str:
    # Properties.load(InputStream) reads ISO-8859-1 and drops a backslash before an
    # unknown character, so a regex like `a\.b` must be written `a\\.b`.
    out: list[str] = []
    for i, ch in enumerate(text):
        if ch == "\\":
            out.append("\\\\")
        elif ch in "\n\r\t\f":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t", "\f": "\\f"}[ch])
        elif ch in "=:#!" or (ch == " " and (is_key or i == 0)):
            out.append("\\" + ch)
        elif ord(ch) > 0x7E or ord(ch) < 0x20:
            out.extend(f"\\u{unit:04x}" for unit in _utf16_units(ch))
        else:
            out.append(ch)
    return "".join(out)


def _utf16_units(ch: str) -> list[int]:
    data = ch.encode("utf-16-be")
    return [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]


class _LogLines:
    """Reads the complete lines a growing log file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0
        self.partial = b""

    def new_lines(self) -> list[str]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                data = f.read()
        except FileNotFoundError:
            return []
        self.pos += len(data)
        *complete, self.partial = (self.partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in complete]


class RealMirrorMaker:
    """One real MM2 dedicated-mode process; a context manager that starts and stops it.

    `properties` is a mapping (rendered to ``<work_dir>/mm2.properties``), the text of
    a properties file, or a ``Path`` to an existing one. `clusters` limits the target
    clusters this node serves (MM2's ``--clusters``).
    """

    def __init__(
        self,
        properties: Mapping[str, str] | str | Path,
        work_dir: Path,
        heap: str = "512m",
        clusters: Sequence[str] = (),
        lock_timeout: float = 600.0,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.heap = heap
        self.clusters = list(clusters)
        self.lock_timeout = lock_timeout
        self._properties = properties
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[bytes] | None = None
        self.started_at: float | None = None

    # -- paths -----------------------------------------------------------------

    @property
    def properties_file(self) -> Path:
        """The properties file MM2 reads."""
        if isinstance(self._properties, Path):
            return self._properties
        return self.work_dir / "mm2.properties"

    @property
    def log_file(self) -> Path:
        """MM2's log (log4j, INFO and up)."""
        return self.work_dir / "server.log"

    @property
    def stdout_file(self) -> Path:
        """Where the JVM's own stdout/stderr go (crashes before logging starts)."""
        return self.work_dir / "stdout.log"

    @property
    def pid(self) -> int | None:
        """The JVM's PID while it runs."""
        return self._proc.pid if self._proc is not None else None

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> RealMirrorMaker:
        """Write the config and launch MM2; return at once (see :meth:`wait_replicating`)."""
        if self.is_running():
            raise MirrorMakerError(f"MM2 already runs (pid {self.pid})")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not isinstance(self._properties, Path):
            text = (
                self._properties
                if isinstance(self._properties, str)
                else render_properties(self._properties)
            )
            self.properties_file.write_text(text, encoding="latin-1")
        self._acquire_lock()
        args = [str(self.properties_file)]
        if self.clusters:
            args += ["--clusters", *self.clusters]
        self._proc = spawn_java(
            MAIN_CLASS,
            *args,
            heap=self.heap,
            logs_dir=self.work_dir,
            stdout_file=self.stdout_file,
        )
        self.started_at = time.monotonic()
        log.info("started MirrorMaker 2 (pid %d), log %s", self._proc.pid, self.log_file)
        return self

    def is_running(self) -> bool:
        """True while the MM2 process we started is alive."""
        return self._proc is not None and self._proc.poll() is None

    def wait_replicating(self, topic: str | None = None, timeout: float = 120.0) -> float:
        """Wait until MM2 replicates `topic` (default: any topic); return seconds since start.

        Name the topic: on restart MM2 first runs the connector config stored in
        ``mm2-configs.<source>.internal`` by the previous run, and only then its own.
        Raise :class:`MirrorMakerError` if MM2 exits or `timeout` passes first.
        """
        return self.wait_for_log(replicating_pattern(topic), timeout)

    def wait_for_log(self, pattern: re.Pattern[str] | str, timeout: float = 120.0) -> float:
        """Wait until a line of MM2's log matches `pattern`; return seconds since start."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        lines = _LogLines(self.log_file)
        while True:
            if any(regex.search(line) for line in lines.new_lines()):
                assert self.started_at is not None
                return time.monotonic() - self.started_at
            if not self.is_running():
                code = self._proc.returncode if self._proc else None
                raise MirrorMakerError(
                    f"MM2 exited (status {code}) before logging {regex.pattern!r}; "
                    f"see {self.log_file} and {self.stdout_file}"
                )
            if time.monotonic() > deadline:
                raise MirrorMakerError(
                    f"MM2 did not log {regex.pattern!r} within {timeout}s; see {self.log_file}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 30.0) -> int | None:
        """Stop MM2 gracefully (SIGTERM, so tasks commit progress), SIGKILL after `timeout`.

        Return the exit status, or None if it was not running.
        """
        proc = self._proc
        if proc is None:
            self._release_lock()
            return None
        try:
            return stop_java(proc, timeout, "MM2")
        finally:
            self._proc = None
            self._release_lock()

    def kill(self) -> None:
        """Stop MM2 at once (SIGKILL), losing progress it has not flushed."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        self._proc = None
        self._release_lock()

    def __enter__(self) -> RealMirrorMaker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- one MM2 per Connect group ---------------------------------------------

    def _lock_name(self) -> str:
        props = self._read_properties()
        clusters = [c.strip() for c in props.get("clusters", "").split(",") if c.strip()]
        groups = []
        for src in clusters:
            for tgt in clusters:
                if src != tgt and props.get(f"{src}->{tgt}.enabled", "").lower() == "true":
                    group = props.get(f"{tgt}.group.id", f"{src}-mm2")
                    groups.append(f"{props.get(f'{tgt}.bootstrap.servers', '')}|{group}")
        return hashlib.sha256("\n".join(sorted(groups)).encode()).hexdigest()[:16]

    def _read_properties(self) -> dict[str, str]:
        if isinstance(self._properties, Mapping):
            return dict(self._properties)
        if isinstance(self._properties, Path):
            path, text = self._properties, decode(self._properties.read_bytes())
        else:
            path, text = self.properties_file, self._properties
        return {key: value for key, value, _line in parse_properties(text, path)}

    def _acquire_lock(self) -> None:
        lock_dir = cache_root() / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        handle = open(lock_dir / f"mm2-{self._lock_name()}.lock", "wb")  # noqa: SIM115
        deadline = time.monotonic() + self.lock_timeout
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    handle.close()
                    raise MirrorMakerError(
                        "another MM2 with the same target cluster and worker group has run "
                        f"for over {self.lock_timeout}s on this machine; "
                        "stop it or give this one another group.id"
                    ) from None
                time.sleep(0.5)
        self._lock = handle

    def _release_lock(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the file drops the flock
            self._lock = None
