"""The options added to the local tooling's JVMs."""

from __future__ import annotations

import pytest

from mm2py.dev.jars import JVM_OPTIONS_VARIABLE, extra_jvm_options, java_command


def test_added_jvm_options_are_split_as_a_shell_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(JVM_OPTIONS_VARIABLE, "-XX:TieredStopAtLevel=1  '-Dname=a b'")
    assert extra_jvm_options() == ["-XX:TieredStopAtLevel=1", "-Dname=a b"]


def test_no_added_jvm_options_when_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(JVM_OPTIONS_VARIABLE, raising=False)
    assert extra_jvm_options() == []


def test_a_heap_committed_at_start_only_when_asked() -> None:
    assert {"-Xmx1g", "-Xms1g"} <= set(java_command("kafka.Kafka", heap="1g", initial_heap="1g"))
    assert not [a for a in java_command("kafka.Kafka", heap="1g") if a.startswith("-Xms")]
