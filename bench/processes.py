"""CPU time and peak memory of a process and its descendants, from /proc (the tree is
mm2py.dev.processes.process_tree): `ProcessCpu` counts a child that exited up to its
last sample; `PeakRss` samples resident memory until stopped; `JitCpu` is the CPU a
JVM's just-in-time compiler threads have used.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import Final

from mm2py.dev.processes import process_tree

CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")


def _status_kib(pid: int, field: str) -> int | None:
    """A `kB` field of /proc/<pid>/status (VmRSS, VmHWM), or None if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return 0


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return "?"


def _stat_times(path: str) -> tuple[str, float, float] | None:
    """The command name, user and sys CPU-seconds in a /proc `stat` file (of a process or
    a thread), or None if it is gone."""
    try:
        with open(path) as f:
            raw = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # Fields after the command name, which is in parentheses and may hold spaces:
    # state is field 3, utime 14, stime 15.
    name, _, rest = raw.partition("(")[2].rpartition(")")
    fields = rest.split()
    return name, int(fields[11]) / CLOCK_TICKS, int(fields[12]) / CLOCK_TICKS


def _stat_cpu(path: str) -> tuple[str, float] | None:
    """The command name and user+sys CPU-seconds in a /proc `stat` file, or None."""
    times = _stat_times(path)
    return None if times is None else (times[0], times[1] + times[2])


def this_thread_cpu() -> tuple[float, float]:
    """The calling thread's user and sys CPU-seconds so far."""
    times = _stat_times(f"/proc/self/task/{threading.get_native_id()}/stat")
    assert times is not None  # the calling thread exists
    return times[1], times[2]


def process_cpu_seconds(pid: int) -> float | None:
    """User+sys CPU-seconds `pid` used so far, all its threads (None if it is gone).

    Its waited-for children are not included (`ProcessCpu` follows them itself).
    """
    stat = _stat_cpu(f"/proc/{pid}/stat")
    return None if stat is None else stat[1]


# HotSpot names its compiler threads "C1 CompilerThread<n>" and "C2 CompilerThread<n>"
# (a thread's comm holds 15 characters).
_COMPILER_THREAD_PREFIXES: Final = ("C1 CompilerThre", "C2 CompilerThre")


class JitCpu:
    """User+sys CPU time of the JIT compiler threads of every JVM among `roots` and their
    descendants.

    Each `sample()` returns the sum over every compiler thread ever seen, each at its last
    reading: HotSpot ends idle compiler threads (and starts them again), and a thread
    that ended still counts, so the sum never goes down.
    """

    def __init__(self, roots: Sequence[int]) -> None:
        self.roots = list(roots)
        self.seen: dict[tuple[int, str], float] = {}

    def sample(self) -> float:
        for root in self.roots:
            for pid in process_tree(root):
                try:
                    threads = os.listdir(f"/proc/{pid}/task")
                except (FileNotFoundError, ProcessLookupError, PermissionError):
                    continue
                for tid in threads:
                    stat = _stat_cpu(f"/proc/{pid}/task/{tid}/stat")
                    if stat is not None and stat[0].startswith(_COMPILER_THREAD_PREFIXES):
                        self.seen[(pid, tid)] = stat[1]
        return sum(self.seen.values())


class ProcessCpu:
    """User+sys CPU time of a process and its descendants (e.g. task processes).

    Each `sample()` reads /proc/<pid>/stat of every process in the tree and returns
    the sum over every process ever seen, each at its last reading: a child that
    exited still counts, up to the sample before it exited.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: dict[int, float] = {}

    def sample(self) -> float:
        for pid in process_tree(self.pid):
            seconds = process_cpu_seconds(pid)
            if seconds is not None:
                self.seen[pid] = seconds
        return sum(self.seen.values())


class PeakRss:
    """Samples the resident memory of a process and its descendants until stopped.

    ``peak_bytes`` is the larger of the highest sampled sum of VmRSS over the tree
    and the root's VmHWM (the kernel's own high-water mark, which catches peaks
    between samples). ``per_process`` is each process's own peak (its VmHWM), by
    ``<comm>-<pid>``. Use as ``with PeakRss(pid) as rss: ...; rss.peak_bytes``.
    """

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self.peak_kib = 0
        self.per_process_kib: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"peak-rss-{pid}", daemon=True)

    @property
    def peak_bytes(self) -> int:
        return self.peak_kib * 1024

    def per_process_mib(self) -> dict[str, float]:
        """Each process's peak resident memory in MiB (not the launcher a process was
        until it exec'd, seen with nothing resident)."""
        return {name: round(kib / 1024, 1) for name, kib in self.per_process_kib.items() if kib > 0}

    def sample(self) -> None:
        """Take one sample now (also called by the background thread)."""
        total = 0
        for pid in process_tree(self.pid):
            rss = _status_kib(pid, "VmRSS")
            if rss is None:
                continue  # exited meanwhile
            hwm = _status_kib(pid, "VmHWM") or 0
            total += rss
            name = f"{_comm(pid)}-{pid}"
            self.per_process_kib[name] = max(self.per_process_kib.get(name, 0), rss, hwm)
        hwm = _status_kib(self.pid, "VmHWM") or 0
        self.peak_kib = max(self.peak_kib, total, hwm)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> PeakRss:
        self.sample()
        self._thread.start()
        return self

    def stop(self) -> int:
        """Stop sampling (take a last sample if the process still runs); return peak bytes."""
        self.sample()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.peak_bytes

    def __enter__(self) -> PeakRss:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
