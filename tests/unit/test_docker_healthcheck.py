"""The image's HEALTHCHECK script (docker/healthcheck.py): where it looks for /health."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("healthcheck", ROOT / "docker/healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_address_is_the_daemons_listen_else_its_config_else_the_default(
    tmp_path: Path,
) -> None:
    h = _script()
    entry = ["/usr/local/bin/python", "/usr/local/bin/mm2py"]
    cmd = [*entry, "run", "/etc/mm2py/mm2.properties", "--listen", "0.0.0.0:8083"]
    assert h.listen_of(cmd) == "0.0.0.0:8083"  # the image's CMD
    assert h.listen_of([*entry, "run", "c", "--listen=127.0.0.1:9000"]) == "127.0.0.1:9000"
    config = tmp_path / "mm2.properties"
    config.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\nlisteners = http://:9123\n"
    )
    argv = [*entry, "--log-format", "json", "run", "--clusters", "B", str(config)]
    assert h.listen_of(argv) == "0.0.0.0:9123"  # MM2's listeners, as mm2py run reads it
    assert h.listen_of([*entry, "run", str(tmp_path / "missing")]) == "127.0.0.1:8083"
    assert h.listen_of(["python", "-m", "pytest", "run"]) is None  # not mm2py


def test_a_wildcard_address_is_asked_on_loopback() -> None:
    h = _script()
    assert h.health_url("0.0.0.0:8083") == "http://127.0.0.1:8083/health"
    assert h.health_url("[::]:8083") == "http://[::1]:8083/health"
    assert h.health_url("10.1.2.3:9000") == "http://10.1.2.3:9000/health"
