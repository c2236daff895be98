"""The replicators under test (mm2py, MM2, the backfill) as processes, and the copy they
make of a pre-filled topic, timed from B's end offsets with their CPU time over the same
window (`watch_copy`).
"""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from confluent_kafka import KafkaException, TopicPartition

from bench.processes import ProcessCpu
from bench.workload import Workload, cpu_per_million
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients

log = logging.getLogger(__name__)

# How often the copy watcher reads B's end offsets: the resolution of the copy time.
SAMPLE_INTERVAL: Final = 0.05


# A transactional copy is over once its end offsets stood still this long (10 commit
# intervals of mm2py's default).
TRANSACTIONAL_SETTLE_S: Final = 1.0


class ReplicatorError(RuntimeError):
    """A replicator under test exited or did not copy what it should."""


@dataclass(frozen=True)
class Running:
    """A replicator process while it runs."""

    system: str
    pid: int
    is_running: Callable[[], bool]
    log_file: Path


def check_alive(running: Running) -> None:
    """Raise ReplicatorError if `running` has exited."""
    if not running.is_running():
        raise ReplicatorError(f"{running.system} exited early; see {running.log_file}")


@contextmanager
def running_command(
    system: str, cmd: Sequence[str], log_file: Path
) -> Iterator[tuple[Running, subprocess.Popen[bytes]]]:
    """Run `cmd` as `system`, its output in `log_file`; on leaving, stop it if it still runs.

    Stopping is SIGTERM, then a kill if it has not exited 20 s later. A non-zero exit
    code is logged as a warning.
    """
    with open(log_file, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.info("started %s (pid %d), log %s", system, proc.pid, log_file)
    try:
        yield Running(system, proc.pid, lambda: proc.poll() is None, log_file), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM for 20 s; killing it", system, proc.pid)
                proc.kill()
                proc.wait()
        if proc.returncode != 0:
            log.warning("%s exited with %s; see %s", system, proc.returncode, log_file)


@dataclass(frozen=True)
class Copy:
    """How a system copied a pre-filled topic, as seen from B's end offsets."""

    startup_s: float  # launch -> first copied record visible on B
    copy_s: float  # first sample with records on B -> sample with all of them
    copied_in_window: int  # records that arrived during copy_s
    cpu_s: float | None = None  # user+sys CPU-seconds of the replicator during copy_s
    end_offsets: int = 0  # sum of the remote topic's end offsets at the end (markers too)

    @property
    def cpu_s_per_m_records(self) -> float | None:
        """CPU-seconds per million records copied in the window."""
        return cpu_per_million(self.cpu_s, self.copied_in_window)


def _remote_count(consumer: Any, topic: str, partitions: int) -> int:
    """Records in `topic` on B now (0 while it or a partition leader does not exist yet)."""
    total = 0
    for p in range(partitions):
        try:
            total += consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=5)[1]
        except KafkaException:
            return 0  # not created yet
    return total


def watch_copy(
    target: LocalCluster,
    remote_topic: str,
    workload: Workload,
    running: Running,
    timeout: float,
    isolation: str = "read_committed",
    transactional: bool = False,
) -> Copy:
    """Follow B's end offsets until `remote_topic` holds the whole workload.

    Start-up (JVM, Connect worker, task assignment; Python imports, group join) is
    excluded by timing from the first sample that sees copied records: the rate is
    (records - records seen at that sample) / (time from that sample to the first
    sample seeing all), so its resolution is SAMPLE_INTERVAL plus one offsets query.

    The replicator's CPU time over the same window is the growth of its process
    tree's user+sys time (`ProcessCpu`) between those two samples.

    `isolation` is the isolation.level of the offsets queries. The backfill is watched
    with "read_uncommitted", on high watermarks: its records count when written, not
    when their transaction commits (up to 10 s later), as the daemon's do. Commit
    markers add one offset per transaction (a few per copy).

    `transactional`: the replicator commits transactions often (mm2py exactly-once,
    every 100 ms), so the markers, one offset per partition and commit, count too:
    the end offsets reach the workload's record count before its last records are
    committed. Sampling then goes on until the end offsets have not moved for
    TRANSACTIONAL_SETTLE_S, and the copy ends at the first sample that saw their final
    value (its last commit). Markers below the first sample (a commit or two) are
    counted as records in the window: at most 8 offsets per commit, negligible.
    """
    launched = time.monotonic()
    deadline = launched + timeout
    consumer = clients.consumer(target.client_properties(), {"isolation.level": isolation})
    first: tuple[float, int, float] | None = None
    # The first sample that saw the current count, once it reached the workload's.
    last: tuple[float, int, float] | None = None
    cpu = ProcessCpu(running.pid)
    try:
        while True:
            before = time.monotonic()
            have = _remote_count(consumer, remote_topic, workload.partitions)
            now = (before + time.monotonic()) / 2  # when the queries saw the counts
            cpu_now = cpu.sample()
            if have and first is None:
                first = (now, have, cpu_now)
            if have >= workload.records:
                assert first is not None
                if last is None or have != last[1]:
                    last = (now, have, cpu_now)
                if not transactional or now - last[0] >= TRANSACTIONAL_SETTLE_S:
                    return Copy(
                        first[0] - launched,
                        last[0] - first[0],
                        workload.records - first[1],
                        last[2] - first[2],
                        last[1],
                    )
            check_alive(running)
            if now > deadline:
                raise ReplicatorError(
                    f"{running.system}: {remote_topic} on {target.alias} has {have} of "
                    f"{workload.records} records after {timeout:.0f} s"
                )
            time.sleep(SAMPLE_INTERVAL)
    finally:
        consumer.close()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a daemon's --listen)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
