"""librdkafka alone, as fast as it goes: the pipe limit's second tool for each half.

    python -m bench.rdkafka_perf produce <bootstrap> <topic> <records> <record_bytes> [k=v ...]
    python -m bench.rdkafka_perf consume <bootstrap> <topic> <records> [k=v ...]

`produce` sends `records` records of `record_bytes` random bytes (no key, the
partitions in turn) with the given producer settings and no delivery
callbacks, waits for every acknowledgement and prints one JSON line: records,
seconds (first produce to last acknowledgement; interpreter start-up excluded), left
(records still not acknowledged after 5 minutes). A record the target rejected is
not reported (no callbacks): the caller counts what the topic holds.

`consume` reads every partition of `topic` from its beginning (no group) until
`records` records came, in batches, and prints records and seconds (first record
to last, connecting excluded).

It is the client mm2py copies with, doing nothing but one half of the copy: a
replicator built on it cannot go faster.
"""

from __future__ import annotations

import json
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def _props(bootstrap: str, settings: list[str]) -> dict[str, str]:
    props = {"bootstrap.servers": bootstrap}
    for setting in settings:
        key, value = setting.split("=", 1)
        props[key] = value
    return props


def produce(
    bootstrap: str, topic: str, records: int, record_bytes: int, settings: list[str]
) -> int:
    producer = Producer(_props(bootstrap, settings))
    partitions = 0
    deadline = time.monotonic() + 30
    while not partitions and time.monotonic() < deadline:  # a topic created a moment ago
        partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
        time.sleep(0 if partitions else 0.1)
    if not partitions:
        raise SystemExit(f"{topic} has no partitions on {bootstrap} after 30 s")
    payload = os.urandom(record_bytes)
    send, poll = producer.produce, producer.poll
    start = time.monotonic()
    for i in range(records):
        while True:
            try:
                # Round robin, as a replicator writes every partition at once: with no
                # key, librdkafka's sticky partitioner fills one partition at a time.
                send(topic, payload, None, i % partitions)
                break
            except BufferError:
                poll(0.005)
    left = producer.flush(300)
    seconds = time.monotonic() - start
    print(json.dumps({"records": records, "seconds": seconds, "left": left}))
    return 1 if left else 0


def consume(bootstrap: str, topic: str, records: int, settings: list[str]) -> int:
    consumer = Consumer({"group.id": "bench-rdkafka-perf", **_props(bootstrap, settings)})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0: from the start
    seen = 0
    start = None
    deadline = time.monotonic() + 300
    while seen < records and time.monotonic() < deadline:
        batch = consumer.consume(10000, 1.0)
        if batch and start is None:
            start = time.monotonic()
        seen += sum(1 for msg in batch if msg.error() is None)
    seconds = time.monotonic() - (start or time.monotonic())
    consumer.close()
    print(json.dumps({"records": seen, "seconds": seconds}))
    return 0 if seen >= records else 1


def main(argv: list[str]) -> int:
    mode, bootstrap, topic, records, *rest = argv
    if mode == "produce":
        return produce(bootstrap, topic, int(records), int(rest[0]), rest[1:])
    return consume(bootstrap, topic, int(records), rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
