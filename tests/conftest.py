"""Session-wide real Kafka clusters, started through `mm2py local`'s launcher.

Clusters A, B and C are plain; D and E are secured (SASL_PLAINTEXT,
SCRAM-SHA-512, StandardAuthorizer); G is plain with short KIP-848 group sessions
(`SHORT_CONSUMER_SESSIONS`). All run Kafka's default broker settings otherwise. A
cluster starts the first time a test asks for it. A and B, which nearly every module
uses, stay up until the session's end; any other cluster the session started is stopped
at the end of the module that asked for it (an idle broker costs about 3% of a core, and
a module that needs it again starts it again, in about 3 s); clusters that were already
running (e.g. `make demo`) are left alone. When a
test failed, the stopped clusters' logs are kept (the path is printed at the end).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from mm2py.dev.jars import JVM_OPTIONS_VARIABLE
from mm2py.dev.launcher import PORT_OFFSET_VARIABLE, LocalCluster, LocalKafka, default_state_dir
from mm2py.dev.registry import LocalRegistries, LocalRegistry

SECURED = {"D", "E"}
# Brokers as Kafka ships them, but for G: its KIP-848 groups have a 10 s session (Kafka's
# default, and minimum, is 45 s). Only for the test of a dead node's failover under the
# `consumer` protocol (test_cluster), which on default brokers waits out the 45 s.
SHORT_CONSUMER_SESSIONS = {
    "group.consumer.min.session.timeout.ms": "6000",
    "group.consumer.session.timeout.ms": "10000",
    "group.consumer.min.heartbeat.interval.ms": "1000",
    "group.consumer.heartbeat.interval.ms": "2000",
}
TUNED = {"G": SHORT_CONSUMER_SESSIONS}


# Under pytest-xdist (`make test` runs three), each worker has clusters of its own:
# worker N's ports moved up by (N + 1) x WORKER_PORT_STEP, clear of clusters already
# running on the default ports (`make demo`'s), and a state folder of its own.
WORKER_PORT_STEP = 100
SESSION_OFFSET_VARIABLE = "MM2PY_TEST_SESSION_PORT_OFFSET"

# The tests' JVMs (brokers, MM2, Connect, registries, Spark's daemons) compile with the
# JIT's first tier only. The suite was bound by the CPU, and a broker's second-tier
# compiles cost it more than they return in runs this short: a broker's start, a 62,000
# record workload and 20 s idle took 6.8-6.9 CPU-s this way against 10.9-13.4 with
# both tiers (2026-11-28, docs/tests.md). The tier changes how fast the JVM runs Kafka's
# code, not what it does: no broker setting changes. Set MM2PY_JVM_OPTIONS to override.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault(JVM_OPTIONS_VARIABLE, TEST_JVM_OPTIONS)
    # The session's own port offset, before a worker's is added: what the session keeps
    # on this machine between runs (the Docker test's engine and its cached base image)
    # is the session's, whichever worker runs the module that uses it.
    os.environ.setdefault(SESSION_OFFSET_VARIABLE, os.environ.get(PORT_OFFSET_VARIABLE, "0"))
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ...; unset without xdist
    if worker:
        number = int(worker.removeprefix("gw"))
        base = int(os.environ.get(PORT_OFFSET_VARIABLE, "0"))
        os.environ[PORT_OFFSET_VARIABLE] = str(base + (number + 1) * WORKER_PORT_STEP)
        os.environ["MM2PY_TEST_CLUSTERS"] = f"{clusters_state_dir()}-{worker}"
    if "SPARK_CONF_DIR" not in os.environ:
        os.environ["SPARK_CONF_DIR"] = str(spark_defaults(clusters_state_dir() / "spark-conf"))


def spark_defaults(folder: Path) -> Path:
    """A Spark configuration folder whose spark-defaults.conf gives the Spark applications
    the tests start the tests' JVM options, as the brokers and Spark's master and workers
    have them: `mm2py backfill`'s driver JVM, local[*] or submitted (and executors, through
    `spark.executor.defaultJavaOptions`). The `defaultJavaOptions` come before the
    application's own extraJavaOptions (its log4j file), which they leave alone. A local[*]
    backfill of two tests used 17.6 CPU-s of the machine with the first JIT tier only
    against 24.2 without (2026-12-04, `/proc/stat`, two runs each)."""
    folder.mkdir(parents=True, exist_ok=True)
    options = os.environ[JVM_OPTIONS_VARIABLE]
    (folder / "spark-defaults.conf").write_text(
        f"spark.driver.defaultJavaOptions {options}\nspark.executor.defaultJavaOptions {options}\n"
    )
    return folder


# The modules that take minutes (`--durations=0` of a fresh-clone run with three workers,
# 2026-12-04), longest first. Under xdist every worker orders its collection so, and `make
# test`'s `--no-loadscope-reorder` has the scheduler hand modules out in that order (by
# default it hands out the modules with the most tests first): the long ones start first,
# and no worker is left running one of them at the end while the others idle. The Docker
# test goes before modules it usually outlasts: a machine's first run builds its base
# image (3 min).
LONGEST_MODULES = (
    "test_faults.py",
    "test_mm2_handover.py",
    "test_exactly_once.py",
    "test_cluster.py",
    "test_failover_command.py",
    "test_backfill.py",
    "test_backfill_cluster.py",
    "test_docker.py",
    "test_checkpoints.py",
    "test_failover.py",
    "test_source.py",
    "test_api.py",
    "test_secured.py",
    "test_schema_registry.py",
    "test_batch_copy.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # one process: the order the suite has always run in

    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONGEST_MODULES.index(name) if name in LONGEST_MODULES else len(LONGEST_MODULES)

    items.sort(key=rank)  # stable: the order within a module and among the rest is kept


# The clusters that stay up for the whole session: nearly every module uses them.
SESSION_LONG = {"A", "B"}


class Clusters:
    """Lazily started local clusters, by alias."""

    def __init__(self, kafka: LocalKafka) -> None:
        self.kafka = kafka
        self.started: list[str] = []

    def down(self, aliases: list[str], failed: bool) -> None:
        """Stop `aliases` (which this session started) and delete their data; after a
        failed test their brokers' logs are kept."""
        keep = kept_logs_dir() if failed else None
        self.kafka.down(aliases, keep_logs_in=keep)
        self.started = [alias for alias in self.started if alias not in aliases]
        if keep is not None and keep.exists():
            KEPT.append(keep)

    def __getitem__(self, alias: str) -> LocalCluster:
        # A and B, which nearly every module uses, start together: their JVMs start side
        # by side rather than one after the other.
        aliases = sorted(SESSION_LONG) if alias in SESSION_LONG else [alias]
        self.started += [a for a in aliases if not self.kafka.is_running(a)]
        secure = [a for a in aliases if a in SECURED]
        tuned = {a: TUNED[a] for a in aliases if a in TUNED} or None
        return self.kafka.up(aliases, secure=secure, broker_settings=tuned)[aliases.index(alias)]

    def restart(self, alias: str) -> None:
        """Stop and start one broker on its data (a brief outage)."""
        self.kafka.stop(alias)
        self.kafka.start(alias)


def clusters_state_dir() -> Path:
    """Where the tests' clusters are recorded (the launcher's default folder)."""
    return Path(os.environ.get("MM2PY_TEST_CLUSTERS", default_state_dir()))


def kept_logs_dir() -> Path:
    """Where a failed session keeps its brokers' logs."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return clusters_state_dir().parent / "kept-broker-logs" / f"{stamp}-{os.getpid()}"


KEPT: list[Path] = []


SESSION_CLUSTERS: list[Clusters] = []  # the session's handle, once a test asked for one


@pytest.fixture(scope="session")
def clusters(request: pytest.FixtureRequest) -> Iterator[Clusters]:
    handle = Clusters(LocalKafka(clusters_state_dir()))
    SESSION_CLUSTERS.append(handle)
    try:
        yield handle
    finally:
        SESSION_CLUSTERS.remove(handle)
        handle.down(list(handle.started), failed=bool(request.session.testsfailed))


@pytest.fixture(scope="module", autouse=True)
def _module_clusters_down(request: pytest.FixtureRequest) -> Iterator[None]:
    """At a module's end, the clusters it started beyond A and B go down. Set up before
    the module's own fixtures, so it runs after their teardown (the module's daemons have
    stopped)."""
    yield
    for handle in SESSION_CLUSTERS:
        extra = [alias for alias in handle.started if alias not in SESSION_LONG]
        if extra:
            handle.down(extra, failed=bool(request.session.testsfailed))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for path in KEPT:
        terminalreporter.write_line(f"the brokers' logs of this failed run are kept in {path}")


class Registries:
    """Lazily started local schema registries (Apicurio), one per cluster alias."""

    def __init__(self, registries: LocalRegistries) -> None:
        self.registries = registries
        self.started: list[str] = []

    def __getitem__(self, alias: str) -> LocalRegistry:
        return self.up(alias)[0]

    def up(self, *aliases: str) -> list[LocalRegistry]:
        """The registries of `aliases`, those not running started together (their JVMs
        start side by side rather than one after the other)."""
        self.started += [a for a in aliases if self.registries.pid(a) is None]
        return self.registries.up(aliases)


@pytest.fixture(scope="module")
def registries() -> Iterator[Registries]:
    """Schema registries beside the clusters, started through `mm2py local`'s tooling;
    those the module started are stopped at its end (one module uses them)."""
    handle = Registries(LocalRegistries(clusters_state_dir()))
    try:
        yield handle
    finally:
        handle.registries.down(handle.started)


@pytest.fixture
def cluster_a(clusters: Clusters) -> LocalCluster:
    return clusters["A"]


@pytest.fixture
def cluster_b(clusters: Clusters) -> LocalCluster:
    return clusters["B"]


@pytest.fixture
def secured_cluster(clusters: Clusters) -> LocalCluster:
    return clusters["D"]


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> str:
    """A name no other test (or earlier run) uses, for topics and groups."""
    base = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:40]
    return f"{base}-{uuid.uuid4().hex[:8]}"
