"""Every key mm2py accepts is honoured or said once to be ignored; exactly-once as MM2's.

One log line per key and load, naming the file and every place the key is set, never
a value; exactly-once runs where the target enables it, a flow that settles for
at-least-once says why once, and a config that requires what it cannot have fails to
load (ConfigError) and says nothing else.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mm2py.compat.filters import TopicFilter
from mm2py.config import ConfigError, MirrorConfig, load_config

BASE = "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
YAML = "clusters:\n  A: {bootstrap.servers: 'a:9092'}\n  B: {bootstrap.servers: 'b:9092'}\n"


def load(tmp_path: Path, text: str, name: str = "mm2.properties") -> tuple[Path, MirrorConfig]:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path, load_config(path)


def lines(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


# --- keys mm2py does not act on: said once per load ---


def test_tasks_max_is_honoured_and_not_warned(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = BASE + "tasks.max = 7\nA->B.tasks.max = 3\n"
    with caplog.at_level(logging.INFO):
        _, config = load(tmp_path, text)
    assert caplog.records == []
    assert config.flow("A", "B").settings.tasks_max == 3
    assert config.flow("B", "A").settings.tasks_max == 7


def test_offset_lag_max_is_warned_once_as_not_needed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        path, _ = load(tmp_path, BASE + "offset.lag.max = 4321\nA->B.offset.lag.max = 0\n")
    [line] = lines(caplog)
    assert line.startswith(f"{path}: offset.lag.max, A->B.offset.lag.max: not needed: ")
    assert "translation is exact" in line
    assert "4321" not in caplog.text


def test_each_load_says_it_again(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        load(tmp_path, BASE + "offset.lag.max = 1\n")
        load(tmp_path, BASE + "offset.lag.max = 1\n")
    assert len(lines(caplog)) == 2


def test_yaml_says_the_same(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = YAML + "offset.lag.max: 2\nA->B:\n  tasks.max: 3\n  offset.lag.max: 5\n"
    with caplog.at_level(logging.WARNING):
        path, _ = load(tmp_path, text, "mm2.yaml")
    assert [line.split(": ")[:2] for line in lines(caplog)] == [
        [str(path), "offset.lag.max, A->B.offset.lag.max"],
    ]


def test_mm2s_own_topic_keys_are_noted_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Files shared with MM2 need them (configs/mm2.properties): no warning, one note each.
    text = BASE + "config.storage.replication.factor = 1\nB.status.storage.replication.factor = 1\n"
    with caplog.at_level(logging.INFO):
        path, _ = load(tmp_path, text)
    assert lines(caplog) == []
    assert lines(caplog, logging.INFO) == [
        f"{path}: config.storage.replication.factor: ignored: mm2py has no Connect config"
        " topic (MM2's)",
        f"{path}: B.status.storage.replication.factor: ignored: mm2py has no Connect status"
        " topic (MM2's)",
    ]


def test_connect_worker_keys_mm2_uses_are_noted_at_info_not_guessed_at(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # MM2's worker takes them at the top or under the target's prefix; before, they were
    # an "unknown key" or "not a librdkafka client property (did you mean
    # B.topic.metadata.refresh.interval.ms?)".
    text = (
        BASE
        + "plugin.discovery = service_load\nB.plugin.discovery = service_load\n"
        + "B.offset.flush.interval.ms = 1000\noffset.flush.timeout.ms = 5000\n"
    )
    with caplog.at_level(logging.INFO):
        path, config = load(tmp_path, text)
    assert lines(caplog) == []
    assert lines(caplog, logging.INFO) == [
        f"{path}: B.offset.flush.interval.ms, offset.flush.timeout.ms: ignored: mm2py records"
        " progress every second, or in each transaction exactly-once (Connect's offset flush)",
        f"{path}: plugin.discovery, B.plugin.discovery: ignored: mm2py loads no Connect plug-ins",
    ]
    # Not passed to librdkafka either.
    assert "plugin.discovery" not in config.cluster("B").properties
    assert "offset.flush.interval.ms" not in config.cluster("B").properties


# --- keys others wire in: typed, with MM2's defaults ---


def test_timeouts_and_progress_partitions_are_typed_with_mm2s_defaults(tmp_path: Path) -> None:
    text = (
        BASE
        + "admin.timeout.ms = 2500\nA->B.consumer.poll.timeout.ms = 250\n"
        + "B.offset.storage.partitions = 5\n"
    )
    _, config = load(tmp_path, text)
    ab, ba = config.flow("A", "B").settings, config.flow("B", "A").settings
    assert (ab.admin_timeout, ab.consumer_poll_timeout) == (2.5, 0.25)
    assert (ba.admin_timeout, ba.consumer_poll_timeout) == (2.5, 1.0)
    # A Connect worker key: read from the target cluster, as MM2's workerConfig does.
    assert (ab.offset_storage_partitions, ba.offset_storage_partitions) == (5, 25)


# --- exactly-once ---


def test_requested_without_enabled_support_copies_at_least_once_and_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # requested is Connect's default: without B.exactly.once.source.support = enabled,
    # MM2 copies at-least-once and says nothing either.
    text = (
        BASE
        + "exactly.once.support = requested\nA->B.exactly.once.support = Requested\n"
        + "B.exactly.once.source.support = disabled\n"
    )
    with caplog.at_level(logging.INFO):
        _, config = load(tmp_path, text)
    assert caplog.records == []
    assert [f.settings.exactly_once for f in config.flows] == ["off", "off"]


def test_enabled_support_turns_exactly_once_on_for_the_flows_into_that_cluster_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        BASE + "A->B.enabled = true\nB->A.enabled = true\nB.exactly.once.source.support = Enabled\n"
    )
    with caplog.at_level(logging.INFO):
        _, config = load(tmp_path, text)
    assert caplog.records == []
    ab, ba = config.flow("A", "B").settings, config.flow("B", "A").settings
    assert (ab.exactly_once, ab.exactly_once_key) == ("requested", "exactly.once.support")
    assert ba.exactly_once == "off"


def test_preparing_copies_at_least_once_with_one_note(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = BASE + "A->B.enabled = true\nB.exactly.once.source.support = preparing\n"
    with caplog.at_level(logging.INFO):
        path, config = load(tmp_path, text)
    assert lines(caplog) == []  # nothing to warn about: MM2 does the same while preparing
    assert lines(caplog, logging.INFO) == [
        f"{path}: B.exactly.once.source.support: preparing: copies at-least-once, as MM2 does"
        " while preparing; set enabled for exactly-once"
    ]
    assert config.flow("A", "B").settings.exactly_once == "off"


def test_requested_with_a_read_uncommitted_source_warns_once_and_copies_at_least_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = (
        BASE
        + "A->B.enabled = true\nB.exactly.once.source.support = enabled\n"
        + "A.consumer.isolation.level = read_uncommitted\nA.sasl.password = Not-In-Any-Line\n"
    )
    with caplog.at_level(logging.INFO):
        path, config = load(tmp_path, text)
    assert lines(caplog) == [
        f"{path}: A.consumer.isolation.level: read_uncommitted: A->B copies at-least-once"
        " although B.exactly.once.source.support = enabled: exactly-once needs the source"
        " read with read_committed, as in MM2; remove the key or set read_committed"
    ]
    assert config.flow("A", "B").settings.exactly_once == "off"
    assert "Not-In-Any-Line" not in caplog.text


def test_a_refused_config_says_only_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    text = BASE + "tasks.max = 4\nA->B.enabled = true\nexactly.once.support = required\n"
    path = tmp_path / "mm2.properties"
    path.write_text(text + "B.exactly.once.source.support = preparing\n", encoding="utf-8")
    with caplog.at_level(logging.INFO), pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: exactly.once.support: required, but exactly-once")
    assert caplog.records == []


# --- Java regexes in the config ---


def test_java_named_groups_and_quoting_load_and_select_as_in_mm2(tmp_path: Path) -> None:
    # In .properties a backslash is written twice (java.util.Properties), as for MM2.
    text = BASE + "A->B.topics = (?<name>orders), \\\\Qpay.ments\\\\E, (?i)audit-\\\\p{Digit}+\n"
    _, config = load(tmp_path, text)
    settings = config.flow("A", "B").settings
    assert settings.topics == ["(?<name>orders)", "\\Qpay.ments\\E", "(?i)audit-\\p{Digit}+"]
    selected = TopicFilter(settings.topics, settings.topics_exclude)
    names = ["orders", "pay.ments", "payxments", "AUDIT-12", "audit-x", "orders2"]
    assert [n for n in names if selected.should_replicate_topic(n)] == [
        "orders",
        "pay.ments",
        "AUDIT-12",
    ]
