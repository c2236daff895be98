"""A producer at a steady rate, in a process of its own: the load of bench.replication's
latency runs (their warm-up and the measured records).

``python -m bench.steady_producer BOOTSTRAP TOPIC --rate R --bytes B [--records N]
[--set KEY=VALUE ...]`` sends records of B random bytes (one of 256 values made at start),
no key, to the client's partitioner, each timestamped when it is handed to the client
(CreateTime, as Kafka's producer sets it). The rate holds per millisecond: each tick
hands over the records due since the start, so a late tick catches up rather than
lowering the rate. Without ``--records`` it runs until SIGTERM or SIGINT. Either way it
then waits for every delivery report and prints one JSON line: ``sent``, ``acked``,
``errors`` (the first delivery error, or null) and ``seconds``; exit code 1 if any record
was not acknowledged.

It replaces Kafka's ProducerPerformance for these runs: a fresh JVM compiles Kafka's
client for about a minute on two cores (its JIT threads took 22% of a core through the
measured window, 2026-11-29), load that belonged to no system under test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from confluent_kafka import Producer

TICK_S = 0.001
FLUSH_TIMEOUT_S = 60.0


def _pairs(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.steady_producer", description=__doc__)
    parser.add_argument("bootstrap")
    parser.add_argument("topic")
    parser.add_argument("--rate", type=int, required=True, help="records per second")
    parser.add_argument("--bytes", type=int, required=True, help="value size")
    parser.add_argument("--records", type=int, default=0, help="then stop (0: until SIGTERM)")
    parser.add_argument("--set", type=_pairs, action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)

    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    values = [os.urandom(args.bytes) for _ in range(256)]
    acked = 0
    first_error: str | None = None

    def delivered(err: Any, msg: Any) -> None:
        nonlocal acked, first_error
        if err is None:
            acked += 1
        elif first_error is None:
            first_error = f"{msg.topic()}-{msg.partition()}: {err}"

    producer = Producer({"bootstrap.servers": args.bootstrap, **dict(args.set)})
    sent = 0
    start = time.monotonic()
    while not stopping and (args.records == 0 or sent < args.records):
        due = int((time.monotonic() - start) * args.rate) + 1
        if args.records:
            due = min(due, args.records)
        while sent < due:
            try:
                producer.produce(args.topic, values[sent % len(values)], on_delivery=delivered)
            except BufferError:
                producer.poll(TICK_S)  # the client's queue is full: let deliveries drain
                continue
            sent += 1
        producer.poll(0)
        time.sleep(TICK_S)
    seconds = time.monotonic() - start
    left = producer.flush(FLUSH_TIMEOUT_S)
    if left and first_error is None:
        first_error = f"{left} records not acknowledged within {FLUSH_TIMEOUT_S:.0f} s"
    print(
        json.dumps(
            {"sent": sent, "acked": acked, "errors": first_error, "seconds": round(seconds, 3)}
        ),
        flush=True,
    )
    return 0 if acked == sent else 1


if __name__ == "__main__":
    sys.exit(main())
