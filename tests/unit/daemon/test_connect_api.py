"""The Connect-compatible REST API over a stand-in daemon: its pure mapping of flows to MM2's
connectors, and its answers over HTTP (served by uvicorn on a free port, no broker)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from mm2py.config import MirrorConfig, load_config
from mm2py.daemon import connect_worker
from mm2py.daemon.api import ApiServer, bind, build_app
from mm2py.daemon.connect_api import java_boolean, restart_plan, task_number
from mm2py.daemon.connect_worker import (
    CHECKPOINT,
    HEARTBEAT,
    SOURCE,
    Connector,
    Task,
    connector_config,
    connector_state,
    kinds_run,
    split_name,
    task_config,
    task_state,
    worker_id,
)
from mm2py.runtime.status import FlowStatus, Health, PartStatus, flow_state, health

SECRET = "pw-Zq81xv"
CONFIG = f"""clusters = A, B
A.bootstrap.servers = a:9092
B.bootstrap.servers = b:9092
A.security.protocol = SASL_SSL
A.sasl.mechanism = SCRAM-SHA-512
A.sasl.jaas.config = org.apache.kafka.common.security.scram.ScramLoginModule required \\
  username="alice" password="{SECRET}";
B.consumer.ssl.key.password = {SECRET}
A->B.enabled = true
topics = .*
A->B.topics = orders.*
replication.policy.class = org.apache.kafka.connect.mirror.DefaultReplicationPolicy
offset.storage.topic = my-offsets
B->A.emit.heartbeats.enabled = true
"""


@pytest.fixture
def config(tmp_path: Path) -> MirrorConfig:
    path = tmp_path / "mm2.properties"
    path.write_text(CONFIG)
    return load_config(path)


def part(name: str, state: str = "RUNNING", **extra: Any) -> PartStatus:
    return PartStatus.model_validate({"part": name, "state": state, "restarts": 0, **extra})


def flow_status(name: str, *parts: PartStatus) -> FlowStatus:
    source, target = name.split("->")
    return FlowStatus(
        name=name,
        source=source,
        target=target,
        replicating=any(p.part != "heartbeat" for p in parts),
        delivery="at-least-once",
        state=flow_state(parts),
        parts=list(parts),
        topics=[],
        lag_records=0,
    )


# -- pure -------------------------------------------------------------------------------


def test_connector_config_is_the_flows_mm2_settings_with_secrets_hidden(
    config: MirrorConfig,
) -> None:
    shown = connector_config(config, Connector(config.flow("A", "B"), SOURCE))
    assert shown["name"] == "A->B.MirrorSourceConnector"
    assert shown["connector.class"] == "org.apache.kafka.connect.mirror.MirrorSourceConnector"
    assert (shown["source.cluster.alias"], shown["target.cluster.alias"]) == ("A", "B")
    assert shown["enabled"] == "true"
    assert shown["topics"] == "orders.*"  # A->B.topics over topics
    assert shown["replication.policy.class"] == (
        "org.apache.kafka.connect.mirror.DefaultReplicationPolicy"
    )
    assert shown["source.cluster.bootstrap.servers"] == "a:9092"
    assert shown["source.cluster.sasl.username"] == "alice"
    assert shown["source.cluster.sasl.password"] == "[hidden]"
    assert shown["target.consumer.ssl.key.password"] == "[hidden]"
    assert "offset.storage.topic" not in shown  # a worker setting in MM2
    assert SECRET not in json.dumps(shown)
    heartbeat = Connector(config.flow("B", "A"), HEARTBEAT)
    assert connector_config(config, heartbeat)["enabled"] == "false"


def test_task_configs_carry_what_mm2s_tasks_are_given(config: MirrorConfig) -> None:
    flow = config.flow("A", "B")
    task = Task(0, "h:1", "RUNNING", partitions=("t-0", "t-1"), groups=("g1", "g2"))
    source = task_config(config, Connector(flow, SOURCE), task)
    assert source["task.class"] == "org.apache.kafka.connect.mirror.MirrorSourceTask"
    assert (source["task.index"], source["task.assigned.partitions"]) == ("0", "t-0,t-1")
    checkpoint = task_config(config, Connector(flow, CHECKPOINT), task)
    assert checkpoint["task.assigned.groups"] == "g1,g2"
    heartbeat = task_config(config, Connector(flow, HEARTBEAT), task)
    assert "task.index" not in heartbeat and "task.assigned.partitions" not in heartbeat


def test_a_flow_shows_only_the_connectors_it_runs() -> None:
    full = flow_status("A->B", part("source"), part("checkpoint"), part("sync"), part("heartbeat"))
    assert kinds_run(full) == [SOURCE, CHECKPOINT, HEARTBEAT]
    # emit.checkpoints off, no heartbeats: the source connector alone (sync is its own work).
    assert kinds_run(flow_status("A->B", part("source"), part("sync"))) == [SOURCE]
    assert kinds_run(flow_status("B->A", part("heartbeat"))) == [HEARTBEAT]
    assert split_name("A->B.MirrorSourceConnector") == ("A->B", SOURCE)
    assert split_name("x.y->z.MirrorHeartbeatConnector") == ("x.y->z", HEARTBEAT)
    assert split_name("A->B.Other") is None and split_name("nothing") is None


def test_part_states_as_connect_task_states() -> None:
    assert task_state(part("source")) == ("RUNNING", None)
    assert task_state(part("source", "PAUSED")) == ("PAUSED", None)
    failed = part("source", "FAILED", trace="Traceback\nBoom")
    assert task_state(failed) == ("FAILED", "Traceback\nBoom")
    # A cluster that does not answer: Connect's task stays RUNNING while its clients retry...
    outage = ["cluster B (b:9092) since 12:00:00"]
    assert task_state(part("source", "UNREACHABLE", unreachable=outage)) == ("RUNNING", None)
    # ...unless it failed meanwhile.
    ended = part("source", "UNREACHABLE", trace="Boom", unreachable=outage)
    assert task_state(ended) == ("FAILED", "Boom\n" + outage[0])
    stopped = part("source", failed_partitions={"A.t-0": "record too large"})
    state, trace = task_state(stopped)
    assert state == "FAILED" and trace is not None and "A.t-0: record too large" in trace


def test_the_source_connector_itself_is_its_config_and_acl_sync() -> None:
    status = flow_status("A->B", part("source"), part("sync", "FAILED", trace="denied"))
    running = [Task(0, "h:1", "RUNNING")]
    assert connector_state(SOURCE, status, running) == ("FAILED", "denied")
    paused = flow_status("A->B", part("source", "PAUSED"), part("sync", "PAUSED"))
    assert connector_state(SOURCE, paused, [Task(0, "h:1", "PAUSED")]) == ("PAUSED", None)
    assert connector_state(HEARTBEAT, status, running) == ("RUNNING", None)


def test_request_parameters_read_as_connect_reads_them() -> None:
    assert java_boolean("TRUE") and java_boolean("true")
    assert not java_boolean("yes") and not java_boolean(None) and not java_boolean("")
    assert task_number("0") == 0 and task_number("+3") == 3 and task_number("-1") == -1
    assert task_number("x") is None and task_number("2147483648") is None
    assert task_number(" 1") is None
    failed, running = Task(0, "h:1", "FAILED"), Task(0, "h:1", "RUNNING")
    assert restart_plan("RUNNING", [running], include_tasks=False, only_failed=False)
    assert not restart_plan("RUNNING", [failed], include_tasks=False, only_failed=True)
    assert restart_plan("RUNNING", [failed], include_tasks=True, only_failed=True)
    assert restart_plan("FAILED", [running], include_tasks=False, only_failed=True)
    assert not restart_plan("RUNNING", [running], include_tasks=True, only_failed=True)


def test_worker_id_is_the_rest_listener() -> None:
    assert worker_id("127.0.0.1:8083") == "127.0.0.1:8083"
    assert worker_id("[::1]:8083") == "[::1]:8083"
    wildcard = worker_id("0.0.0.0:9000")
    assert wildcard.endswith(":9000") and not wildcard.startswith("0.0.0.0")


# -- over HTTP ----------------------------------------------------------------------------


class StandIn:
    """What the API needs of the daemon, with flows given as statuses."""

    def __init__(self, config: MirrorConfig, statuses: dict[str, FlowStatus]) -> None:
        self.config = config
        self.listen = "127.0.0.1:8083"
        self.registry = CollectorRegistry()
        self.statuses = statuses
        self.calls: list[tuple[str, str]] = []

    def flow_names(self) -> list[str]:
        return list(self.statuses)

    def flow_status(self, name: str) -> FlowStatus:
        return self.statuses[name]

    def pause_flow(self, name: str) -> None:
        self.calls.append(("pause", name))

    def resume_flow(self, name: str) -> None:
        self.calls.append(("resume", name))

    def restart_flow(self, name: str) -> None:
        self.calls.append(("restart", name))

    def health(self) -> Health:
        return health(self.statuses.values())

    def cluster_status(self) -> list[Any]:
        return []

    def flow_cluster(self, name: str) -> None:
        return None  # no cluster of nodes: the API shows this node's tasks

    def flow_parts(self, name: str) -> list[Any]:
        return []  # statuses only


@pytest.fixture
def stand_in(config: MirrorConfig) -> StandIn:
    failed = part("checkpoint", "FAILED", trace="Traceback\nKafkaException: denied")
    return StandIn(
        config,
        {
            "A->B": flow_status("A->B", part("source"), failed, part("sync"), part("heartbeat")),
            "B->A": flow_status("B->A", part("heartbeat")),
        },
    )


@pytest.fixture
def base(stand_in: StandIn) -> Iterator[str]:
    server = ApiServer(build_app(stand_in), bind("127.0.0.1", 0))  # type: ignore[arg-type]
    server.start()
    try:
        yield f"http://127.0.0.1:{server.socket.getsockname()[1]}"
    finally:
        server.stop()


def call(base: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any, Any]:
    request = urllib.request.Request(base + path, data=body, method=method)
    for _ in range(50):
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None, resp.headers
        except urllib.error.HTTPError as err:
            raw = err.read()
            return err.code, json.loads(raw) if raw else None, err.headers
        except urllib.error.URLError:  # the server thread is still starting
            time.sleep(0.1)
    raise AssertionError(f"no answer from {base}")


SRC = "/connectors/A-%3EB.MirrorSourceConnector"
CKP = "/connectors/A-%3EB.MirrorCheckpointConnector"


def test_connectors_and_their_states(base: str) -> None:
    code, names, _ = call(base, "GET", "/connectors")
    assert code == 200
    assert names == [
        "A->B.MirrorSourceConnector",
        "A->B.MirrorCheckpointConnector",
        "A->B.MirrorHeartbeatConnector",
        "B->A.MirrorHeartbeatConnector",
    ]
    code, status, _ = call(base, "GET", f"{CKP}/status")
    assert code == 200 and status["connector"]["state"] == "RUNNING"
    assert "trace" not in status["connector"]
    task = status["tasks"][0]
    assert (task["id"], task["state"], task["worker_id"]) == (0, "FAILED", "127.0.0.1:8083")
    assert task["trace"].endswith("KafkaException: denied")
    code, expanded, _ = call(base, "GET", "/connectors?expand=info&expand=status&expand=x")
    assert code == 200 and set(expanded["B->A.MirrorHeartbeatConnector"]) == {"info", "status"}
    code, only, _ = call(base, "GET", "/connectors?expand=x")
    assert code == 200 and only["A->B.MirrorSourceConnector"] == {}
    code, found, _ = call(base, "GET", "/connectors/A-B.MirrorSourceConnector")  # A-B for A->B
    assert code == 200 and found["tasks"] == [
        {"connector": SRC[12:].replace("%3E", ">"), "task": 0}
    ]
    code, body, _ = call(base, "GET", "/connector-plugins")
    assert code == 200 and [p["class"].rsplit(".", 1)[1] for p in body] == sorted(
        [SOURCE, CHECKPOINT, HEARTBEAT]
    )


def test_errors_are_connects_error_body(base: str, stand_in: StandIn) -> None:
    code, body, _ = call(base, "GET", "/connectors/A-%3EB.MirrorNothing/status")
    assert (code, body["error_code"]) == (404, 404)
    assert body["message"] == "No status found for connector A->B.MirrorNothing"
    # B->A runs no checkpoint connector.
    assert call(base, "GET", "/connectors/B-%3EA.MirrorCheckpointConnector")[0] == 404
    assert call(base, "GET", f"{SRC}/tasks/1/status")[1]["message"] == (
        "No status found for task A->B.MirrorSourceConnector-1"
    )
    assert call(base, "POST", f"{SRC}/tasks/x/restart")[1] == {
        "error_code": 404,
        "message": "HTTP 404 Not Found",
    }
    assert call(base, "GET", "/no/such/path")[1]["message"] == "HTTP 404 Not Found"
    code, body, headers = call(base, "POST", f"{SRC}/config")
    assert (code, body["message"]) == (405, "HTTP 405 Method Not Allowed")
    assert headers["Allow"] == "GET, PATCH, PUT"
    code, body, _ = call(base, "GET", "/flows/X-%3EY/status")  # /flows' errors too
    assert code == 404 and body["message"].startswith("no flow 'X->Y'")
    assert stand_in.calls == []


def test_writes_mm2py_cannot_honour_conflict(base: str, stand_in: StandIn) -> None:
    created = json.dumps({"name": "A->B.MirrorSourceConnector", "config": {}}).encode()
    code, body, _ = call(base, "POST", "/connectors", created)
    assert (code, body["message"]) == (409, "Connector A->B.MirrorSourceConnector already exists")
    code, body, _ = call(base, "POST", "/connectors", b'{"name": "new"}')
    assert code == 409 and "mm2.properties" in body["message"]
    assert call(base, "POST", "/connectors", b"{not json")[0] == 400
    for method, path in [
        ("PUT", f"{SRC}/config"),
        ("PATCH", f"{SRC}/config"),
        ("DELETE", SRC),
        ("PUT", f"{SRC}/stop"),
        ("PATCH", f"{SRC}/offsets"),
        ("DELETE", f"{SRC}/offsets"),
    ]:
        code, body, _ = call(base, method, path, b"{}" if method != "DELETE" else None)
        assert (code, body["error_code"]) == (409, 409), (method, path)
    assert call(base, "DELETE", "/connectors/nope.MirrorSourceConnector")[0] == 404
    assert stand_in.calls == []


def test_pause_resume_restart_act_on_the_flow(base: str, stand_in: StandIn) -> None:
    assert call(base, "PUT", f"{SRC}/pause")[:2] == (202, None)
    assert call(base, "PUT", f"{SRC}/resume")[:2] == (202, None)
    # The checkpoint connector cannot pause alone; a pair that only heartbeats can.
    code, body, _ = call(base, "PUT", f"{CKP}/pause")
    assert code == 409 and "A->B.MirrorSourceConnector" in body["message"]
    assert call(base, "PUT", "/connectors/B-%3EA.MirrorHeartbeatConnector/pause")[0] == 202
    assert call(base, "POST", f"{SRC}/restart")[:2] == (204, None)
    # Nothing of the source connector failed: onlyFailed restarts nothing.
    code, body, _ = call(base, "POST", f"{SRC}/restart?includeTasks=true&onlyFailed=true")
    assert code == 202 and body["name"] == "A->B.MirrorSourceConnector"
    # The checkpoint task FAILED: it is restarted.
    assert call(base, "POST", f"{CKP}/restart?includeTasks=true&onlyFailed=TRUE")[0] == 202
    assert call(base, "POST", f"{CKP}/tasks/0/restart")[:2] == (204, None)
    assert stand_in.calls == [
        ("pause", "A->B"),
        ("resume", "A->B"),
        ("pause", "B->A"),
        ("restart", "A->B"),
        ("restart", "A->B"),
        ("restart", "A->B"),
    ]


def test_no_answer_shows_a_secret(base: str) -> None:
    for path in ["/connectors?expand=info", f"{SRC}/config", f"{SRC}/tasks", f"{CKP}/status"]:
        code, body, _ = call(base, "GET", path)
        assert code == 200 and SECRET not in json.dumps(body)


def test_the_cluster_id_is_asked_again_only_after_a_while(
    stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    def ask(cluster: Any) -> str | None:
        asked.append(cluster.alias)
        return None if len(asked) == 1 else "abc"

    monkeypatch.setattr(connect_worker, "ask_cluster_id", ask)
    worker = connect_worker.LocalWorker(stand_in)  # type: ignore[arg-type]
    assert worker.kafka_cluster_id() is None  # B does not answer: null at once
    assert worker.kafka_cluster_id() is None and asked == ["B"]  # not asked again yet
    worker._cluster_id_next = 0.0  # as after CLUSTER_ID_RETRY seconds
    assert worker.kafka_cluster_id() == "abc" and asked == ["B", "B"]
    assert worker.kafka_cluster_id() == "abc" and asked == ["B", "B"]  # kept once known
