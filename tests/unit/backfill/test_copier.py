"""What a failed range copy says: the range, and the cause in the target's or the
registry's words (the copy itself is the copy core's: tests/unit/replication)."""

from __future__ import annotations

import logging
from typing import Any

from mm2py.backfill.copier import RangeCopyError, RangeTask, _range_error
from mm2py.backfill.plan import OffsetRange
from mm2py.replication.committers import PartitionRejected, RunUnproven
from mm2py.replication.delivery import PartitionState
from mm2py.replication.schemas import UnresolvedSchema
from mm2py.replication.stats import PartitionStats
from mm2py.replication.transactions import TransactionFailed, TransactionLog

TASK = RangeTask("A->B", "A", "B", OffsetRange("t", 0, 0, 10), "A.t", "id", "p", 1, {}, {})
WHERE = "flow A->B: copying t-0 [0, 10) (range 1/1)"
REJECTED = "ProduceRequest for A.t [0] with 1 message(s) failed: Broker: Message size too large"


class _Loop:
    """The part of a CopyLoop the error reads: its partition states."""

    def __init__(self, state: PartitionState) -> None:
        self.by_source = {("t", 0): state}


def _state() -> PartitionState:
    return PartitionState("t", 0, "A.t", PartitionStats())


def _log(failure: str | None = None) -> TransactionLog:
    txn_log = TransactionLog(logging.getLogger("t"))
    txn_log.failure = failure
    return txn_log


def _error(exc: BaseException, txn_log: TransactionLog, state: Any = None) -> BaseException:
    return _range_error(TASK, exc, txn_log, _Loop(state or _state()))  # type: ignore[arg-type]


def test_an_unresolved_schema_id_names_the_record_and_the_way_out() -> None:
    state = _state()
    state.failure_cause = (6, UnresolvedSchema(987656, "not in the source registry"))
    error = _error(PartitionRejected("schema id 987656 of the value ..."), _log(), state)
    assert isinstance(error, RangeCopyError)
    assert str(error) == (
        f"{WHERE}: record t-0 offset 6: schema id 987656: not in the source registry; "
        "schema.registry.unresolved.ids = copy copies such records unchanged"
    )


def test_a_rejected_record_says_which_and_the_target_s_words() -> None:
    error = _error(PartitionRejected("target B rejected record t-0 offset 4: too large"), _log())
    assert str(error) == f"{WHERE}: target B rejected record t-0 offset 4: too large"
    error = _error(PartitionRejected("target B rejected record t-0 offset 4"), _log(REJECTED))
    assert str(error).endswith(f"offset 4: {REJECTED}")
    # A transaction that failed on the target's rejection says it as the target did.
    error = _error(TransactionFailed("flow A->B: committing to cluster B: x"), _log(REJECTED))
    assert str(error) == f"{WHERE}: {REJECTED}"


def test_a_run_not_proven_and_errors_of_the_copier_itself_pass_as_they_are() -> None:
    unproven = RunUnproven("t-0 offsets 1..2 ...")
    assert _error(unproven, _log(REJECTED)) is unproven
    stalled = RangeCopyError("flow A->B: copying t-0 [0, 10) (range 1/1): nothing read ...")
    assert _error(stalled, _log()) is stalled
    interrupted = KeyboardInterrupt()
    assert _error(interrupted, _log()) is interrupted
