"""The checkpoint part's pure rules: which checkpoints, when, where."""

from __future__ import annotations

from typing import Any

from mm2py.compat.formats import Checkpoint, OffsetSync
from mm2py.compat.offsets import OffsetSyncStore, Translation
from mm2py.config import FlowConfig
from mm2py.config.models import FlowSettings
from mm2py.config.rules import FlowRules
from mm2py.kafka.groups import CommittedOffset
from mm2py.parts.checkpoint import (
    CheckpointStore,
    is_newer,
    offsets_to_sync,
    proven_by_new_syncs,
    translate_group,
)


def _rules(**settings: Any) -> FlowRules:
    flow = FlowConfig(source="A", target="B", enabled=True, settings=FlowSettings(**settings))
    return FlowRules(flow)


def _cp(up: int, down: int, topic: str = "A.t", partition: int = 0) -> Checkpoint:
    return Checkpoint("g", topic, partition, up, down)


def test_checkpoints_only_move_forward_unless_the_group_was_rewound() -> None:
    assert is_newer(_cp(10, 10), None)
    assert is_newer(_cp(11, 11), _cp(10, 10))  # the group advanced
    assert is_newer(_cp(10, 12), _cp(10, 11))  # same offset, better translation
    assert not is_newer(_cp(10, 10), _cp(10, 10))  # nothing new
    assert not is_newer(_cp(10, 9), _cp(10, 10))  # would move the target offset back
    assert not is_newer(_cp(12, 9), _cp(10, 10))
    assert is_newer(_cp(5, 5), _cp(10, 10))  # rewound on the source: MM2 follows it


def test_translate_group_renames_and_skips_what_it_cannot_translate() -> None:
    syncs = OffsetSyncStore()
    syncs.add_all(
        [
            OffsetSync("t", 0, 0, 0),
            OffsetSync("t", 0, 99, 99),
            OffsetSync("t", 1, 50, 0),
            OffsetSync("B.back", 0, 0, 0),  # came from B: checkpointed under its own name
            OffsetSync("B.back", 0, 9, 9),
            OffsetSync("excluded", 0, 0, 0),
        ]
    )
    offsets = {
        ("t", 0): CommittedOffset(40, "m"),
        ("t", 1): CommittedOffset(10),  # before the first sync
        ("t", 2): CommittedOffset(10),  # no syncs
        ("B.back", 0): CommittedOffset(3),
        ("excluded", 0): CommittedOffset(3),
    }
    rules = _rules(**{"topics.exclude": ["excluded"]})
    out = translate_group("g", offsets, rules, syncs)
    assert out == [
        (Checkpoint("g", "back", 0, 3, 3, ""), Translation(3, True)),
        (Checkpoint("g", "A.t", 0, 40, 40, "m"), Translation(40, True)),
    ]


def test_a_group_ahead_of_the_syncs_gets_a_safe_checkpoint_first() -> None:
    syncs = OffsetSyncStore()
    syncs.add(OffsetSync("t", 0, 0, 0))
    ((cp, found),) = translate_group("g", {("t", 0): CommittedOffset(500)}, _rules(), syncs)
    assert (cp.downstream_offset, found.exact) == (1, False)
    syncs.add(OffsetSync("t", 0, 499, 499))
    ((cp, found),) = translate_group("g", {("t", 0): CommittedOffset(500)}, _rules(), syncs)
    assert (cp.downstream_offset, found.exact) == (500, True)


def test_new_syncs_prove_pending_checkpoints_at_once() -> None:
    """Issue 24: the group at 301 was checkpointed at 251 while the syncs were (0 -> 0)
    and (251 -> 250); (450 -> 449) proves 301 -> 300, written as soon as it is read."""
    syncs = OffsetSyncStore()
    syncs.add_all([OffsetSync("t", p, 0, 0) for p in (0, 1)])
    syncs.add_all([OffsetSync("t", p, 251, 250) for p in (0, 1)])
    offsets = {"g": {("t", 0): CommittedOffset(301, "m"), ("t", 1): CommittedOffset(301)}}
    store = CheckpointStore()
    ((cp0, _), (cp1, _)) = translate_group("g", offsets["g"], _rules(), syncs)
    store.add(cp0)
    store.add(cp1)
    pending = [("g", "A.t", 0), ("g", "A.t", 1)]
    assert cp0.downstream_offset == 251
    assert proven_by_new_syncs(offsets, pending, _rules(), syncs, store) == []
    syncs.add(OffsetSync("t", 0, 450, 449))
    assert proven_by_new_syncs(offsets, pending, _rules(), syncs, store) == [
        (Checkpoint("g", "A.t", 0, 301, 300, "m"), Translation(300, True))
    ]
    # Only pending keys, and groups whose offsets were read, are looked at.
    syncs.add(OffsetSync("t", 1, 450, 449))
    assert proven_by_new_syncs(offsets, pending[1:], _rules(), syncs, store) == [
        (Checkpoint("g", "A.t", 1, 301, 300, ""), Translation(300, True))
    ]
    assert proven_by_new_syncs({}, pending, _rules(), syncs, store) == []
    # Already written exact: nothing new.
    store.add(Checkpoint("g", "A.t", 0, 301, 300, "m"))
    assert proven_by_new_syncs(offsets, pending[:1], _rules(), syncs, store) == []


def test_group_offset_sync_never_moves_a_target_group_back() -> None:
    cps = {("A.t", 0): _cp(10, 10), ("A.t", 1): _cp(20, 20, partition=1), ("A.u", 0): _cp(5, 5)}
    target = {("A.t", 0): 12, ("A.t", 1): 3}  # A.u: not committed on the target yet
    assert offsets_to_sync(cps, target) == {
        ("A.t", 1): cps[("A.t", 1)],
        ("A.u", 0): cps[("A.u", 0)],
    }


def test_the_store_keeps_the_latest_checkpoint_per_group_and_partition() -> None:
    store = CheckpointStore()
    store.add(_cp(1, 1))
    store.add(_cp(2, 2))
    store.add(Checkpoint("h", "A.t", 0, 7, 7))
    assert store.get("g", "A.t", 0) == _cp(2, 2)
    assert store.of_group("h") == {("A.t", 0): Checkpoint("h", "A.t", 0, 7, 7)}
    assert store.get("x", "A.t", 0) is None
