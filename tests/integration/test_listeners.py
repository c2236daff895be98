"""`mm2py run` serves its REST API on MM2's `listeners` unless --listen is given."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from mm2py.dev.launcher import LocalCluster
from tests.daemon_harness import free_port, mm2_properties
from tests.kafka_helpers import wait_until

pytestmark = pytest.mark.integration


def _worker_id(port: int) -> str | None:
    """The worker_id of the source connector's status on 127.0.0.1:port, once it answers."""
    url = f"http://127.0.0.1:{port}/connectors/A-%3EB.MirrorSourceConnector/status"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(json.loads(resp.read())["connector"]["worker_id"])
    except OSError:
        return None


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as resp:
            return resp.status == 200
    except OSError:
        return False


@pytest.mark.parametrize("with_listen", [False, True])
def test_listeners_is_the_rest_address_and_listen_wins(
    cluster_a: LocalCluster, cluster_b: LocalCluster, tmp_path: Path, with_listen: bool
) -> None:
    listeners, listen = free_port(), free_port()
    config = tmp_path / "mm2.properties"
    config.write_text(
        mm2_properties(cluster_a, cluster_b, "listeners-nothing")
        + f"listeners = http://127.0.0.1:{listeners}\n"
    )
    command = [sys.executable, "-m", "mm2py.cli", "run", str(config)]
    if with_listen:
        command += ["--listen", f"127.0.0.1:{listen}"]
    log = tmp_path / "mm2py.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
    try:
        serving, other = (listen, listeners) if with_listen else (listeners, listen)
        worker = wait_until(
            lambda: _worker_id(serving), timeout=60, what=f"the REST API on {serving}"
        )
        assert worker == f"127.0.0.1:{serving}"
        assert not _answers(other)
    finally:
        proc.terminate()
        proc.wait(15)
    assert proc.returncode == 0, log.read_text()
