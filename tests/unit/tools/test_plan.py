"""`mm2py plan`'s pure decisions: why a topic is copied or left out, and the internal topics."""

from __future__ import annotations

from pathlib import Path

from mm2py.config import load_config
from mm2py.config.rules import FlowRules
from mm2py.tools.plan import internal_topics, left_out_reason, topic_choice


def _rules(tmp_path: Path, extra: str = "") -> tuple[FlowRules, Path]:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\n"
        "A.bootstrap.servers = a:9092\n"
        "B.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\n"
        "topics = orders.*, B\\\\.payments\n"
        "topics.exclude = orders-test\n" + extra
    )
    config = load_config(path)
    return FlowRules(config.flow("A", "B")), path


def test_each_left_out_topic_has_its_reason(tmp_path: Path) -> None:
    rules, _ = _rules(tmp_path)
    assert topic_choice(rules, "orders") == "topics"
    assert topic_choice(rules, "heartbeats") == "heartbeats"  # flows even without a match
    assert topic_choice(rules, "orders-test") is None
    assert left_out_reason(rules, "orders-test") == "topics.exclude"
    assert left_out_reason(rules, "invoices") == "no match"
    assert left_out_reason(rules, "__consumer_offsets") == "internal"
    assert left_out_reason(rules, "mm2-offset-syncs.B.internal") == "internal"
    assert left_out_reason(rules, "B.payments") == "cycle"  # came from the target


def test_internal_topics_of_a_flow_and_of_a_pair_that_only_heartbeats(tmp_path: Path) -> None:
    _, path = _rules(tmp_path, "tasks.max = 4\noffset-syncs.topic.location = target\n")
    config = load_config(path)
    flows = config.enabled_flows()
    planned = {
        (t.cluster, t.topic, t.partitions) for t in internal_topics(flows, config.heartbeat_flows())
    }
    assert planned == {
        ("B", "mm2-offsets.A.internal", 25),
        ("B", "mm2-offset-syncs.B.internal", 1),
        ("B", "A.checkpoints.internal", 1),
        ("B", "mm2py-tasks.A.4.internal", 4),
        ("B", "heartbeats", 1),
        # B->A replicates nothing but emits heartbeats into A, as MM2 does.
        ("A", "heartbeats", 1),
        ("A", "mm2py-tasks.B.1.internal", 1),
    }
