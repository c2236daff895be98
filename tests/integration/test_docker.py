"""The Docker image, built and run for real against the local clusters.

A Docker engine that already answers (DOCKER_HOST or the default socket) is used;
otherwise, as root, the test starts Debian's `dockerd` (docker.io, which `make test`
installs) with the vfs storage driver and no bridge or iptables, its images kept in
MM2PY_DOCKER_ROOT (default /var/cache/mm2py-test-docker, suffixed with
MM2PY_LOCAL_PORT_OFFSET when set), and stops it at the end.
Containers run on the host's network. Without an engine the test skips, saying why.

No image registry is reachable here, so the official base image is replaced by a
stand-in (docker/standin-base.sh: debootstrap of bookworm from this machine's Debian
mirror, Python 3.11 at /usr/local, this machine's CA bundle trusted), imported with
`docker import` and tagged with a hash of what makes it: built once (~2 min), then
found. The project's Dockerfile is built on it (`--build-arg BASE=...`; BuildKit caches
the JRE layer, so a code change rebuilds in ~30 s) and run: it replicates with the
mounted config, runs as a non-root user, answers /health, its HEALTHCHECK turns healthy
with another --listen (a wildcard address, as the CMD's) and with the config's MM2
`listeners` instead, and SIGTERM stops it cleanly within 10 s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.conftest import SESSION_OFFSET_VARIABLE
from tests.daemon_harness import free_port, mm2_properties
from tests.kafka_helpers import RECENT_MS, create_topic, produce, read_all, wait_until

# A first run builds the base image and the JRE layer (~4 min on a busy 2-core machine),
# beyond the suite's 300 s per test.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
STANDIN_SCRIPT = ROOT / "docker" / "standin-base.sh"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_MIRROR = "http://deb.debian.org/debian"
IMAGE = "mm2py-test:latest"
STOP_WITHIN = 10.0


@dataclass
class Engine:
    """The docker client, pointed at a running engine."""

    client: str
    env: dict[str, str]

    def run(
        self, *args: str, timeout: float = 120, stdin: Any = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [self.client, *args],
            env=self.env,
            stdin=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"docker {' '.join(args)}: {done.stderr.strip()[-2000:]}")
        return done

    def answers(self) -> bool:
        try:
            return self.run("info", timeout=20, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False


def _client() -> str | None:
    """The client of the dockerd package (Debian's has BuildKit built in), else any."""
    dockerd = shutil.which("dockerd")
    if dockerd is not None:
        sbin = Path(dockerd).parent
        for beside in (sbin / "docker", sbin.parent / "bin" / "docker"):
            if beside.is_file():
                return str(beside)
    return shutil.which("docker")


@pytest.fixture(scope="module")
def engine() -> Iterator[Engine]:
    client = _client()
    if client is None:
        pytest.skip("no docker client: `make test` installs Debian's docker.io")
    running = Engine(client, dict(os.environ))
    if running.answers():
        yield running
        return
    dockerd = shutil.which("dockerd")
    if dockerd is None:
        pytest.skip("no Docker engine runs and dockerd is not installed (Debian's docker.io)")
    if os.geteuid() != 0:
        pytest.skip("no Docker engine runs and starting dockerd needs root")
    data_root = Path(os.environ.get("MM2PY_DOCKER_ROOT") or default_data_root())
    data_root.mkdir(parents=True, exist_ok=True)
    # A short path: containerd's sockets live under the exec root.
    run_dir = Path(tempfile.mkdtemp(prefix="mm2py-docker-", dir="/tmp"))
    socket = run_dir / "docker.sock"
    log_path = run_dir / "dockerd.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [
                dockerd,
                "--storage-driver",
                "vfs",
                "--iptables=false",
                "--bridge=none",
                "--data-root",
                str(data_root),
                "--exec-root",
                str(run_dir / "exec"),
                "--pidfile",
                str(run_dir / "dockerd.pid"),
                "-H",
                f"unix://{socket}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    started = Engine(client, dict(os.environ, DOCKER_HOST=f"unix://{socket}"))
    try:
        deadline = time.monotonic() + 60
        while not (socket.exists() and started.answers()):
            if proc.poll() is not None or time.monotonic() > deadline:
                last = log_path.read_text(errors="replace").strip().splitlines()[-1:]
                pytest.skip(f"dockerd did not start: {last[0] if last else 'no output'}")
            time.sleep(0.5)
        yield started
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        _unmount_under(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def _unmount_under(folder: Path) -> None:
    """Unmount what dockerd left mounted under `folder` (its default network namespace)."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    points = [line.split()[1] for line in mounts if len(line.split()) > 1]
    for point in sorted((p for p in points if p.startswith(f"{folder}/")), reverse=True):
        subprocess.run(["umount", point], capture_output=True, timeout=30, check=False)


def default_data_root() -> str:
    """Where a started engine keeps its images (the cached base). One engine per folder:
    a test session with its own port offset (MM2PY_LOCAL_PORT_OFFSET) gets its own; the
    workers of one session share it (one module uses it), so the base image a machine
    built once is found whichever worker runs this module."""
    offset = os.environ.get(SESSION_OFFSET_VARIABLE, "").strip()
    return "/var/cache/mm2py-test-docker" + (f"-{offset}" if offset not in ("", "0") else "")


def debian_mirror() -> str:
    """The Debian mirror apt uses here (one-line or deb822 sources), else deb.debian.org."""
    sources = Path("/etc/apt/sources.list")
    if sources.is_file():
        for line in sources.read_text().splitlines():
            found = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", line + " ")
            if found:
                return found[1]
    for path in sorted(Path("/etc/apt/sources.list.d").glob("*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = dict(
                re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE),
            )
            if "bookworm" in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
    return DEFAULT_MIRROR


def standin_base(engine: Engine) -> str:
    """The stand-in base image's tag, built and imported unless already there."""
    mirror = debian_mirror()
    digest = hashlib.sha256()
    for part in (STANDIN_SCRIPT.read_bytes(), mirror.encode(), CA_BUNDLE.read_bytes()):
        digest.update(hashlib.sha256(part).digest())
    tag = f"mm2py-standin-base:{digest.hexdigest()[:16]}"
    if engine.run("image", "inspect", tag, check=False).returncode == 0:
        return tag
    if shutil.which("debootstrap") is None:
        pytest.skip("debootstrap is not installed (`make test` installs it)")
    with tempfile.TemporaryDirectory(prefix="mm2py-standin-", dir="/var/tmp") as tmp:
        rootfs = Path(tmp) / "rootfs"
        done = subprocess.run(
            [str(STANDIN_SCRIPT), str(rootfs), mirror, str(CA_BUNDLE)],
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, f"{STANDIN_SCRIPT} failed:\n{done.stdout[-3000:]}"
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        try:
            engine.run(
                "import",
                "--change",
                "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--change",
                "ENV LANG=C.UTF-8",
                "--change",
                'CMD ["python3"]',
                "-",
                tag,
                stdin=tar.stdout,
                timeout=600,
            )
        finally:
            tar.wait(60)
    return tag


@pytest.fixture(scope="module")
def image(engine: Engine) -> str:
    base = standin_base(engine)
    build = ("build", "--network", "host", "--build-arg", f"BASE={base}", "--tag", IMAGE)
    engine.env["DOCKER_BUILDKIT"] = "1"
    started = time.monotonic()
    done = engine.run(*build, str(ROOT), timeout=900, check=False)
    if done.returncode != 0 and "buildx" in done.stderr:
        # A client whose BuildKit is a plugin it lacks: the classic builder (slower
        # with vfs, one full copy of the image per step).
        engine.env["DOCKER_BUILDKIT"] = "0"
        done = engine.run(*build, str(ROOT), timeout=900, check=False)
    assert done.returncode == 0, f"docker build failed:\n{done.stderr[-3000:]}"
    # With vfs every layer is a full copy of the image's files: the builds of earlier runs
    # (their image untagged now, their layers in the build cache) are removed, so that the
    # data root holds the base image, the JRE layer (used by this build, so kept) and this
    # build, however many runs a machine makes. Without it the CI machine's roots grew by
    # about 0.6 GB a run, to 20 GB.
    engine.run("image", "prune", "--force")
    unused_for = f"until={int(time.monotonic() - started) + 60}s"
    engine.run("builder", "prune", "--all", "--force", "--filter", unused_for)
    return IMAGE


@contextmanager
def containers(engine: Engine, *runs: tuple[Path, Sequence[str]]) -> Iterator[list[str]]:
    """`docker run` of the image for each (config, arguments), on the host's network with
    the config mounted where the image reads it; removed together at the end (with vfs
    each holds a full copy of the image), their logs shown when the test fails."""
    names: list[str] = []
    try:
        for config, args in runs:
            name = f"mm2py-test-{os.getpid()}-{free_port()}"
            engine.run(
                "run",
                "--detach",
                "--name",
                name,
                "--network",
                "host",
                "--volume",
                f"{config}:/etc/mm2py/mm2.properties:ro",
                IMAGE,
                *args,
            )
            names.append(name)
        yield names
    except BaseException:
        for name in names:
            logs = engine.run("logs", "--tail", "80", name, check=False)
            print(f"--- docker logs {name}\n{logs.stdout}{logs.stderr}", flush=True)
        raise
    finally:
        if names:
            engine.run("rm", "--force", *names, check=False, timeout=300)


def inspect(engine: Engine, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = json.loads(engine.run("inspect", name).stdout)
    return found[0]


def health(listen: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{listen}/health", timeout=5) as resp:
            return int(resp.status)
    except OSError:
        return None


def healthy(engine: Engine, name: str) -> dict[str, Any] | None:
    """The container's health once Docker's HEALTHCHECK found it healthy."""
    state = inspect(engine, name)["State"]
    assert state["Running"], state
    found: dict[str, Any] = state.get("Health") or {}
    return found if found.get("Status") == "healthy" else None


def _run_args(listen: str) -> Sequence[str]:
    return ("run", "/etc/mm2py/mm2.properties", "--listen", listen)


def test_the_image_replicates_as_non_root_is_healthy_and_stops_on_sigterm(
    engine: Engine,
    image: str,
    cluster_a: LocalCluster,
    cluster_b: LocalCluster,
    unique: str,
    tmp_path: Path,
) -> None:
    config = inspect(engine, image)["Config"]
    # The image's own command: the mounted config, listening beyond loopback.
    assert config["Cmd"] == list(_run_args("0.0.0.0:8083"))
    assert config["Entrypoint"] == ["mm2py"] and config["User"] == "mm2py"
    assert config["Healthcheck"]["Test"][0] == "CMD"

    create_topic(cluster_a, unique, partitions=2)
    records = [(i % 2, f"k{i}".encode(), f"v{i}".encode(), [], RECENT_MS + i) for i in range(200)]
    produce(cluster_a, unique, records)
    replicating = tmp_path / "mm2.properties"
    replicating.write_text(mm2_properties(cluster_a, cluster_b, unique))
    # A second daemon, with a flow of its own (no topic) and no --listen: MM2's
    # `listeners` in its config. The host's network: each takes a free port (a fixed
    # one, as the CMD's 8083, could be someone else's); the first listens on every
    # interface as the CMD does.
    wildcard, listeners = free_port(), free_port()
    configured = tmp_path / "listeners.properties"
    configured.write_text(
        mm2_properties(
            cluster_a, cluster_b, f"{unique}-none", listeners=f"http://127.0.0.1:{listeners}"
        )
    )
    with containers(
        engine,
        (replicating, _run_args(f"0.0.0.0:{wildcard}")),
        (configured, ("run", "/etc/mm2py/mm2.properties")),
    ) as (main, by_config):
        copied = read_all(cluster_b, f"A.{unique}", expected=len(records), timeout=90)
        assert sorted((r.partition, r.key, r.value) for r in copied) == sorted(
            (p, k, v) for p, k, v, _h, _t in records
        )
        # The daemon (PID 1, the entry point) runs as the image's user, not root.
        status = engine.run("exec", main, "cat", "/proc/1/status").stdout
        uid = re.search(r"^Uid:\s+(\d+)", status, re.MULTILINE)
        assert uid is not None and uid[1] == "10001", status
        # /health, and Docker's HEALTHCHECK (first run 15 s after the start) asking each
        # daemon where it listens (a wildcard address on loopback).
        for name, port in ((main, wildcard), (by_config, listeners)):
            assert wait_until(lambda port=port: health(f"127.0.0.1:{port}") == 200, what="/health")
            state = wait_until(
                lambda name=name: healthy(engine, name), timeout=60, what=f"{name} healthy"
            )
            assert f"http://127.0.0.1:{port}/health: ok" in state["Log"][-1]["Output"], state
        # SIGTERM: a clean stop, within 10 s.
        started = time.monotonic()
        engine.run("kill", "--signal", "TERM", main)
        code = engine.run("wait", main, timeout=STOP_WITHIN + 5).stdout.strip()
        took = time.monotonic() - started
        assert code == "0" and took < STOP_WITHIN, (code, took)
        assert not inspect(engine, main)["State"]["OOMKilled"]
