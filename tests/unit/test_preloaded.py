"""The preloaded interpreter's nodes (tests/preloaded.py) against `python -m mm2py.cli`:
the same output and exit status, their environment, session and folder, and a
signal's death reported as `subprocess.Popen` reports it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.preloaded import FORKER


def _forked(argv: list[str], tmp_path: Path, **env: str) -> tuple[int, str]:
    out = tmp_path / "out.log"
    with open(out, "wb") as fd:
        proc = FORKER.start(argv, dict(os.environ, **env), fd.fileno(), fd.fileno())
    code = proc.wait(60)
    return code, out.read_text()


def _fresh(argv: list[str], **env: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=60,
        env=dict(os.environ, **env),
    )
    return done.returncode, done.stdout


@pytest.mark.parametrize(
    "argv",
    [["--version"], ["run", "/nonexistent/mm2.properties"], ["no-such-command"]],
    ids=["version", "missing-config", "unknown-command"],
)
def test_a_forked_command_says_and_exits_as_a_fresh_one(argv: list[str], tmp_path: Path) -> None:
    assert _forked(argv, tmp_path) == _fresh(argv)


def test_a_forked_command_reads_the_environment_it_is_given(tmp_path: Path) -> None:
    # argparse wraps its help at the width COLUMNS gives.
    narrow = _forked(["run", "--help"], tmp_path, COLUMNS="40")
    assert narrow == _fresh(["run", "--help"], COLUMNS="40")
    assert narrow != _fresh(["run", "--help"], COLUMNS="160")


def test_a_forked_node_runs_in_its_own_session_and_folder(tmp_path: Path) -> None:
    config = tmp_path / "mm2.properties"
    config.write_text(
        "clusters = A, B\nA.bootstrap.servers = 127.0.0.1:1\nB.bootstrap.servers = 127.0.0.1:2\n"
        "A->B.enabled = true\n"
    )
    out = tmp_path / "node.log"
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        with open(out, "wb") as fd:
            proc = FORKER.start(
                ["run", str(config), "--listen", "127.0.0.1:0"],
                dict(os.environ),
                fd.fileno(),
                fd.fileno(),
            )
    finally:
        os.chdir(before)
    try:
        deadline = time.monotonic() + 30
        while "A->B" not in out.read_text() and time.monotonic() < deadline:
            assert proc.poll() is None, out.read_text()
            time.sleep(0.1)
        assert os.getsid(proc.pid) == proc.pid
        assert Path(f"/proc/{proc.pid}/cwd").resolve() == tmp_path.resolve()
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGKILL)
    assert proc.wait(10) == -signal.SIGKILL
    assert proc.returncode == -signal.SIGKILL
