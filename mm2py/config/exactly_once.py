"""Exactly-once, as MM2 configures it: which flows copy exactly-once, and how often they commit.

MM2's keys (Kafka Connect's, KIP-618): ``<target>.exactly.once.source.support`` =
disabled | preparing | enabled; ``exactly.once.support`` = requested | required;
``transaction.boundary`` = poll | interval (connector is refused, as Connect refuses it
for MirrorSourceConnector); unset, a commit once a task caught up and at least every
models.DEFAULT_TRANSACTION_INTERVAL_MS while behind. The target producer's
``transaction.timeout.ms`` (``B.producer.transaction.timeout.ms``, which MM2 gives its
tasks' producers; models.DEFAULT_TRANSACTION_TIMEOUT_MS, Connect's, unset) is how long
the brokers keep a transaction that its writer left open.

Invariants:
- where a key is set in several places the most specific wins: ``A->B.``, ``B.``, global;
- ``required`` makes a flow that cannot copy exactly-once a configuration error;
- a source consumer reading read_uncommitted makes exactly-once unavailable for its flows;
- a flow commits more often than its transactions time out, or fails to load;
- everything here is pure: the loader reads the keys and raises or logs.
Design: docs/design/exactly-once-config.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from mm2py.config.models import ExactlyOnceMode

SUPPORT_KEY = "exactly.once.source.support"
LEVEL_KEY = "exactly.once.support"
BOUNDARY_KEY = "transaction.boundary"
INTERVAL_KEY = "transaction.boundary.interval.ms"  # a FlowSettings field
TIMEOUT_KEY = "transaction.timeout.ms"  # the target producer's
# librdkafka's range for transaction.timeout.ms (the brokers refuse more than their
# transaction.max.timeout.ms, 15 minutes by default, when a task starts).
TIMEOUT_RANGE_MS = (1000, 2_147_483_647)
KEYS = (SUPPORT_KEY, LEVEL_KEY, BOUNDARY_KEY)

_ALLOWED = {
    SUPPORT_KEY: ("disabled", "preparing", "enabled"),
    LEVEL_KEY: ("requested", "required"),
    BOUNDARY_KEY: ("poll", "interval"),
}


def parse_word(key: str, value: object) -> str:
    """The value of one of KEYS in lower case (Connect's CaseInsensitiveValidString);
    ValueError saying what is allowed, or why ``transaction.boundary = connector`` is not."""
    allowed = _ALLOWED[key]
    word = value.strip().lower() if isinstance(value, str) else ""
    if key == BOUNDARY_KEY and word == "connector":
        raise ValueError(
            "connector: MM2's connectors define no transaction boundaries (Connect refuses"
            " it for MirrorSourceConnector); use poll or interval"
        )
    if word not in allowed:
        raise ValueError(f"expected {', '.join(allowed[:-1])} or {allowed[-1]}")
    return word


@dataclass(frozen=True)
class Setting:
    """A key's value (lower case) and where it was set, as written
    (``A->B.exactly.once.support``)."""

    value: str
    shown: str


@dataclass(frozen=True)
class Problem:
    """What to say about a key: an error (the flow cannot run) or a warning."""

    key: str
    message: str


@dataclass(frozen=True)
class Resolved:
    """A flow's exactly-once mode, and the key that asked for it (for later messages)."""

    mode: ExactlyOnceMode
    key: str
    error: Problem | None = None
    warning: Problem | None = None


def resolve(
    flow: str,
    target: str,
    support: Setting | None,
    level: Setting | None,
    isolation: Setting | None,
) -> Resolved:
    """The mode of ``flow`` (``A->B``) into ``target``: off unless ``support`` is enabled.

    ``isolation`` is the source consumer's isolation.level, where set. An error for
    ``required`` when exactly-once cannot be had; a warning when ``requested`` settles
    for at-least-once because of the source's isolation level.
    """
    wanted = level.value if level else "requested"
    key = level.shown if level else LEVEL_KEY
    support_key = support.shown if support else f"{target}.{SUPPORT_KEY}"
    if support is None or support.value != "enabled":
        if wanted == "required":
            now = f"is {support.value}" if support else "is not set (disabled)"
            return Resolved(
                "off",
                key,
                error=Problem(
                    key,
                    f"required, but exactly-once is not enabled for flows into {target}"
                    f" ({support_key} {now}); set {target}.{SUPPORT_KEY} = enabled, or"
                    f" {key} = requested to copy at-least-once",
                ),
            )
        return Resolved("off", key)
    if isolation is not None and isolation.value == "read_uncommitted":
        if wanted == "required":
            return Resolved(
                "off",
                key,
                error=Problem(
                    isolation.shown,
                    f"read_uncommitted: exactly-once ({key} = required for {flow}) needs the"
                    " source read with read_committed, as in MM2; remove the key or set"
                    " read_committed",
                ),
            )
        return Resolved(
            "off",
            key,
            warning=Problem(
                isolation.shown,
                f"read_uncommitted: {flow} copies at-least-once although {support_key} ="
                " enabled: exactly-once needs the source read with read_committed, as in MM2;"
                " remove the key or set read_committed",
            ),
        )
    return Resolved("required" if wanted == "required" else "requested", key)


def boundary_interval_ms(boundary: Setting | None, interval_ms: int) -> int:
    """How often a task commits its transaction, in ms: 0 (after every batch) for
    ``transaction.boundary = poll``, else ``interval_ms``."""
    return 0 if boundary is not None and boundary.value == "poll" else interval_ms


def parse_timeout_ms(value: str) -> int:
    """A ``transaction.timeout.ms`` value in ms; ValueError saying what is allowed."""
    low, high = TIMEOUT_RANGE_MS
    try:
        ms = int(value.strip())
    except ValueError:
        raise ValueError(f"expected a whole number of milliseconds (got {value!r})") from None
    if not low <= ms <= high:
        raise ValueError(f"expected {low} to {high} ms (got {ms})")
    return ms


def interval_problem(
    interval_ms: int, interval_key: str, timeout_ms: int, timeout_key: str | None
) -> str | None:
    """Why a flow that commits every `interval_ms` cannot run with transactions that
    time out after `timeout_ms` (set at `timeout_key`; None: Connect's default), or None
    when it can: the brokers would abort every transaction before its commit."""
    if interval_ms < timeout_ms:
        return None
    where = (
        f"{timeout_key} = {timeout_ms}" if timeout_key else f"{TIMEOUT_KEY} {timeout_ms}, Connect's"
    )
    return (
        f"{interval_ms} ms is not shorter than the transactions' timeout ({where}): the"
        f" brokers would abort each transaction before its commit; set {interval_key} lower"
        f" or {TIMEOUT_KEY} higher"
    )
