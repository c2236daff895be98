"""The `mm2py` command line: one entry point, one subcommand per job."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from mm2py import __version__

if TYPE_CHECKING:
    from mm2py.config import MirrorConfig

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def _aliases(text: str) -> list[str]:
    return [a.strip() for a in text.split(",") if a.strip()]


# -- mm2py local ----------------------------------------------------------------


def _local(args: argparse.Namespace) -> int:
    from mm2py.dev.jars import JarFetchError, fetch_jars
    from mm2py.dev.launcher import LocalClusterError, LocalKafka

    kafka = LocalKafka(args.dir)
    try:
        if args.action == "fetch":
            print(f"Kafka jars in {fetch_jars()}")
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
        elif args.action == "down":
            stopped = kafka.down(args.clusters)
            print(
                "stopped " + (", ".join(stopped) if stopped else "nothing (no clusters recorded)")
            )
        else:
            known = kafka.known()
            if not known:
                print(f"no local clusters under {kafka.state_dir}")
            for cluster in known:
                state = "running" if kafka.is_running(cluster.alias) else "stopped"
                secured = " secured" if cluster.secure else ""
                print(f"{cluster.alias}  {cluster.bootstrap_servers}  {state}{secured}")
    except (LocalClusterError, JarFetchError) as err:
        print(f"mm2py local {args.action}: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
        help="fetch only downloads the Kafka jars into the cache",
    )
    p.add_argument(
        "--clusters",
        type=_aliases,
        default=None,
        help="comma-separated aliases (default A,B; `down` defaults to all)",
    )
    p.add_argument(
        "--secure",
        type=_aliases,
        default=[],
        help="aliases to start with SASL_PLAINTEXT/SCRAM-SHA-512 and the StandardAuthorizer",
    )
    p.add_argument(
        "--dir", type=Path, default=None, help="state folder (default ~/.cache/mm2py/local)"
    )
    p.set_defaults(func=_local)


# -- mm2py run -------------------------------------------------------------------


def _load(path: Path) -> MirrorConfig:
    """Load a config or exit 2 with its one-line error (never a traceback)."""
    from mm2py.config import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as err:
        print(f"mm2py: {err}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _run(args: argparse.Namespace) -> int:
    from mm2py.daemon.supervisor import (
        ClusterAccessError,
        Daemon,
        ListenError,
        select_flows,
        select_heartbeat_flows,
    )

    config = _load(args.config)
    for alias in args.clusters or []:
        if alias not in config.clusters:
            known = ", ".join(config.clusters)
            print(
                f"mm2py: {args.config}: --clusters: unknown cluster {alias!r}; known: {known}",
                file=sys.stderr,
            )
            return EXIT_USAGE
    flows = select_flows(config, args.clusters)
    if not flows:
        print(f"mm2py: {args.config}: no enabled flow (set A->B.enabled = true)", file=sys.stderr)
        return EXIT_USAGE
    daemon = Daemon(config, flows, args.listen, select_heartbeat_flows(config, args.clusters))
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    try:
        daemon.run()
    except (ListenError, ClusterAccessError) as err:
        print(f"mm2py: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "run",
        help="replicate every enabled flow of an MM2 config (the daemon)",
        description="Run the replicator on a mm2.properties or YAML config until SIGTERM/SIGINT.",
    )
    p.add_argument("config", type=Path, help="mm2.properties (MM2 format) or .yaml/.yml")
    p.add_argument(
        "--clusters",
        type=_aliases,
        default=None,
        help="only run flows whose target is one of these aliases (as MM2's --clusters)",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8083",
        help="address of the REST API and /metrics (default 127.0.0.1:8083)",
    )
    p.set_defaults(func=_run)


# -- mm2py translate-offsets -------------------------------------------------------


def _translate_offsets(args: argparse.Namespace) -> int:
    from confluent_kafka import KafkaException

    from mm2py.config import ConfigError
    from mm2py.tools.translate import (
        ApplyRefused,
        apply_offsets,
        check_aliases,
        format_json,
        format_text,
        gather,
    )

    config = _load(args.config)
    try:
        flow = check_aliases(config, args.source, args.target)
    except ConfigError as err:
        print(f"mm2py: {err}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = gather(config, flow, args.group, args.topic or ())
    except (KafkaException, TimeoutError) as err:
        print(f"mm2py: reading checkpoints on {args.target} failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    status = EXIT_OK if report.complete else EXIT_FAILED
    if args.apply:
        try:
            apply_offsets(config, report)
        except ApplyRefused as err:
            print(f"mm2py: translate-offsets --apply refused: {err}", file=sys.stderr)
            return EXIT_USAGE
        except KafkaException as err:
            print(
                f"mm2py: committing offsets of group {args.group} on {args.target} failed: {err}",
                file=sys.stderr,
            )
            status = EXIT_FAILED
    sys.stdout.write(format_json(report) if args.json else format_text(report))
    return status


def _add_pair_arguments(
    p: argparse.ArgumentParser,
    source_help: str = "alias of the source cluster",
    target_help: str = "alias of the target cluster",
) -> None:
    """CONFIG, --source and --target: the flow a command works on."""
    p.add_argument("config", type=Path, help="mm2.properties (MM2 format) or .yaml/.yml")
    p.add_argument("--source", required=True, help=source_help)
    p.add_argument("--target", required=True, help=target_help)


def _add_translate_offsets(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "translate-offsets",
        help="a consumer group's positions on the target cluster, from MM2's checkpoints",
        description=(
            "Print, per remote topic partition, the group's upstream offset, its translated "
            "downstream offset and the checkpoint's age, from <source>.checkpoints.internal "
            "on the target (written by mm2py or by MirrorMaker 2). Partitions that cannot "
            "be translated are listed with the reason. Exit status: 0 all translated, "
            "1 something could not be translated, 2 usage error or --apply refused."
        ),
    )
    _add_pair_arguments(
        p, "alias of the cluster the group ran on", "alias of the cluster to fail over to"
    )
    p.add_argument("--group", required=True, help="consumer group id")
    p.add_argument(
        "--topic",
        action="extend",
        nargs="+",
        metavar="T",
        help="only these topics (source or remote names): --topic T U or --topic T --topic U",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument(
        "--apply",
        action="store_true",
        help="commit the translated offsets to the group on the target "
        "(refused while the group has members there)",
    )
    p.set_defaults(func=_translate_offsets)


# -- mm2py verify ----------------------------------------------------------------


def _verify(args: argparse.Namespace) -> int:
    import re

    from confluent_kafka import KafkaException

    from mm2py.config import ConfigError
    from mm2py.tools.digest import format_json, format_text
    from mm2py.tools.translate import check_aliases
    from mm2py.tools.verify import PROGRESS_MIN_RECORDS, ProgressBar, Verifier, VerifyError

    config = _load(args.config)
    try:
        flow = check_aliases(config, args.source, args.target)
        if args.topics is not None:
            re.compile(args.topics)
    except ConfigError as err:
        print(f"mm2py: {err}", file=sys.stderr)
        return EXIT_USAGE
    except re.error as err:
        print(f"mm2py verify: --topics: invalid regular expression: {err}", file=sys.stderr)
        return EXIT_USAGE
    verifier = Verifier(config, flow)
    bar = None
    try:
        if sys.stderr.isatty():
            total = verifier.estimate(args.topics)
            if total >= PROGRESS_MIN_RECORDS:
                bar = ProgressBar(total)
        report = verifier.run(args.topics, bar)
    except (VerifyError, KafkaException) as err:
        print(f"mm2py verify: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if bar is not None:
            bar.close()
    sys.stdout.write(format_json(report) if args.json else format_text(report))
    return EXIT_OK if report.ok else EXIT_FAILED


def _add_verify(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verify",
        help="prove the target's copies equal their source, partition by partition",
        description=(
            "Read every replicated partition on both clusters (the source read_committed) "
            "and compare them record by record: count, and a digest over key, value, "
            "headers and timestamp in order, over the records both sides have. Status per "
            "partition: match; behind (equal so far, the rest not copied yet); mismatch; "
            "extra (the target has records its source does not); missing; unaligned "
            "(retention deleted the start on one side and no offset sync places it). "
            "Exit status 0 when every partition matches (or is behind), 1 otherwise, "
            "2 on a usage error."
        ),
    )
    _add_pair_arguments(p)
    p.add_argument(
        "--topics",
        default=None,
        metavar="REGEX",
        help="only replicated topics whose source or remote name matches (default: all "
        "but heartbeats)",
    )
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_verify)


# -- mm2py backfill --------------------------------------------------------------


def _backfill(args: argparse.Namespace) -> int:
    import re

    from confluent_kafka import KafkaException

    from mm2py.backfill.job import BackfillError, BackfillOptions, format_summary, run_backfill
    from mm2py.backfill.plan import TimeBoundError, parse_time_bound
    from mm2py.config import ConfigError
    from mm2py.tools.translate import check_aliases

    config = _load(args.config)
    try:
        check_aliases(config, args.source, args.target)
        topics = re.compile(args.topics) if args.topics is not None else None
        options = BackfillOptions(
            args.source,
            args.target,
            topics,
            parse_time_bound(args.from_, "earliest"),
            parse_time_bound(args.until, "now"),
            args.master,
            args.range_records,
            args.parallelism,
        )
    except ConfigError as err:
        print(f"mm2py: {err}", file=sys.stderr)
        return EXIT_USAGE
    except re.error as err:
        print(f"mm2py backfill: --topics: invalid regular expression: {err}", file=sys.stderr)
        return EXIT_USAGE
    except TimeBoundError as err:
        print(f"mm2py backfill: --from/--until: {err}", file=sys.stderr)
        return EXIT_USAGE
    tty = sys.stderr.isatty()

    def show(line: str) -> None:
        # On a terminal one line is rewritten in place; in a log, one line per update.
        sys.stderr.write(f"\r\033[K{line}" if tty else f"{line}\n")
        sys.stderr.flush()

    try:
        summary = run_backfill(config, options, show)
    except (BackfillError, KafkaException) as err:
        print(f"{chr(10) if tty else ''}mm2py backfill: {err}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print(
            f"{chr(10) if tty else ''}mm2py backfill: interrupted; run it again to continue "
            "from the last commit of each partition",
            file=sys.stderr,
        )
        return 130
    if tty:
        sys.stderr.write("\n")
    sys.stdout.write(format_summary(summary))
    return EXIT_OK


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _add_backfill(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from mm2py.backfill.plan import DEFAULT_RANGE_RECORDS

    p = sub.add_parser(
        "backfill",
        help="bulk-copy a flow's history with Spark, then hand over to `mm2py run`",
        description=(
            "Copy the records of the flow's topics (offsets fixed when it starts) to their "
            "remote topics with a PySpark job: same partition, key, value, headers and "
            "timestamp, aborted transactions left out. Writes offset syncs and the progress "
            "`mm2py run` (or MM2) continues from. Run again after an interruption: completed "
            "ranges are not copied again. Also runs under spark-submit "
            "(mm2py/backfill/submit.py)."
        ),
    )
    _add_pair_arguments(p)
    p.add_argument(
        "--topics",
        default=None,
        metavar="REGEX",
        help="only the flow's topics whose (source) name matches in full (default: all)",
    )
    p.add_argument(
        "--from",
        dest="from_",
        default="earliest",
        metavar="WHEN",
        help="earliest (default), an ISO-8601 time (UTC unless it says) or epoch ms: "
        "start at the first record with a timestamp at or after it",
    )
    p.add_argument(
        "--until",
        default="now",
        metavar="WHEN",
        help="now (default: the end offsets when the backfill starts), an ISO-8601 time "
        "or epoch ms: stop before the first record with a timestamp at or after it",
    )
    p.add_argument(
        "--master",
        default=None,
        help="Spark master (default: spark-submit's, else local[*])",
    )
    p.add_argument(
        "--range-records",
        type=_positive,
        default=DEFAULT_RANGE_RECORDS,
        metavar="N",
        help="split partitions into ranges of at most N offsets "
        f"(default {DEFAULT_RANGE_RECORDS:,})",
    )
    p.add_argument(
        "--parallelism",
        type=_positive,
        default=None,
        metavar="N",
        help="ranges copying at once (default: Spark's default parallelism, e.g. N of local[N])",
    )
    p.set_defaults(func=_backfill)


# -- mm2py status ----------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    from pydantic import ValidationError

    from mm2py.daemon.status import FlowStatus, Health, format_status

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
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        print(
            f"mm2py status: no mm2py daemon answers at {base} ({reason}); "
            "is `mm2py run` running? give its address with --url",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except (ValueError, ValidationError) as err:
        first = str(err).splitlines()[0]
        print(f"mm2py status: {base} is not an mm2py daemon: {first}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(format_status(flows, health))
    return EXIT_OK


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "status",
        help="flows, parts, states, lag and latency of a running daemon (its REST API)",
        description="Print a running daemon's flows with their parts' states, and per topic "
        "the records copied, the lag and the replication latency (p50/p99 of the last "
        "minute). Exit status 1 when no daemon answers.",
    )
    p.add_argument(
        "--url",
        default="http://127.0.0.1:8083",
        help="the daemon's address (its --listen; default http://127.0.0.1:8083)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help=argparse.SUPPRESS)
    p.set_defaults(func=_status)


# -- mm2py demo ------------------------------------------------------------------


def _demo(args: argparse.Namespace) -> int:
    from mm2py.config import ConfigError
    from mm2py.dev.demo import run_demo
    from mm2py.dev.jars import JarFetchError
    from mm2py.dev.launcher import LocalClusterError

    try:
        run_demo(args.config, seconds=args.seconds, rate=args.rate, listen=args.listen)
    except ConfigError as err:
        print(f"mm2py: {err}", file=sys.stderr)
        return EXIT_USAGE
    except (LocalClusterError, JarFetchError) as err:
        print(f"mm2py demo: {err}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _add_demo(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from mm2py.dev.demo import DEFAULT_CONFIG

    p = sub.add_parser(
        "demo",
        help="start local clusters A and B, replicate live sample traffic, show it arriving",
    )
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--seconds", type=float, default=None, help="stop after this long")
    p.add_argument("--rate", type=float, default=5.0, help="orders per second produced to A")
    p.add_argument("--listen", default="127.0.0.1:8083", help="address for /metrics")
    p.set_defaults(func=_demo)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser (exposed for tests and --help)."""
    parser = argparse.ArgumentParser(
        prog="mm2py",
        description="Replicate Kafka topics between clusters; compatible with MirrorMaker 2.",
    )
    parser.add_argument("--version", action="version", version=f"mm2py {__version__}")
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text: one line per event; json: one JSON object per line (time, level, "
        "logger, message, flow, topic, partition) for log shippers",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_run(sub)
    _add_translate_offsets(sub)
    _add_verify(sub)
    _add_backfill(sub)
    _add_status(sub)
    _add_local(sub)
    _add_demo(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `mm2py` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    from mm2py import logs

    logs.configure(args.log_level, args.log_format)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
