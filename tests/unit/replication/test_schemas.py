"""Schema id translation in the copy loop and the translator's bookkeeping, against an
in-memory registry that answers as Confluent's API does (ids per content, versions per
subject, 404 for what it does not hold). Real registries: tests/integration/
test_schema_registry.py."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka.schema_registry import RegisteredSchema, Schema, SchemaReference
from confluent_kafka.schema_registry.common.schema_registry_client import SchemaVersion
from confluent_kafka.schema_registry.error import SchemaRegistryError

from mm2py.compat.schema_framing import header
from mm2py.replication.copy_loop import CopyLoop, NewPartition
from mm2py.replication.schemas import SchemaTranslator
from mm2py.replication.stats import ReplicationStats, SchemaStats
from tests.unit.replication.test_copy_loop import (
    FakeConsumer,
    FakeProducer,
    FakeProgress,
    Record,
)


class MemoryRegistry:
    """Confluent's registry semantics, in memory: an id per distinct content (schema,
    type, references), subjects as lists of ids (versions from 1)."""

    def __init__(self, first_id: int = 1) -> None:
        self.contents: dict[int, Schema] = {}
        self.subjects: dict[str, list[int]] = {}
        self.levels: dict[str, str] = {}
        self.next_id = first_id

    def _key(self, schema: Schema) -> tuple[object, ...]:
        refs = tuple((r.name, r.subject, r.version) for r in schema.references or [])
        return schema.schema_str, schema.schema_type, refs

    def register_schema(self, subject: str, schema: Schema) -> int:
        same = [i for i, held in self.contents.items() if self._key(held) == self._key(schema)]
        if same:
            schema_id = same[0]
        else:
            schema_id, self.next_id = self.next_id, self.next_id + 1
            self.contents[schema_id] = schema
        versions = self.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return schema_id

    def get_schema(self, schema_id: int) -> Schema:
        if schema_id not in self.contents:
            raise SchemaRegistryError(404, 40403, f"Schema {schema_id} not found")
        return self.contents[schema_id]

    def get_schema_versions(self, schema_id: int) -> list[SchemaVersion]:
        return [
            SchemaVersion(subject, ids.index(schema_id) + 1)
            for subject, ids in self.subjects.items()
            if schema_id in ids
        ]

    def get_versions(self, subject: str) -> list[int]:
        if subject not in self.subjects:
            raise SchemaRegistryError(404, 40401, f"Subject {subject} not found")
        return list(range(1, len(self.subjects[subject]) + 1))

    def get_version(self, subject: str, version: int) -> RegisteredSchema:
        schema_id = self.subjects[subject][version - 1]
        return RegisteredSchema(
            schema_id=schema_id,
            guid=None,
            schema=self.contents[schema_id],
            subject=subject,
            version=version,
        )

    def lookup_schema(self, subject: str, schema: Schema) -> RegisteredSchema:
        for version, schema_id in enumerate(self.subjects.get(subject, []), 1):
            if self._key(self.contents[schema_id]) == self._key(schema):
                return RegisteredSchema(
                    schema_id=schema_id, guid=None, schema=schema, subject=subject, version=version
                )
        raise SchemaRegistryError(404, 40403, "Schema not found")

    def get_compatibility(self, subject: str | None = None) -> str:
        if subject is None:
            return "BACKWARD"
        if subject not in self.levels:
            raise SchemaRegistryError(404, 40408, "Subject has no compatibility level")
        return self.levels[subject]

    def set_compatibility(self, subject: str, level: str) -> str:
        self.levels[subject] = level
        return level


def _avro(name: str) -> Schema:
    return Schema(f'{{"type": "record", "name": "{name}", "fields": []}}', "AVRO")


def _framed(schema_id: int, payload: bytes = b"\x02\x06abc") -> bytes:
    return header(schema_id) + payload


def _loop(
    source: MemoryRegistry, target: MemoryRegistry, stats: SchemaStats | None = None
) -> tuple[CopyLoop, FakeProducer]:
    producer = FakeProducer()
    loop = CopyLoop(
        "A->B",
        "B",
        FakeConsumer(),
        producer,
        FakeProgress(),  # type: ignore[arg-type]
        None,
        ReplicationStats("A", "B"),
        {},
        schemas=SchemaTranslator("A->B", source, target, stats=stats),
    )
    return loop, producer


def test_framed_keys_and_values_get_the_targets_ids_and_nothing_else_changes() -> None:
    source, target = MemoryRegistry(), MemoryRegistry(first_id=100)
    value_id = source.register_schema("t-value", _avro("V"))
    key_id = source.register_schema("t-key", _avro("K"))
    stats = SchemaStats()
    loop, producer = _loop(source, target, stats)
    loop.assign([NewPartition("t", 0, "A.t")], {})  # copies t's subjects up front
    assert target.subjects == {"A.t-key": [100], "A.t-value": [101]}
    records = [
        Record("t", 0, 0, _framed(value_id), _framed(key_id)),
        Record("t", 0, 1, b"plain", b"\x00\x01"),  # not framed (too short)
        Record("t", 0, 2, None, _framed(key_id)),  # a tombstone with a framed key
    ]
    loop.consumer.queued += records
    loop.copy_batch(lambda: False)
    assert [(r.key(), r.value()) for r in producer.written] == [
        (_framed(100), _framed(101)),
        (b"\x00\x01", b"plain"),
        (_framed(100), None),
    ]
    assert stats.ids_translated == 3


def test_an_unresolvable_id_stops_its_partition_naming_the_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, target = MemoryRegistry(), MemoryRegistry(first_id=100)
    value_id = source.register_schema("t-value", _avro("V"))
    stats = SchemaStats()
    loop, producer = _loop(source, target, stats)
    loop.assign([NewPartition("t", 0, "A.t"), NewPartition("t", 1, "A.t")], {})
    loop.consumer.queued += [
        Record("t", 0, 0, _framed(value_id)),
        Record("t", 0, 1, _framed(4242)),
        Record("t", 0, 2, _framed(value_id)),
        Record("t", 1, 0, _framed(value_id)),
    ]
    with caplog.at_level(logging.ERROR):
        loop.copy_batch(lambda: False)
        producer.poll()
    failure = loop.failed_partitions()["A.t-0"]
    assert "schema id 4242 of the value of record t-0 offset 1 cannot be resolved" in failure
    assert [(r.partition(), r.value()) for r in producer.written] == [
        (0, _framed(100)),
        (1, _framed(100)),
    ]
    assert ("t", 0) in loop.consumer.paused
    assert stats.failures == 1


def test_references_point_at_the_targets_versions_and_subjects_follow_the_remote_topic() -> None:
    source, target = MemoryRegistry(), MemoryRegistry(first_id=50)
    target.register_schema("shared", _avro("Unrelated"))  # the target's "shared" has v1 already
    inner = source.register_schema("shared", _avro("Inner"))
    outer = Schema(_avro("Outer").schema_str, "AVRO", [SchemaReference("Inner", "shared", 1)])
    outer_id = source.register_schema("orders-value", outer)
    other_id = source.register_schema("com.acme.Event", _avro("Event"))  # RecordNameStrategy
    source.set_compatibility("orders-value", "FULL")
    translator = SchemaTranslator("A->B", source, target)

    got = translator.resolve("orders", "A.orders", header(outer_id), False)
    copied = target.contents[int.from_bytes(got[1:], "big")]
    assert [(r.name, r.subject, r.version) for r in copied.references] == [("Inner", "shared", 2)]
    assert target.subjects["shared"][1] == target.register_schema("shared", _avro("Inner"))
    assert list(target.subjects) == ["shared", "A.orders-value"]
    # Its own level for orders-value; the source's global one for the others.
    assert target.levels == {"A.orders-value": "FULL", "shared": "BACKWARD"}
    event = translator.resolve("orders", "A.orders", header(other_id), False)
    assert target.subjects["com.acme.Event"] == [int.from_bytes(event[1:], "big")]
    # Cached: asking again makes no request.
    lookups = translator.stats.lookups
    assert translator.heads("orders")[header(outer_id)] == got
    assert translator.translate("orders", "A.orders", _framed(outer_id), False) == (
        got + _framed(outer_id)[5:]
    )
    assert translator.stats.lookups == lookups
    assert inner != outer_id


class UnreachableRegistry(MemoryRegistry):
    """A registry that never answers (the client's HTTP error)."""

    asked = 0

    def get_versions(self, subject: str) -> list[int]:
        self.asked += 1
        raise ConnectionError("[Errno 111] Connection refused")

    def get_schema(self, schema_id: int) -> Schema:
        self.asked += 1
        raise ConnectionError("[Errno 111] Connection refused")


def test_a_registry_that_cannot_be_asked_ends_the_loop_and_copies_nothing() -> None:
    source = UnreachableRegistry()
    loop, producer = _loop(source, MemoryRegistry())
    # Copying subjects up front gives up at the first failure, not once per topic.
    loop.assign([NewPartition(t, 0, f"A.{t}") for t in ("t", "u", "v")], {})
    assert source.asked == 1
    loop.consumer.queued += [Record("t", 0, 0, _framed(7)), Record("t", 0, 1, _framed(7))]
    with pytest.raises(RuntimeError, match="the source schema registry could not be asked"):
        loop.copy_batch(lambda: False)
    assert producer.written == [] and loop.failed_partitions() == {}
