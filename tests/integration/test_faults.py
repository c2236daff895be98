"""Issue 12's fault scenario, in the suite: a live producer into 8 partitions of A, three
`mm2py run` nodes copying A->B, four kill -9 of nodes, a kill -9 of B's broker, a 12 s
SIGSTOP of A's broker and a zombie node, 2-4 s apart (the scenario's SUITE shape; `python
-m bench.faults` runs issue 12's, with ten kills and a 20 s stop; tests/faults_scenario.py
has the details and the counting). A read_committed read of the remote topic must then
have:

- exactly-once (`B.exactly.once.source.support = enabled`): every record exactly once,
  in order per partition, in the default mode (batch pass-through in mm2py's own
  transactions) and with the record copier forced (`replication.copy.mode = record`);
- at-least-once (the key absent): no record lost (repeats allowed, and counted), in the
  default mode (batch pass-through) and with the record copier forced
  (`replication.copy.mode = record`);

and no node may have crashed (died of a signal the scenario did not send; such a node
is restarted so that the counts are still found, and named in the report).

The faults' order and moments come from a fixed seed (MM2PY_FAULTS_SEED overrides it),
printed with the outcome.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import Clusters
from tests.faults_scenario import SEED, SUITE, Mode, Outcome, run_scenario

# The clusters' fixtures start A and B for the session if they do not run yet.
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("cluster_a", "cluster_b")]


def _seed() -> int:
    return int(os.environ.get("MM2PY_FAULTS_SEED", SEED))


def _run(
    clusters: Clusters, tmp_path: Path, unique: str, mode: Mode, copy_mode: str | None = None
) -> Outcome:
    outcome = run_scenario(
        clusters.kafka, tmp_path, unique, mode, _seed(), print, SUITE, copy_mode=copy_mode
    )
    print(outcome.report())
    assert outcome.per_partition, outcome.report()
    return outcome


@pytest.mark.timeout(480)
@pytest.mark.parametrize(
    "copy_mode",
    [
        # The default mode, batch pass-through (mm2py.config.copy_mode): the broker faults
        # and the zombie are what its raw clients must survive.
        pytest.param(None, id="default"),
        # The record copier, which flows that need per-record work get.
        pytest.param("record", id="record"),
    ],
)
def test_at_least_once_loses_nothing_under_kills_broker_loss_and_a_zombie(
    clusters: Clusters, tmp_path: Path, unique: str, copy_mode: str | None
) -> None:
    outcome = _run(clusters, tmp_path, unique, "at-least-once", copy_mode)
    for p, counts in outcome.per_partition.items():
        assert counts.lost == 0 and counts.foreign == 0, (
            f"partition {p}: {counts}\n{outcome.report()}"
        )
    assert not outcome.crashes, outcome.report()


@pytest.mark.timeout(480)
@pytest.mark.parametrize(
    "copy_mode",
    [
        # The default mode, batch pass-through in mm2py's own transactions
        # (mm2py.kafka.raw_transactions).
        pytest.param(None, id="default"),
        # The record copier, in librdkafka's transactions.
        pytest.param("record", id="record"),
    ],
)
def test_exactly_once_copies_every_record_once_in_order_under_kills_broker_loss_and_a_zombie(
    clusters: Clusters, tmp_path: Path, unique: str, copy_mode: str | None
) -> None:
    outcome = _run(clusters, tmp_path, unique, "exactly-once", copy_mode)
    for p, counts in outcome.per_partition.items():
        assert counts.exact, f"partition {p}: {counts}\n{outcome.report()}"
    assert not outcome.crashes, outcome.report()
