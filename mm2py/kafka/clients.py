"""The one place Kafka clients are built.

Every client gets its connection settings from a cluster's config
(`ClusterConfig.librdkafka(role)`) or, for local test clusters, from the
launcher's recorded properties; tuning for a job is passed as `overrides`.
librdkafka's own log lines go through Python logging, never to stderr; its line for
every failed connection attempt (tens a second while a cluster is down) is folded: the
first per cluster a minute at WARNING, the rest at DEBUG. Whether a cluster is
reachable is the daemon's business (mm2py.runtime.reachability), in one line per change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)
_librdkafka_log = logging.getLogger("mm2py.librdkafka")

# How long an admin request may take unless a flow's `admin.timeout.ms` says (MM2: 60 s).
ADMIN_TIMEOUT = 60.0
# A request's future is awaited this much longer than the request's own timeout, so that
# the request's error (naming the cause) arrives rather than a bare timeout.
RESULT_GRACE = 5.0


# Connection-failure lines of librdkafka per cluster: at most one a window at WARNING.
FOLD_WINDOW = 60.0


class ConnectionLogFolder:
    """Which connection-failure lines to show: the first per key in each window (thread-safe)."""

    def __init__(
        self, window: float = FOLD_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window = window
        self._clock = clock
        self._lock = threading.Lock()
        self._shown: dict[str, float] = {}

    def loud(self, key: str) -> bool:
        """True for the first line of `key` in a window (show it); False for the rest."""
        now = self._clock()
        with self._lock:
            last = self._shown.get(key)
            if last is not None and now - last < self.window:
                return False
            self._shown[key] = now
            return True


def is_connection_failure(facility: str, message: str) -> bool:
    """A librdkafka line about a failed or lost connection (facility FAIL), or all down."""
    return facility == "FAIL" or message.endswith("brokers are down")


_folder = ConnectionLogFolder()


class ClusterLog:
    """librdkafka's `logger` for the clients of one cluster: folds connection failures.

    librdkafka calls `log(level, "%s [%s] %s", facility, client name, message)`.
    """

    def __init__(self, bootstrap: str, folder: ConnectionLogFolder | None = None) -> None:
        self.bootstrap = bootstrap
        self._folder = folder or _folder

    def log(self, level: int, fmt: str, *args: Any) -> None:
        if len(args) == 3 and is_connection_failure(str(args[0]), str(args[2])):
            if self._folder.loud(self.bootstrap):
                _librdkafka_log.log(
                    logging.WARNING,
                    fmt + " (more connection failures to %s within %.0f s are logged at DEBUG)",
                    *args,
                    self.bootstrap,
                    self._folder.window,
                )
            else:
                _librdkafka_log.log(logging.DEBUG, fmt, *args)
            return
        _librdkafka_log.log(level, fmt, *args)


def _settings(props: Mapping[str, str], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    settings: dict[str, Any] = dict(props)
    if overrides:
        settings.update(overrides)
    settings.setdefault("logger", ClusterLog(str(settings.get("bootstrap.servers", ""))))
    return settings


def admin_client(
    props: Mapping[str, str], overrides: Mapping[str, Any] | None = None
) -> AdminClient:
    """An AdminClient for the cluster described by `props`."""
    return AdminClient(_settings(props, overrides))


def producer(props: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Producer:
    """A Producer for the cluster described by `props`."""
    return Producer(_settings(props, overrides))


def consumer(props: Mapping[str, str], overrides: Mapping[str, Any] | None = None) -> Consumer:
    """A Consumer for the cluster described by `props` (group.id defaults to none)."""
    settings = _settings(props, overrides)
    settings.setdefault("group.id", "mm2py-unused")
    settings.setdefault("enable.auto.commit", False)
    return Consumer(settings)


def admin_result(future: Future[Any], timeout: float) -> Any:
    """An admin request's result; a request that never answers raises a KafkaException
    (_TIMED_OUT) that says how long it waited, never a TimeoutError without a message."""
    try:
        return future.result(timeout=timeout + RESULT_GRACE)
    except FutureTimeout:
        error = KafkaError(KafkaError._TIMED_OUT, f"no answer within {timeout:.0f} s")
        raise KafkaException(error) from None


def error_text(exc: BaseException) -> str:
    """The message of a KafkaException (its KafkaError's text) or of any other error."""
    first = exc.args[0] if exc.args else exc
    return str(first.str()) if isinstance(first, KafkaError) else str(first)


def cluster_metadata(admin: AdminClient, timeout: float) -> Any:
    """The cluster's metadata (ID, brokers, controller), as a Metadata request answers:
    how mm2py asks whether a cluster answers, and which brokers it has. Raises
    KafkaException when there is no answer within `timeout` seconds.

    Not AdminClient.describe_cluster: librdkafka (2.16) aborts the whole process
    (assertion `rko_result` in rd_kafka_admin_response_parse) when a describe-cluster
    request is answered on a connection whose ApiVersionRequest had timed out, as
    happens when a broker is paused while the client connects (reproduced with a
    SIGSTOPped broker: an abort within a few pauses; none with Metadata requests).
    """
    return admin.list_topics(timeout=timeout)


# A topic name Kafka rejects (':' is not allowed in one). See `cluster_answers`.
PROBE_TOPIC = "mm2py:probe"


def cluster_answers(admin: AdminClient, timeout: float) -> Any:
    """A Metadata request for PROBE_TOPIC alone, answered with the cluster's ID and
    brokers and an "invalid topic" error for the name (no broker creates it, whatever
    its auto.create.topics.enable): how the daemon asks every PROBE_INTERVAL whether a
    cluster answers. `cluster_metadata` would list every topic of the cluster: ~9 ms of
    CPU per call at 2,000 partitions, where this costs ~0.3 ms. Raises KafkaException
    when there is no answer within `timeout` seconds."""
    return admin.list_topics(topic=PROBE_TOPIC, timeout=timeout)


def describe_cluster(props: Mapping[str, str], timeout: float = 3.0) -> bool:
    """True when the cluster answers (`cluster_metadata`) in time."""
    admin = admin_client(props, {"log_level": 0})
    try:
        cluster_metadata(admin, timeout)
    except Exception:  # any failure means "not ready yet"; callers poll with a deadline
        return False
    return True


# How long access_error() waits after a transport error for a TLS or login error.
UNREACHABLE_GRACE = 3.0
# How long each of access_error()'s Metadata requests may wait for an answer.
ACCESS_ASK_TIMEOUT = 0.25

# Errors that retrying cannot fix: wrong credentials, a certificate that does not verify.
_ACCESS_ERRORS = frozenset(
    {KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED, KafkaError._SSL}
)


def is_access_error(err: KafkaError) -> bool:
    """A refused login or certificate: retrying with the same settings cannot help."""
    return err.code() in _ACCESS_ERRORS


def access_problem(alias: str, props: Mapping[str, str], err: KafkaError) -> str:
    """What failed on cluster `alias` and what to check, without any secret."""
    return refused_access(alias, props, tls=err.code() == KafkaError._SSL, detail=err.str())


def refused_access(alias: str, props: Mapping[str, str], *, tls: bool, detail: str) -> str:
    """What to check when cluster `alias` refused the TLS handshake (`tls`) or the login,
    whichever client saw it; `detail` is the client's error text (shown for TLS only: a
    refused login says nothing more). `props` are the cluster's librdkafka properties;
    no secret is read."""
    if tls:
        return (
            f"cluster {alias}: TLS handshake failed ({detail}): check "
            f"{alias}.ssl.truststore.location (or ssl.ca.location) and the brokers' "
            "certificates"
        )
    mechanism = props.get("sasl.mechanism") or props.get("sasl.mechanisms") or "GSSAPI"
    user = props.get("sasl.username")
    who = f" as user {user}" if user else ""
    return (
        f"cluster {alias}: authentication failed (SASL {mechanism}{who}): check "
        f"sasl.jaas.config (or {alias}.sasl.username and sasl.password)"
    )


def access_error(props: Mapping[str, str], timeout: float = 10.0) -> KafkaError | None:
    """The authentication or TLS error a cluster answers with, if any.

    None when the cluster answers (`cluster_metadata`), cannot be reached, or gives
    no answer within `timeout`: retrying is the parts' business then. librdkafka
    reports these errors through error_cb, served by poll(), so the Metadata requests
    are short ones (ACCESS_ASK_TIMEOUT) with a poll between them, on the caller's
    thread: nothing is left asking once this returns, and a refused login ends
    `mm2py run` at once.
    """
    errors: list[KafkaError] = []
    admin = admin_client(props, {"error_cb": errors.append})
    deadline = time.monotonic() + timeout
    grace_set = False
    while True:
        admin.poll(0)
        refused = next((err for err in errors if err.code() in _ACCESS_ERRORS), None)
        if refused is not None:
            return refused
        if errors and not grace_set:
            # A refused TLS handshake may be reported as a transport error first and as
            # _SSL on a later attempt: wait for that briefly, then take the cluster for
            # unreachable.
            deadline = min(deadline, time.monotonic() + UNREACHABLE_GRACE)
            grace_set = True
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            cluster_metadata(admin, min(ACCESS_ASK_TIMEOUT, left))
        except KafkaException as exc:
            failure = exc.args[0] if exc.args else None
            if isinstance(failure, KafkaError) and failure.code() in _ACCESS_ERRORS:
                return failure
            continue  # no answer yet
        return None  # the cluster answers
