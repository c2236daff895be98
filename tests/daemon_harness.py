"""Run `mm2py run` as a real process against the local clusters, for integration tests.

Each node is a process of its own, forked from this worker's preloaded interpreter
(tests/preloaded.py: the same entry point, without a second of imports per node), or
started as `python -m mm2py.cli run` when MM2PY_TEST_FRESH_INTERPRETERS=1."""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mm2py.dev import mirrormaker
from mm2py.dev.launcher import LocalCluster
from tests.kafka_helpers import wait_until
from tests.preloaded import FORKER, ForkedProcess, fresh_interpreters


def mm2_properties(source: LocalCluster, target: LocalCluster, topics: str, **extra: str) -> str:
    """An MM2 properties file replicating `topics` from `source` to `target`.

    The same file real MM2 runs (see mm2py.dev.mirrormaker.mm2_properties).
    """
    props = mirrormaker.mm2_properties(
        source.alias,
        source.bootstrap_servers,
        target.alias,
        target.bootstrap_servers,
        topics,
        **extra,
    )
    # Each file is a cluster of its own: other tests' daemons (a module's shared one, say)
    # may run the same flow beside it and must not take its tasks. Nodes started on the
    # same file share this group.
    props.setdefault("cluster.group.prefix", f"mm2py-test-{uuid.uuid4().hex[:12]}")
    return mirrormaker.render_properties(props)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RunningDaemon:
    proc: subprocess.Popen[bytes] | ForkedProcess
    log_path: Path
    listen: str

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self, gzipped: bool = False) -> str:
        """GET /metrics as text; `gzipped` asks for gzip, as Prometheus does, and checks
        that it came so."""
        request = urllib.request.Request(f"http://{self.listen}/metrics")
        if gzipped:
            request.add_header("Accept-Encoding", "gzip")
        with urllib.request.urlopen(request, timeout=5) as resp:
            body = resp.read()
            if gzipped:
                assert resp.headers["Content-Encoding"] == "gzip"
                body = gzip.decompress(body)
            return str(body.decode())

    def status(self, flow: str) -> str:
        """GET /flows/{flow}/status, as text."""
        url = f"http://{self.listen}/flows/{urllib.parse.quote(flow)}/status"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())

    def status_json(self, flow: str) -> dict[str, Any]:
        """GET /flows/{flow}/status, parsed."""
        parsed: dict[str, Any] = json.loads(self.status(flow))
        return parsed

    def task_pids(self) -> set[int]:
        """The pids of the daemon's task processes, as its status names them (a spare
        process waiting for a task is not one)."""
        with urllib.request.urlopen(f"http://{self.listen}/flows", timeout=5) as resp:
            flows = json.loads(resp.read())
        return {
            part["pid"]
            for flow in flows
            for part in self.status_json(flow)["parts"]
            if part.get("task") is not None and part.get("pid")
        }

    @contextmanager
    def reported(self) -> Iterator[None]:
        """Print `report()` if the block raises (pytest shows it under "Captured stdout"
        of the failed test), then let the error go on."""
        try:
            yield
        except BaseException:
            print(self.report(), flush=True)
            raise

    def report(self) -> str:
        """Each flow's status from the REST API, then the log's tail (for failed tests)."""
        lines = [f"--- mm2py daemon on {self.listen}, log {self.log_path}"]
        try:
            with urllib.request.urlopen(f"http://{self.listen}/flows", timeout=5) as resp:
                flows = json.loads(resp.read())
            lines += [self.status(flow) for flow in flows]
        except (OSError, ValueError) as exc:
            lines.append(f"(no status: {exc})")
        lines += self.log().splitlines()[-60:]
        return "\n".join(lines)

    def serving(self) -> bool:
        """Whether the REST API answers (GET / is 200)."""
        try:
            with urllib.request.urlopen(f"http://{self.listen}/", timeout=10) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def wait_serving(self, timeout: float = 60.0) -> None:
        """Wait until the REST API answers; the process must not exit meanwhile."""

        def answering() -> bool:
            assert self.proc.poll() is None, f"the daemon exited\n{self.report()}"
            return self.serving()

        wait_until(answering, timeout=timeout, interval=0.1, what=f"the REST API on {self.listen}")

    def stop(
        self, sig: int = signal.SIGTERM, timeout: float = 15.0, group: bool = False
    ) -> tuple[int, float]:
        """Signal the daemon (with `group`, every process of its process group, as a
        Ctrl-C in its terminal or systemd's stop does); return its exit status and how
        long it took to exit."""
        ended = self.proc.poll()
        if ended is not None:
            return ended, 0.0
        started = time.monotonic()
        if group:
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        return code, time.monotonic() - started


@contextmanager
def running_daemon(
    config_path: Path, *args: str, global_args: Sequence[str] = ()
) -> Iterator[RunningDaemon]:
    """`mm2py [GLOBAL_ARGS] run CONFIG` in the background; killed at the end if still running."""
    listen = f"127.0.0.1:{free_port()}"
    log_path = config_path.with_suffix(f".{listen.rsplit(':', 1)[1]}.log")
    argv = [*global_args, "run", str(config_path), "--listen", listen, *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc: subprocess.Popen[bytes] | ForkedProcess
    with open(log_path, "wb") as out:
        if fresh_interpreters():
            proc = subprocess.Popen(
                [sys.executable, "-m", "mm2py.cli", *argv],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its process group is its own (`stop(group=True)`)
            )
        else:  # in a session of its own too
            proc = FORKER.start(argv, env, out.fileno(), out.fileno())
    daemon = RunningDaemon(proc, log_path, listen)
    try:
        with daemon.reported():  # what the daemon saw, when the test fails
            yield daemon
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
