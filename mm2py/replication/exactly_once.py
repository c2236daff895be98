"""Exactly-once at start-up: does each flow's target accept our transactions?

A flow resolved to exactly-once by its config (``FlowSettings.exactly_once``, see
mm2py.config.exactly_once) needs the target to run a transaction coordinator and to
let our user write transactional ids ``<cluster.group.prefix>-<source>-><target>-...``
(ACL: TransactionalId, pattern PREFIXED ``<prefix>-``, WRITE and DESCRIBE).
`check_transactions` asks once, with a producer whose id is the flow's probe id
(``...-probe``: never a task's, so it fences no task), before the daemon starts.
`settle_exactly_once` acts on the answers: a flow that requires exactly-once and is
refused stops the start (ConfigError naming the key, exit 2); one that only requests
it says why once and copies at-least-once (its settings say ``off``, so nothing later
tries transactions).

A target that gives no answer, or refuses the login, is not judged here: the daemon's
own checks report those (mm2py.kafka.access, the parts' reachability).

`transactional_id` names the transactional id of a task, as Connect names its tasks'
(``<group>-<connector>-<task>``); `mirrormaker2_transactional_id` names the id of
MM2's own task, which mm2py's tasks fence when they take over a flow from MM2.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from mm2py.compat.formats import SOURCE_CONNECTOR_NAME
from mm2py.config import ClusterConfig, ConfigError, FlowConfig, MirrorConfig
from mm2py.config.rules import group_id
from mm2py.kafka import clients

log = logging.getLogger(__name__)

# How long the target may take to answer at all, then to initialise the probe's id (the
# first id on a new cluster creates __transaction_state: a few seconds).
REACH_TIMEOUT = 5.0
INIT_TIMEOUT = 30.0

# A target that answered nothing in time proves nothing: its brokers or its transaction
# coordinator may be down for a moment (a restart, a coordinator loading its log).
_UNCERTAIN = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


@dataclass(frozen=True)
class Refusal:
    """Why a target does not take a flow's transactions. `certain` is False when it only
    gave no answer in time: a flow that requests exactly-once then keeps it (its tasks
    retry until the target answers) rather than settle for less because of a blip."""

    reason: str
    certain: bool = True


Check = Callable[[FlowConfig, ClusterConfig, str], "Refusal | None"]


def transactional_id(prefix: str, source: str, target: str, task: int | str) -> str:
    """The transactional id of task `task` of flow source->target:
    ``<prefix>-<source>-><target>-<task>`` (`prefix` is ``cluster.group.prefix``), the
    flow's group id (`mm2py.config.rules.group_id`) and the task. Stable across restarts
    and moves, so a task's new owner fences the previous one; ``task = "probe"`` is the
    start-up check's."""
    return f"{group_id(prefix, source, target)}-{task}"


def mirrormaker2_worker_group(source: str) -> str:
    """MM2's default Connect worker group for flows from `source` in its dedicated mode
    (MirrorMakerConfig.workerConfig; a ``group.id`` set for the target is not followed):
    the prefix of its tasks' transactional ids."""
    return f"{source}-mm2"


def mirrormaker2_transactional_id(source: str, task: int) -> str:
    """The transactional id of task `task` of MM2's source connector for flows from
    `source`, in MM2's dedicated mode with exactly-once: Connect's
    ``<worker group>-<connector>-<task>``."""
    return f"{mirrormaker2_worker_group(source)}-{SOURCE_CONNECTOR_NAME}-{task}"


class _QuietLog:
    """The probe's librdkafka logger: a refusal is reported once, by the caller."""

    def log(self, level: int, fmt: str, *args: Any) -> None:
        log.debug(fmt, *args)


def check_transactions(flow: FlowConfig, target: ClusterConfig, prefix: str) -> Refusal | None:
    """Why `target` refuses the transactions of `flow`, or None when it accepts them (or
    gives no answer, or refuses the login: not this check's to report).

    Initialises a transactional producer with the flow's probe id, then closes it.
    """
    admin_props = target.librdkafka("admin")
    if not clients.describe_cluster(admin_props, REACH_TIMEOUT):
        log.warning(
            "%s: cannot check now that cluster %s accepts transactions (no answer within"
            " %.0f s); its tasks will find out",
            flow.name,
            target.alias,
            REACH_TIMEOUT,
        )
        return None
    props = target.librdkafka("producer")
    tid = transactional_id(prefix, flow.source, flow.target, "probe")
    producer = clients.producer(
        props,
        {
            "transactional.id": tid,
            "enable.idempotence": True,
            "acks": "all",
            "logger": _QuietLog(),
        },
    )
    try:
        producer.init_transactions(INIT_TIMEOUT)
    except KafkaException as exc:
        return refusal(exc.args[0], target.alias, props, prefix, tid)
    finally:
        # A producer that failed fatally raises that error again on close: reported above.
        with contextlib.suppress(KafkaException):
            producer.close()
    return None


def refusal(
    err: KafkaError, alias: str, props: Mapping[str, str], prefix: str, tid: str
) -> Refusal:
    """What a failed init_transactions of id `tid` on cluster `alias` means, and what to do."""
    return Refusal(_reason(err, alias, props, prefix, tid), err.code() not in _UNCERTAIN)


def _reason(err: KafkaError, alias: str, props: Mapping[str, str], prefix: str, tid: str) -> str:
    user = props.get("sasl.username")
    who = f"User:{user}" if user else "the principal mm2py logs in as"
    code = err.code()
    if code == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
        return (
            f"cluster {alias} refuses the transactional id {tid}"
            f" (TRANSACTIONAL_ID_AUTHORIZATION_FAILED): grant {who} WRITE and DESCRIBE on"
            f" TransactionalId prefix '{prefix}-' (pattern PREFIXED)"
        )
    if code == KafkaError.CLUSTER_AUTHORIZATION_FAILED:
        return (
            f"cluster {alias} refuses idempotent writes (CLUSTER_AUTHORIZATION_FAILED):"
            f" grant {who} IDEMPOTENT_WRITE on the cluster"
        )
    if code == KafkaError._TIMED_OUT:
        return (
            f"cluster {alias} gave no transaction coordinator within {INIT_TIMEOUT:.0f} s: its"
            " brokers must be able to host __transaction_state"
            " (transaction.state.log.replication.factor and min.isr no more than the live"
            " brokers)"
        )
    return f"cluster {alias} refuses transactions ({err.name()}: {err.str()})"


def settle_exactly_once(
    config: MirrorConfig, flows: Sequence[FlowConfig], check: Check = check_transactions
) -> MirrorConfig:
    """`config` once every flow of `flows` that asks for exactly-once is checked (at once):
    a required one refused raises ConfigError naming where exactly.once.support was set,
    the target and the reason; a requested one refused is said in one warning and its
    settings become at-least-once (``exactly_once = "off"``)."""
    asking = [flow for flow in flows if flow.settings.exactly_once != "off"]
    if not asking:
        return config
    with ThreadPoolExecutor(max_workers=len(asking)) as pool:
        reasons = list(
            pool.map(
                lambda flow: check(
                    flow, config.cluster(flow.target), flow.settings.cluster_group_prefix
                ),
                asking,
            )
        )
    at_least_once: set[str] = set()
    for flow, refused in zip(asking, reasons, strict=True):
        key = flow.settings.exactly_once_key
        reason = refused.reason if refused is not None else ""
        if refused is None:
            log.info("%s copies exactly-once (%s = %s)", flow.name, key, flow.settings.exactly_once)
        elif flow.settings.exactly_once == "required":
            raise ConfigError(
                config.path,
                key,
                f"required, but {flow.name} cannot copy exactly-once: {reason};"
                f" or set {key} = requested to copy at-least-once",
            )
        elif not refused.certain:
            log.warning(
                "%s copies exactly-once, though cluster %s could not be checked: %s; its"
                " tasks retry until it answers",
                flow.name,
                flow.target,
                reason,
            )
        else:
            log.warning(
                "%s: %s: %s copies at-least-once, not exactly-once: %s",
                config.path,
                key,
                flow.name,
                reason,
            )
            at_least_once.add(flow.name)
    if not at_least_once:
        return config
    return config.model_copy(
        update={
            "flows": [
                flow.model_copy(update={"settings": flow.settings.resolved(exactly_once="off")})
                if flow.name in at_least_once
                else flow
                for flow in config.flows
            ]
        }
    )
