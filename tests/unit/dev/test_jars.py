"""The options added to the local tooling's JVMs."""

from __future__ import annotations

from pathlib import Path

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


def test_arguments_in_a_file_stay_off_the_command_line(tmp_path: Path) -> None:
    args_file = tmp_path / "format.args"
    secret = "[name=bob,password=s3cret-Value_1]"
    command = java_command("kafka.tools.StorageTool", "format", secret, args_file=args_file)
    assert not [a for a in command if "s3cret" in a or a == "kafka.tools.StorageTool"]
    assert command[-1] == f"@{args_file}"
    assert args_file.read_text().splitlines() == [
        '"kafka.tools.StorageTool"',
        '"format"',
        f'"{secret}"',
    ]
    assert args_file.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("awkward", ['Zq9"x', "Zq9\\x", "Zq9\nx"])
def test_an_argument_a_file_cannot_hold_is_refused_without_showing_it(
    tmp_path: Path, awkward: str
) -> None:
    with pytest.raises(ValueError, match="quote, backslash or line break") as refused:
        java_command("kafka.Kafka", awkward, args_file=tmp_path / "args")
    assert "Zq9" not in str(refused.value)
