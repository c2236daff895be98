"""Schema registry replication against real brokers and two real registries (Apicurio).

One daemon copies `sr-<run>.*` from A to B with ``schema.registry.sync.enabled``; each
test writes its own topic with confluent-kafka's serializers against A's registry and
reads the copies with confluent-kafka's deserializers against B's registry. B's registry
holds schemas of its own before the daemon starts, so the same schema has another id
there, and every copy must carry B's id.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.schema_registry import (
    Schema,
    SchemaReference,
    SchemaRegistryClient,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor_pb2 import FieldDescriptorProto

from mm2py.backfill.copier import RangeCopyError, RangeTask, copy_range
from mm2py.backfill.plan import OffsetRange
from mm2py.compat.schema_framing import schema_id
from mm2py.dev.launcher import LocalCluster
from tests.conftest import Clusters, Registries
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import Rec, create_topic, produce, read_all, wait_until

pytestmark = pytest.mark.integration
FieldType = FieldDescriptorProto.Type
Label = FieldDescriptorProto.Label

RUN = f"sr-{uuid.uuid4().hex[:6]}"
ORDER = {
    "type": "record",
    "name": "Order",
    "namespace": "mm2py.test",
    "fields": [{"name": "id", "type": "long"}, {"name": "item", "type": "string"}],
}
ORDER_V2 = {
    **ORDER,
    "fields": [*ORDER["fields"], {"name": "note", "type": "string", "default": ""}],
}
KEY = {
    "type": "record",
    "name": "OrderKey",
    "namespace": "mm2py.test",
    "fields": [{"name": "customer", "type": "string"}],
}


@dataclass
class Setup:
    a: LocalCluster
    b: LocalCluster
    source: SchemaRegistryClient  # A's registry
    target: SchemaRegistryClient  # B's registry
    daemon: RunningDaemon
    source_url: str
    target_url: str


@pytest.fixture(scope="module")
def setup(
    clusters: Clusters, registries: Registries, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    a, b = clusters["A"], clusters["B"]
    reg_a, reg_b = registries.up("A", "B")
    source = SchemaRegistryClient({"url": reg_a.url})
    target = SchemaRegistryClient({"url": reg_b.url})
    # B's registry holds other schemas first: the same schema gets another id there.
    for i in range(7):
        fields = [{"name": f"f{i}", "type": "int"}]
        schema = {"type": "record", "name": f"Other{i}", "fields": fields}
        target.register_schema(f"{RUN}-other-value", Schema(json.dumps(schema), "AVRO"))
    path = tmp_path_factory.mktemp("schemas") / "mm2.properties"
    extra = {
        "schema.registry.sync.enabled": "true",
        "A.schema.registry.url": reg_a.url,
        "B.schema.registry.url": reg_b.url,
    }
    path.write_text(mm2_properties(a, b, f"{RUN}.*", **extra))
    with running_daemon(path) as daemon:
        yield Setup(a, b, source, target, daemon, reg_a.url, reg_b.url)


def _copies(b: LocalCluster, remote: str, count: int, timeout: float = 60) -> list[Rec]:
    def probe() -> list[Rec] | None:
        try:
            records = read_all(b, remote, timeout=5)
        except Exception:
            return None
        return records if len(records) >= count else None

    return wait_until(probe, timeout, 0.5, f"{count} records in {remote}")


def _metric(daemon: RunningDaemon, name: str) -> float:
    """The value of the flow A->B's series of `name` on /metrics (0 when absent)."""
    for line in daemon.metrics().splitlines():
        if line.startswith(name + '{source="A",target="B"}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _order(pair: tuple[dict[str, Any], dict[str, Any]]) -> tuple[str, int]:
    return pair[0]["customer"], pair[1]["id"]


def _ctx(topic: str, field: str = MessageField.VALUE) -> SerializationContext:
    return SerializationContext(topic, field)


def test_avro_keys_and_values_get_the_targets_ids(setup: Setup) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.avro"
    create_topic(a, topic, partitions=2)
    values = AvroSerializer(source, json.dumps(ORDER))
    keys = AvroSerializer(source, json.dumps(KEY))
    orders = [({"customer": f"c{i % 3}"}, {"id": i, "item": f"item-{i}"}) for i in range(20)]
    records = [
        (i % 2, keys(k, _ctx(topic, MessageField.KEY)), values(v, _ctx(topic)))
        for i, (k, v) in enumerate(orders)
    ]
    produce(a, topic, records)

    copies = _copies(b, f"A.{topic}", len(records))
    remote = f"A.{topic}"
    read_values = AvroDeserializer(target)
    read_keys = AvroDeserializer(target)
    got = [
        (read_keys(c.key, _ctx(remote, MessageField.KEY)), read_values(c.value, _ctx(remote)))
        for c in copies
    ]
    assert sorted(got, key=_order) == sorted(orders, key=_order)
    assert len(copies) == len(records)  # one record out per record in
    # The payloads are the source's bytes; only the ids differ, and they are B's.
    source_ids = {schema_id(r[2]) for r in records} | {schema_id(r[1]) for r in records}
    target_ids = {schema_id(c.value) for c in copies} | {schema_id(c.key) for c in copies}
    assert source_ids.isdisjoint(target_ids)
    assert sorted(c.value[5:] for c in copies) == sorted(r[2][5:] for r in records)
    for subject in (f"{remote}-value", f"{remote}-key"):
        latest = target.get_latest_version(subject)
        assert latest.schema_id in target_ids
    assert target.get_latest_version(f"{remote}-value").schema.schema_str == (
        source.get_latest_version(f"{topic}-value").schema.schema_str
    )


def test_json_schema_values(setup: Setup) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.json"
    create_topic(a, topic)
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Payment",
        "type": "object",
        "properties": {"amount": {"type": "number"}, "currency": {"type": "string"}},
        "required": ["amount"],
    }
    write = JSONSerializer(json.dumps(schema), source)
    payments = [{"amount": i * 1.5, "currency": "EUR"} for i in range(10)]
    produce(a, topic, [(0, None, write(p, _ctx(topic))) for p in payments])

    copies = _copies(b, f"A.{topic}", len(payments))
    read = JSONDeserializer(None, schema_registry_client=target)
    assert [read(c.value, _ctx(f"A.{topic}")) for c in copies] == payments
    assert target.get_schema(schema_id(copies[0].value)).schema_type == "JSON"


def _protobuf_messages(package: str) -> tuple[Any, Any]:
    """Two message classes, Ping and Pong, of one .proto file (built at run time)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name=f"{package}.proto", package=package, syntax="proto3"
    )
    ping = proto.message_type.add(name="Ping")
    ping.field.add(name="n", number=1, type=FieldType.TYPE_INT32, label=Label.LABEL_OPTIONAL)
    pong = proto.message_type.add(name="Pong")
    pong.field.add(name="s", number=1, type=FieldType.TYPE_STRING, label=Label.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{name}"))
        for name in ("Ping", "Pong")
    )  # type: ignore[return-value]


def test_protobuf_values_keep_their_message_indexes(setup: Setup) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.proto"
    create_topic(a, topic)
    _, pong = _protobuf_messages(f"mm2py.{RUN.replace('-', '_')}")
    conf = {"use.deprecated.format": False}
    write = ProtobufSerializer(pong, source, conf)
    # Pong is the file's second message: its records carry message indexes [1].
    records = [write(pong(s=f"pong-{i}"), _ctx(topic)) for i in range(3)]
    assert records[0][5:7] == bytes([0x02, 0x02])
    produce(a, topic, [(0, None, value) for value in records])

    copies = _copies(b, f"A.{topic}", 3)
    read = ProtobufDeserializer(pong, conf, target)
    assert [read(c.value, _ctx(f"A.{topic}")).s for c in copies] == ["pong-0", "pong-1", "pong-2"]
    target_id = schema_id(copies[0].value)
    assert target_id is not None and target_id != schema_id(records[0])
    assert [c.value[5:] for c in copies] == [r[5:] for r in records]  # indexes and message
    copied = target.get_schema(target_id)
    assert copied.schema_type == "PROTOBUF"
    assert target.get_latest_version(f"A.{topic}-value").schema_id == target_id


def test_references_are_copied_first(setup: Setup) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.refs"
    create_topic(a, topic)
    address = {
        "type": "record",
        "name": "Address",
        "namespace": "mm2py.test",
        "fields": [{"name": "city", "type": "string"}],
    }
    customer = {
        "type": "record",
        "name": "Customer",
        "namespace": "mm2py.test",
        "fields": [{"name": "name", "type": "string"}, {"name": "home", "type": "Address"}],
    }
    ref_subject = f"{RUN}-address"
    source.register_schema(ref_subject, Schema(json.dumps(address), "AVRO"))
    reference = SchemaReference("mm2py.test.Address", ref_subject, 1)
    source.register_schema(f"{topic}-value", Schema(json.dumps(customer), "AVRO", [reference]))
    write = AvroSerializer(
        source, None, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    people = [{"name": f"n{i}", "home": {"city": f"city-{i}"}} for i in range(5)]
    produce(a, topic, [(0, None, write(p, _ctx(topic))) for p in people])

    copies = _copies(b, f"A.{topic}", len(people))
    read = AvroDeserializer(target)
    assert [read(c.value, _ctx(f"A.{topic}")) for c in copies] == people
    copied = target.get_latest_version(f"A.{topic}-value")
    assert [(r.name, r.subject) for r in copied.schema.references] == [
        ("mm2py.test.Address", ref_subject)
    ]
    assert target.get_latest_version(ref_subject).schema.schema_str == json.dumps(address)


def test_schema_registered_after_the_start_and_unknown_ids(setup: Setup) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.late"
    create_topic(a, topic, partitions=2)
    v1 = AvroSerializer(source, json.dumps(ORDER))
    produce(a, topic, [(0, None, v1({"id": 1, "item": "x"}, _ctx(topic)))])
    _copies(b, f"A.{topic}", 1)
    # A second version, registered while the daemon copies the topic.
    v2 = AvroSerializer(source, json.dumps(ORDER_V2))
    later = [{"id": i, "item": "y", "note": f"v2-{i}"} for i in range(4)]
    produce(a, topic, [(0, None, v2(o, _ctx(topic))) for o in later])
    # An id A's registry never gave: partition 1 stops at it, partition 0 goes on.
    good = v1({"id": 7, "item": "before"}, _ctx(topic))
    unknown = b"\x00" + (987654).to_bytes(4, "big") + good[5:]
    produce(a, topic, [(1, None, good), (1, None, unknown), (1, None, good)])
    produce(a, topic, [(0, None, v2({"id": 9, "item": "z", "note": "after"}, _ctx(topic)))])

    copies = _copies(b, f"A.{topic}", 7)
    read = AvroDeserializer(target)
    by_partition = {
        p: [read(c.value, _ctx(f"A.{topic}")) for c in copies if c.partition == p] for p in (0, 1)
    }
    assert by_partition[0][1:] == [*later, {"id": 9, "item": "z", "note": "after"}]
    assert by_partition[1] == [{"id": 7, "item": "before"}]  # nothing after the unknown id
    assert len(target.get_versions(f"A.{topic}-value")) == 2
    daemon = setup.daemon
    named = f"schema id 987654 of the value of record {topic}-1 offset 1 cannot be resolved"
    wait_until(lambda: named in daemon.log(), what="the error naming the record and its id")

    def stopped() -> str | None:
        for part in daemon.status_json("A->B")["parts"]:
            reason: str | None = part.get("failed_partitions", {}).get(f"A.{topic}-1")
            if reason:
                return reason
        return None

    assert named in wait_until(stopped, what="partition 1 shown as stopped")
    assert 'mm2py_errors_total{part="source",source="A",target="B"}' in daemon.metrics()
    wait_until(lambda: _metric(daemon, "mm2py_schema_failures_total") >= 1, what="failures")
    assert _metric(daemon, "mm2py_schema_ids_translated_total") >= 6
    assert _metric(daemon, "mm2py_schemas_copied_total") >= 2
    assert _metric(daemon, "mm2py_schema_registry_lookups_total") >= 4


def test_every_version_of_a_subject_is_copied_in_order_with_its_compatibility(
    setup: Setup,
) -> None:
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"{RUN}.history"
    subject = f"{topic}-value"
    source.set_compatibility(subject, "FORWARD")
    versions = [
        {
            **ORDER,
            "fields": [
                *ORDER["fields"],
                *[{"name": f"x{n}", "type": "int", "default": 0} for n in range(i)],
            ],
        }
        for i in range(3)
    ]
    for schema in versions:
        source.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    create_topic(a, topic)
    # Only the last version is in a record; every version is copied when the topic is.
    last = AvroSerializer(
        source, None, conf={"auto.register.schemas": False, "use.latest.version": True}
    )
    produce(a, topic, [(0, None, last({"id": 1, "item": "i", "x0": 0, "x1": 1}, _ctx(topic)))])

    _copies(b, f"A.{topic}", 1)
    remote = f"A.{topic}-value"
    copied = [target.get_version(remote, v).schema.schema_str for v in target.get_versions(remote)]
    assert copied == [source.get_version(subject, v).schema.schema_str for v in (1, 2, 3)]
    assert target.get_compatibility(remote) == "FORWARD"


def test_plan_lists_the_subjects_it_would_copy(setup: Setup, tmp_path: Path) -> None:
    topic = f"{RUN}.planned"
    subject = f"{topic}-value"
    for schema in (ORDER, ORDER_V2):
        setup.source.register_schema(subject, Schema(json.dumps(schema), "AVRO"))
    create_topic(setup.a, topic)
    path = tmp_path / "mm2.properties"
    extra = {
        "schema.registry.sync.enabled": "true",
        "A.schema.registry.url": setup.source_url,
        "B.schema.registry.url": setup.target_url,
    }
    path.write_text(mm2_properties(setup.a, setup.b, f"{RUN}\\.planned", **extra))
    done = subprocess.run(
        [sys.executable, "-m", "mm2py.cli", "plan", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (flow,) = json.loads(done.stdout)["flows"]
    assert [(s["subject"], s["remote_subject"], s["versions"]) for s in flow["subjects"]] == [
        (subject, f"A.{subject}", 2)
    ]


def test_unresolved_ids_copied_as_they_are_when_asked(setup: Setup) -> None:
    """``schema.registry.unresolved.ids = copy``: the translator gives an unknown id back
    as it is (counted), and still translates the ids it can."""
    from mm2py.compat.schema_framing import header
    from mm2py.replication.schemas import SchemaTranslator

    source, target = setup.source, setup.target
    translator = SchemaTranslator("A->B", source, target, unresolved="copy")
    topic = f"{RUN}.copy-mode"
    unknown = header(987655)
    assert translator.resolve(topic, f"A.{topic}", unknown, False) == unknown
    assert translator.heads(topic)[unknown] == unknown
    known = source.register_schema(f"{topic}-value", Schema(json.dumps(KEY), "AVRO"))
    got = translator.resolve(topic, f"A.{topic}", header(known), False)
    assert got == header(target.get_latest_version(f"A.{topic}-value").schema_id)
    assert translator.stats.failures == 1 and translator.stats.schemas_copied == 1


def test_backfill_translates_ids_and_fails_a_range_at_an_unknown_id(setup: Setup) -> None:
    """The backfill's range copier (what a Spark task runs) translates ids as the daemon
    does; a range that meets an id it cannot resolve fails, naming the record, and its
    transaction leaves nothing on the target."""
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"backfill-{RUN}"  # not replicated by the module's daemon
    remote = f"A.{topic}"
    create_topic(a, topic)
    create_topic(b, remote)
    write = AvroSerializer(source, json.dumps(ORDER))
    orders = [{"id": i, "item": f"b{i}"} for i in range(6)]
    good = [write(o, _ctx(topic)) for o in orders]
    unknown = b"\x00" + (987656).to_bytes(4, "big") + good[0][5:]
    produce(a, topic, [(0, None, value) for value in [*good, unknown]])

    def task(start: int, end: int) -> RangeTask:
        return RangeTask(
            "A->B",
            "A",
            "B",
            OffsetRange(topic, 0, start, end),
            remote,
            f"mm2py-backfill-test-{RUN}-{start}",
            f"mm2-offsets.{RUN}.internal",
            1,
            a.client_properties(),
            b.client_properties(),
            schema_registries=(
                {"url": setup.source_url},
                {"url": setup.target_url},
                "fail",
            ),
        )

    result = copy_range(task(0, 6))
    assert result.records == 6
    read = AvroDeserializer(target)
    copies = read_all(b, remote)
    assert [read(c.value, _ctx(remote)) for c in copies] == orders
    assert target.get_latest_version(f"{remote}-value").schema_id == schema_id(copies[0].value)
    with pytest.raises(RangeCopyError, match=f"{topic}-0 offset 6: schema id 987656"):
        copy_range(task(6, 7))
    assert len(read_all(b, remote)) == 6


def test_exactly_once_copies_translated_ids_and_stops_at_an_unknown_one(
    setup: Setup, tmp_path: Path
) -> None:
    """Exactly-once: translated records are committed with their progress; an unknown id
    aborts the open transaction and the next one goes on without that partition."""
    a, b, source, target = setup.a, setup.b, setup.source, setup.target
    topic = f"eos-{RUN}"
    create_topic(a, topic, partitions=2)
    write = AvroSerializer(source, json.dumps(ORDER))
    orders = [{"id": i, "item": f"e{i}"} for i in range(10)]
    good = write(orders[0], _ctx(topic))
    unknown = b"\x00" + (987657).to_bytes(4, "big") + good[5:]
    produce(a, topic, [(0, None, write(o, _ctx(topic))) for o in orders])
    produce(a, topic, [(1, None, good), (1, None, unknown), (1, None, good)])
    path = tmp_path / "mm2.properties"
    extra = {
        "schema.registry.sync.enabled": "true",
        "A.schema.registry.url": setup.source_url,
        "B.schema.registry.url": setup.target_url,
        "B.exactly.once.source.support": "enabled",
    }
    path.write_text(mm2_properties(a, b, topic, **extra))
    remote = f"A.{topic}"
    with running_daemon(path) as daemon:
        copies = _copies(b, remote, len(orders))
        named = f"schema id 987657 of the value of record {topic}-1 offset 1 cannot be resolved"
        wait_until(lambda: named in daemon.log(), what="the error naming the record")
        assert daemon.status_json("A->B")["delivery"] == "exactly-once"
        copies = read_all(b, remote)
    read = AvroDeserializer(target)
    assert [read(c.value, _ctx(remote)) for c in copies if c.partition == 0] == orders
    on_one = [c.value for c in copies if c.partition == 1]
    assert len(on_one) <= 1 and all(schema_id(v) != 987657 for v in on_one)


def test_records_wait_while_the_target_registry_cannot_be_asked(
    setup: Setup, registries: Registries, tmp_path: Path
) -> None:
    """A target registry that does not answer holds the records back (the part restarts
    with backoff); once it answers, they are copied with its ids. B's registry here is
    registry C, stopped and started again (empty: Apicurio keeps nothing on disk)."""
    a, b, source = setup.a, setup.b, setup.source
    topic = f"unreachable-{RUN}"
    remote = f"A.{topic}"
    create_topic(a, topic)
    path = tmp_path / "mm2.properties"
    extra = {
        "schema.registry.sync.enabled": "true",
        "A.schema.registry.url": setup.source_url,
        "B.schema.registry.url": registries["C"].url,
    }
    path.write_text(mm2_properties(a, b, topic, **extra))
    v1 = AvroSerializer(source, json.dumps(ORDER))
    produce(a, topic, [(0, None, v1({"id": 1, "item": "before"}, _ctx(topic)))])
    with running_daemon(path) as daemon:
        _copies(b, remote, 1)
        registries.registries.down(["C"])
        v2 = AvroSerializer(source, json.dumps(ORDER_V2))
        later = {"id": 2, "item": "after", "note": "registered while C was down"}
        produce(a, topic, [(0, None, v2(later, _ctx(topic)))])
        wait_until(
            lambda: "the target schema registry could not be asked" in daemon.log(),
            60,
            what="the part failing on the target registry",
        )
        assert len(read_all(b, remote)) == 1  # nothing copied with a wrong id
        target = SchemaRegistryClient({"url": registries["C"].url})
        copies = _copies(b, remote, 2, timeout=180)
    assert len(copies) == 2
    assert AvroDeserializer(target)(copies[1].value, _ctx(remote)) == later
