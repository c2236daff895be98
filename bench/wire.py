"""The CPU of one copy round's requests on the wire: aiokafka's generic structs against
mm2py.kafka.wire, for the same Fetch v11 and Produce v7 and their answers.

A round of the batch copier sends one Fetch to the source's leader and one Produce to
the target's and reads both answers. This times, per round and in microseconds of CPU
(`time.process_time`), each of the four on this process alone, no network: encoding
the two requests as aiokafka's connection does (`prepare(versions).encode()`), and
decoding the two answers from the buffer it hands over. Prints one JSON line per system,
then their ratios.

    python -m bench.wire [--partitions 8] [--batch-bytes 3072] [--rounds 20000]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from io import BytesIO
from typing import Any

from aiokafka.protocol.fetch import FetchRequest_v11, FetchResponse_v11
from aiokafka.protocol.produce import ProduceRequest, ProduceResponse_v7

from mm2py.kafka.raw_clients import FetchPlan, _Produce, _SessionFetchRequest

KAFKA_4_VERSIONS = {0: (3, 12), 1: (4, 17)}  # Produce and Fetch, as a Kafka 4.1 broker has them
TOPIC = "bench-topic"


def _cpu_us(step: Callable[[], Any], rounds: int) -> float:
    start = time.process_time()
    for _ in range(rounds):
        step()
    return (time.process_time() - start) / rounds * 1e6


def measure(partitions: int, batch_bytes: int, rounds: int) -> dict[str, dict[str, float]]:
    batch = bytes(batch_bytes)
    produce_topics = [(TOPIC, [(p, batch) for p in range(partitions)])]
    positions = {(TOPIC, p): 1_000_000 + p for p in range(partitions)}
    plan = FetchPlan(12345, 7, positions, [], positions)
    fetch_kwargs = {"max_wait_time": 500, "min_bytes": 1, "max_bytes": 52_428_800}
    produce_answer = ProduceResponse_v7(
        [(TOPIC, [(p, 0, 5_000_000 + p, -1, 0) for p in range(partitions)])], 0
    ).encode()
    fetch_answer = FetchResponse_v11(
        0,
        0,
        12345,
        [(TOPIC, [(p, 0, 2_000_000, 2_000_000, 0, [], -1, batch) for p in range(partitions)])],
    ).encode()

    def produce(request_type: type) -> Callable[[], Any]:
        def step() -> Any:
            request = request_type(
                transactional_id=None, required_acks=-1, timeout=30_000, topics=produce_topics
            )
            return request.prepare(KAFKA_4_VERSIONS).encode()

        return step

    def fetch(aiokafka_only: bool) -> Callable[[], Any]:
        def step() -> Any:
            request = _SessionFetchRequest(plan, partition_max_bytes=1_048_576, **fetch_kwargs)
            if aiokafka_only:  # the struct the raw clients built before mm2py.kafka.wire
                return FetchRequest_v11(
                    -1,
                    500,
                    1,
                    52_428_800,
                    1,
                    plan.session_id,
                    plan.epoch,
                    [
                        (topic, [(p, -1, at, -1, limit) for p, at, limit in partitions])
                        for topic, partitions in request.topics
                    ],
                    [],
                    "",
                ).encode()
            return request.prepare(KAFKA_4_VERSIONS).encode()

        return step

    def answer(decode: Callable[[BytesIO], Any], body: bytes) -> Callable[[], Any]:
        def step() -> Any:
            buffer = BytesIO(body)
            return decode(buffer)

        return step

    ours_produce = _Produce(transactional_id=None, required_acks=-1, timeout=1, topics=[])
    ours_fetch = _SessionFetchRequest(plan, partition_max_bytes=1, **fetch_kwargs)
    systems = {
        "aiokafka": {
            "produce_request_us": produce(ProduceRequest),
            "fetch_request_us": fetch(aiokafka_only=True),
            "produce_answer_us": answer(ProduceResponse_v7.decode, produce_answer),
            "fetch_answer_us": answer(FetchResponse_v11.decode, fetch_answer),
        },
        "mm2py.wire": {
            "produce_request_us": produce(_Produce),
            "fetch_request_us": fetch(aiokafka_only=False),
            "produce_answer_us": answer(
                ours_produce.prepare(KAFKA_4_VERSIONS).RESPONSE_TYPE.decode, produce_answer
            ),
            "fetch_answer_us": answer(
                ours_fetch.prepare(KAFKA_4_VERSIONS).RESPONSE_TYPE.decode, fetch_answer
            ),
        },
    }
    out: dict[str, dict[str, float]] = {}
    for system, steps in systems.items():
        figures = {name: round(_cpu_us(step, rounds), 1) for name, step in steps.items()}
        figures["round_us"] = round(sum(figures.values()), 1)
        out[system] = figures
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--batch-bytes", type=int, default=3072)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    results = measure(args.partitions, args.batch_bytes, args.rounds)
    for system, figures in results.items():
        print(json.dumps({"system": system, "partitions": args.partitions, **figures}))
    theirs, ours = results["aiokafka"], results["mm2py.wire"]
    ratios = {name: round(theirs[name] / ours[name], 2) for name in theirs}
    print(json.dumps({"system": "aiokafka / mm2py.wire", **ratios}))


if __name__ == "__main__":
    main()
