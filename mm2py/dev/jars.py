"""Apache Kafka jars from Maven Central, fetched once with Maven and cached.

The same classpath runs local brokers, the real MirrorMaker 2 (for compatibility
tests and benchmarks) and Kafka's perf tools, with a class-data archive of the jars
once `mm2py local fetch` has built it (mm2py.dev.class_archive).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from mm2py.cache import cache_root
from mm2py.errors import Mm2pyError

log = logging.getLogger(__name__)

POM = Path(__file__).with_name("pom.xml")
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")


class JarFetchError(Mm2pyError):
    """Maven could not provide the Kafka jars."""


def jar_dir(pom: Path = POM) -> Path:
    """The cache folder for a pom (a changed pom gets a new folder)."""
    digest = hashlib.sha256(pom.read_bytes()).hexdigest()[:12]
    return cache_root() / f"jars-{digest}"


def fetch_jars(pom: Path = POM) -> Path:
    """Download the pom's dependencies (default: the Kafka jars) into the cache once."""
    target = jar_dir(pom)
    marker = target / ".complete"
    if marker.exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("Maven (mvn) is not on PATH; install it (apt-get install maven)")
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    log.info("fetching the jars of %s from Maven Central into %s", pom.name, target)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(pom),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={partial}",
        "-DincludeScope=runtime",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise JarFetchError(f"mvn dependency:copy-dependencies failed:\n{done.stdout}{done.stderr}")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    marker.touch()
    return target


def classpath() -> str:
    """A java -cp argument covering every cached jar."""
    return str(fetch_jars() / "*")


# The JVM options Kafka's own scripts give every tool and the broker
# (kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS). Without them Java 17 runs G1 with
# its 200 ms pause goal rather than Kafka's 20 ms: a broker then stops every client for
# longer than Kafka's own start script would let it.
KAFKA_JVM_OPTIONS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
)


# Options added to every JVM the local tooling starts (brokers, MirrorMaker 2, Connect,
# the perf tools, the schema registries, Spark's master and workers), after Kafka's.
# Unset, the JVMs run as Kafka's scripts run them. The tests set it (tests/conftest.py).
JVM_OPTIONS_VARIABLE = "MM2PY_JVM_OPTIONS"


def extra_jvm_options() -> list[str]:
    """The options of `MM2PY_JVM_OPTIONS`, split as a shell would."""
    return shlex.split(os.environ.get(JVM_OPTIONS_VARIABLE, ""))


def class_archive() -> Path:
    """Where the class-data archive of the cached jars for this machine's java lives
    (mm2py.dev.class_archive builds it; the JVM checks that it matches its own build
    and the classpath, and without a match loads the classes as it would without it)."""
    java = shutil.which("java")
    digest = hashlib.sha256(str(Path(java).resolve() if java else "").encode()).hexdigest()[:12]
    return jar_dir() / f"classes-{digest}.jsa"


def java_command(
    main_class: str,
    *args: str,
    heap: str = "512m",
    initial_heap: str | None = None,
    logs_dir: Path | None = None,
    gc_log: bool = False,
    options: Sequence[str] = (),
    args_file: Path | None = None,
) -> list[str]:
    """The command line that runs `main_class` from the cached jars, with a heap of at
    most `heap` (committed at start: `initial_heap`), Kafka's JVM options, the jars'
    class-data archive when it is built, `MM2PY_JVM_OPTIONS`, then `options`.

    log4j writes to `<logs_dir>/server.log` (default: the cache's logs folder); with
    `gc_log`, the JVM logs its collections to `<logs_dir>/gc.log`, as kafka-server-start
    does (one line a pause, with its length).

    With `args_file`, `main_class` and `args` are written to that file (readable by its
    owner only) and the command line names the file instead, as `@<file>`, which the
    java launcher expands: for arguments that hold secrets, which the process list
    would otherwise show to every user of the machine. The caller removes the file.
    """
    logs = logs_dir or cache_root() / "logs"
    java = shutil.which("java")
    if java is None:
        raise JarFetchError(
            "java is not on PATH; install a JDK 17 (apt-get install openjdk-17-jdk)"
        )
    gc = [f"-Xlog:gc:file={logs / 'gc.log'}:time,uptime:filecount=2,filesize=20M"] if gc_log else []
    archive = class_archive()
    shared = [f"-XX:SharedArchiveFile={archive}"] if archive.exists() else []
    launch = [main_class, *args]
    if args_file is not None:
        launch = [f"@{_write_args_file(args_file, launch)}"]
    return [
        java,
        f"-Xmx{heap}",
        *([f"-Xms{initial_heap}"] if initial_heap else []),
        *KAFKA_JVM_OPTIONS,
        *shared,
        *gc,
        *extra_jvm_options(),
        *options,
        f"-Dkafka.logs.dir={logs}",
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
        "-cp",
        classpath(),
        *launch,
    ]


def _write_args_file(path: Path, args: Sequence[str]) -> Path:
    """Write `args` as a java launcher argument file, one quoted argument a line."""
    if any(c in arg for arg in args for c in '"\\\n\r'):
        # Not shown: the argument may be the secret the file is for.
        raise ValueError(f"an argument for {path} holds a quote, backslash or line break")
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("".join(f'"{arg}"\n' for arg in args))
    return path


def spawn_java(
    main_class: str, *args: str, heap: str, logs_dir: Path, stdout_file: Path
) -> subprocess.Popen[bytes]:
    """Start `main_class` in a session of its own (so `stop_java` signals the whole group),
    log4j writing under `logs_dir`, stdout and stderr appended to `stdout_file`."""
    cmd = java_command(main_class, *args, heap=heap, logs_dir=logs_dir)
    with open(stdout_file, "ab") as out:
        return subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def stop_java(proc: subprocess.Popen[bytes], timeout: float, what: str) -> int:
    """SIGTERM the process group, SIGKILL after `timeout` s; its exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) ignored SIGTERM for %ss; killing it", what, proc.pid, timeout)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode
