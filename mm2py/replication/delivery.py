"""Delivery proof: which source offsets the target holds, and which must be copied again.

Records are sent in runs (`Run`: consecutive source offsets of one partition). Delivery
reports of one partition come in order (idempotent producer). Invariants:
- A. `PartitionState.acked` is a source offset whose record, and every one before it since
  the partition started, the target acknowledged, one after another.
- B. Nothing at or past `PartitionState.unproven_from` counts as acknowledged.
- C. A run without a report per record is proven only when its first and last reports are
  target offsets `count - 1` apart; else its partition is unproven past the first record.
- D. A partition with a run not proven gets a report per record (`per_record_reports`) for
  as long as the caller keeps the set.
- E. The proof talks to no client: what follows from a report (an offset sync, records
  counted, copying again, a loop-ending failure) goes to its `ProofOutcomes` (the loop's
  committer, mm2py.replication.committers).
A run's state is (first source offset, count, first target offset), nothing per record, so
a copier of whole record batches can prove them here too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, TopicPartition

from mm2py.logs import partition_fields
from mm2py.replication.offset_syncs import SyncRule
from mm2py.replication.stats import PartitionStats

log = logging.getLogger(__name__)

SourcePartition = tuple[str, int]
# `PartitionState.unproven_from` of a partition whose every record sent may still count.
NONE_UNPROVEN = 2**62
# `Run.count` while records are still being added to the run.
OPEN_RUN = 2**62
# `PartitionState.stop_at` of a partition copied for as long as it is assigned.
NO_STOP = 2**62
# Called when the target rejected a record: (partition, source offset, reason, record size).
StopPartition = Callable[["PartitionState", int, str, int], None]


class ProofOutcomes(Protocol):
    """Where what the proof finds goes; `Committer` implements it per delivery mode."""

    @property
    def aborting(self) -> bool:
        """Whether what is in flight will be dropped whatever its reports say."""

    def fail(self, reason: str, replace: bool = False) -> None:
        """The loop must end (the part restarts)."""

    def on_copied(
        self, stats: PartitionStats, count: int, first_ts: int, last_ts: int, now: float
    ) -> None:
        """`count` more records proven, timestamps `first_ts`..`last_ts` (ms), at `now`."""

    def on_sync(self, state: PartitionState, upstream: int, downstream: int) -> None:
        """An offset sync the proof found."""

    def copy_again(self, state: PartitionState, offset: int) -> str:
        """`state`'s partition must be copied again from `offset`; says how."""

    def not_proven(self, reason: str) -> None:
        """Records were sent that are not proven (`reason` names them)."""


@dataclass
class PartitionState:
    """The copy state of one source partition and its remote partition."""

    topic: str
    partition: int
    remote_topic: str
    stats: PartitionStats
    read: int = -1  # last source offset produced to the target
    acked: int = -1  # last source offset the target acknowledged
    acked_downstream: int = -1
    submitted: int = -1  # last offset sent to the progress topic
    committed: int = -1  # last offset the progress topic acknowledged
    syncs: SyncRule = field(default_factory=SyncRule)
    failure: str | None = None
    # The first source offset not known to be copied: one the target rejected, or the
    # first one after a run's first record when the run was not proven. Nothing from
    # there counts as acknowledged.
    unproven_from: int = NONE_UNPROVEN
    report_every_record: bool = False  # a delivery report per record, not per run
    # Where the consumer was sent anew for this partition (a copy again, an assignment
    # after its topic was created again): until a record at or past it is read, the
    # consumer's position may still be the one before (a seek takes effect later).
    sought: int = -1
    reporting: Run | None = None  # the run whose delivery reports come now
    gone: bool = False  # its source topic was deleted; unassigned until it exists again
    failed_size: int = 0
    # The source offset copying ends before (a backfill range's end), and whether every
    # offset before it was read (records, or the partition's end reached).
    stop_at: int = NO_STOP
    at_stop: bool = False
    # What the reports showed of the remote partition: the target offset of the first
    # record acknowledged, and the target offsets other writers took among the records.
    first_downstream: int = -1
    foreign: int = 0
    # The source offset and error behind `failure` when it is not the target rejecting a
    # record (a schema id that cannot be resolved: mm2py.replication.schemas).
    failure_cause: tuple[int, Exception] | None = None
    # The source partition as the consumer's calls take it, made once: `update_lag` asks
    # for every partition's watermarks each second, and a new TopicPartition per call was
    # a third of that pass's CPU (2,000 partitions: 8.3 ms, 5.1 ms with this one).
    source_tp: TopicPartition = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.source_tp = TopicPartition(self.topic, self.partition)

    def progress(self) -> int:
        """The last source offset copied, as progress records it: `acked`, or at its stop
        offset, every record read acknowledged, the one before the stop (the offsets
        after the last record are transaction markers or aborted records)."""
        if self.at_stop and self.acked >= self.read:
            return self.stop_at - 1
        return self.acked

    def acknowledged_so_far(self) -> None:
        """Count in `acked` the records of the run reporting now that the target has
        acknowledged so far (a whole run is counted at its end)."""
        run = self.reporting
        if run is not None and run.expect >= 0:
            upstream = run.first + run.expect - run.base - 1
            if self.acked < upstream < self.unproven_from:
                self.acked = upstream
                self.acked_downstream = run.expect - 1


class Run:
    """Records of one source partition with consecutive offsets, sent one after another.

    Reports come in the order the records were produced. `on_end` is the callback of
    its first and last records (the others have none): the last is expected where the
    first says the run ends; anything else goes to `DeliveryProof._end_report`. A
    partition reporting every record has `on_delivery` for each: target offsets are
    expected to follow each other, a record at `expect` is counted with one comparison;
    anything else (the run's first report, a gap on the target, an error) goes to
    `DeliveryProof._delivery_slow`.
    """

    __slots__ = (
        "base",
        "count",
        "errors",
        "expect",
        "first",
        "proof",
        "state",
        "stop",
        "ts",
        "ts_last",
    )

    def __init__(self, proof: DeliveryProof, state: PartitionState, first: int, ts: int) -> None:
        self.proof = proof
        self.state = state
        self.first = first  # source offset of its first record
        self.ts = ts  # timestamp (ms) of its first record
        self.ts_last = ts  # and of its last
        self.count = OPEN_RUN  # records produced; set when the run is closed
        self.expect = -1  # target offset of the next record; -1 before the first report
        self.base = 0  # target offset its first record would have at the current distance
        self.errors = 0  # reports with an error before the first acknowledgement
        self.stop = -1  # `expect` once every record is acknowledged (known when closed)

    def on_delivery(self, err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() == self.expect:
            self.expect += 1
            if self.expect == self.stop:
                self.proof._run_acknowledged(self)
            return
        self.proof._delivery_slow(self, err, msg)

    def on_end(self, err: KafkaError | None, msg: Any) -> None:
        if err is None and msg.offset() == self.stop - 1:
            self.expect = self.stop
            self.proof._run_acknowledged(self)
            return
        self.proof._end_report(self, err, msg)

    def close(self, count: int) -> None:
        """No more records: `count` were produced."""
        self.count = count
        if self.expect >= 0:
            self.stop = self.base + count
            if self.expect == self.stop:
                self.proof._run_acknowledged(self)


class DeliveryProof:
    """Turns delivery reports into proven progress, offset syncs and copies again.

    `start_run` opens a run, `reports` gives the producer's callback for each of its
    records, `Run.close` ends it, `cut` ends it early. What follows goes to `committer`;
    a rejected record to `stop_partition`.
    """

    def __init__(
        self,
        flow_name: str,
        target_alias: str,
        committer: ProofOutcomes,
        stop_partition: StopPartition,
        per_record_reports: set[SourcePartition] | None = None,
    ) -> None:
        """`per_record_reports`: partitions that get a report per record, kept by the
        caller across loops; the proof adds those whose run it could not prove."""
        self.flow_name = flow_name
        self.target_alias = target_alias
        self.committer = committer
        self._stop_partition = stop_partition
        self.per_record_reports = per_record_reports if per_record_reports is not None else set()
        # A delivery report was served since the caller last cleared it.
        self.report_served = False

    def start_run(self, state: PartitionState, first: int, ts: int) -> Run:
        """A run of `state`'s partition from source offset `first` (timestamp `ts`, ms)."""
        return Run(self, state, first, ts)

    @staticmethod
    def reports(run: Run, count: int) -> list[Callable[[KafkaError | None, Any], None] | None]:
        """The delivery callback of each of `count` records of `run` (None: no report)."""
        if run.state.report_every_record:
            return [run.on_delivery] * count
        if count == 1:
            return [run.on_end]
        return [run.on_end, *([None] * (count - 2)), run.on_end]

    def cut(self, run: Run, stop: int) -> None:
        """`run` (closed) ends before source offset `stop`, which was not sent. Unless
        every record reports, the last one sent asked for no report: nothing after the
        run's first record can be proven copied."""
        state = run.state
        if stop - run.first > 1 and not state.report_every_record:
            state.unproven_from = min(state.unproven_from, run.first + 1)
            self.committer.not_proven(
                f"flow {self.flow_name}: {state.topic}-{state.partition} offsets "
                f"{run.first + 1}..{stop - 1} were sent without the report that proves them"
            )

    def _delivery_slow(self, run: Run, err: KafkaError | None, msg: Any) -> None:
        """A delivery report of `run` that is not the next contiguous acknowledgement:
        its first, one after a gap on the target, or an error."""
        self.report_served = True
        state = run.state
        # The record's place in the run: reports come in order, and a rejected record
        # takes no target offset.
        index = run.errors if run.expect < 0 else run.expect - run.base
        upstream = run.first + index
        if err is not None:
            if run.expect < 0:
                run.errors += 1
            else:
                run.base -= 1
            if self._ends_loop(state, upstream, err):
                return
            if state.failure is None and run.expect >= 0:
                # The records before it in this run were acknowledged.
                self._acknowledged(state, upstream - 1, run.expect - 1, index, run, time.time())
            self._stop_partition(state, upstream, err.str(), record_size(msg))
            return
        downstream = msg.offset()
        if run.expect >= 0:
            state.foreign += max(downstream - run.expect, 0)  # another writer's records
        elif state.first_downstream < 0:
            state.first_downstream = downstream
        if state.failure is None and state.syncs.on_copied(upstream, downstream):
            self.committer.on_sync(state, upstream, downstream)
        state.reporting = run
        run.base = downstream - index
        run.expect = downstream + 1
        if run.count != OPEN_RUN:
            run.stop = run.base + run.count
            if run.expect == run.stop:
                self._run_acknowledged(run)

    def _ends_loop(self, state: PartitionState, upstream: int, err: KafkaError) -> bool:
        """A delivery error that is not the target refusing the record `upstream`: the
        producer failed, the loop is aborting, or the record timed out (True)."""
        if producer_failed(err) or self.committer.aborting:
            # The loop ends (an open transaction aborts): only the first failure says why.
            self.committer.fail(f"writing to {self.target_alias}: {err.str()}")
            return True
        if err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            return True  # dropped by an abort
        if err.code() == KafkaError._MSG_TIMED_OUT:
            # Nothing is lost: the part restarts from its last progress.
            self.committer.fail(
                f"copying {state.topic}-{state.partition} offset {upstream} to "
                f"{state.remote_topic} on {self.target_alias} failed: {err.str()}",
                replace=True,
            )
            return True
        return False

    def _end_report(self, run: Run, err: KafkaError | None, msg: Any) -> None:
        """A report of `run`'s first or last record (not one per record) that does not
        end it: the first (where the target offsets start), an error, or the last where
        the first did not say."""
        self.report_served = True
        if run.errors:
            return  # its first record's report was an error, handled then
        state = run.state
        at_first = run.expect < 0
        if err is not None:
            if at_first:
                run.errors = 1
            upstream = run.first if at_first else run.first + run.count - 1
            if not self._ends_loop(state, upstream, err):
                self._unproven_run(
                    state,
                    run,
                    run.first if at_first else run.first + 1,
                    f"the target refused offset {upstream}: {err.str()}",
                )
            return
        downstream = msg.offset()
        if not at_first:
            # Target offsets past the run's length: other writers' records (unless one
            # of the run's was lost, which this report cannot tell).
            state.foreign += max(downstream - (run.base + run.count - 1), 0)
            self._unproven_run(
                state,
                run,
                run.first + 1,
                f"its {run.count} records went to {state.remote_topic} offsets {run.base} "
                f"to {downstream}, not one after another",
            )
            return
        if state.first_downstream < 0:
            state.first_downstream = downstream
        if (
            state.failure is None
            and run.first < state.unproven_from
            and state.syncs.on_copied(run.first, downstream)
        ):
            self.committer.on_sync(state, run.first, downstream)
        state.reporting = run
        run.base = downstream
        run.expect = downstream + 1
        if run.count != OPEN_RUN:
            run.stop = run.base + run.count
            if run.expect == run.stop:
                self._run_acknowledged(run)

    def _unproven_run(self, state: PartitionState, run: Run, offset: int, detail: str) -> None:
        """Nothing of `state`'s partition from `offset` counts; it is copied again from
        there with a report per record (how: `Committer.copy_again`)."""
        if offset >= state.unproven_from:
            return  # already: this run's first report, or an earlier run
        if offset > run.first:  # its first record is proven
            self._acknowledged(state, run.first, run.base, 1, run, time.time())
        state.unproven_from = offset
        where = (state.topic, state.partition)
        self.per_record_reports.add(where)
        last = run.first + run.count - 1
        again = self.committer.copy_again(state, offset)
        reason = (
            f"flow {self.flow_name}: copying {state.topic}-{state.partition} offsets "
            f"{offset}..{last} to {self.target_alias} is not proven: {detail}; {again}, with "
            "a delivery report per record"
        )
        log.warning("%s", reason, extra=partition_fields(*where))
        self.committer.not_proven(reason)

    def _run_acknowledged(self, run: Run) -> None:
        """Every record of `run` was acknowledged, the last at `run.expect - 1`."""
        self.report_served = True
        last = run.first + run.count - 1
        if last < run.state.unproven_from:
            self._acknowledged(run.state, last, run.expect - 1, run.count, run, time.time())

    def _acknowledged(
        self,
        state: PartitionState,
        upstream: int,
        downstream: int,
        count: int,
        run: Run,
        now: float,
    ) -> None:
        """Progress to `upstream` (at `downstream`), `count` more records of `run` copied."""
        if count <= 0:
            return
        state.acked = upstream
        state.acked_downstream = downstream
        # The last record's timestamp is known only for a whole run (a partial one: its first).
        last_ts = run.ts_last if count == run.count else run.ts
        self.committer.on_copied(state.stats, count, run.ts, last_ts, now)


def producer_failed(err: KafkaError) -> bool:
    """The producer as a whole cannot go on (a fatal error; fenced by another holder of
    its transactional id), as opposed to one record refused."""
    return bool(err.fatal() or err.code() in (KafkaError._FATAL, KafkaError._FENCED))


def record_size(msg: Any) -> int:
    """Key plus value bytes of a record."""
    key, value = msg.key(), msg.value()
    return (len(key) if key else 0) + (len(value) if value else 0)
