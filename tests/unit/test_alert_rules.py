"""The shipped Prometheus alert rules (grafana/alerts/mm2py-rules.yml) under
`promtool test rules`, with the cases in tests/unit/alerts/mm2py-rules.test.yml.

promtool comes with Debian's `prometheus` package, which `make unit` and `make test`
install. Every alert must have a case in which it fires: a rule whose expression never
fires makes promtool fail, so a broken rule cannot pass unnoticed.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "grafana" / "alerts" / "mm2py-rules.yml"
CASES = ROOT / "tests" / "unit" / "alerts" / "mm2py-rules.test.yml"
NEVER = "vector(0) > 1"


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail(
            "promtool is not installed: `make unit` or `make test` installs it "
            "(apt-get install prometheus)"
        )
    return binary


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


def alerts(rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]


def test_rules_are_valid_and_pass_their_promtool_tests() -> None:
    checked = run("check", "rules", str(RULES), cwd=ROOT)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = run("test", "rules", CASES.name, cwd=CASES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_and_a_rule_that_never_fires_fails_its_test(
    tmp_path: Path,
) -> None:
    rules = yaml.safe_load(RULES.read_text())
    names = [rule["alert"] for rule in alerts(rules)]
    assert set(names) >= {
        "Mm2pyReplicationLatencyHigh",
        "Mm2pyLagGrowing",
        "Mm2pyRecordsSkipped",
        "Mm2pyHeartbeatStale",
        "Mm2pyPartFailing",
        "Mm2pyClusterUnreachable",
    }
    cases = yaml.safe_load(CASES.read_text())
    tested = {
        case["alertname"] for test in cases["tests"] for case in test.get("alert_rule_test", [])
    }
    assert tested == set(names)

    # The same layout under tmp_path, so that the cases' relative rule_files path holds.
    broken_rules = tmp_path / RULES.relative_to(ROOT)
    broken_cases = tmp_path / CASES.relative_to(ROOT)
    broken_rules.parent.mkdir(parents=True)
    broken_cases.parent.mkdir(parents=True)
    broken_cases.write_text(CASES.read_text())
    for name in names:
        broken = yaml.safe_load(RULES.read_text())
        for rule in alerts(broken):
            if rule["alert"] == name:
                rule["expr"] = NEVER
        broken_rules.write_text(yaml.safe_dump(broken))
        result = run("test", "rules", broken_cases.name, cwd=broken_cases.parent)
        assert result.returncode != 0, f"{name} never firing went unnoticed"
        assert f"alertname: {name}," in result.stdout + result.stderr, name
