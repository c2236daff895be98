"""The Grafana dashboard's queries against a real Prometheus scraping a replicating daemon.

Prometheus is Debian's `prometheus` package (`make test` installs it), run here as a
plain process with its own config and data folder. Every panel's query, with the
template variables substituted as Grafana does, must return data with a value. The
same Prometheus loads the shipped alert rules (grafana/alerts/) and evaluates them.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import mm2py.runtime.metrics
from mm2py.dev.launcher import LocalCluster
from mm2py.kafka import clients
from tests.daemon_harness import free_port, mm2_properties, running_daemon
from tests.kafka_helpers import create_topic, wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "grafana" / "dashboards" / "mm2py.json"
ALERT_RULES = ROOT / "grafana" / "alerts" / "mm2py-rules.yml"


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of every panel."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def substitute(expr: str, flow: str, topic: str) -> str:
    """The template variables as Grafana fills them in (one value, or `.*` for All)."""
    return expr.replace("$__rate_interval", "15s").replace("$flow", flow).replace("$topic", topic)


@contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail(
            "prometheus is not installed: `make test` installs it (apt-get install prometheus)"
        )
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files:\n  - '{ALERT_RULES}'\n"
        "scrape_configs:\n  - job_name: mm2py\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    address = f"127.0.0.1:{free_port()}"
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'prometheus-data'}",
            f"--web.listen-address={address}",
            "--storage.tsdb.retention.time=1h",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: _get(f"http://{address}/-/ready") is not None, what="Prometheus ready")
        yield f"http://{address}"
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def _get(url: str) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = resp.read()
    except OSError:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body


def query(base: str, expr: str) -> list[dict[str, Any]]:
    answer = _get(f"{base}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")
    assert isinstance(answer, dict) and answer["status"] == "success", (expr, answer)
    return list(answer["data"]["result"])


def answered(base: str, expr: str) -> list[dict[str, Any]] | None:
    """The series of `expr` if at least one has a finite value, else None."""
    series = query(base, expr)
    return series if any(math.isfinite(float(s["value"][1])) for s in series) else None


@contextmanager
def traffic(cluster: LocalCluster, topic: str, group: str) -> Iterator[None]:
    """Bursts of records to `topic`, read by `group` (committing), until the block ends.

    Between bursts the group is caught up and idle, so its checkpoints become exact
    (that is when mm2py_checkpoint_latency_seconds observes).
    """
    stop = threading.Event()

    def run() -> None:
        producer = clients.producer(cluster.client_properties(), {"linger.ms": 5})
        consumer = clients.consumer(
            cluster.client_properties(),
            {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False},
        )
        consumer.subscribe([topic])
        i = 0
        while not stop.is_set():
            for _ in range(40):
                producer.produce(topic, f"v{i}".encode(), f"k{i}".encode(), partition=i % 2)
                i += 1
            producer.flush(10)
            idle_until = time.monotonic() + 2.5
            while time.monotonic() < idle_until and not stop.is_set():
                if consumer.consume(100, 0.2):
                    consumer.commit(asynchronous=False)
        consumer.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def test_every_dashboard_query_returns_data_from_a_real_prometheus(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    queries = panel_queries()
    titles = {title for title, _ in queries}
    assert len(titles) == 10 and len(queries) == 14
    # mm2py_checkpoint_latency_seconds comes with the checkpoint part; skip its panel only
    # if the metric is not defined at all.
    has_checkpoints = (
        "mm2py_checkpoint_latency_seconds" in Path(mm2py.runtime.metrics.__file__).read_text()
    )
    if not has_checkpoints:
        queries = [(t, q) for t, q in queries if "checkpoint_latency" not in q]

    create_topic(cluster_a, unique, partitions=2)
    remote = f"A.{unique}"
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(cluster_a, cluster_b, unique))
    with (
        running_daemon(config) as daemon,
        traffic(cluster_a, unique, f"group-{unique}"),
        prometheus(tmp_path, daemon.listen) as prom,
    ):
        # The template variables' own queries (label_values) list the flow and the topic.
        flows = wait_until(
            lambda: (_get(f"{prom}/api/v1/label/flow/values?match[]=mm2py_flow_info") or {}).get(
                "data"
            ),
            what="flow values",
        )
        assert "A->B" in flows
        wait_until(
            lambda: (
                remote
                in (
                    _get(f"{prom}/api/v1/label/topic/values?match[]=mm2py_records_total") or {}
                ).get("data", [])
            ),
            timeout=60,
            what="topic values",
        )
        assert_rules_loaded(prom)
        for flow, topic in (("A->B", re.escape(remote).replace("\\", "\\\\")), (".*", ".*")):
            for title, expr in queries:
                promql = substitute(expr, flow, topic)
                series = wait_until(
                    lambda promql=promql: answered(prom, promql),
                    timeout=60,
                    what=f"data for panel {title!r}: {promql}",
                )
                if flow == "A->B" and "flow" in series[0]["metric"]:
                    assert {s["metric"]["flow"] for s in series} == {"A->B"}, title
                if topic != ".*" and "topic" in series[0]["metric"]:
                    assert {s["metric"]["topic"] for s in series} == {remote}, title


def assert_rules_loaded(prom: str) -> None:
    """Every shipped alert rule is loaded and has been evaluated without error."""
    shipped = set(re.findall(r"^\s*- alert: (\w+)$", ALERT_RULES.read_text(), re.MULTILINE))
    assert "Mm2pyRecordsSkipped" in shipped

    def evaluated() -> dict[str, dict[str, Any]] | None:
        answer = _get(f"{prom}/api/v1/rules?type=alert")
        if not isinstance(answer, dict) or answer.get("status") != "success":
            return None
        rules = {
            rule["name"]: rule
            for group in answer["data"]["groups"]
            for rule in group["rules"]
            if group["file"] == str(ALERT_RULES)
        }
        done = set(rules) == shipped and all(r["health"] != "unknown" for r in rules.values())
        return rules if done else None

    rules = wait_until(evaluated, timeout=30, what="alert rules loaded and evaluated")
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
