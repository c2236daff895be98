"""Remote topics: what to create or grow (pure), and that a refresh asks the target
once per kind of change however many topics are new (a fake admin counts requests)."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from mm2py.compat.topic_configs import SOURCE_DEFAULT, SOURCE_TOPIC, ConfigPropertyFilter
from mm2py.config import load_config
from mm2py.config.rules import FlowRules
from mm2py.replication.remote_topics import ensure_remote_topics, plan_remote_topics


def _done(value: Any = None, error: KafkaError | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(value)
    return future


class _Entry:
    def __init__(self, name: str, value: str, source: int) -> None:
        self.name, self.value, self.source = name, value, source
        self.is_read_only = self.is_sensitive = False


class FakeAdmin:
    """Answers DescribeConfigs, CreateTopics and CreatePartitions; counts the requests."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.requests: list[tuple[str, int]] = []  # (request, how many topics)
        self.created: dict[str, tuple[int, dict[str, str]]] = {}
        self.grown: dict[str, int] = {}
        self.refuse = refuse or set()

    def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
        self.requests.append(("DescribeConfigs", len(resources)))
        return {
            r: _done(
                {
                    "retention.ms": _Entry("retention.ms", "-1", SOURCE_TOPIC),
                    "segment.ms": _Entry("segment.ms", "604800000", SOURCE_DEFAULT),
                }
            )
            for r in resources
        }

    def create_topics(self, new: list[Any], request_timeout: float) -> Any:
        self.requests.append(("CreateTopics", len(new)))
        out = {}
        for topic in new:
            if topic.topic in self.refuse:
                out[topic.topic] = _done(error=KafkaError(KafkaError.POLICY_VIOLATION))
            else:
                self.created[topic.topic] = (topic.num_partitions, dict(topic.config))
                out[topic.topic] = _done()
        return out

    def create_partitions(self, new: list[Any], request_timeout: float) -> Any:
        self.requests.append(("CreatePartitions", len(new)))
        for p in new:
            self.grown[p.topic] = p.new_total_count
        return {p.topic: _done() for p in new}


def _rules(tmp_path: Path) -> FlowRules:
    path = tmp_path / "mm2.properties"
    path.write_text(
        "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
        "A->B.enabled = true\nreplication.factor = 1\n"
    )
    return FlowRules(load_config(path).flow("A", "B"))


def test_plan_creates_missing_and_grows_smaller_never_shrinks() -> None:
    plan = plan_remote_topics({"A.new": 4, "A.small": 6, "A.big": 2}, {"A.small": 3, "A.big": 5})
    assert plan.create == {"A.new": 4} and plan.grow == {"A.small": 6}


def test_500_new_topics_are_one_describe_one_create_and_one_grow_request(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    source: Any = FakeAdmin()
    target: Any = FakeAdmin()
    topics = {f"t{i}": 4 for i in range(500)}
    existing = {"A.t0": 2}  # exists with fewer partitions: grown
    result = ensure_remote_topics(rules, source, target, topics, existing, ConfigPropertyFilter([]))
    assert source.requests == [("DescribeConfigs", 499)]
    assert target.requests == [("CreateTopics", 499), ("CreatePartitions", 1)]
    assert len(target.created) == 499 and target.grown == {"A.t0": 4}
    # Created with the source's own configs, not its defaults.
    assert target.created["A.t7"] == (4, {"retention.ms": "-1"})
    assert result.ready == set(topics) and not result.failed
    assert len(result.changed) == 500


def test_a_refused_topic_is_named_and_the_others_are_ready(tmp_path: Path) -> None:
    rules = _rules(tmp_path)
    target: Any = FakeAdmin(refuse={"A.bad"})
    source: Any = FakeAdmin()
    result = ensure_remote_topics(
        rules, source, target, {"bad": 1, "good": 1}, {}, ConfigPropertyFilter([])
    )
    assert result.ready == {"good"}
    assert "cannot create topic 'A.bad'" in result.failed["bad"]
    assert "cluster B" in result.failed["bad"]
    assert "A.bad" not in result.changed
