"""A Spark standalone cluster on this machine, from the installed PySpark's own launcher.

A master and `workers` workers, each its own JVM, so each executor is a JVM and a Python
of its own, as on a real cluster.

Invariants:
- `start()` returns the master URL once every worker has registered, or raises
  `LocalSparkError` with the log tail of the process that did not come up;
- ports (master 17077, UI 18080, workers' UIs 18081..) move with MM2PY_LOCAL_PORT_OFFSET;
- the master and workers take MM2PY_JVM_OPTIONS (as SPARK_DAEMON_JAVA_OPTS), as every JVM
  the local tooling starts does (mm2py.dev.jars);
- the workers' environment does not lead to mm2py (no PYSPARK_PYTHON, PYTHONPATH,
  VIRTUAL_ENV, nor this virtualenv on the PATH): executors start `python3` unless the
  driver ships a Python;
- `kill_worker(i)` SIGKILLs a worker with its executor and Python workers; `stop()` kills
  what is left and keeps the folder (logs). Design: docs/design/dev-tools.md.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from mm2py.dev.jars import extra_jvm_options
from mm2py.dev.launcher import PORT_OFFSET_VARIABLE
from mm2py.dev.processes import kill_tree, signal_tree
from mm2py.errors import Mm2pyError

MASTER_PORT = 17077
MASTER_UI_PORT = 18080
START_TIMEOUT = 180.0
LOG_TAIL_LINES = 20
# An executor's log line for a task starting or ending (Spark 4.0's Executor).
_TASK_LINE = re.compile(
    r"Executor: (?P<what>Running|Finished|Exception in|Executor killed) task "
    r".*\(TID (?P<tid>\d+)\)"
)


class LocalSparkError(Mm2pyError):
    """The local Spark cluster did not start."""


def _port_offset() -> int:
    return int(os.environ.get(PORT_OFFSET_VARIABLE, "0") or "0")


def spark_home() -> Path:
    try:
        import pyspark
    except ImportError:
        raise LocalSparkError(
            "a local Spark cluster needs pyspark: pip install 'mm2py[spark]'"
        ) from None
    return Path(pyspark.__file__).parent


def worker_environment() -> dict[str, str]:
    """This process's environment without the ways to this virtualenv's Python."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "VIRTUAL_ENV")
    }
    venv_bin = str(Path(sys.prefix) / "bin")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin
    )
    env["SPARK_HOME"] = str(spark_home())
    return env


class LocalSpark:
    """A standalone master and its workers, started and stopped by the caller."""

    def __init__(self, folder: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.folder = folder
        self.workers = workers
        self.cores = cores
        self.memory = memory
        offset = _port_offset()
        self.master_port = MASTER_PORT + offset
        self.ui_port = MASTER_UI_PORT + offset
        self._procs: list[subprocess.Popen[bytes]] = []  # master first, then the workers

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.master_port}"

    def _spawn(self, name: str, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.folder / f"{name}.log"
        env = worker_environment()
        env["SPARK_LOG_DIR"] = str(self.folder / "logs")
        env["SPARK_DAEMON_JAVA_OPTS"] = " ".join(
            shlex.quote(option) for option in extra_jvm_options()
        )
        with log.open("ab") as out:
            return subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.folder,
                start_new_session=True,
            )

    def start(self, timeout: float = START_TIMEOUT) -> str:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._procs.append(
            self._spawn(
                "master",
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.master_port),
                "--webui-port",
                str(self.ui_port),
            )
        )
        for i in range(self.workers):
            work = self.folder / f"worker{i}"
            work.mkdir(exist_ok=True)
            self._procs.append(
                self._spawn(
                    f"worker{i}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.master_url,
                    "--host",
                    "127.0.0.1",
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--webui-port",
                    str(self.ui_port + 1 + i),
                    "--work-dir",
                    str(work),
                )
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, proc in enumerate(self._procs):
                if proc.poll() is not None:
                    self.stop()
                    raise LocalSparkError(self._died(i, proc.returncode))
            if self.alive_workers() >= self.workers:
                return self.master_url
            time.sleep(0.5)
        self.stop()
        raise LocalSparkError(
            f"the local Spark cluster in {self.folder} had {self.alive_workers()} of "
            f"{self.workers} workers after {timeout:.0f} s; see its *.log files"
        )

    def _died(self, i: int, code: int | None) -> str:
        name = "master" if i == 0 else f"worker{i - 1}"
        lines = (self.folder / f"{name}.log").read_text(errors="replace").splitlines()
        tail = "\n".join(lines[-LOG_TAIL_LINES:])
        return f"the Spark {name} in {self.folder} exited ({code}) while starting:\n{tail}"

    def alive_workers(self) -> int:
        """Workers the master counts as alive (0 while it does not answer)."""
        try:
            url = f"http://127.0.0.1:{self.ui_port}/json/"
            with urllib.request.urlopen(url, timeout=2) as answer:
                return int(json.load(answer).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def running_tasks(self, i: int) -> set[str]:
        """The tasks (TIDs) worker i's executors run now, from their logs: started
        ("Running task ... (TID n)") and not yet ended (finished, failed or killed)."""
        running: set[str] = set()
        for log in sorted((self.folder / f"worker{i}").glob("app-*/*/stderr")):
            for line in log.read_text(errors="replace").splitlines():
                found = _TASK_LINE.search(line)
                if found is None:
                    continue
                if found["what"] == "Running":
                    running.add(found["tid"])
                else:
                    running.discard(found["tid"])
        return running

    def worker_pid(self, i: int) -> int:
        return self._procs[1 + i].pid

    def freeze_worker(self, i: int, frozen: bool = True) -> None:
        """SIGSTOP worker i with its executor and Python workers (`frozen`), or SIGCONT
        them: a frozen executor holds whatever it had open, a transaction included."""
        signal_tree(self._procs[1 + i].pid, signal.SIGSTOP if frozen else signal.SIGCONT)

    def kill_worker(self, i: int) -> None:
        """SIGKILL worker i, its executor and the executor's Python workers."""
        proc = self._procs[1 + i]
        kill_tree(proc.pid)
        proc.wait(10)

    def stop(self) -> None:
        for proc in reversed(self._procs):
            kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        self._procs.clear()
