"""librdkafka alone, as fast as it goes: the pipe limit's second tool for each half.

    python -m bench.rdkafka_perf produce <bootstrap> <topic> <records> <record_bytes> [k=v ...]
    python -m bench.rdkafka_perf consume <bootstrap> <topic> <records> [k=v ...]
    python -m bench.rdkafka_perf --start-at <epoch seconds> produce|consume ...

`produce` sends `records` records of `record_bytes` random bytes (with
``--json-values``, bench.workload's JSON-like documents instead: TEMPLATES of them made
before connecting, in turn, so that a compressing producer compresses as on the
compressed workload; no key; RUN_RECORDS to one partition, then as many to the next,
the partitions in turn) with the given producer settings and no delivery callbacks,
waits for every acknowledgement and prints one JSON line: records, seconds (first
produce to last acknowledgement; interpreter start-up, connecting and an idempotent
producer's wait for its producer id excluded), left (records still not acknowledged
after 5 minutes), and ``start`` and ``end``: that window in wall-clock time (Unix epoch
seconds). A record the target rejected is not reported (no callbacks): the caller
counts what the topic holds.

`consume` reads every partition of `topic` from its beginning (no group) until
`records` records came, in batches, and prints records, seconds (first record
to last; connecting to the partitions' leaders is done before, by asking their
offsets), and that window's ``start`` and ``end`` in epoch seconds.

``--start-at``: once connected (topic metadata read), wait until this epoch time before
producing or reading, so that tools started together (bench.pipe_limit's run of both
halves at once) begin their windows together, whatever each one's start-up took.

It is the client mm2py copies with, doing nothing but one half of the copy: a
replicator built on it cannot go faster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.workload import TEMPLATES, json_like_values

# Records produced to one partition before the next, as a replicator writes what it
# read: a batch of 5,000 from 8 partitions. Against one record per partition in turn
# (1M x 1 KiB, then 2M x 100 B, into one broker, three runs each): 246k-347k vs
# 178k-256k records/s, and 840k-987k vs 474k-692k.
RUN_RECORDS = 625


def _props(bootstrap: str, settings: list[str]) -> dict[str, str]:
    props = {"bootstrap.servers": bootstrap}
    for setting in settings:
        key, value = setting.split("=", 1)
        props[key] = value
    return props


def _wait_until(epoch: float | None) -> None:
    if epoch is not None:
        time.sleep(max(0.0, epoch - time.time()))


def _report(records: int, start: float, end: float, **more: int) -> None:
    """The JSON line: `start` and `end` are time.time() readings."""
    print(
        json.dumps({"records": records, "seconds": end - start, "start": start, "end": end, **more})
    )


def produce(
    bootstrap: str,
    topic: str,
    records: int,
    record_bytes: int,
    settings: list[str],
    start_at: float | None = None,
    json_values: bool = False,
) -> int:
    values = (
        list(json_like_values(min(records, TEMPLATES), record_bytes))
        if json_values
        else [os.urandom(record_bytes)]
    )
    idempotence: dict[str, str | None] = {"state": None}

    def on_stats(raw: str) -> None:
        idempotence["state"] = json.loads(raw).get("eos", {}).get("idemp_state", "")

    producer = Producer(
        {**_props(bootstrap, settings), "statistics.interval.ms": 20, "stats_cb": on_stats}
    )
    partitions = 0
    deadline = time.monotonic() + 30
    while not partitions and time.monotonic() < deadline:  # a topic created a moment ago
        partitions = len(producer.list_topics(topic, timeout=30).topics[topic].partitions)
        time.sleep(0 if partitions else 0.1)
    if not partitions:
        raise SystemExit(f"{topic} has no partitions on {bootstrap} after 30 s")
    # An idempotent producer sends nothing before it has its producer id, which took
    # 0.5 s after connecting in one start of two: that wait is not producing.
    while idempotence["state"] not in ("", "Assigned") and time.monotonic() < deadline:
        producer.poll(0.01)
    if idempotence["state"] not in ("", "Assigned"):
        raise SystemExit(f"no producer id from {bootstrap}: {idempotence['state']}")
    send, poll, pool = producer.produce, producer.poll, len(values)
    _wait_until(start_at)
    start = time.time()
    for i in range(records):
        while True:
            try:
                send(topic, values[i % pool], None, (i // RUN_RECORDS) % partitions)
                break
            except BufferError:
                poll(0.005)
    left = producer.flush(300)
    _report(records, start, time.time(), left=left)
    return 1 if left else 0


def consume(
    bootstrap: str, topic: str, records: int, settings: list[str], start_at: float | None = None
) -> int:
    consumer = Consumer({"group.id": "bench-rdkafka-perf", **_props(bootstrap, settings)})
    partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
    # Connect to the partitions' leaders now (asking their offsets), not in the window.
    for p in partitions:
        consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
    # Assigning starts the fetching: only after the common start.
    _wait_until(start_at)
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])  # 0: from the start
    seen = 0
    start = end = None
    deadline = time.monotonic() + 300
    while seen < records and time.monotonic() < deadline:
        # No more than are left: a call for more would wait out its timeout at the end.
        batch = consumer.consume(min(10000, records - seen), 1.0)
        if batch:
            end = time.time()
            if start is None:
                start = end
        seen += sum(1 for msg in batch if msg.error() is None)
    consumer.close()
    now = time.time()
    _report(seen, start or now, end or now)
    return 0 if seen >= records else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench.rdkafka_perf")
    parser.add_argument("--start-at", type=float, help="epoch seconds to begin at")
    parser.add_argument(
        "--json-values", action="store_true", help="produce JSON-like documents, not random bytes"
    )
    parser.add_argument("mode", choices=("produce", "consume"))
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("records", type=int)
    parser.add_argument("rest", nargs="*", help="produce: record_bytes, then k=v settings")
    args = parser.parse_args(argv)
    if args.mode == "produce":
        record_bytes, *settings = args.rest
        return produce(
            args.bootstrap,
            args.topic,
            args.records,
            int(record_bytes),
            settings,
            args.start_at,
            args.json_values,
        )
    return consume(args.bootstrap, args.topic, args.records, args.rest, args.start_at)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
