"""`mm2py status`: a running daemon's flows, parts, lag and latency, and each flow's
cluster (nodes, tasks, states), read from its REST API."""

from __future__ import annotations

import argparse
import sys

from mm2py.cli.arguments import Subparsers
from mm2py.errors import EXIT_OK, Mm2pyError


def run(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from pydantic import ValidationError

    from mm2py.cluster.view import FlowCluster, format_cluster
    from mm2py.runtime.status import FlowStatus, Health, format_status

    base = args.url.rstrip("/")

    def get(path: str) -> object:
        try:
            with urllib.request.urlopen(base + path, timeout=args.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            if err.code == 503:  # /health: not ready, with the reasons
                return json.loads(err.read())
            raise

    try:
        names = get("/flows")
        if not isinstance(names, list):
            raise ValueError("GET /flows did not answer a list")
        flows = [
            FlowStatus.model_validate(get(f"/flows/{urllib.parse.quote(n, safe='')}/status"))
            for n in names
        ]
        health = Health.model_validate(get("/health"))
        answer = get("/cluster")
        if not isinstance(answer, list):
            raise ValueError("GET /cluster did not answer a list")
        clusters = [FlowCluster.model_validate(c) for c in answer]
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise Mm2pyError(
            f"no mm2py daemon answers at {base} ({reason}); "
            "is `mm2py run` running? give its address with --url"
        ) from err
    except (ValueError, ValidationError) as err:
        first = str(err).splitlines()[0]
        raise Mm2pyError(f"{base} is not an mm2py daemon: {first}") from err
    sys.stdout.write(format_status(flows, health))
    if clusters:
        sys.stdout.write("\n" + "\n".join(format_cluster(clusters)).rstrip() + "\n")
    return EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "status",
        help="flows, parts, states, lag and latency of a running daemon, and its clusters",
        description="Print a running daemon's flows with their parts' states, and per topic "
        "the records copied, the lag and the replication latency (p50/p99 of the last "
        "minute); then each flow's mm2py cluster: its nodes and which runs which task, "
        "with the tasks' states and partitions. Exit status 1 when no daemon answers.",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8083",
        help="the daemon's address (its --listen; default http://127.0.0.1:8083)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help=argparse.SUPPRESS)
    p.set_defaults(func=run)
