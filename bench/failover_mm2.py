"""Failover with the real MirrorMaker 2's offset translation, case by case, next to mm2py.

    .venv/bin/python bench/failover_mm2.py                       # both systems, every case
    .venv/bin/python bench/failover_mm2.py --systems mirrormaker2 --cases head idle

Runs the scenarios of tests/integration/test_failover.py (the same code): numbered
records on A, a consumer group reads part of them there and commits, fails over to B
with `mm2py translate-offsets --apply` (which reads only the checkpoints on B, so it
works the same on what MM2 wrote) and reads the rest on B. Prints, per system and
case, how many records the group read twice (duplicates) and never (gaps).

MM2 is given every chance: the failover waits until its checkpoints reach the
group's committed offsets (up to --checkpoint-timeout seconds) before applying
them. When they never do, the group on B has no committed offset for the partition
and starts from the beginning (auto.offset.reset=earliest), which is what a consumer
failing over with MM2's checkpoints gets. Uses the running local clusters A and B
(`mm2py local up`). Nothing is asserted: it reports.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python bench/failover_mm2.py` puts bench/ on sys.path, not the repository root.
if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import contextlib
import json
import logging
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict
from functools import partial
from typing import Any

from mm2py.dev.launcher import LocalCluster, LocalKafka, default_state_dir
from mm2py.dev.mirrormaker import RealMirrorMaker
from tests.integration import test_failover as scenario
from tests.integration.test_failover import Outcome, Replicator

log = logging.getLogger("bench.failover_mm2")

SYSTEMS = ("mirrormaker2", "mm2py")
CASES = ("head", "far-behind", "idle", "transactional", "compacted", "restart")


def _starter(system: str, config: Path, work: Path) -> Callable[[], AbstractContextManager[Any]]:
    """A factory of running replicators for `config` (one at a time)."""
    if system == "mm2py":
        return lambda: scenario.mm2py_daemon(config)

    @contextmanager
    def mirrormaker() -> Iterator[RealMirrorMaker]:
        with RealMirrorMaker(config, work / f"mm2-{uuid.uuid4().hex[:6]}") as mm2:
            yield mm2

    return mirrormaker


def run_system(
    system: str, cases: list[str], a: LocalCluster, b: LocalCluster, work: Path, timeout: float
) -> list[Outcome]:
    exact = system == "mm2py"
    outcomes: list[Outcome] = []

    def replicator(tag: str) -> tuple[Replicator, Callable[[], AbstractContextManager[Any]]]:
        prefix = f"fo-{system[:5]}-{tag}-{uuid.uuid4().hex[:6]}"
        config = scenario.run_config(work, a, b, prefix)
        r = Replicator(a, b, config, prefix, exact=exact, checkpoint_timeout=timeout)
        return r, _starter(system, config, work)

    shared = [c for c in cases if c in ("head", "far-behind", "idle", "transactional")]
    if shared:
        r, start = replicator("shared")
        with start():
            for case in shared:
                outcomes.append(_timed(system, case, partial(_SHARED[case], r)))
    if "compacted" in cases:
        r, start = replicator("c")
        scenario.compact_on_a(a, r.names("compacted")[0])
        with start():
            outcomes.append(_timed(system, "compacted", lambda: scenario.case_compacted(r)))
    if "restart" in cases:
        r, start = replicator("r")
        outcomes.append(_timed(system, "restart", lambda: scenario.case_restart(r, start)))
    return outcomes


_SHARED: dict[str, Callable[[Replicator], Outcome]] = {
    "head": scenario.case_head,
    "far-behind": scenario.case_far_behind,
    "idle": scenario.case_idle,
    "transactional": scenario.case_transactional,
}


def _timed(system: str, case: str, run: Callable[[], Outcome]) -> Outcome:
    started = time.monotonic()
    log.info("%s: %s ...", system, case)
    out = run()
    log.info("%s: %s done in %.0fs", system, case, time.monotonic() - started)
    print(f"{system:<13} {out.line()}", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--checkpoint-timeout", type=float, default=45.0)
    parser.add_argument("--json", action="store_true", help="also print one JSON line per case")
    parser.add_argument(
        "--work-dir", type=Path, default=None, help="keep configs and MM2 logs here"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    logging.getLogger("mm2py").setLevel(logging.ERROR)
    kafka = LocalKafka(default_state_dir())
    a, b = kafka.up(["A"])[0], kafka.up(["B"])[0]
    results: list[tuple[str, Outcome]] = []
    with contextlib.ExitStack() as stack:
        work = args.work_dir or Path(
            stack.enter_context(tempfile.TemporaryDirectory(prefix="failover-bench-"))
        )
        work.mkdir(parents=True, exist_ok=True)
        for system in args.systems:
            for out in run_system(system, args.cases, a, b, work, args.checkpoint_timeout):
                results.append((system, out))
    print("\nsystem        case           duplicates  gaps  checkpoint at the group's offset")
    for system, out in results:
        print(
            f"{system:<13} {out.case:<14} {out.duplicates:>10}  {out.gaps:>4}  "
            f"{'yes' if out.translated else 'no'}"
        )
        if args.json:
            print(json.dumps({"system": system, **asdict(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
