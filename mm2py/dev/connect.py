"""A real Apache Kafka Connect worker (distributed mode) from the cached jars, running MM2's
connectors: what mm2py's Connect-compatible REST API is compared with.

It runs ``org.apache.kafka.connect.cli.ConnectDistributed <worker.properties>`` as a child
process, its log in ``<work_dir>/server.log``, its REST listener on a free port of
127.0.0.1. Connectors are created through that REST API, named as Strimzi names MM2's
(``A->B.MirrorSourceConnector``), with :func:`mirror_connector_config`'s settings.

Invariant: the worker's internal topics (on the target) and its group id come from
`prefix`, so workers of different tests never meet. How the worker behaves, observed:
docs/design/dev-tools.md.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from mm2py.dev.jars import spawn_java, stop_java
from mm2py.dev.mirrormaker import render_properties

log = logging.getLogger(__name__)

MAIN_CLASS: Final = "org.apache.kafka.connect.cli.ConnectDistributed"
MIRROR_PACKAGE: Final = "org.apache.kafka.connect.mirror."
BYTE_ARRAY_CONVERTER: Final = "org.apache.kafka.connect.converters.ByteArrayConverter"


class ConnectWorkerError(RuntimeError):
    """The Connect worker could not be started, exited, or did not get where it was asked."""


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def worker_properties(
    bootstrap: str, prefix: str, rest_port: int, **overrides: str
) -> dict[str, str]:
    """A distributed worker working in the cluster at `bootstrap`, for single-node clusters.

    `prefix` names its group and its three internal topics (one partition each,
    replication factor 1). Byte-array converters, as MM2 uses.
    """
    props = {
        "bootstrap.servers": bootstrap,
        "group.id": f"{prefix}-group",
        "offset.storage.topic": f"{prefix}-offsets",
        "config.storage.topic": f"{prefix}-configs",
        "status.storage.topic": f"{prefix}-status",
        "offset.storage.replication.factor": "1",
        "config.storage.replication.factor": "1",
        "status.storage.replication.factor": "1",
        "offset.storage.partitions": "1",
        "status.storage.partitions": "1",
        "key.converter": BYTE_ARRAY_CONVERTER,
        "value.converter": BYTE_ARRAY_CONVERTER,
        "header.converter": BYTE_ARRAY_CONVERTER,
        "listeners": f"http://127.0.0.1:{rest_port}",
        "offset.flush.interval.ms": "1000",
        "plugin.discovery": "service_load",
    }
    props.update(overrides)
    return props


def mirror_connector_config(
    kind: str,
    source_alias: str,
    source_bootstrap: str,
    target_alias: str,
    target_bootstrap: str,
    **overrides: str,
) -> dict[str, str]:
    """The config of one of MM2's connectors (`kind`: MirrorSourceConnector,
    MirrorCheckpointConnector or MirrorHeartbeatConnector) for single-node clusters: every
    replication factor 1, one-second intervals, ACL sync off (no authorizer)."""
    config = {
        "connector.class": MIRROR_PACKAGE + kind,
        "source.cluster.alias": source_alias,
        "target.cluster.alias": target_alias,
        "source.cluster.bootstrap.servers": source_bootstrap,
        "target.cluster.bootstrap.servers": target_bootstrap,
        "key.converter": BYTE_ARRAY_CONVERTER,
        "value.converter": BYTE_ARRAY_CONVERTER,
        "tasks.max": "1",
        "replication.factor": "1",
        "offset-syncs.topic.replication.factor": "1",
        "checkpoints.topic.replication.factor": "1",
        "heartbeats.topic.replication.factor": "1",
        "refresh.topics.interval.seconds": "1",
        "refresh.groups.interval.seconds": "1",
        "emit.checkpoints.interval.seconds": "1",
        "emit.heartbeats.interval.seconds": "1",
        "sync.topic.acls.enabled": "false",
    }
    config.update(overrides)
    return config


class ConnectWorker:
    """One real Connect worker process; a context manager that starts and stops it."""

    def __init__(
        self, bootstrap: str, work_dir: Path, prefix: str, heap: str = "512m", **overrides: str
    ) -> None:
        self.work_dir = Path(work_dir)
        self.heap = heap
        self.port = free_port()
        self.properties = worker_properties(bootstrap, prefix, self.port, **overrides)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.work_dir / "server.log"

    @property
    def stdout_file(self) -> Path:
        return self.work_dir / "stdout.log"

    # -- lifecycle -------------------------------------------------------------

    def start(self) -> ConnectWorker:
        """Write the worker config and launch the worker; see :meth:`wait_ready`."""
        if self.is_running():
            raise ConnectWorkerError("the Connect worker already runs")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        config = self.work_dir / "worker.properties"
        config.write_text(render_properties(self.properties), encoding="latin-1")
        self._proc = spawn_java(
            MAIN_CLASS,
            str(config),
            heap=self.heap,
            logs_dir=self.work_dir,
            stdout_file=self.stdout_file,
        )
        log.info("started a Connect worker (pid %d) on %s", self._proc.pid, self.url)
        return self

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Wait until the worker's REST API answers GET / (and it has joined its group)."""
        self._wait(lambda: self.request("GET", "/")[0] == 200, timeout, lambda: "answer GET /")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; the exit status (None if not running)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        return stop_java(proc, timeout, "the Connect worker")

    def __enter__(self) -> ConnectWorker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- its REST API ----------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """(status, parsed JSON body or None) of a request; (0, None) while nothing listens."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=30) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, _json(err.read())
        except OSError:
            return 0, None

    def create_connector(self, name: str, config: Mapping[str, str]) -> None:
        """POST /connectors; ConnectWorkerError unless Connect answers 201."""
        status, body = self.request("POST", "/connectors", {"name": name, "config": dict(config)})
        if status != 201:
            raise ConnectWorkerError(f"creating connector {name} answered {status}: {body}")

    def wait_running(self, name: str, tasks: int = 1, timeout: float = 120.0) -> dict[str, Any]:
        """Wait until the connector and `tasks` tasks are RUNNING; return its status."""
        path = f"/connectors/{urllib.parse.quote(name, safe='')}/status"
        last: list[Any] = [None]

        def running() -> bool:
            status, body = self.request("GET", path)
            last[0] = body
            return (
                status == 200
                and body["connector"]["state"] == "RUNNING"
                and len(body["tasks"]) == tasks
                and all(t["state"] == "RUNNING" for t in body["tasks"])
            )

        self._wait(running, timeout, lambda: f"run {name} with {tasks} task(s) (last: {last[0]})")
        return dict(last[0])

    def _wait(self, done: Callable[[], bool], timeout: float, what: Callable[[], str]) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if not self.is_running():
                raise ConnectWorkerError(
                    f"the Connect worker exited before it could {what()}; see {self.log_file} "
                    f"and {self.stdout_file}"
                )
            if time.monotonic() > deadline:
                raise ConnectWorkerError(
                    f"the Connect worker did not {what()} within {timeout}s; see {self.log_file}"
                )
            time.sleep(0.2)


def _json(data: bytes) -> Any:
    try:
        return json.loads(data) if data.strip() else None
    except ValueError:
        return data.decode(errors="replace")
