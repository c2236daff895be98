"""The class-data archive of the Kafka jars (the JDK's CDS): every JVM started from them
(brokers, the storage formatting before each, MirrorMaker 2, Connect, the perf tools)
maps the classes a broker loads rather than reading and verifying them from the jars
again. A broker took 5.7-6.4 CPU-s and 4.6-5.5 s to answer without it, 3.3 CPU-s and
2.7-2.9 s with it (2026-11-28, this 2-core machine: docs/tests.md).

Contract:
- `ensure()` builds the archive once for a jar set and a java (`jars.class_archive()`
  names it): a throwaway broker on a folder of its own starts with
  ``-XX:ArchiveClassesAtExit``, serves a topic's produce, fetch and consumer group, and
  is stopped cleanly, when its JVM writes the classes it loaded. It is written under a
  temporary name and renamed, so a JVM never maps a half-written archive.
- `jars.java_command` adds the archive when it exists. An archive the JVM does not
  accept (another JDK build, other jars) only costs the start time it would have saved:
  the JVM then loads its classes as usual. Nothing a broker does depends on it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from mm2py.dev.jars import class_archive, fetch_jars
from mm2py.dev.launcher import PORT_OFFSET_VARIABLE, LocalClusterError, LocalKafka
from mm2py.dev.processes import environment

log = logging.getLogger(__name__)

# The throwaway broker's ports: cluster A's moved up by this, clear of `make demo`'s and
# the test workers' (offsets 0 to a few hundred) and below Linux's ephemeral range.
PORT_OFFSET = 3900
RECORDS = 200
TIMEOUT = 60.0


def ensure() -> Path | None:
    """The archive, built if it is missing; None when it could not be built (the reason
    is logged: JVMs then start without it)."""
    fetch_jars()
    archive = class_archive()
    if archive.exists():
        return archive
    partial = archive.with_name(f"{archive.name}.{os.getpid()}.partial")
    home = Path(tempfile.mkdtemp(prefix="mm2py-class-archive-"))
    try:
        kafka = LocalKafka(home, jvm_options=[f"-XX:ArchiveClassesAtExit={partial}"])
        with environment(PORT_OFFSET_VARIABLE, str(PORT_OFFSET)):
            try:
                (cluster,) = kafka.up(["A"], timeout=TIMEOUT)
                try:
                    _exercise(cluster.bootstrap_servers)
                finally:
                    kafka.stop("A", timeout=TIMEOUT)
            except (LocalClusterError, KafkaException, RuntimeError) as exc:
                log.warning("no class archive of the Kafka jars (JVMs start without): %s", exc)
                return None
        if not partial.exists():
            log.warning("the JVM wrote no class archive at %s; JVMs start without one", partial)
            return None
        partial.rename(archive)
        log.info("class archive of the Kafka jars in %s", archive)
        return archive
    finally:
        partial.unlink(missing_ok=True)
        shutil.rmtree(home, ignore_errors=True)


def _exercise(bootstrap: str) -> None:
    """A topic created, written and read by a consumer group: the classes of the paths
    that the tests and benchmarks use get loaded, and so archived."""
    topic = f"class-archive-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(TIMEOUT)
    # log_level 3: the first InitProducerId meets "coordinator load in progress" (retried)
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 3}
    )
    for i in range(RECORDS):
        producer.produce(topic, f"value-{i}".encode(), f"key-{i}".encode())
    if producer.flush(TIMEOUT):
        raise RuntimeError(f"the class archive's broker did not take its records ({bootstrap})")
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": topic,
            "auto.offset.reset": "earliest",
            "group.protocol": "consumer",
        }
    )
    try:
        consumer.subscribe([topic])
        seen = 0
        while seen < RECORDS:
            msgs = consumer.consume(RECORDS, TIMEOUT)
            if not msgs:
                raise RuntimeError(f"the class archive's broker served no records ({bootstrap})")
            seen += sum(1 for m in msgs if m.error() is None)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
