"""The command line: every command listed, and errors mapped to one stderr line and an
exit status in one place (`run_command`), without a broker."""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest
from confluent_kafka import KafkaError, KafkaException

from mm2py import cli
from mm2py.backfill.job import BackfillError
from mm2py.backfill.plan import TimeBoundError
from mm2py.config import ConfigError
from mm2py.daemon.supervisor import ListenError
from mm2py.dev.jars import JarFetchError
from mm2py.dev.launcher import LocalClusterError
from mm2py.errors import Interrupted, Mm2pyError, UsageError
from mm2py.tools.translate import ApplyRefused
from mm2py.tools.verify import VerifyError

COMMANDS = [
    "run",
    "plan",
    "failover",
    "translate-offsets",
    "verify",
    "backfill",
    "status",
    "local",
    "demo",
]

CONFIG = """\
clusters = A, B
A.bootstrap.servers = 127.0.0.1:1
B.bootstrap.servers = 127.0.0.1:2
A->B.enabled = {enabled}
"""


def _raising(err: BaseException) -> cli.Command:
    def command(args: argparse.Namespace) -> NoReturn:
        raise err

    return command


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "mm2.properties"
    path.write_text(CONFIG.format(enabled="true"))
    return path


@pytest.fixture(autouse=True)
def _keep_pytest_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() installs mm2py's log handler on the root logger, replacing pytest's.
    monkeypatch.setattr("mm2py.logs.configure", lambda level, fmt: None)


def test_help_lists_every_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = re.findall(r"^    (\S+)", done.stdout, re.MULTILINE)  # COMMAND's rows
    assert listed == COMMANDS


def test_the_runtime_never_imports_dev_tooling() -> None:
    probe = (
        "import sys\n"
        "from mm2py.cli import build_parser\n"
        "build_parser().parse_args(['run', 'mm2.properties'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('mm2py.dev')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[]\n"


@pytest.mark.parametrize(
    ("err", "status"),
    [
        (Mm2pyError("it failed"), 1),
        (UsageError("bad option"), 2),
        (Interrupted("stopped"), 130),
        (ConfigError("mm2.properties", "A->B.topics", "bad regex"), 2),
        (TimeBoundError("'x' is not 'now'"), 2),
        (ApplyRefused("group g has 1 active member(s)"), 2),
        (ListenError("127.0.0.1:8083 is in use"), 1),
        (BackfillError("range 3/3 failed"), 1),
        (VerifyError("listing topics failed"), 1),
        (LocalClusterError("no local cluster 'Z'"), 1),
        (JarFetchError("mvn is not on PATH"), 1),
    ],
)
def test_an_mm2py_error_gives_its_exit_status_and_one_stderr_line(
    err: Mm2pyError, status: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.run_command("verify", _raising(err), argparse.Namespace()) == status
    out, errors = capsys.readouterr()
    assert out == ""
    assert errors == f"mm2py verify: {err}\n"


def test_a_message_on_several_lines_is_printed_on_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = BackfillError("range 3/3 failed:\n  Broker: Message size too large\n")
    assert cli.run_command("backfill", _raising(err), argparse.Namespace()) == 1
    assert capsys.readouterr().err == (
        "mm2py backfill: range 3/3 failed: Broker: Message size too large\n"
    )


def test_run_errors_start_with_mm2py_alone(capsys: pytest.CaptureFixture[str]) -> None:
    err = ListenError("cannot listen on 127.0.0.1:8083: address in use")
    assert cli.run_command("run", _raising(err), argparse.Namespace()) == 1
    assert capsys.readouterr().err == f"mm2py: {err}\n"


def test_a_kafka_error_no_command_put_in_words_is_a_failure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = KafkaException(KafkaError(KafkaError._TRANSPORT, "broker 127.0.0.1:1 down"))
    assert cli.run_command("verify", _raising(err), argparse.Namespace()) == 1
    line = capsys.readouterr().err
    assert line.startswith("mm2py verify: ") and line.count("\n") == 1
    assert "broker 127.0.0.1:1 down" in line


@pytest.mark.parametrize("err", [KeyError("flows"), TypeError("a bug")])
def test_an_unexpected_exception_propagates_with_its_traceback(
    err: Exception, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(type(err)) as raised:
        cli.run_command("run", _raising(err), argparse.Namespace())
    assert raised.value is err
    assert capsys.readouterr().err == ""


def _main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = cli.main(argv)
    out, errors = capsys.readouterr()
    assert out == ""
    return status, errors


def test_run_usage_errors(config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.properties"
    assert _main(["run", str(missing)], capsys) == (2, f"mm2py: {missing}: no such file\n")
    assert _main(["run", str(config), "--clusters", "Z"], capsys) == (
        2,
        f"mm2py: {config}: --clusters: unknown cluster 'Z'; known: A, B\n",
    )
    config.write_text(CONFIG.format(enabled="false"))
    assert _main(["run", str(config)], capsys) == (
        2,
        f"mm2py: {config}: no enabled flow (set A->B.enabled = true)\n",
    )


def test_tool_usage_errors_name_the_option(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pair = [str(config), "--source", "A", "--target"]
    assert _main(["verify", *pair, "Z"], capsys) == (
        2,
        f"mm2py verify: {config}: --target: unknown cluster 'Z'; known: A, B\n",
    )
    status, line = _main(["verify", *pair, "B", "--topics", "("], capsys)
    assert status == 2
    assert line.startswith("mm2py verify: --topics: invalid regular expression: ")
    assert _main(["translate-offsets", *pair, "A", "--group", "g"], capsys) == (
        2,
        f"mm2py translate-offsets: {config}: --target: must differ from --source\n",
    )
    assert _main(["translate-offsets", *pair, "B", "--group", "g", "--accept-inexact"], capsys) == (
        2,
        "mm2py translate-offsets: --accept-inexact goes with --apply\n",
    )
    status, line = _main(["backfill", *pair, "B", "--from", "last tuesday"], capsys)
    assert status == 2
    assert line.startswith("mm2py backfill: --from/--until: 'last tuesday' is not 'earliest'")
    assert line.count("\n") == 1


def test_status_without_a_daemon(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    status, line = _main(["status", "--url", url, "--timeout", "5"], capsys)
    assert status == 1
    assert line.startswith(f"mm2py status: no mm2py daemon answers at {url} (")
    assert line.endswith("is `mm2py run` running? give its address with --url\n")
