"""librdkafka's producer alone, as fast as it goes: the pipe limit's second producing tool.

    python -m bench.rdkafka_perf <bootstrap> <topic> <records> <record_bytes> [key=value ...]

Produces `records` records of `record_bytes` random bytes (no key, librdkafka's
partitioner) with the given producer settings and no delivery callbacks, waits for
every acknowledgement and prints one JSON line: records, seconds (first produce to
last acknowledgement; interpreter start-up excluded), left (records still not
acknowledged after 5 minutes). A record the target rejected is not reported (no
callbacks): the caller counts what the topic holds. It is the client mm2py copies
with, doing nothing but produce: a replicator built on it cannot write into the
target faster.
"""

from __future__ import annotations

import json
import os
import sys
import time

from confluent_kafka import Producer


def main(argv: list[str]) -> int:
    bootstrap, topic, records, record_bytes, *settings = argv
    props = {"bootstrap.servers": bootstrap}
    for setting in settings:
        key, value = setting.split("=", 1)
        props[key] = value
    producer = Producer(props)
    payload = os.urandom(int(record_bytes))
    produce, poll = producer.produce, producer.poll
    start = time.monotonic()
    for _ in range(int(records)):
        while True:
            try:
                produce(topic, payload)
                break
            except BufferError:
                poll(0.005)
    left = producer.flush(300)
    seconds = time.monotonic() - start
    print(json.dumps({"records": int(records), "seconds": seconds, "left": left}))
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
