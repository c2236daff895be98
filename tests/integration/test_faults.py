"""Issue 12's fault scenario, in the suite: a live producer into 8 partitions of A, three
`mm2py run` nodes copying A->B, four kill -9 of nodes, a kill -9 of B's broker, a 12 s
SIGSTOP of A's broker and a zombie node, 2-4 s apart (the scenario's SUITE shape; `python
-m bench.faults` runs issue 12's, with ten kills and a 20 s stop; tests/faults_scenario.py
has the details and the counting).

Each run tests both copiers under the same faults: the default mode (batch pass-through)
on flow A->B, and the record copier (`replication.copy.mode = record`, which flows that
need per-record work get) on flow A1->B, A1 being another alias of cluster A copying a
topic of its own, on the same three nodes. A read_committed read of each remote topic
must then have:

- exactly-once (`B.exactly.once.source.support = enabled`): every record exactly once,
  in order per partition (batch pass-through in mm2py's own transactions, the record
  copier in librdkafka's);
- at-least-once (the key absent): no record lost (repeats allowed, and counted);

and no node may have crashed (died of a signal the scenario did not send; such a node
is restarted so that the counts are still found, and named in the report).

One run with both copiers rather than one each: the scenario is mostly waiting its faults
define (a session to expire, B's broker to be let back), which the two flows now share;
four runs took 315-394 s of one pytest worker (docs/tests.md).

The faults' order and moments come from a fixed seed (MM2PY_FAULTS_SEED overrides it),
printed with the outcome.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Clusters
from tests.faults_scenario import SEED, SUITE, Mode, Outcome, report, run_scenario

# The clusters' fixtures start A and B for the session if they do not run yet.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("cluster_a", "cluster_b")]


def _seed() -> int:
    return int(os.environ.get("MM2PY_FAULTS_SEED", SEED))


# The default mode (batch pass-through, mm2py.config.copy_mode: the broker faults and the
# zombie are what its raw clients must survive), then the record copier.
COPY_MODES = (None, "record")


def _run(clusters: Clusters, tmp_path: Path, unique: str, mode: Mode) -> list[Outcome]:
    outcomes = run_scenario(
        clusters.kafka, tmp_path, unique, mode, _seed(), print, SUITE, copy_modes=COPY_MODES
    )
    print(report(outcomes))
    assert all(o.per_partition for o in outcomes), report(outcomes)
    return outcomes


@pytest.mark.timeout(480)
def test_at_least_once_loses_nothing_under_kills_broker_loss_and_a_zombie(
    clusters: Clusters, tmp_path: Path, unique: str
) -> None:
    outcomes = _run(clusters, tmp_path, unique, "at-least-once")
    for outcome in outcomes:
        for p, counts in outcome.per_partition.items():
            assert counts.lost == 0 and counts.foreign == 0, (
                f"{outcome.copy.describe()} partition {p}: {counts}\n{report(outcomes)}"
            )
    assert not outcomes[0].crashes, report(outcomes)


@pytest.mark.timeout(480)
def test_exactly_once_copies_every_record_once_in_order_under_kills_broker_loss_and_a_zombie(
    clusters: Clusters, tmp_path: Path, unique: str
) -> None:
    outcomes = _run(clusters, tmp_path, unique, "exactly-once")
    for outcome in outcomes:
        for p, counts in outcome.per_partition.items():
            assert counts.exact, (
                f"{outcome.copy.describe()} partition {p}: {counts}\n{report(outcomes)}"
            )
    assert not outcomes[0].crashes, report(outcomes)
