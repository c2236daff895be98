"""A preloaded interpreter that starts `mm2py run` nodes by fork, for the tests.

A node started as `python -m mm2py.cli run CONFIG` spends most of its first second
importing (about 0.7 CPU-s: the config models, the daemon, FastAPI); the suite's
parallel step starts about 150 of them. Each pytest worker therefore keeps one
interpreter that has imported what a node imports, and forks a node from it on
request: the node runs the
same entry point (`runpy` runs `mm2py.cli` as `__main__`, as `-m` does, so the task
processes it spawns start from the same main module), with the test's argument list,
environment, working folder and output files, in a session of its own, as
`tests.daemon_harness.running_daemon` used to start it with `subprocess.Popen`.
`MM2PY_TEST_FRESH_INTERPRETERS=1` starts each node in a fresh interpreter instead.

What differs from a fresh interpreter: the modules were imported before the node's
environment was set (mm2py reads its environment when it runs, not at import), and
the node's parent is this interpreter, not the test (`ForkedProcess` relays the exit
status). Nothing else of this process reaches the node: it forks only while it is
the only thread (it checks), the node's descriptors are its own output files and
/dev/null, and Python reseeds `random` in a forked child.

Protocol, over a Unix packet socket (each message arrives whole) that the test's
process binds and passes in: a request is one JSON message (argv, env, cwd) with the
node's stdout and stderr as descriptors; the answer is the node's pid, then, on the same
connection, its exit status (as `subprocess.Popen.returncode` gives it: minus the signal
that killed it) when it ends.
This interpreter ends when its parent closes its stdin.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

FRESH_VARIABLE = "MM2PY_TEST_FRESH_INTERPRETERS"
# What `mm2py run` imports before its first copy (mm2py.cli.run).
PRELOAD = (
    "mm2py.cli",
    "mm2py.logs",
    "mm2py.config",
    "mm2py.cluster.task",
    "mm2py.daemon.supervisor",
    "mm2py.daemon.api",
    "mm2py.replication.exactly_once",
)
MAX_REQUEST = 1 << 20


def fresh_interpreters() -> bool:
    """Whether nodes start in interpreters of their own (MM2PY_TEST_FRESH_INTERPRETERS=1)."""
    return os.environ.get(FRESH_VARIABLE, "") not in ("", "0")


# -- the test's side ----------------------------------------------------------------------


class ForkedProcess:
    """A node forked by the preloaded interpreter, with the part of `subprocess.Popen`'s
    interface the tests use (pid, returncode, poll, wait, send_signal, terminate, kill)."""

    def __init__(self, connection: socket.socket, pid: int, args: list[str]) -> None:
        self._connection = connection
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def _read_status(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        ready, _, _ = select.select([self._connection], [], [], timeout)
        if not ready:
            return
        message = self._connection.recv(64)
        if not message:
            raise RuntimeError(f"the preloaded interpreter went away before node {self.pid} ended")
        self.returncode = int(message)
        self._connection.close()

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_status(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forker:
    """This process's preloaded interpreter, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._path: Path | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    def _started(self) -> Path:
        if self._proc is not None and self._proc.poll() is None and self._path is not None:
            return self._path
        folder = Path(os.environ.get("TMPDIR", "/tmp"))
        path = folder / f"mm2py-preloaded-{os.getpid()}.sock"
        path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(path))
        listener.listen(16)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-u", "-m", "tests.preloaded", str(listener.fileno())],
                stdin=subprocess.PIPE,
                pass_fds=[listener.fileno()],
            )
        finally:
            listener.close()  # the interpreter holds it now
        self._path = path
        return path

    def start(
        self, argv: list[str], env: dict[str, str], stdout: int, stderr: int
    ) -> ForkedProcess:
        """Fork a node running `mm2py <argv>` with `env`, its output on `stdout` and
        `stderr` (descriptors), in a session of its own."""
        with self._lock:
            path = self._started()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        connection.connect(str(path))
        request = json.dumps({"argv": argv, "env": env, "cwd": os.getcwd()}).encode()
        socket.send_fds(connection, [request], [stdout, stderr])
        answer = connection.recv(64)
        if not answer:
            connection.close()
            raise RuntimeError(f"the preloaded interpreter did not start `mm2py {argv}`")
        return ForkedProcess(connection, int(answer), ["mm2py", *argv])

    def close(self) -> None:
        """End the interpreter (nodes it forked run on)."""
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
            self._proc.wait(10)
            self._proc = None
        if self._path is not None:
            self._path.unlink(missing_ok=True)


FORKER = Forker()
atexit.register(FORKER.close)


# -- the preloaded interpreter ------------------------------------------------------------


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    message, fds, _flags, _addr = socket.recv_fds(connection, MAX_REQUEST, 2)
    return json.loads(message), fds


def _become_node(request: dict[str, Any], fds: list[int], keep_closed: list[Any]) -> None:
    """In the forked child: take the node's descriptors, session, folder and
    environment, then run `mm2py` as `python -m mm2py.cli` would. Returns only by
    raising SystemExit, which ends this interpreter as the node's exit."""
    for thing in keep_closed:
        thing.close()
    stdout, stderr = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {devnull, stdout, stderr}:
        os.close(fd)
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["mm2py", *request["argv"]]
    runpy.run_module("mm2py.cli", run_name="__main__", alter_sys=True)
    raise SystemExit(0)


def serve(listener: socket.socket) -> None:
    """Fork nodes on request until stdin closes."""
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _events in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 1024):
                    return
            elif key.data == "request":
                connection, _ = listener.accept()
                request, fds = _receive(connection)
                threads = _threads()
                if threads != 1:
                    connection.close()
                    raise RuntimeError(f"cannot fork safely: {threads} threads")
                pid = os.fork()
                if pid == 0:
                    others = [other for _pid, other in running.values()]
                    pidfds = list(running)
                    selector.close()
                    for pidfd in pidfds:
                        os.close(pidfd)
                    _become_node(request, fds, [listener, connection, *others])
                for fd in fds:
                    os.close(fd)
                connection.send(str(pid).encode())
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, connection)
                selector.register(pidfd, selectors.EVENT_READ, "exit")
            else:
                pidfd = key.fd
                pid, connection = running.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test may no longer ask
                    connection.send(str(os.waitstatus_to_exitcode(status)).encode())
                connection.close()


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
