"""How a copying client's settings are made: one precedence, in the daemon and the backfill.

1. the cluster's settings from the config (``A.consumer.*``, ``B.producer.*``, ...) win
   over mm2py's tuning (batching, queue sizes, fetch waits): a user who sets
   ``linger.ms`` gets it;
2. what correctness needs is enforced whatever the config says — read_committed
   (aborted transactions are never copied), idempotent ``acks=all`` producers
   (no record lost or reordered by a retry), no automatic offset commits — with one
   warning per key and role when the config asked for something else.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

CONSUMER_REQUIRED: Mapping[str, Any] = {
    "isolation.level": "read_committed",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}
PRODUCER_REQUIRED: Mapping[str, Any] = {
    "acks": "all",
    "enable.idempotence": True,
}

_warned: set[tuple[str, str]] = set()


def _same(configured: str, required: Any) -> bool:
    if isinstance(required, bool):
        return configured.strip().lower() == str(required).lower()
    if required == "all":
        return configured.strip() in ("all", "-1")
    return configured.strip() == str(required)


def copy_settings(
    props: Mapping[str, str],
    tuning: Mapping[str, Any],
    required: Mapping[str, Any],
    where: str,
) -> dict[str, Any]:
    """Overrides for `clients.consumer/producer(props, ...)`: tuning where `props` says
    nothing, then `required`. `where` names the client for the warning (e.g.
    ``cluster A consumer``)."""
    for key, value in required.items():
        configured = props.get(key)
        if configured is not None and not _same(configured, value) and (where, key) not in _warned:
            _warned.add((where, key))
            log.warning(
                "%s: the configured %s is not used: mm2py needs %s = %s to copy correctly",
                where,
                key,
                key,
                str(value).lower() if isinstance(value, bool) else value,
            )
    return {**{k: v for k, v in tuning.items() if k not in props}, **required}
