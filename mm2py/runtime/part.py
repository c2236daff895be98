"""What the daemon runs: parts of a flow, each on its own thread with start()/stop()."""

from __future__ import annotations

import gc
import logging
import threading
import traceback
from abc import ABC, abstractmethod

from confluent_kafka import KafkaError

from mm2py import logs
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.config.rules import FlowRules
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.reachability import UNREACHABLE_ERRORS, Reachability

log = logging.getLogger(__name__)

# How long stopping a part (its thread winding down) may take before the caller goes on.
STOP_TIMEOUT = 9.0


def freeze_start_up() -> None:
    """Keep what start-up made (modules, config, FastAPI's app) out of the collector.

    It lives as long as the process. Left in, the collector's older passes walk it
    again and again: in the daemon every thread, copy loops too, paused 30-50 ms about
    twice a minute; in a task process copying small records the consumer's new record
    objects set those passes off so often that they took ~12% of its time.
    """
    gc.collect()
    gc.freeze()


class Part(ABC):
    """One job of one flow (source, checkpoint, heartbeat, ...).

    `run()` works until `stopping` is set; an exception ends the part, is counted
    in mm2py_errors_total{part=name} and the daemon restarts the part with backoff.

    `pause()` stops the part's work until `resume()`; by default by stopping its
    run (the daemon does not restart a part paused so). A part that can pause in
    place (the source part) overrides both and sets `pauses_in_place`: its run
    goes on while paused, and is restarted (paused) if it fails meanwhile.

    `clusters()` names the clusters the part talks to; while one of them is
    unreachable (`reachability`, set by the daemon) the part shows UNREACHABLE.
    """

    name = "part"
    # True for a part whose pause() keeps its run going (paused in place): the
    # daemon restarts such a run if it fails while paused, and it starts paused.
    pauses_in_place = False

    def __init__(self, flow: FlowConfig, metrics: Metrics) -> None:
        self.flow = flow
        self.metrics = metrics
        self.errors = metrics.errors.labels(flow.source, flow.target, self.name)
        self.stopping = threading.Event()
        self.error: BaseException | None = None
        self.error_trace: str | None = None
        self.paused = False
        self.reachability: Reachability | None = None
        self._thread: threading.Thread | None = None

    def clusters(self) -> tuple[str, ...]:
        """The clusters this part talks to: its flow's target (heartbeats)."""
        return (self.flow.target,)

    def note_client_error(self, alias: str, err: KafkaError) -> None:
        """For an error_cb of a client of `alias`: a transport failure counts against it."""
        if self.reachability is not None and err.code() in UNREACHABLE_ERRORS:
            self.reachability.failed(alias)

    @abstractmethod
    def run(self) -> None:
        """Do the part's work until `self.stopping` is set."""

    def start(self) -> None:
        self.stopping.clear()
        self.error = None
        self.error_trace = None
        self._thread = threading.Thread(
            target=self._run_guarded, name=f"{self.name}-{self.flow.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def pause(self) -> None:
        """Stop working until `resume()` (returns at once; the run winds down on its own)."""
        self.paused = True
        self.stopping.set()

    def resume(self, timeout: float = STOP_TIMEOUT) -> None:
        """Work again after `pause()`."""
        self.paused = False
        if self.stopping.is_set():
            self.stop(timeout)
            self.start()

    def restart(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop and start again (a paused part stays paused)."""
        self.stop(timeout)
        if not self.paused:
            self.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def idle_by_request(self) -> bool:
        """Not running because it was paused (not because it failed)."""
        return self.paused and not self.pauses_in_place

    def _run_guarded(self) -> None:
        logs.set_context(flow=self.flow.name, part=self.name)
        try:
            self.run()
        except BaseException as exc:  # the daemon restarts the part and reports the error
            self.error = exc
            # A task process's own trace, where the error came from one (TaskFailed).
            self.error_trace = getattr(exc, "trace", None) or traceback.format_exc()
            self.errors.inc()
            log.error("flow %s: %s part failed: %s", self.flow.name, self.name, exc, exc_info=True)


class FlowPart(Part):
    """A part that works between its flow's two clusters, by the flow's rules."""

    def __init__(
        self, flow: FlowConfig, source: ClusterConfig, target: ClusterConfig, metrics: Metrics
    ) -> None:
        super().__init__(flow, metrics)
        self.rules = FlowRules(flow)
        self.source = source
        self.target = target

    def clusters(self) -> tuple[str, ...]:
        return (self.flow.source, self.flow.target)
