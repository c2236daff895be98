"""mm2py's Connect-compatible REST API beside a real Kafka Connect worker running MM2's three
connectors on the same clusters: both are asked the same questions and must answer with
the same status codes and the same JSON structure (keys, value types, Connect's state
names); values may differ (versions, worker ids), except where both copy the same data.

The worker's MM2 uses the separator `-`, so its remote topic (`A-t`) and internal topics
(`A-checkpoints-internal`, `mm2-offset-syncs-B-internal`) never meet mm2py's (`_` would
collide: Kafka refuses `A_t` beside `A.t`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mm2py.dev.connect import ConnectWorker, mirror_connector_config
from mm2py.dev.launcher import LocalCluster
from tests.daemon_harness import RunningDaemon, mm2_properties, running_daemon
from tests.kafka_helpers import commit_offsets, create_topic, produce, wait_until

pytestmark = pytest.mark.integration

KINDS = ("MirrorSourceConnector", "MirrorCheckpointConnector", "MirrorHeartbeatConnector")
STATES = {"UNASSIGNED", "RUNNING", "PAUSED", "FAILED", "RESTARTING", "STOPPED"}
SOURCE = "A->B.MirrorSourceConnector"
# Keys mm2py adds to Connect's answer, by path.
EXTRA_KEYS = {"/": {"name"}}


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw.strip() else None
    except urllib.error.HTTPError as err:
        raw = err.read()
        return err.code, json.loads(raw) if raw.strip() else None


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def differences(connect: Any, ours: Any, where: str, path: str) -> list[str]:
    """Where the structure of `ours` differs from `connect`'s (keys, types, state names)."""
    if isinstance(connect, dict) and isinstance(ours, dict):
        if where.endswith("config") or (where == "" and path.endswith("/config")):
            # Connector and task settings: the keys are data, the values strings.
            types = {type(v).__name__ for v in [*connect.values(), *ours.values()]}
            return [] if types == {"str"} else [f"{where}: values {types}"]
        out = []
        extra = EXTRA_KEYS.get(path, set()) if where == "" else set()
        if connect.keys() != ours.keys() - extra:
            out.append(f"{where or '.'}: keys {sorted(connect)} != {sorted(ours)}")
        for key in connect.keys() & ours.keys():
            out += differences(connect[key], ours[key], f"{where}.{key}".lstrip("."), path)
        return out
    if isinstance(connect, list) and isinstance(ours, list):
        if bool(connect) != bool(ours):
            return [f"{where or '.'}: {len(connect)} items != {len(ours)}"]
        return [d for item in ours for d in differences(connect[0], item, where + "[]", path)]
    if where.endswith("state"):
        return [] if {connect, ours} <= STATES else [f"{where}: {connect!r}, {ours!r}"]
    if where.endswith("version") and None in (connect, ours):
        return []  # Connect shows null while a connector restarts
    if type(connect) is not type(ours):
        return [f"{where or '.'}: {type(connect).__name__} != {type(ours).__name__}"]
    return []


class Both:
    """Asks the Connect worker and mm2py the same question, compares the answers."""

    def __init__(self, worker: ConnectWorker, daemon: RunningDaemon) -> None:
        self.connect = worker.url
        self.mm2py = f"http://{daemon.listen}"
        self.asked = 0

    def ask(self, method: str, path: str, body: Any = None) -> tuple[Any, Any]:
        connect = _call(self.connect, method, path, body)
        ours = _call(self.mm2py, method, path, body)
        assert ours[0] == connect[0], f"{method} {path}: {connect} vs mm2py {ours}"
        found = differences(connect[1], ours[1], "", path)
        assert not found, f"{method} {path}: {found}\nConnect: {connect[1]}\nmm2py:   {ours[1]}"
        self.asked += 1
        return connect[1], ours[1]


def _offsets(base: str, kind: str) -> list[Any]:
    code, body = _call(base, "GET", f"/connectors/{_q('A->B.' + kind)}/offsets")
    return list(body["offsets"]) if code == 200 else []


def _copied(base: str, topic: str) -> dict[tuple[str, int], int]:
    """The source connector's offsets of `topic` (heartbeats topics are copied too)."""
    return {
        (o["partition"]["topic"], o["partition"]["partition"]): o["offset"]["offset"]
        for o in _offsets(base, KINDS[0])
        if o["partition"]["topic"] == topic
    }


def _states(base: str) -> set[str]:
    _code, body = _call(base, "GET", f"/connectors/{_q(SOURCE)}/status")
    return {body["connector"]["state"], *(t["state"] for t in body["tasks"])}


def test_connect_api_answers_as_a_connect_worker_running_mm2(
    cluster_a: LocalCluster, cluster_b: LocalCluster, unique: str, tmp_path: Path
) -> None:
    create_topic(cluster_a, unique, partitions=2)
    produce(cluster_a, unique, [(i % 2, None, f"v{i}".encode()) for i in range(10)])
    group = f"{unique}-g"
    commit_offsets(cluster_a, group, {(unique, 0): 2, (unique, 1): 3})
    a, b = cluster_a.bootstrap_servers, cluster_b.bootstrap_servers
    config = tmp_path / "mm2.properties"
    config.write_text(mm2_properties(cluster_a, cluster_b, unique, groups=group))

    with ConnectWorker(b, tmp_path / "connect", f"mm2py-test-{unique}") as worker:
        worker.wait_ready()
        for kind in KINDS:
            settings = mirror_connector_config(
                kind,
                "A",
                a,
                "B",
                b,
                topics=unique,
                groups=group,
                **{"replication.policy.separator": "-"},
            )
            worker.create_connector(f"A->B.{kind}", settings)
        with running_daemon(config) as daemon:
            # Asked right away below: a node answers once it has started its REST API
            # (asked before, the first call was refused in a fresh clone's run).
            daemon.wait_serving()
            both = Both(worker, daemon)
            for kind in KINDS:
                worker.wait_running(f"A->B.{kind}")
            for base in (worker.url, both.mm2py):
                for kind in KINDS:
                    wait_until(
                        lambda b=base, k=kind: _offsets(b, k), timeout=90, what=f"{kind} offsets"
                    )
                # Everything copied: the last offset of each partition is 4.
                wait_until(
                    lambda b=base: _copied(b, unique) == {(unique, 0): 4, (unique, 1): 4},
                    timeout=60,
                    what=f"all records copied ({base})",
                )

            root, ours = both.ask("GET", "/")
            assert ours["name"] == "mm2py" and ours["kafka_cluster_id"] == root["kafka_cluster_id"]
            names, ours = both.ask("GET", "/connectors")
            assert sorted(ours) == sorted(names) == sorted(f"A->B.{k}" for k in KINDS)
            for expand in ("status", "info", "status&expand=info"):
                both.ask("GET", f"/connectors?expand={expand}")
            both.ask("GET", "/connector-plugins")

            for kind in KINDS:
                name = _q(f"A->B.{kind}")
                both.ask("GET", f"/connectors/{name}")
                connect, ours = both.ask("GET", f"/connectors/{name}/config")
                for key in ("connector.class", "source.cluster.alias", "target.cluster.alias"):
                    assert ours[key] == connect[key], key
                assert ours["name"] == connect["name"] == f"A->B.{kind}"
                connect, ours = both.ask("GET", f"/connectors/{name}/tasks")
                for key in ("task.class", "task.index", "task.assigned.groups", "connector.class"):
                    assert ours[0]["config"].get(key) == connect[0]["config"].get(key), key
                if kind == KINDS[0]:
                    # The heartbeats topic (copied whatever the filter) appears on A when
                    # the pair B->A first emits, a moment of its own on each side.
                    assigned = [
                        {p for p in t[0]["config"]["task.assigned.partitions"].split(",")}
                        - {"heartbeats-0"}
                        for t in (connect, ours)
                    ]
                    assert assigned[0] == assigned[1] == {f"{unique}-0", f"{unique}-1"}
                both.ask("GET", f"/connectors/{name}/status")
                both.ask("GET", f"/connectors/{name}/tasks/0/status")
                connect, ours = both.ask("GET", f"/connectors/{name}/offsets")
                if kind == KINDS[0]:  # both copied the same topic to its end
                    assert _copied(both.mm2py, unique) == _copied(worker.url, unique)
                    assert {*ours["offsets"][0]["partition"]} == {"cluster", "topic", "partition"}

            source = _q(SOURCE)
            # Errors: the same codes, Connect's error body.
            for method, path in [
                ("GET", "/connectors/A-%3EB.NoSuchConnector"),
                ("GET", "/connectors/nope/status"),
                ("GET", f"/connectors/{source}/tasks/7/status"),
                ("GET", f"/connectors/{source}/tasks/x/status"),
                ("POST", f"/connectors/{source}/tasks/7/restart"),
                ("POST", f"/connectors/{source}/tasks/x/restart"),
                ("PUT", "/connectors/nope/pause"),
                ("PUT", "/connectors/nope/resume"),
                ("POST", "/connectors/nope/restart"),
                ("DELETE", "/connectors/nope"),
                ("GET", "/connectors/nope/offsets"),
                ("PATCH", "/connectors"),
                ("PUT", f"/connectors/{source}/status"),
                ("GET", "/no/such/path"),
            ]:
                connect, _ours = both.ask(method, path)
                assert set(connect) == {"error_code", "message"}
            # Creating an existing connector conflicts on both.
            existing = mirror_connector_config(KINDS[0], "A", a, "B", b, topics=unique)
            both.ask("POST", "/connectors", {"name": SOURCE, "config": existing})

            # Pause, resume and restarts: the same codes, the same status structure.
            both.ask("PUT", f"/connectors/{source}/pause")
            for base in (worker.url, both.mm2py):
                wait_until(lambda b=base: _states(b) == {"PAUSED"}, timeout=30, what="PAUSED")
            both.ask("GET", f"/connectors/{source}/status")
            both.ask("PUT", f"/connectors/{source}/resume")
            for base in (worker.url, both.mm2py):
                wait_until(lambda b=base: _states(b) == {"RUNNING"}, timeout=30, what="RUNNING")
            both.ask("POST", f"/connectors/{source}/restart")
            both.ask("POST", f"/connectors/{source}/restart?includeTasks=true")
            both.ask("POST", f"/connectors/{source}/restart?includeTasks=true&onlyFailed=true")
            for base in (worker.url, both.mm2py):
                wait_until(lambda b=base: _states(b) == {"RUNNING"}, timeout=60, what="RUNNING")
            both.ask("POST", f"/connectors/{source}/tasks/0/restart")
            assert both.asked >= 40
