"""Fault benchmark: what a read_committed reader of the remote topic gets after issue 12's
faults, in at-least-once and in exactly-once mode.

    .venv/bin/python -m bench.faults                       # both modes (~5 min)
    .venv/bin/python -m bench.faults --modes exactly-once --seed 7

The scenario is the fault test's (tests/faults_scenario.py): a live idempotent producer
writes 400 numbered records/s into 8 partitions of A while three `mm2py run` nodes copy
A->B (tasks.max 4); meanwhile ten kill -9 of nodes (each restarted), one kill -9 of B's
broker (restarted on its data), a 20 s SIGSTOP of A's broker and a zombie node (SIGSTOP
past its group session, then SIGCONT), in an order and at moments drawn from the seed.
Then the producer stops, the copy catches up, and the remote topic is read from the
beginning with isolation.level=read_committed: records lost, duplicated and out of
order (first copied after a later record), summed over the partitions, the seconds
the scenario took, and how many nodes crashed (died of a signal not sent by the
scenario; restarted, and named in the JSON line). Exactly-once promises every record once, in order;
at-least-once promises none lost.

Clusters as bench.replication: fresh A and B when their ports are free, otherwise the
running ones, which must be `mm2py local` clusters of MM2PY_LOCAL_DIR (B's broker is
killed and A's stopped). Prints one JSON line per mode on stdout, then a table with the
load averages; the timeline of each run goes to stderr.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bench.replication import bench_clusters
from bench.report import emit, load_averages, logs_dir
from bench.topics import delete_topics
from mm2py.dev.launcher import LocalKafka
from tests.faults_scenario import MODES, SEED, Mode, Outcome, ScenarioError, run_scenario

PROMISE = {"at-least-once": "0 lost", "exactly-once": "every record once, in order"}


def kept(outcome: Outcome) -> bool:
    """Whether the mode kept its promise (pure)."""
    total = outcome.total
    if outcome.mode == "exactly-once":
        return total.exact
    return total.lost == 0 and total.foreign == 0


def line(outcome: Outcome, load_before: list[float]) -> dict[str, Any]:
    """The JSON line of one run (pure)."""
    total = outcome.total
    return {
        "measure": "faults",
        "mode": outcome.mode,
        "seed": outcome.seed,
        "produced": total.produced,
        "copied": total.copied,
        "lost": total.lost,
        "duplicated": total.duplicated,
        "out_of_order": total.out_of_order,
        "foreign": total.foreign,
        # Records A lost or holds twice though its producer had them acknowledged: the
        # counts above are against what A holds (tests/faults_scenario.py).
        "source_faults": outcome.source_faults,
        "caught_up": outcome.caught_up,
        "node_crashes": outcome.crashes,
        "seconds": round(outcome.seconds, 1),
        "promise": PROMISE[outcome.mode],
        "kept": kept(outcome),
        "load_avg_before": load_before,
        "load_avg_after": load_averages(),
    }


def table(lines: Sequence[dict[str, Any]]) -> str:
    """The runs as a Markdown table (pure)."""
    rows = [
        "| mode | records produced | lost | duplicated | out of order | seconds "
        "| promise kept | node crashes | load 1m before / after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for ln in lines:
        if "error" in ln:
            rows.append(f"| {ln['mode']} | error: {ln['error'].splitlines()[0]} ||||||||")
            continue
        dup = ln["duplicated"]
        share = f" ({dup / ln['produced']:.1%})" if ln["produced"] else ""
        rows.append(
            f"| {ln['mode']} | {ln['produced']:,} | {ln['lost']} | {dup}{share} "
            f"| {ln['out_of_order']} | {ln['seconds']} "
            f"| {'yes' if ln['kept'] else 'NO'} ({ln['promise']}) | {len(ln['node_crashes'])} "
            f"| {ln['load_avg_before'][0]} / {ln['load_avg_after'][0]} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.faults", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--seed", type=int, default=SEED, help="the faults' order and moments")
    args = parser.parse_args(argv)
    run_dir = logs_dir() / f"faults-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"logs and configs of this run: {run_dir}", file=sys.stderr)
    clusters, started = bench_clusters()
    kafka = started or LocalKafka()
    load_start = load_averages()
    lines: list[dict[str, Any]] = []
    mode: Mode
    try:
        for mode in args.modes:
            topic = f"bench-faults-{mode}-{uuid.uuid4().hex[:8]}"
            print(f"--- {mode}, seed {args.seed}, topic {topic}", file=sys.stderr)
            load_before = load_averages()
            try:
                [outcome] = run_scenario(
                    kafka,
                    run_dir,
                    topic,
                    mode,
                    args.seed,
                    log=lambda text: print(text, file=sys.stderr, flush=True),
                )
            except ScenarioError as error:
                result: dict[str, Any] = {"measure": "faults", "mode": mode, "error": str(error)}
            else:
                print(outcome.report(), file=sys.stderr)
                result = line(outcome, load_before)
            finally:
                delete_topics(clusters["A"], [topic])
                delete_topics(clusters["B"], [f"A.{topic}"])
            lines.append(result)
            emit(result)
    finally:
        if started is not None:
            started.down(["A", "B"])
    load_end = load_averages()
    print(
        f"\n{table(lines)}\n\nseed {args.seed}; load averages: start {load_start}, "
        f"end {load_end}; {os.cpu_count()} cores"
    )
    failed = any("error" in ln or not ln["kept"] or ln["node_crashes"] for ln in lines)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
