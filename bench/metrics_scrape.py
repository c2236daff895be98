"""/metrics at scale: series, bytes and scrape time of a daemon copying many partitions.

    .venv/bin/python -m bench.metrics_scrape                     # 500 topics x 4 partitions
    .venv/bin/python -m bench.metrics_scrape --topics 100 --scrapes 5

Set-up (not timed), as bench.many_topics: N fresh topics ``bench-many-<8 hex>-<i>`` of
P partitions on A, R records of 100 bytes in each partition, and the daemon spawned
on ``<prefix>-.*`` (mm2py.dev.mirrormaker.mm2_properties for A->B, plus any
``--set KEY=VALUE``, e.g. ``--set metrics.partition.labels=true``). Once B holds every
record (so every partition's series exist and its histograms hold observations), the
daemon is left idle for `--settle` seconds, then ``GET /metrics`` is sent `--scrapes`
times, one second apart, without compression, then as often with ``Accept-Encoding:
gzip`` as Prometheus scrapes (``gzip_sent_bytes``: the body as sent, its full length if the
daemon does not compress; ``gzip_scrape_ms_median``).

Measured per scrape: ``scrape_ms``, request sent to the whole body read (the daemon
collects and renders while its copy loops idle); reported as min, median and max.
``series`` is the number of sample lines (neither ``#`` comments nor blank),
``bytes`` the body's length, ``gzip_bytes`` its gzip (level 6) length,
``replication_series`` the sample lines of mm2py_records/bytes/lag/age/latency.
The machine and the local clusters are shared, so the load average before and after
is in the line. Prints one JSON line on stdout; progress goes to stderr. The topics
are deleted at the end. Run it on another checkout with PYTHONPATH pointing at it
(the daemon inherits the environment); ``mm2py`` in the line says which code ran.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import argparse
import gzip
import logging
import re
import statistics
import time
import urllib.request
from typing import Any, Final

import mm2py
from bench.many_topics import fill_source, watch_remote
from bench.replicators import ReplicatorError, free_port, running_command
from bench.report import add_set_option, emit, load_averages, logs_dir
from bench.topics import delete_topics, local_clusters
from mm2py.dev.launcher import LocalCluster
from mm2py.dev.mirrormaker import mm2_properties, render_properties
from mm2py.kafka import clients

log = logging.getLogger("bench.metrics_scrape")

REPLICATION: Final = (
    "mm2py_records_total",
    "mm2py_bytes_total",
    "mm2py_replication_lag_records",
    "mm2py_record_age_seconds",
    "mm2py_replication_latency_seconds",
)


def scrape(listen: str, encoding: str = "") -> tuple[float, bytes]:
    """One GET /metrics with this Accept-Encoding: (seconds to the whole body, body as sent)."""
    request = urllib.request.Request(
        f"http://{listen}/metrics", headers={"Accept-Encoding": encoding}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=30) as resp:
        body: bytes = resp.read()
    return time.perf_counter() - started, body


def one_run(
    clusters: dict[str, LocalCluster], args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    source_cluster, target = clusters["A"], clusters["B"]
    log.info("creating and filling %d topics x %d partitions on A", args.topics, args.partitions)
    source = fill_source(source_cluster, args.topics, args.partitions, args.records)
    remote_prefix = f"{source_cluster.alias}.{source.prefix}-"
    extra = dict(args.set)
    try:
        props = mm2_properties(
            source_cluster.alias,
            source_cluster.bootstrap_servers,
            target.alias,
            target.bootstrap_servers,
            re.escape(source.prefix) + "-.*",
            **extra,
        )
        config = run_dir / f"{source.prefix}.properties"
        config.write_text(render_properties(props), encoding="latin-1")
        listen = f"127.0.0.1:{free_port()}"
        cmd = [sys.executable, "-m", "mm2py.cli", "run", str(config), "--listen", listen]
        log.info("starting the daemon on %s-* (%s)", source.prefix, extra or "default settings")
        with running_command("mm2py", cmd, config.with_suffix(".log")) as (running, _proc):
            watch_remote(target, source, source_cluster.alias, time.monotonic(), running, 600)
            log.info("all copied; idle for %.0f s, then %d scrapes", args.settle, args.scrapes)
            time.sleep(args.settle)
            load_before = load_averages()
            times: list[float] = []
            body = b""
            for _ in range(args.scrapes):
                took, body = scrape(listen)
                times.append(took)
                time.sleep(1)
            # As Prometheus scrapes: it always asks for gzip.
            sent_times: list[float] = []
            sent = b""
            for _ in range(args.scrapes):
                took, sent = scrape(listen, "gzip")
                sent_times.append(took)
                time.sleep(1)
            load_after = load_averages()
    finally:
        log.info("deleting %s-* on A and %s* on B", source.prefix, remote_prefix)
        delete_topics(source_cluster, source.topics)
        remote = clients.admin_client(target.client_properties()).list_topics(timeout=60).topics
        delete_topics(target, [t for t in remote if t.startswith(remote_prefix)])
    lines = [line for line in body.decode().splitlines() if line and not line.startswith("#")]
    return {
        "system": "mm2py",
        "topics": args.topics,
        "partitions": args.topics * args.partitions,
        "settings": extra,
        "series": len(lines),
        "replication_series": sum(1 for line in lines if line.startswith(REPLICATION)),
        "bytes": len(body),
        "gzip_bytes": len(gzip.compress(body, 6)),
        "scrape_ms_min": round(1000 * min(times), 1),
        "scrape_ms_median": round(1000 * statistics.median(times), 1),
        "scrape_ms_max": round(1000 * max(times), 1),
        "scrapes": len(times),
        "gzip_sent_bytes": len(sent),
        "gzip_scrape_ms_median": round(1000 * statistics.median(sent_times), 1),
        "load_before": load_before,
        "load_after": load_after,
        "mm2py": str(Path(mm2py.__file__).parent),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="bench.metrics_scrape", description=(__doc__ or "").split("\n", 1)[0]
    )
    parser.add_argument("--topics", type=int, default=500, help="new topics (default 500)")
    parser.add_argument("--partitions", type=int, default=4, help="per topic (default 4)")
    parser.add_argument("--records", type=int, default=5, help="per partition (default 5)")
    parser.add_argument("--scrapes", type=int, default=10, help="GET /metrics (default 10)")
    parser.add_argument("--settle", type=float, default=5, help="idle seconds before (5)")
    add_set_option(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )
    run_dir = logs_dir() / f"metrics-scrape-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("logs and configs of this run: %s; mm2py from %s", run_dir, mm2py.__file__)
    try:
        emit(one_run(local_clusters(["A", "B"]), args, run_dir))
    except ReplicatorError as e:
        log.error("run failed: %s", e)
        emit({"system": "mm2py", "error": str(e), "load": load_averages()})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
