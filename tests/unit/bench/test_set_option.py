"""The benchmarks' --set option: KEY=VALUE pairs, and a clear error for anything else."""

import argparse

import pytest

from bench.report import add_set_option


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench")
    add_set_option(parser)
    return parser


def test_pairs_are_kept_in_order_and_a_value_may_hold_equals_signs() -> None:
    args = _parser().parse_args(["--set", "B.producer.linger.ms=5", "--set", "a.b=x=y"])
    assert dict(args.set) == {"B.producer.linger.ms": "5", "a.b": "x=y"}


@pytest.mark.parametrize("bad", ["linger", "=5"])
def test_a_setting_without_a_key_is_refused_naming_it(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--set", bad])
    assert f"{bad!r} is not KEY=VALUE" in capsys.readouterr().err
