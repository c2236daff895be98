"""MM2's `listeners` key (dedicated mode's REST listener) as the address mm2py serves on (pure).

`listeners` is Kafka Connect's list of URLs, `PROTOCOL://HOST:PORT` (RestServerConfig;
an empty host binds every interface, as Jetty does). mm2py serves plain HTTP: the first
`http` listener is its REST address, given as `--listen` takes it (`host:port`);
`--listen` still wins. An `https` listener cannot be served and is refused when no
`http` one is listed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Connect's RestServer.LISTENER_PATTERN.
_LISTENER = re.compile(r"^(.*)://\[?([0-9a-zA-Z\-%._:]*)\]?:(-?[0-9]+)$")


@dataclass(frozen=True)
class Listener:
    """One URL of `listeners`."""

    protocol: str  # lower case
    host: str
    port: int

    @property
    def address(self) -> str:
        """`host:port` as `--listen` takes it; an empty host: every interface."""
        return f"{self.host or '0.0.0.0'}:{self.port}"


def parse_listener(url: str) -> Listener:
    """One listener URL; ValueError saying what is wrong."""
    found = _LISTENER.match(url.strip())
    if found is None:
        raise ValueError(f"{url!r} is not a listener URL; write it as http://host:port")
    protocol, host, port = found.group(1).lower(), found.group(2), int(found.group(3))
    if protocol not in ("http", "https"):
        raise ValueError(f"{url!r}: unknown protocol {protocol!r}; use http")
    if not 0 <= port <= 65535:
        raise ValueError(f"{url!r}: port {port} is out of range")
    return Listener(protocol, host, port)


def rest_address(value: object) -> tuple[str, list[str]]:
    """The `host:port` mm2py listens on for `listeners` (a comma-separated string or a
    list), and the listeners it does not serve; ValueError when it can serve none."""
    urls = value if isinstance(value, list) else str(value).split(",")
    listeners = [parse_listener(str(url)) for url in urls if str(url).strip()]
    if not listeners:
        raise ValueError("no listener given; write one as http://host:port")
    plain = [item for item in listeners if item.protocol == "http"]
    if not plain:
        raise ValueError(
            "mm2py serves its REST API over plain HTTP only; list an http:// listener "
            "(and terminate TLS in front of it)"
        )
    unused = [f"{i.protocol}://{i.host}:{i.port}" for i in listeners if i is not plain[0]]
    return plain[0].address, unused
