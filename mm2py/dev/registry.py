"""Local schema registries beside the local clusters (dev tooling): Apicurio Registry.

Apicurio Registry 2.6.13.Final (Maven Central, `io.apicurio:apicurio-registry-app`, the
`all` tarball) serves Confluent's Schema Registry API at `/apis/ccompat/v7`, keeps
everything in memory and runs on Java 17 (3.x needs Java 21). Maven fetches the tarball
once into the cache; it is unpacked beside it. Each registry lives in
`<state dir>/registry-<alias>/` (its PID and log); `down` only signals PIDs recorded
there, as the clusters' launcher does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mm2py.cache import cache_root
from mm2py.dev.jars import JarFetchError, extra_jvm_options
from mm2py.dev.launcher import (
    PORT_OFFSET_VARIABLE,
    LocalClusterError,
    _reserve_ports,
    default_state_dir,
)

log = logging.getLogger(__name__)

APICURIO_VERSION = "2.6.13.Final"
APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:tar.gz:all"
RUNNER_JAR = f"apicurio-registry-app-{APICURIO_VERSION}-runner.jar"
CCOMPAT_PATH = "/apis/ccompat/v7"
# Beside each cluster's broker port (A :19092 -> its registry :19081); the same offset
# (MM2PY_LOCAL_PORT_OFFSET) shifts them.
REGISTRY_PORTS = {
    "A": 19081,
    "B": 29081,
    "C": 39081,
    "D": 49081,
    "E": 59081,
    "F": 61081,
    "G": 62081,
}


def registry_port(alias: str) -> int:
    """The local registry's HTTP port for cluster `alias` (with the port offset)."""
    offset = int(os.environ.get(PORT_OFFSET_VARIABLE, "0") or 0)
    return REGISTRY_PORTS[alias] + offset


def apicurio_dir() -> Path:
    """Where the unpacked Apicurio Registry lives."""
    return cache_root() / f"apicurio-registry-{APICURIO_VERSION}"


def fetch_registry() -> Path:
    """Fetch Apicurio Registry with Maven (once) and unpack it; its folder."""
    target = apicurio_dir()
    if (target / ".complete").exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("Maven (mvn) is not on PATH; install it (apt-get install maven)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    log.info("fetching %s from Maven Central into %s", APICURIO_ARTIFACT, target)
    cmd = [
        mvn,
        "-q",
        "-B",
        "dependency:copy",
        f"-Dartifact={APICURIO_ARTIFACT}",
        f"-DoutputDirectory={partial}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise JarFetchError(f"mvn dependency:copy failed:\n{done.stdout}{done.stderr}")
    tarball = next(partial.glob("*.tar.gz"))
    with tarfile.open(tarball) as archive:
        archive.extractall(partial, filter="data")
    tarball.unlink()
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".complete").touch()
    return target


@dataclass(frozen=True)
class LocalRegistry:
    """One local registry as recorded on disk."""

    alias: str
    port: int
    home: Path

    @property
    def url(self) -> str:
        """The URL a Confluent client is given (Confluent's API lives under it)."""
        return f"http://127.0.0.1:{self.port}{CCOMPAT_PATH}"

    @property
    def log_file(self) -> Path:
        return self.home / "registry.log"


class LocalRegistries:
    """Starts, finds and stops the registries kept under one state folder."""

    def __init__(self, state_dir: Path | None = None) -> None:
        self.state_dir = (state_dir or default_state_dir()).resolve()

    def _home(self, alias: str) -> Path:
        return self.state_dir / f"registry-{alias}"

    def registry(self, alias: str) -> LocalRegistry:
        meta = self._home(alias) / "registry.json"
        if not meta.exists():
            raise LocalClusterError(f"no local registry for {alias!r} under {self.state_dir}")
        return LocalRegistry(alias, int(json.loads(meta.read_text())["port"]), self._home(alias))

    def known(self) -> list[LocalRegistry]:
        if not self.state_dir.exists():
            return []
        homes = sorted(self.state_dir.glob("registry-*/registry.json"))
        return [self.registry(p.parent.name.removeprefix("registry-")) for p in homes]

    def pid(self, alias: str) -> int | None:
        """The PID of the running registry we started for `alias`, else None."""
        try:
            pid = int((self._home(alias) / "pid").read_text().strip())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            return None
        # Guard against a recycled PID: it must be our registry for this folder.
        if RUNNER_JAR.encode() not in cmdline or str(self._home(alias)).encode() not in cmdline:
            return None
        return pid

    def up(self, aliases: Iterable[str], timeout: float = 120.0) -> list[LocalRegistry]:
        """Start the registries that do not run yet and wait until all answer."""
        app = fetch_registry()
        aliases = list(aliases)
        # C's port and up lie in Linux's ephemeral range, as the brokers' do (launcher).
        _reserve_ports(*(registry_port(a) for a in aliases if a in REGISTRY_PORTS))
        started: dict[str, subprocess.Popen[bytes]] = {}
        for alias in aliases:
            if alias not in REGISTRY_PORTS:
                raise LocalClusterError(f"unknown local cluster alias {alias!r}")
            if self.pid(alias) is None:
                started[alias] = self._launch(alias, app)
        registries = [self.registry(alias) for alias in aliases]
        deadline = time.monotonic() + timeout
        for registry in registries:
            self._wait_ready(registry, deadline, started.get(registry.alias))
        return registries

    def _launch(self, alias: str, app: Path) -> subprocess.Popen[bytes]:
        home = self._home(alias)
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        registry = LocalRegistry(alias, registry_port(alias), home)
        (home / "registry.json").write_text(json.dumps({"port": registry.port}))
        java = shutil.which("java")
        if java is None:
            raise JarFetchError("java is not on PATH; install a JDK 17 (openjdk-17-jdk)")
        cmd = [
            java,
            "-Xmx384m",
            *extra_jvm_options(),
            f"-Dquarkus.http.port={registry.port}",
            "-Dquarkus.http.host=127.0.0.1",
            # Named so that `pid` recognises this registry's process (and no other).
            f"-Dmm2py.registry.home={home}",
            "-jar",
            str(app / RUNNER_JAR),
        ]
        with open(registry.log_file, "ab") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=home,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        (home / "pid").write_text(str(proc.pid))
        log.info("started the schema registry of %s (pid %d) on %s", alias, proc.pid, registry.url)
        return proc

    def _wait_ready(
        self, registry: LocalRegistry, deadline: float, proc: subprocess.Popen[bytes] | None
    ) -> None:
        while True:
            if proc is not None and proc.poll() is not None:
                raise LocalClusterError(
                    f"the schema registry of {registry.alias} exited during start; "
                    f"see {registry.log_file}"
                )
            if answers(registry.url):
                return
            if time.monotonic() > deadline:
                raise LocalClusterError(
                    f"the schema registry of {registry.alias} did not answer on "
                    f"{registry.url} in time; see {registry.log_file}"
                )
            time.sleep(0.5)

    def down(self, aliases: Iterable[str] | None = None) -> list[str]:
        """Stop the given (default: all recorded) registries and delete their folders."""
        names = list(aliases) if aliases is not None else [r.alias for r in self.known()]
        for alias in names:
            pid = self.pid(alias)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
                deadline = time.monotonic() + 15
                while self.pid(alias) is not None and time.monotonic() < deadline:
                    time.sleep(0.1)
                if self.pid(alias) is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            shutil.rmtree(self._home(alias), ignore_errors=True)
        return names


def answers(url: str) -> bool:
    """Whether a registry answers its subjects list at `url`."""
    try:
        with urllib.request.urlopen(f"{url}/subjects", timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False
