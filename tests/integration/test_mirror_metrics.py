"""MM2's metric names (``metrics.mm2.names.enabled``) read by Strimzi's MirrorMaker 2
dashboard, from a real Prometheus scraping a replicating daemon.

The queries are those of the MM2 panels of Strimzi's dashboard
(strimzi/strimzi-kafka-operator,
packaging/examples/metrics/grafana-dashboards/strimzi-kafka-mirror-maker-2.json) with
the Kubernetes label matchers (strimzi_io_kind, strimzi_io_cluster) removed:

- "Total record rate": sum of record_rate
- "Total byte rate": sum of byte_rate
- "Record Age": record_age_ms, _avg, _min, _max by (partition, topic)
- "Replication Latency": replication_latency_ms, _avg, _min, _max by (partition, topic)
- "Offset Synchronization Latency": checkpoint_latency_ms, _avg, _min, _max by
  (source, target)

Not taken: the panels on Kafka Connect's, the Java clients', the JVM's and the
container's metrics (connector and task counts, incoming/outgoing bytes, CPU, JVM
memory, GC, outstanding messages, producer buffer, offset commit time, consumer lag),
which mm2py has not.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.daemon_harness import mm2_properties, running_daemon
from tests.integration.test_grafana import answered, prometheus, traffic
from tests.kafka_helpers import create_topic, wait_until

pytestmark = pytest.mark.integration

_SOURCE = "kafka_connect_mirror_mirrorsourceconnector_"
_CHECKPOINT = "kafka_connect_mirror_mirrorcheckpointconnector_"
STRIMZI_PANELS: dict[str, list[str]] = {
    "Total record rate": [f"sum({_SOURCE}record_rate)"],
    "Total byte rate": [f"sum({_SOURCE}byte_rate)"],
    "Record Age": [
        f"sum({_SOURCE}record_age_ms{suffix}) by (partition, topic)"
        for suffix in ("", "_avg", "_min", "_max")
    ],
    "Replication Latency": [
        f"sum({_SOURCE}replication_latency_ms{suffix}) by (partition, topic)"
        for suffix in ("", "_avg", "_min", "_max")
    ],
    "Offset Synchronization Latency": [
        f"sum({_CHECKPOINT}checkpoint_latency_ms{suffix}) by (source, target)"
        for suffix in ("", "_avg", "_min", "_max")
    ],
}


def test_strimzis_mirror_maker_2_panels_return_data_from_a_real_prometheus(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    remote = f"A.{unique}"
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(cluster_a, cluster_b, unique, **{"metrics.mm2.names.enabled": "true"})
    )

    def answer(expr: str) -> list[dict[str, Any]] | None:
        """The series of `expr` once each has a finite value, those by partition for both
        partitions of the remote topic. By partition, only the remote topic's are asked
        to be finite: a partition that copied nothing for a minute (A.heartbeats, made on
        A by an earlier test) shows NaN for its min/max/avg, as MM2's does."""
        series = answered(prom, expr)
        if series is None:
            return None
        if "by (partition, topic)" in expr:
            series = [s for s in series if s["metric"]["topic"] == remote]
        if not all(math.isfinite(float(s["value"][1])) for s in series):
            return None
        if "by (partition, topic)" in expr:
            mine = {s["metric"]["partition"] for s in series}
            if mine != {"0", "1"}:
                return None
        if "rate" in expr and not float(series[0]["value"][1]) > 0:
            return None  # the series is there from the assignment, the records come next
        return series

    with (
        running_daemon(config) as daemon,
        traffic(cluster_a, unique, f"group-{unique}"),
        prometheus(tmp_path, daemon.listen) as prom,
    ):
        for title, queries in STRIMZI_PANELS.items():
            for expr in queries:
                series = wait_until(
                    lambda expr=expr: answer(expr),
                    timeout=60,
                    what=f"data for Strimzi's panel {title!r}: {expr}",
                )
                if "by (source, target)" in expr:
                    assert {(s["metric"]["source"], s["metric"]["target"]) for s in series} == {
                        ("A", "B")
                    }, (title, expr, series)
        counted = wait_until(
            lambda: answered(prom, f'sum({_SOURCE}record_count{{topic="{remote}"}})'),
            what="record_count",
        )
        assert float(counted[0]["value"][1]) > 0
        # mm2py's own metrics are still there beside them.
        assert "mm2py_records_total" in daemon.metrics()
