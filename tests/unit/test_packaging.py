"""Dockerfile, docker-compose.yml and the Grafana files, checked without a Docker engine:
every path they copy or mount exists, and the files they point at fit together."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from mm2py.config import load_config

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(doc, dict)
    return doc


def _dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_every_path_the_dockerfile_copies_exists() -> None:
    instructions = _dockerfile_instructions(ROOT / "Dockerfile")
    copies = [args for word, args in instructions if word in ("COPY", "ADD")]
    assert copies
    for args in copies:
        parts = [p for p in args.split() if not p.startswith("--")]
        for source in parts[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
    words = dict(instructions)
    # The base is an ARG (a stand-in in tests/integration/test_docker.py); its default
    # stays the official image.
    defaults = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)
    base = re.sub(r"\$\{(\w+)\}", lambda m: defaults[m[1]], words["FROM"])
    assert base.startswith("python:3.11-slim")
    runs = [args for word, args in instructions if word == "RUN"]
    assert any("openjdk-17-jre-headless" in args for args in runs)  # a JRE, for Spark
    user = [args for word, args in instructions if word == "USER"]
    assert user and user[-1] not in ("root", "0")
    assert json.loads(words["ENTRYPOINT"]) == ["mm2py"]
    # Inside a container the API must listen beyond loopback.
    assert "0.0.0.0:8083" in words["CMD"]


def test_every_path_docker_compose_builds_or_mounts_exists() -> None:
    services = _compose()["services"]
    assert {"kafka-a", "kafka-b", "mm2py", "prometheus", "grafana"} <= services.keys()
    mounts: dict[str, str] = {}
    for name, service in services.items():
        build = service.get("build")
        if build is not None:
            context = build if isinstance(build, str) else build["context"]
            assert (ROOT / context / "Dockerfile").is_file(), name
        for volume in service.get("volumes", []):
            host, container = volume.split(":")[:2]
            if host.startswith("."):
                assert (ROOT / host).exists(), f"{name} mounts {host}, which does not exist"
                mounts[container] = host
    # What is mounted is what the services read.
    config = load_config(ROOT / mounts["/etc/mm2py/mm2.properties"])
    assert [f.name for f in config.enabled_flows()] == ["A->B"]
    assert {c.bootstrap_servers for c in config.clusters.values()} == {
        "kafka-a:9092",
        "kafka-b:9092",
    }
    assert "/etc/mm2py/mm2.properties" in services["mm2py"]["command"]
    assert "0.0.0.0:8083" in services["mm2py"]["command"]
    prometheus = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]).read_text())
    targets = prometheus["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["mm2py:8083"]
    assert mounts["/etc/grafana/provisioning"] == "./grafana/provisioning"
    assert mounts["/var/lib/grafana/dashboards"] == "./grafana/dashboards"


def test_prometheus_config_is_valid_for_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:  # `make test` installs Debian's prometheus, which brings it
        return
    done = subprocess.run(
        [promtool, "check", "config", str(ROOT / "docker" / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_grafana_provisioning_fits_the_dashboard_and_compose() -> None:
    datasources = yaml.safe_load(
        (ROOT / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"]
    assert datasources[0]["type"] == "prometheus" and datasources[0]["isDefault"] is True
    assert datasources[0]["url"] == "http://prometheus:9090"  # the compose service
    providers = yaml.safe_load((ROOT / "grafana/provisioning/dashboards/mm2py.yml").read_text())[
        "providers"
    ]
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards"

    dashboard = json.loads((ROOT / "grafana/dashboards/mm2py.json").read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["flow"]["query"]["query"] == "label_values(mm2py_flow_info, flow)"
    assert variables["topic"]["query"]["query"] == "label_values(mm2py_records_total, topic)"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            expr = target["expr"]
            assert expr.count("(") == expr.count(")"), expr
            assert "mm2py_" in expr
