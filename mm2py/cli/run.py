"""`mm2py run`: the daemon, replicating every enabled flow of a config until stopped."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from mm2py.cli.arguments import Subparsers, aliases
from mm2py.errors import EXIT_OK

if TYPE_CHECKING:
    from mm2py.config import FlowConfig, MirrorConfig

DEFAULT_LISTEN = "127.0.0.1:8083"

log = logging.getLogger(__name__)


def run(args: argparse.Namespace) -> int:
    from mm2py.config import ConfigError, load_config

    config = load_config(args.config)
    for alias in args.clusters or []:
        if alias not in config.clusters:
            known = ", ".join(config.clusters)
            raise ConfigError(
                args.config, "--clusters", f"unknown cluster {alias!r}; known: {known}"
            )
    flows = config.enabled_flows(args.clusters)
    if not flows:
        raise ConfigError(args.config, None, "no enabled flow (set A->B.enabled = true)")
    from mm2py.cluster.task import SPARES

    # The first tasks' process imports the copy path while this one imports the node's
    # (about a second each on a busy machine): the node's first copies start that sooner.
    SPARES.prime()
    try:
        return _run_node(args, config, flows)
    finally:
        SPARES.close()  # on every way out: an exit would wait for the spare otherwise


def _run_node(args: argparse.Namespace, config: MirrorConfig, flows: list[FlowConfig]) -> int:
    from mm2py.daemon.supervisor import Daemon
    from mm2py.replication.exactly_once import settle_exactly_once

    # Whether each target accepts the transactions its flow asks for, before anything runs.
    config = settle_exactly_once(config, flows)
    flows = config.enabled_flows(args.clusters)
    # --listen wins over MM2's `listeners` in the config.
    listen = args.listen or config.listen or DEFAULT_LISTEN
    daemon = Daemon(config, flows, listen, config.heartbeat_flows(args.clusters))
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    daemon.run()
    _exit_past_unanswered_calls()
    return EXIT_OK


def _exit_past_unanswered_calls() -> None:
    """End the process now if threads of calls to a cluster that never answered are
    left (a cluster down or paused when the node stopped): the interpreter's exit would
    join a thread pool's threads, for up to admin.timeout.ms. The daemon has stopped
    everything by then, its parts within their deadline; the log says what was left."""
    left = [
        t.name
        for t in threading.enumerate()
        if t is not threading.main_thread() and t.is_alive() and not t.daemon
    ]
    if not left:
        return
    log.warning("exiting without waiting for calls not answered yet (%s)", ", ".join(left))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_OK)


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "run",
        help="replicate every enabled flow of an MM2 config (the daemon)",
        description="Run the replicator on a mm2.properties or YAML config until SIGTERM/SIGINT.",
    )
    p.add_argument("config", type=Path, help="mm2.properties (MM2 format) or .yaml/.yml")
    p.add_argument(
        "--clusters",
        type=aliases,
        default=None,
        help="only run flows whose target is one of these aliases (as MM2's --clusters)",
    )
    p.add_argument(
        "--listen",
        default=None,
        help="address of the REST API and /metrics (default: the config's MM2 `listeners`, "
        f"else {DEFAULT_LISTEN})",
    )
    p.set_defaults(func=run)
