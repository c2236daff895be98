"""`mm2py local` (dev tooling): real single-node Kafka clusters on 127.0.0.1.

mm2py.dev is imported only when the command runs: the runtime never loads it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mm2py.cli.arguments import Subparsers, aliases
from mm2py.errors import EXIT_OK


def run(args: argparse.Namespace) -> int:
    from mm2py.dev import class_archive
    from mm2py.dev.jars import fetch_jars
    from mm2py.dev.launcher import LocalKafka
    from mm2py.dev.registry import LocalRegistries, fetch_registry

    kafka = LocalKafka(args.dir)
    registries = LocalRegistries(args.dir)
    if args.action == "fetch":
        print(f"Kafka jars in {fetch_jars()}")
        archive = class_archive.ensure()
        print(f"their class archive in {archive}" if archive else "no class archive (see the log)")
        print(f"Apicurio Registry in {fetch_registry()}")
    elif args.action == "up":
        clusters = kafka.up(args.clusters or ["A", "B"], secure=args.secure)
        for cluster in clusters:
            extra = ""
            if cluster.secure:
                extra = (
                    f"  SASL_PLAINTEXT SCRAM-SHA-512, users {', '.join(cluster.users)} "
                    f"(passwords in {cluster.home / 'cluster.json'})"
                )
            print(f"{cluster.alias}  {cluster.bootstrap_servers}{extra}")
        if args.registries:
            for registry in registries.up(c.alias for c in clusters):
                print(f"{registry.alias}  schema registry {registry.url}")
    elif args.action == "down":
        registries.down(args.clusters)
        stopped = kafka.down(args.clusters)
        print("stopped " + (", ".join(stopped) if stopped else "nothing (no clusters recorded)"))
    else:
        known = kafka.known()
        if not known:
            print(f"no local clusters under {kafka.state_dir}")
        for cluster in known:
            state = "running" if kafka.is_running(cluster.alias) else "stopped"
            secured = " secured" if cluster.secure else ""
            print(f"{cluster.alias}  {cluster.bootstrap_servers}  {state}{secured}")
        for registry in registries.known():
            state = "running" if registries.pid(registry.alias) else "stopped"
            print(f"{registry.alias}  schema registry {registry.url}  {state}")
    return EXIT_OK


def add_parser(sub: Subparsers) -> None:
    p = sub.add_parser(
        "local",
        help="start/stop real single-node Kafka clusters on 127.0.0.1 (for demos and tests)",
        description=(
            "Real Apache Kafka (KRaft) clusters from Maven Central jars: A on 127.0.0.1:19092, "
            "B on :29092, C on :39092, D on :49092, E on :59092."
        ),
    )
    p.add_argument(
        "action",
        choices=["up", "down", "status", "fetch"],
        help="fetch downloads the Kafka jars and Apicurio Registry into the cache and builds the "
        "jars' class archive (a broker runs for a few seconds); it starts no cluster",
    )
    p.add_argument(
        "--clusters",
        type=aliases,
        default=None,
        help="comma-separated aliases (default A,B; `down` defaults to all)",
    )
    p.add_argument(
        "--secure",
        type=aliases,
        default=[],
        help="aliases to start with SASL_PLAINTEXT/SCRAM-SHA-512 and the StandardAuthorizer",
    )
    p.add_argument(
        "--registries",
        action="store_true",
        help="also start a schema registry (Apicurio, Confluent's API) beside each cluster",
    )
    p.add_argument(
        "--dir", type=Path, default=None, help="state folder (default ~/.cache/mm2py/local)"
    )
    p.set_defaults(func=run)
