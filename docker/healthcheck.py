"""The image's HEALTHCHECK: GET /health of the mm2py daemon running in this container.

The daemon's address is where `mm2py run` put it: its `--listen` argument, read from
its command line in /proc (the image's CMD says 0.0.0.0:8083; `docker run IMAGE run
CONFIG --listen HOST:PORT` moves it), else its config's MM2 `listeners`, else mm2py's
default 127.0.0.1:8083. A wildcard host is asked on loopback. Exit status 0 when
/health answers 200, else 1 (what Docker's HEALTHCHECK reads).
"""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Iterable, Sequence
from pathlib import Path

DEFAULT = "127.0.0.1:8083"  # mm2py run's default address
WITH_VALUE = {"--clusters"}  # mm2py run's options followed by a value, beside --listen
WILDCARDS = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}


def listen_of(argv: Sequence[str]) -> str | None:
    """Where an `mm2py ... run` command line listens (None when it is not one)."""
    if "run" not in argv or not any(Path(a).name == "mm2py" or a == "mm2py.cli" for a in argv):
        return None
    config = None
    args = iter(argv[argv.index("run") + 1 :])
    for arg in args:
        if arg == "--listen":
            return next(args, DEFAULT)
        if arg.startswith("--listen="):
            return arg.split("=", 1)[1]
        if arg in WITH_VALUE:
            next(args, None)
        elif not arg.startswith("-") and config is None:
            config = arg
    return (config_listen(config) if config else None) or DEFAULT


def config_listen(config: str) -> str | None:
    """The REST address from the config's MM2 `listeners`, as `mm2py run` reads it."""
    try:
        from mm2py.config import load_config

        return load_config(Path(config)).listen
    except Exception:  # an unreadable config: the default address
        return None


def health_url(listen: str) -> str:
    host, _, port = listen.rpartition(":")
    host = WILDCARDS.get(host, host)
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}/health"


def command_lines(proc: Path = Path("/proc")) -> Iterable[list[str]]:
    for cmdline in sorted(proc.glob("[0-9]*/cmdline")):
        try:
            raw = cmdline.read_bytes()
        except OSError:
            continue  # ended meanwhile
        yield [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def main() -> int:
    listen = next(
        (found for argv in command_lines() if (found := listen_of(argv)) is not None), DEFAULT
    )
    url = health_url(listen)
    try:
        with urllib.request.urlopen(url, timeout=4) as resp:
            ok = resp.status == 200
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    print(f"{url}: {'ok' if ok else 'not ok'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
