"""A daemon over two clusters nobody answers at, for supervisor tests that need no Kafka."""

from __future__ import annotations

from pathlib import Path

from mm2py.config import load_config
from mm2py.daemon.supervisor import Daemon


def offline_daemon(tmp_path: Path, extra: str = "") -> Daemon:
    """A Daemon for flow A->B (no heartbeat parts), not started; `extra` adds config lines."""
    config = tmp_path / "mm2.properties"
    config.write_text(
        "clusters = A, B\n"
        "A.bootstrap.servers = 127.0.0.1:1\n"
        "B.bootstrap.servers = 127.0.0.1:2\n"
        "A->B.enabled = true\n" + extra
    )
    loaded = load_config(config)
    return Daemon(loaded, loaded.enabled_flows(), "127.0.0.1:0", heartbeat_flows=[])
