"""Whether each cluster answers: unreachable once it has given no answer for a grace period.

`Reachability` is the bookkeeping, pure and thread-safe, on an injected clock. Evidence
comes from two places: any client's error_cb reporting `_TRANSPORT` or
`_ALL_BROKERS_DOWN` (`failed`), and `ClusterProbe`, the daemon's one thread that asks
every cluster for a metadata answer every PROBE_INTERVAL (`clients.cluster_answers`:
`succeeded` when it comes, `failed` at the time it was asked when it does not). A
cluster whose first failure since its last answer is at least its grace old is
unreachable; the first answer makes it reachable again. A refused login or TLS handshake
(error_cb) is an answer: the probe's unanswered requests after it do not count until the
cluster answers again (the parts fail naming the access problem); transport errors still
do. Each change is logged once:
WARNING when a cluster becomes unreachable (after the grace), INFO when it answers
again.

Parts show UNREACHABLE for the clusters they use (mm2py.runtime.status), and
`mm2py_cluster_reachable{cluster}` is 1 or 0.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from mm2py.kafka import clients

log = logging.getLogger(__name__)

# Errors that say a client could not talk to the cluster at all.
UNREACHABLE_ERRORS = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})

PROBE_INTERVAL = 2.0
PROBE_TIMEOUT = 10.0
# librdkafka backs off reconnecting up to 10 s while a cluster is down; the probe tries
# every second, so that a cluster that is back is seen within about PROBE_INTERVAL.
PROBE_CLIENT_TUNING = {"reconnect.backoff.max.ms": 1000}


def clock_time(wall: float) -> str:
    """`12:03:04` in local time, as the log lines show it."""
    return time.strftime("%H:%M:%S", time.localtime(wall))


@dataclass(frozen=True)
class Outage:
    """A cluster that has not answered since `since` (wall-clock seconds)."""

    alias: str
    bootstrap: str
    since: float

    def describe(self) -> str:
        return f"cluster {self.alias} ({self.bootstrap}) since {clock_time(self.since)}"


@dataclass
class _Cluster:
    bootstrap: str
    grace: float
    failing_since: float | None = None  # monotonic, first failure since the last answer
    failing_since_wall: float | None = None
    reported: bool = False  # the "unreachable" line was logged
    # The cluster refused our login or certificate since its last answer: it answers, so
    # the probe's requests that then get no answer do not make it unreachable (the parts
    # fail and name the access problem); a transport error still does.
    refused: bool = False


class Reachability:
    """Per cluster alias: failing since when, and whether past its grace (thread-safe)."""

    def __init__(
        self,
        bootstraps: Mapping[str, str],
        grace: Mapping[str, float],
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`bootstraps` and `grace` (seconds) by cluster alias."""
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()
        self._clusters = {
            alias: _Cluster(bootstrap, grace[alias]) for alias, bootstrap in bootstraps.items()
        }

    @property
    def aliases(self) -> list[str]:
        return list(self._clusters)

    def now(self) -> float:
        """The clock `failed(at=...)` is measured on."""
        return self._clock()

    def grace(self, alias: str) -> float:
        return self._clusters[alias].grace

    def failed(self, alias: str, at: float | None = None) -> None:
        """A client could not reach `alias` (at monotonic time `at`, default now)."""
        now = self._clock()
        at = now if at is None else min(at, now)
        with self._lock:
            state = self._clusters.get(alias)
            if state is None or state.failing_since is not None:
                return
            state.failing_since = at
            state.failing_since_wall = self._wall() - (now - at)

    def unanswered(self, alias: str, asked: float) -> None:
        """The probe's request to `alias`, sent at monotonic time `asked`, got no answer:
        a failure, unless the cluster refused our login since its last answer."""
        with self._lock:
            state = self._clusters.get(alias)
            if state is None or state.refused:
                return
        self.failed(alias, at=asked)

    def refused(self, alias: str) -> None:
        """`alias` refused a login or a TLS handshake: it answers, so it is reachable until
        it answers a request (which ends the refusal) and then fails to."""
        self.succeeded(alias)
        with self._lock:
            state = self._clusters.get(alias)
            if state is not None:
                state.refused = True

    def succeeded(self, alias: str) -> None:
        """`alias` answered: reachable again."""
        with self._lock:
            state = self._clusters.get(alias)
            if state is None:
                return
            state.refused = False
            if state.failing_since is None:
                return
            reported, since_wall = state.reported, state.failing_since_wall
            state.failing_since = state.failing_since_wall = None
            state.reported = False
        if reported and since_wall is not None:
            log.info(
                "cluster %s (%s) is reachable again, after %.0f s without an answer",
                alias,
                state.bootstrap,
                self._wall() - since_wall,
            )

    def check(self) -> None:
        """Log the clusters that have just become unreachable (called every probe)."""
        for outage in self._newly_unreachable():
            log.warning(
                "cluster %s (%s) is unreachable: no answer since %s (%.0f s); its flows "
                "copy nothing until it answers (librdkafka's connection errors for it are "
                "logged at most once a minute)",
                outage.alias,
                outage.bootstrap,
                clock_time(outage.since),
                self._wall() - outage.since,
            )

    def _newly_unreachable(self) -> list[Outage]:
        now = self._clock()
        found = []
        with self._lock:
            for alias, state in self._clusters.items():
                if state.reported or not self._past_grace(state, now):
                    continue
                state.reported = True
                assert state.failing_since_wall is not None
                found.append(Outage(alias, state.bootstrap, state.failing_since_wall))
        return found

    @staticmethod
    def _past_grace(state: _Cluster, now: float) -> bool:
        return state.failing_since is not None and now - state.failing_since >= state.grace

    def outage(self, alias: str) -> Outage | None:
        """The outage of `alias` if it is unreachable (failing for at least its grace)."""
        now = self._clock()
        with self._lock:
            state = self._clusters.get(alias)
            if state is None or not self._past_grace(state, now):
                return None
            assert state.failing_since_wall is not None
            return Outage(alias, state.bootstrap, state.failing_since_wall)

    def outages(self, aliases: Iterable[str]) -> list[Outage]:
        """The outages among `aliases`, in their order, each alias once."""
        out = []
        for alias in dict.fromkeys(aliases):
            outage = self.outage(alias)
            if outage is not None:
                out.append(outage)
        return out

    def error_cb(self, alias: str) -> Callable[[KafkaError], None]:
        """An error_cb (or part of one) that notes transport failures for `alias`, and
        a refused login or certificate as an answer."""

        def note(err: KafkaError) -> None:
            if clients.is_access_error(err):
                self.refused(alias)
            elif err.code() in UNREACHABLE_ERRORS:
                self.failed(alias)

        return note


class ReachabilityCollector(Collector):
    """`mm2py_cluster_reachable{cluster}`: 1, or 0 while a cluster is unreachable."""

    def __init__(self, reachability: Reachability) -> None:
        self._reachability = reachability

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "mm2py_cluster_reachable",
            "1 while the cluster answers; 0 once it has not for cluster.unreachable.grace.ms "
            "(lag of its flows is then the last measured value).",
            labels=["cluster"],
        )
        for alias in self._reachability.aliases:
            gauge.add_metric([alias], 0.0 if self._reachability.outage(alias) else 1.0)
        yield gauge


class ClusterProbe:
    """One thread asking every cluster for a metadata answer every PROBE_INTERVAL."""

    def __init__(
        self,
        reachability: Reachability,
        admin_props: Mapping[str, Mapping[str, str]],
        interval: float = PROBE_INTERVAL,
        timeout: float = PROBE_TIMEOUT,
    ) -> None:
        """`admin_props`: each cluster's admin client settings, by alias (no network here)."""
        self._reachability = reachability
        self._admin_props = admin_props
        self._interval = interval
        # An answer not given within the grace is a failure from the moment it was asked.
        self._timeout = {
            alias: max(min(reachability.grace(alias), timeout), 1.0) for alias in admin_props
        }
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cluster-probe", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        reach = self._reachability
        admins = {
            alias: clients.admin_client(
                props, {**PROBE_CLIENT_TUNING, "error_cb": reach.error_cb(alias)}
            )
            for alias, props in self._admin_props.items()
        }
        pending: dict[str, Future[Any]] = {}
        self._probe(admins, pending)

    def _probe(self, admins: dict[str, Any], pending: dict[str, Future[Any]]) -> None:
        reach = self._reachability
        while True:
            for alias, admin in admins.items():
                admin.poll(0)  # serves error_cb
                if alias not in pending or pending[alias].done():
                    pending[alias] = self._ask(alias, admin)
            reach.check()
            if self._stopping.wait(self._interval):
                return

    def _ask(self, alias: str, admin: Any) -> Future[Any]:
        """One Metadata request to `alias`, waited for in a thread of its own: a daemon
        thread, as a cluster that does not answer must not hold the node's exit (a
        ThreadPoolExecutor's threads are joined when the interpreter ends)."""
        reach = self._reachability
        asked = reach.now()
        future: Future[Any] = Future()

        def ask() -> None:
            try:
                future.set_result(clients.cluster_answers(admin, self._timeout[alias]))
            except Exception as exc:  # the future carries it: a failed answer
                future.set_exception(exc)

        def answered(done: Future[Any]) -> None:
            if done.exception() is None:
                reach.succeeded(alias)
            else:
                reach.unanswered(alias, asked)

        future.add_done_callback(answered)
        threading.Thread(target=ask, name=f"cluster-probe-{alias}", daemon=True).start()
        return future
