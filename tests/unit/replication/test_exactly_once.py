"""The start-up check of exactly-once: what a refusal says, and what becomes of the flow."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from mm2py.config import ClusterConfig, ConfigError, FlowConfig, MirrorConfig, load_config
from mm2py.replication import exactly_once
from mm2py.replication.exactly_once import (
    Refusal,
    check_transactions,
    refusal,
    settle_exactly_once,
    transactional_id,
)

BASE = (
    "clusters = A, B, C\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
    "C.bootstrap.servers = c:9092\nA->B.enabled = true\nA->C.enabled = true\n"
    "cluster.group.prefix = team1\nB.exactly.once.source.support = enabled\n"
    "C.exactly.once.source.support = enabled\n"
)


def load(tmp_path: Path, text: str) -> MirrorConfig:
    path = tmp_path / "mm2.properties"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


class FakeCheck:
    """check_transactions' stand-in: refuses the targets in `refused`, records its calls."""

    def __init__(self, refused: dict[str, str]) -> None:
        self.refused = refused
        self.calls: list[tuple[str, str, str]] = []

    def __call__(self, flow: FlowConfig, target: ClusterConfig, prefix: str) -> Refusal | None:
        self.calls.append((flow.name, target.alias, prefix))
        reason = self.refused.get(target.alias)
        return None if reason is None else Refusal(reason, certain="no answer" not in reason)


def test_transactional_ids_are_the_group_id_and_the_task() -> None:
    assert transactional_id("mm2py", "A", "B", 0) == "mm2py-A->B-0"
    assert transactional_id("team1", "us-east", "eu", "probe") == "team1-us-east->eu-probe"


def test_refusals_name_the_cluster_and_what_to_grant() -> None:
    props = {"sasl.username": "mirror", "sasl.password": "Never-Shown"}
    denied = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied")
    assert refusal(denied, "B", props, "team1", "team1-A->B-probe").reason == (
        "cluster B refuses the transactional id team1-A->B-probe"
        " (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant User:mirror WRITE and DESCRIBE on"
        " TransactionalId prefix 'team1-' (pattern PREFIXED)"
    )
    idempotence = KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED, "denied")
    assert "grant the principal mm2py logs in as IDEMPOTENT_WRITE on the cluster" in (
        refusal(idempotence, "B", {}, "team1", "x").reason
    )
    no_coordinator = KafkaError(KafkaError._TIMED_OUT, "timed out")
    uncertain = refusal(no_coordinator, "B", props, "team1", "x")
    assert "gave no transaction coordinator within 30 s" in uncertain.reason
    assert not uncertain.certain  # only no answer: a requested flow keeps exactly-once
    other = KafkaError(KafkaError.UNSUPPORTED_VERSION, "too old")
    assert refusal(other, "B", props, "team1", "x") == Refusal(
        "cluster B refuses transactions (UNSUPPORTED_VERSION: too old)", certain=True
    )
    for err in (denied, idempotence, no_coordinator, other):
        assert "Never-Shown" not in refusal(err, "B", props, "team1", "x").reason


def test_every_flow_that_asks_is_checked_with_its_prefix(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(tmp_path, BASE + "A->C.cluster.group.prefix = team2\n")
    check = FakeCheck({})
    with caplog.at_level(logging.INFO, logger=exactly_once.__name__):
        settled = settle_exactly_once(config, config.enabled_flows(), check)
    assert settled is config
    assert sorted(check.calls) == [("A->B", "B", "team1"), ("A->C", "C", "team2")]
    assert sorted(r.getMessage() for r in caplog.records) == [
        "A->B copies exactly-once (exactly.once.support = requested)",
        "A->C copies exactly-once (exactly.once.support = requested)",
    ]


def test_flows_at_least_once_are_not_checked(tmp_path: Path) -> None:
    config = load(tmp_path, BASE.replace("= enabled", "= disabled"))
    check = FakeCheck({})
    assert settle_exactly_once(config, config.enabled_flows(), check) is config
    assert check.calls == []


def test_required_and_refused_stops_the_start_naming_the_key(tmp_path: Path) -> None:
    config = load(tmp_path, BASE + "A->C.exactly.once.support = required\n")
    check = FakeCheck({"C": "cluster C refuses the transactional id x (WHY)"})
    with pytest.raises(ConfigError) as err:
        settle_exactly_once(config, config.enabled_flows(), check)
    assert str(err.value) == (
        f"{tmp_path / 'mm2.properties'}: A->C.exactly.once.support: required, but A->C cannot"
        " copy exactly-once: cluster C refuses the transactional id x (WHY); or set"
        " A->C.exactly.once.support = requested to copy at-least-once"
    )
    assert err.value.exit_status == 2


def test_requested_and_refused_copies_at_least_once_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(tmp_path, BASE + "tasks.max = 3\n")
    check = FakeCheck({"C": "cluster C refuses the transactional id x (WHY)"})
    with caplog.at_level(logging.WARNING):
        settled = settle_exactly_once(config, config.enabled_flows(), check)
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'mm2.properties'}: exactly.once.support: A->C copies at-least-once, not"
        " exactly-once: cluster C refuses the transactional id x (WHY)"
    ]
    modes = {f.name: f.settings.exactly_once for f in settled.enabled_flows()}
    assert modes == {"A->B": "requested", "A->C": "off"}
    after = settled.flow("A", "C").settings
    assert after.tasks_max == 3 and after.model_fields_set == {"tasks_max", "cluster_group_prefix"}
    assert config.flow("A", "C").settings.exactly_once == "requested"  # a new config


def test_requested_keeps_exactly_once_when_the_target_only_gave_no_answer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(tmp_path, BASE)
    check = FakeCheck({"C": "cluster C gave no answer (a coordinator loading)"})
    with caplog.at_level(logging.WARNING):
        settled = settle_exactly_once(config, config.enabled_flows(), check)
    assert settled is config
    assert [r.getMessage() for r in caplog.records] == [
        "A->C copies exactly-once, though cluster C could not be checked: cluster C gave no"
        " answer (a coordinator loading); its tasks retry until it answers"
    ]


def test_a_target_that_does_not_answer_is_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    config = load(tmp_path, BASE)
    monkeypatch.setattr(exactly_once.clients, "describe_cluster", lambda props, timeout: False)
    flow = config.flow("A", "B")
    with caplog.at_level(logging.WARNING):
        assert check_transactions(flow, config.cluster("B"), "team1") is None
    assert [r.getMessage() for r in caplog.records] == [
        "A->B: cannot check now that cluster B accepts transactions (no answer within 5 s);"
        " its tasks will find out"
    ]
