"""MM2 keys that mm2py accepts but does not act on, and requests it refuses.

Every key mm2py accepts is honoured or said to be ignored: the keys below are
logged once per load, in one line naming the file and every place the key is
set (``offset.lag.max, A->B.offset.lag.max``), never a value. A config asking for
exactly-once delivery is refused (ConfigError) until mm2py provides it, rather
than run at-least-once with a warning.

The exactly-once keys are Kafka Connect's, as MM2 reads them:
``<target>.exactly.once.source.support`` (DistributedConfig: disabled, preparing,
enabled; a worker setting of the herders that write into ``<target>``) and
``exactly.once.support`` (SourceConnectorConfig: requested, required; global or
``A->B.``). mm2py takes either key wherever it is written: a config that names
one of them asks for exactly-once, even where MM2 itself would not read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Keys whose meaning mm2py does not implement (yet), said at WARNING level.
NOT_HONOURED = {
    "offset.lag.max": (
        "not needed: mm2py writes an offset sync wherever source and target offsets stop"
        " advancing together, so translation is exact whatever the lag"
    ),
}
# Connect worker keys that only MM2's own internal topics use; kept in files shared with
# MM2 (configs/mm2.properties), so said at INFO level: nothing the user asked for is lost.
MM2_ONLY = {
    "config.storage.replication.factor": "ignored: mm2py has no Connect config topic (MM2's)",
    "status.storage.replication.factor": "ignored: mm2py has no Connect status topic (MM2's)",
}

EXACTLY_ONCE_KEYS = ("exactly.once.source.support", "exactly.once.support")
_ALLOWED = {
    "exactly.once.source.support": ("disabled", "preparing", "enabled"),
    "exactly.once.support": ("requested", "required"),
}
_NOT_YET = "exactly-once delivery is not available in mm2py yet"


@dataclass(frozen=True)
class ExactlyOnce:
    """What a value of an exactly-once key means for mm2py."""

    verdict: Literal["fine", "warn", "refuse", "invalid"]
    message: str


def exactly_once(key: str, value: object) -> ExactlyOnce:
    """Judge ``value`` of ``key`` (one of EXACTLY_ONCE_KEYS), as Connect parses it."""
    allowed = _ALLOWED[key]
    word = value.strip().lower() if isinstance(value, str) else ""
    if word not in allowed:
        return ExactlyOnce("invalid", f"expected {', '.join(allowed[:-1])} or {allowed[-1]}")
    if word in ("enabled", "required"):
        instead = "disabled" if key == "exactly.once.source.support" else "requested"
        return ExactlyOnce(
            "refuse",
            f"{word} asks for exactly-once delivery, which is not available in mm2py yet;"
            f" remove the key (or set it to {instead}) to copy at-least-once",
        )
    if word == "requested":
        return ExactlyOnce("warn", f"requested: mm2py copies at-least-once; {_NOT_YET}")
    if word == "preparing":
        return ExactlyOnce(
            "warn",
            f"preparing: mm2py copies at-least-once, as MM2 does while preparing; {_NOT_YET}",
        )
    return ExactlyOnce("fine", "")
