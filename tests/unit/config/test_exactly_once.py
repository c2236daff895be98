"""Exactly-once keys resolved per flow: MM2's keys, MM2's meaning (mm2py.config.exactly_once)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mm2py.config import ConfigError, MirrorConfig, load_config
from mm2py.config.exactly_once import (
    LEVEL_KEY,
    Problem,
    Resolved,
    Setting,
    boundary_interval_ms,
    parse_word,
    resolve,
)
from mm2py.config.models import DEFAULT_TRANSACTION_INTERVAL_MS, DEFAULT_TRANSACTION_TIMEOUT_MS

BASE = (
    "clusters = A, B, C\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
    "C.bootstrap.servers = c:9092\nA->B.enabled = true\n"
)
ENABLED = Setting("enabled", "B.exactly.once.source.support")


def load(tmp_path: Path, text: str, name: str = "mm2.properties") -> MirrorConfig:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return load_config(path)


# --- the pure rules ---


def test_parse_word_is_case_insensitive_and_names_the_allowed_values() -> None:
    assert parse_word("exactly.once.source.support", " Enabled ") == "enabled"
    assert parse_word("transaction.boundary", "POLL") == "poll"
    with pytest.raises(ValueError, match=r"^expected requested or required$"):
        parse_word("exactly.once.support", "yes")
    with pytest.raises(ValueError, match=r"^connector: MM2's connectors define no"):
        parse_word("transaction.boundary", "connector")


def test_resolve_off_unless_the_target_enables_it() -> None:
    for support in (None, Setting("disabled", "x"), Setting("preparing", "x")):
        assert resolve("A->B", "B", support, None, None) == Resolved("off", LEVEL_KEY)
    assert resolve("A->B", "B", ENABLED, None, None) == Resolved("requested", LEVEL_KEY)
    level = Setting("required", "A->B.exactly.once.support")
    assert resolve("A->B", "B", ENABLED, level, Setting("read_committed", "A.isolation.level")) == (
        Resolved("required", "A->B.exactly.once.support")
    )


def test_resolve_required_that_cannot_be_had_is_an_error_naming_the_key() -> None:
    level = Setting("required", "exactly.once.support")
    got = resolve("A->B", "B", None, level, None)
    assert got.mode == "off" and got.warning is None
    assert got.error == Problem(
        "exactly.once.support",
        "required, but exactly-once is not enabled for flows into B"
        " (B.exactly.once.source.support is not set (disabled)); set"
        " B.exactly.once.source.support = enabled, or exactly.once.support = requested to"
        " copy at-least-once",
    )
    uncommitted = Setting("read_uncommitted", "A.consumer.isolation.level")
    got = resolve("A->B", "B", ENABLED, level, uncommitted)
    assert got.error is not None and got.error.key == "A.consumer.isolation.level"


def test_resolve_requested_with_read_uncommitted_warns_and_runs_at_least_once() -> None:
    uncommitted = Setting("read_uncommitted", "A.isolation.level")
    got = resolve("A->B", "B", ENABLED, None, uncommitted)
    assert (got.mode, got.error) == ("off", None)
    assert got.warning is not None and got.warning.key == "A.isolation.level"
    assert "A->B copies at-least-once" in got.warning.message


def test_boundary_poll_commits_after_every_batch() -> None:
    assert boundary_interval_ms(None, 250) == 250
    assert boundary_interval_ms(Setting("interval", "transaction.boundary"), 250) == 250
    assert boundary_interval_ms(Setting("poll", "transaction.boundary"), 250) == 0


# --- through the loader ---


def test_defaults_at_least_once_and_the_default_commit_interval(tmp_path: Path) -> None:
    config = load(tmp_path, BASE)
    for flow in config.flows:
        assert flow.settings.exactly_once == "off"
        assert flow.settings.transaction_boundary_interval_ms == DEFAULT_TRANSACTION_INTERVAL_MS
        assert flow.settings.commit_when_caught_up  # and at least every interval when behind
    assert DEFAULT_TRANSACTION_INTERVAL_MS == 1000


def test_the_most_specific_place_wins(tmp_path: Path) -> None:
    # A->B and B->A replicate; the others resolve all the same (the backfill reads them).
    text = (
        BASE
        + "B->A.enabled = true\n"
        + "exactly.once.source.support = enabled\nC.exactly.once.source.support = disabled\n"
        + "A->B.exactly.once.source.support = preparing\n"
        + "exactly.once.support = required\nB.exactly.once.support = requested\n"
        + "A->B.exactly.once.support = Requested\n"
    )
    config = load(tmp_path, text)
    modes = {f.name: (f.settings.exactly_once, f.settings.exactly_once_key) for f in config.flows}
    assert modes == {
        "A->B": ("off", "A->B.exactly.once.support"),  # its own preparing beats the global
        "A->C": ("off", "exactly.once.support"),  # C's disabled beats the global enabled
        "B->A": ("required", "exactly.once.support"),
        "B->C": ("off", "exactly.once.support"),
        "C->A": ("required", "exactly.once.support"),
        "C->B": ("requested", "B.exactly.once.support"),  # B's level beats the global one
    }


def test_a_flow_that_does_not_replicate_never_fails_the_load(tmp_path: Path) -> None:
    # B->A is not enabled: its target A has no exactly-once, required or not.
    text = BASE + "B.exactly.once.source.support = enabled\nexactly.once.support = required\n"
    config = load(tmp_path, text)
    assert config.flow("A", "B").settings.exactly_once == "required"
    assert config.flow("B", "A").settings.exactly_once == "off"


def test_commit_interval_per_flow_and_poll(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        BASE
        + "A->C.enabled = true\nB.exactly.once.source.support = enabled\n"
        + "C.exactly.once.source.support = enabled\n"
        + "transaction.boundary.interval.ms = 500\nA->C.transaction.boundary = poll\n"
        + "A->B.transaction.boundary = interval\nA->B.transaction.boundary.interval.ms = 20\n"
    )
    with caplog.at_level(logging.WARNING):
        config = load(tmp_path, text)
    assert config.flow("A", "B").settings.transaction_boundary_interval_ms == 20
    assert config.flow("A", "C").settings.transaction_boundary_interval_ms == 0
    assert config.flow("B", "A").settings.transaction_boundary_interval_ms == 500
    # An interval the config sets is when a task commits, as in MM2.
    assert not config.flow("A", "B").settings.commit_when_caught_up
    assert not config.flow("B", "A").settings.commit_when_caught_up
    [line] = [r.getMessage() for r in caplog.records]
    assert line == (
        f"{tmp_path / 'mm2.properties'}: transaction.boundary.interval.ms: ignored:"
        " A->C.transaction.boundary = poll commits a transaction after every batch; set it"
        " to interval to commit every transaction.boundary.interval.ms"
    )


def test_yaml_gives_the_same_modes(tmp_path: Path) -> None:
    text = (
        "clusters:\n  A: {bootstrap.servers: 'a:9092'}\n"
        "  B: {bootstrap.servers: 'b:9092', exactly.once.source.support: enabled}\n"
        "A->B:\n  enabled: true\n  exactly.once.support: required\n"
        "  transaction.boundary: poll\n"
    )
    settings = load(tmp_path, text, "mm2.yaml").flow("A", "B").settings
    assert (settings.exactly_once, settings.exactly_once_key) == (
        "required",
        "A->B.exactly.once.support",
    )
    assert settings.transaction_boundary_interval_ms == 0


def test_resolved_fields_are_not_keys_the_file_set(tmp_path: Path) -> None:
    # The Connect API shows the settings a file set (model_fields_set) under MM2's names.
    config = load(tmp_path, BASE + "B.exactly.once.source.support = enabled\ntasks.max = 2\n")
    settings = config.flow("A", "B").settings
    assert settings.exactly_once == "requested"
    assert settings.model_fields_set == {"tasks_max"}
    assert settings.tasks_max == 2


# --- the transactions' timeout: the target producer's transaction.timeout.ms ---


def test_the_target_producers_transaction_timeout_is_the_flows(tmp_path: Path) -> None:
    # As MM2 gives its tasks' producers B.producer.* (the worker's producer.* settings);
    # the role's key beats the cluster's.
    text = (
        BASE
        + "B->A.enabled = true\nA->C.enabled = true\nexactly.once.source.support = enabled\n"
        + "B.producer.transaction.timeout.ms = 10000\nB.transaction.timeout.ms = 20000\n"
        + "A.transaction.timeout.ms = 30000\n"
    )
    config = load(tmp_path, text)
    timeouts = {f.name: f.settings.transaction_timeout_ms for f in config.flows}
    assert timeouts["A->B"] == 10_000
    assert timeouts["B->A"] == 30_000
    assert timeouts["A->C"] == DEFAULT_TRANSACTION_TIMEOUT_MS
    unset = load(tmp_path, BASE).flow("A", "B").settings
    assert unset.transaction_timeout_ms == DEFAULT_TRANSACTION_TIMEOUT_MS == 60_000


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("ten", "expected a whole number of milliseconds (got 'ten')"),
        ("999", "expected 1000 to 2147483647 ms (got 999)"),
    ],
)
def test_a_bad_transaction_timeout_names_its_key(tmp_path: Path, value: str, why: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, BASE + f"B.producer.transaction.timeout.ms = {value}\n")
    assert "B.producer.transaction.timeout.ms" in str(raised.value)
    assert why in str(raised.value)


def test_an_interval_not_shorter_than_the_timeout_fails_exactly_once_flows(tmp_path: Path) -> None:
    eos = BASE + "B.exactly.once.source.support = enabled\n"
    with pytest.raises(ConfigError) as raised:
        load(
            tmp_path,
            eos + "B.producer.transaction.timeout.ms = 5000\n"
            "A->B.transaction.boundary.interval.ms = 5000\n",
        )
    message = str(raised.value)
    assert "A->B.transaction.boundary.interval.ms" in message
    assert "5000 ms is not shorter than the transactions' timeout" in message
    assert "(B.producer.transaction.timeout.ms = 5000)" in message
    # Connect's 60 s when the timeout is not set.
    with pytest.raises(ConfigError, match=r"transaction\.timeout\.ms 60000, Connect's"):
        load(tmp_path, eos + "transaction.boundary.interval.ms = 60000\n")
    # Shorter is fine; and at-least-once flows open no transaction.
    load(tmp_path, eos + "B.producer.transaction.timeout.ms = 5000\n")
    load(tmp_path, BASE + "B.producer.transaction.timeout.ms = 1000\n")
