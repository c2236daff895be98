"""`mm2py demo`: local clusters A and B, the daemon on configs/mm2.properties, live traffic.

Produces a few orders per second to `demo.orders` on A and shows each copy
arriving in `A.demo.orders` on B with its replication latency.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition

from mm2py.config import load_config
from mm2py.daemon.supervisor import Daemon
from mm2py.dev.launcher import LocalCluster, LocalClusterError, LocalKafka
from mm2py.kafka import clients
from mm2py.kafka.topics import create_topic

log = logging.getLogger(__name__)

DEMO_TOPIC = "demo.orders"
# The demo is development tooling: it runs from a source checkout, on its example config.
DEFAULT_CONFIG = Path("configs") / "mm2.properties"


def _produce_orders(cluster: LocalCluster, stop: threading.Event, rate: float) -> None:
    producer = clients.producer(cluster.client_properties(), {"linger.ms": 0})
    number = 0
    while not stop.wait(1.0 / rate):
        number += 1
        order = {"order": number, "item": ["tea", "rice", "soap"][number % 3]}
        producer.produce(
            DEMO_TOPIC,
            json.dumps(order).encode(),
            f"customer-{number % 7}".encode(),
            headers=[("source", b"mm2py-demo")],
        )
        producer.poll(0)
    producer.flush(5)


def _show_copies(cluster: LocalCluster, stop: threading.Event, out: Callable[[str], None]) -> None:
    remote = f"A.{DEMO_TOPIC}"
    consumer = clients.consumer(cluster.client_properties(), {"auto.offset.reset": "latest"})
    admin = clients.admin_client(cluster.client_properties())
    while not stop.is_set() and remote not in admin.list_topics(timeout=5).topics:
        stop.wait(0.5)
    meta = consumer.list_topics(remote, timeout=10).topics[remote]
    consumer.assign([TopicPartition(remote, p, -1) for p in meta.partitions])  # from the end
    try:
        while not stop.is_set():
            msg: Any = consumer.poll(0.5)
            if msg is None or msg.error():
                continue
            latency_ms = time.time() * 1000 - msg.timestamp()[1]
            out(
                f"B  {remote}[{msg.partition()}]@{msg.offset():<6} "
                f"{msg.value().decode():<36} latency {latency_ms:6.1f} ms"
            )
    finally:
        consumer.close()


def run_demo(
    config_path: Path = DEFAULT_CONFIG,
    seconds: float | None = None,
    rate: float = 5.0,
    listen: str = "127.0.0.1:8083",
    out: Callable[[str], None] = print,
) -> None:
    """Run the demo until interrupted (or for `seconds`)."""
    # The demo shows the records; the daemon's routine log lines would bury them.
    for name in ("mm2py", "uvicorn"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if not config_path.is_file():
        raise LocalClusterError(
            f"no {config_path} here: run the demo from the mm2py source checkout or pass --config"
        )
    a, b = LocalKafka().up(["A", "B"])
    out(f"cluster A on {a.bootstrap_servers}, cluster B on {b.bootstrap_servers}")
    create_topic(clients.admin_client(a.client_properties()), "A", DEMO_TOPIC, 3, 1)
    config = load_config(config_path)
    daemon = Daemon(config, config.enabled_flows(), listen)
    stop = threading.Event()
    workers = [
        threading.Thread(target=daemon.run, name="daemon"),
        threading.Thread(target=_produce_orders, args=(a, stop, rate), daemon=True),
        threading.Thread(target=_show_copies, args=(b, stop, out), daemon=True),
    ]
    for worker in workers:
        worker.start()
    out(f"replicating A -> B with {config_path}; metrics on http://{listen}/metrics")
    out(f"producing {rate:g} orders/s to {DEMO_TOPIC} on A; Ctrl-C to stop")
    try:
        deadline = time.monotonic() + seconds if seconds else None
        while deadline is None or time.monotonic() < deadline:
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        daemon.request_stop()
        workers[0].join(15)
        out("demo stopped; the clusters keep running (`mm2py local down` stops them)")
