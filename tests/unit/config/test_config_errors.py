"""Bad configurations: one-line ConfigErrors naming file and key, and secrets never shown."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from mm2py.config import ConfigError, load_config

SECRET = "Hunter2-TopSecret"
PROPS = (
    "clusters = A, B\nA.bootstrap.servers = a:9092\nB.bootstrap.servers = b:9092\n"
    f"A.sasl.password = {SECRET}\nA->B.enabled = true\n"
)
YAML = (
    "clusters:\n  A:\n    bootstrap.servers: a:9092\n"
    f"    sasl.password: {SECRET}\n  B:\n    bootstrap.servers: b:9092\n"
)
OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"

BAD_PROPERTIES = [
    # (test id, file text, key in the message, part of the message)
    ("unknown-cluster", PROPS + "A->C.enabled = true\n", "A->C.enabled", "'C' is not listed"),
    ("unknown-source", PROPS + "X->B.topics = t\n", "X->B.topics", "'X' is not listed"),
    ("no-bootstrap", PROPS.replace("B.bootstrap.servers = b:9092\n", ""), "B.bootstrap.servers",
     "missing"),
    ("self-flow", PROPS + "A->A.enabled = true\n", "A->A.enabled", "two different clusters"),
    ("bad-topics-regex", PROPS + "A->B.topics = ok, foo(\n", "A->B.topics",
     "invalid regular expression 'foo('"),
    ("bad-groups-regex", PROPS + "groups = [a\n", "groups", "invalid regular expression"),
    ("bad-exclude-regex", PROPS + "B->A.topics.exclude = *x\n", "B->A.topics.exclude",
     "invalid regular expression"),
    ("negative-interval", PROPS + "A->B.emit.checkpoints.interval.seconds = -5\n",
     "A->B.emit.checkpoints.interval.seconds", "or -1 to disable"),
    ("zero-interval", PROPS + "refresh.topics.interval.seconds = 0\n",
     "refresh.topics.interval.seconds", "at least 1 second"),
    ("unknown-policy", PROPS + "replication.policy.class = com.acme.MyPolicy\n",
     "replication.policy.class", "unsupported replication policy"),
    ("continuation-at-eof", PROPS + "topics = a, \\", "line 6", "trailing backslash"),
    ("bad-unicode-escape", PROPS + "topics = \\u12G4\n", "line 6", "\\uXXXX"),
    ("empty-key", PROPS + "= value\n", "line 6", "missing key"),
    ("not-an-int", PROPS + "replication.factor = abc\n", "replication.factor",
     "expected an integer (got 'abc')"),
    ("not-a-bool", PROPS.replace("A->B.enabled = true", "A->B.enabled = maybe"), "A->B.enabled",
     "expected true or false"),
    ("not-a-bool-setting", PROPS + "sync.topic.acls.enabled = yes\n", "sync.topic.acls.enabled",
     "expected true or false"),
    ("empty-clusters", PROPS.replace("clusters = A, B", "clusters ="), "clusters",
     "no clusters listed"),
    ("no-clusters-key", PROPS.replace("clusters = A, B\n", ""), "clusters", "no clusters listed"),
    ("bad-location", PROPS + "offset-syncs.topic.location = middle\n",
     "offset-syncs.topic.location", "'source' or 'target'"),
    ("replication-factor-0", PROPS + "A->B.replication.factor = 0\n", "A->B.replication.factor",
     "between 1 and 32767"),
    ("internal-topic-rf-0", PROPS + "B.offset.storage.replication.factor = 0\n",
     "B.offset.storage.replication.factor", "between 1 and 32767"),
    ("duplicate-alias", PROPS.replace("A, B", "A, B, A"), "clusters", "'A' is listed twice"),
    ("alias-with-separator", PROPS.replace("A", "us.east"), "clusters",
     "contains the replication.policy.separator '.'"),
    ("alias-with-arrow", PROPS.replace("A, B", "A->X, B"), "clusters", "invalid cluster alias"),
    ("empty-separator", PROPS + "replication.policy.separator =\n",
     "replication.policy.separator", "must not be empty"),
    ("bad-security-protocol", PROPS + "A.security.protocol = TLS\n", "A.security.protocol",
     "'SASL_SSL'"),
    ("unmappable-jaas", PROPS + f"B.sasl.jaas.config = {OAUTH} required unsecuredLoginString"
     f'ClaimSub="{SECRET}";\n', "B.sasl.jaas.config", f"login module {OAUTH} cannot be mapped"),
    ("jaas-no-password", PROPS + f'B.sasl.jaas.config = {SCRAM} required username="u";\n',
     "B.sasl.jaas.config", "no password"),
    ("jaas-unterminated", PROPS + f'B.consumer.sasl.jaas.config = {SCRAM} required '
     f'username="u" password="{SECRET}\n', "B.consumer.sasl.jaas.config", "unterminated"),
    ("jaas-garbled", PROPS + f'B.sasl.jaas.config = password="{SECRET}"\n',
     "B.sasl.jaas.config", "expected '<LoginModule> required"),
    ("custom-filter", PROPS + "topic.filter.class = com.acme.Filter\n", "topic.filter.class",
     "custom Java classes"),
    ("config-providers", PROPS + "config.providers = file\n", "config.providers",
     "not supported"),
    ("tasks-max-0", PROPS + "tasks.max = 0\n", "tasks.max", "at least 1"),
    ("registry-sync-no-urls", PROPS + "schema.registry.sync.enabled = true\n",
     "schema.registry.sync.enabled", "A.schema.registry.url and B.schema.registry.url is not set"),
    ("registry-sync-no-target-url", PROPS + "A->B.schema.registry.sync.enabled = true\n"
     "A.schema.registry.url = http://a:8081\n"
     f"A.schema.registry.basic.auth.user.info = u:{SECRET}\n",
     "A->B.schema.registry.sync.enabled", "B.schema.registry.url is not set"),
    ("registry-unresolved-ids", PROPS + "schema.registry.unresolved.ids = skip\n",
     "schema.registry.unresolved.ids", "'fail' or 'copy'"),
    ("copy-mode-bad-value", PROPS + "A->B.replication.copy.mode = raw\n",
     "A->B.replication.copy.mode", "'auto', 'batch' or 'record'"),
    ("copy-mode-batch-registry", PROPS + "A->B.replication.copy.mode = batch\n"
     "A->B.schema.registry.sync.enabled = true\nA.schema.registry.url = http://a:8081\n"
     "B.schema.registry.url = http://b:8081\n", "A->B.replication.copy.mode",
     "set A->B.replication.copy.mode = record or auto"),
    ("negative-lag", PROPS + "offset.lag.max = -1\n", "offset.lag.max", "at least 0"),
    ("missing-flow-key", PROPS + "A->B = x\n", "A->B", "missing setting name"),
    ("admin-timeout-0", PROPS + "admin.timeout.ms = 0\n", "admin.timeout.ms", "at least 1"),
    # Exactly-once required where it cannot be had: the key that requires it, what to set.
    ("eos-required", PROPS + "exactly.once.support = required\n", "exactly.once.support",
     "required, but exactly-once is not enabled for flows into B"
     " (B.exactly.once.source.support is not set (disabled)); set"
     " B.exactly.once.source.support = enabled, or exactly.once.support = requested"),
    ("eos-required-per-flow", PROPS + "A->B.exactly.once.support = REQUIRED \n",
     "A->B.exactly.once.support", "or A->B.exactly.once.support = requested to copy"),
    ("eos-required-preparing", PROPS + "B.exactly.once.source.support = preparing\n"
     "exactly.once.support = required\n", "exactly.once.support",
     "(B.exactly.once.source.support is preparing)"),
    ("eos-required-flow-disables", PROPS + "exactly.once.source.support = enabled\n"
     "A->B.exactly.once.source.support = disabled\nB.exactly.once.support = required\n",
     "B.exactly.once.support", "(A->B.exactly.once.source.support is disabled)"),
    ("eos-required-read-uncommitted", PROPS + "B.exactly.once.source.support = enabled\n"
     "A->B.exactly.once.support = required\nA.consumer.isolation.level = read_uncommitted\n",
     "A.consumer.isolation.level", "read_uncommitted: exactly-once"
     " (A->B.exactly.once.support = required for A->B) needs the source read with"
     " read_committed"),
    ("eos-required-read-uncommitted-common", PROPS + "exactly.once.source.support = enabled\n"
     "exactly.once.support = required\nA.isolation.level = READ_UNCOMMITTED\n",
     "A.isolation.level", "remove the key or set read_committed"),
    ("eos-boundary-connector", PROPS + "transaction.boundary = Connector\n",
     "transaction.boundary", "MM2's connectors define no transaction boundaries"),
    ("eos-boundary-bad-value", PROPS + "A->B.transaction.boundary = batch\n",
     "A->B.transaction.boundary", "expected poll or interval (got 'batch')"),
    ("eos-interval-negative", PROPS + "A->B.transaction.boundary.interval.ms = -1\n",
     "A->B.transaction.boundary.interval.ms", "at least 0"),
    ("eos-bad-value", PROPS + "B.exactly.once.source.support = on\n",
     "B.exactly.once.source.support", "expected disabled, preparing or enabled (got 'on')"),
    ("eos-support-bad-value", PROPS + "exactly.once.support = yes\n", "exactly.once.support",
     "expected requested or required"),
    # Java regexes: what Python cannot run names the part (backslashes doubled in .properties).
    ("unicode-property", PROPS + "A->B.topics = orders, \\\\p{L}+\n", "A->B.topics",
     "regular expression '\\p{L}+' uses the Unicode property \\p{L}"),
    ("brace-split-by-list", PROPS + "groups = app{1,3}\n", "groups",
     "invalid regular expression 'app{1': '{' at position 3 is not a repetition"),
    ("secret-in-bad-line", PROPS + f"B.sasl.password = {SECRET}\\u00ZZ\n", "line 6", "\\uXXXX"),
]  # fmt: skip

BAD_YAML = [
    ("unknown-top-level", YAML + "replicaton.factor: 1\n", "replicaton.factor",
     "did you mean 'replication.factor'?"),
    ("unknown-flow-key", YAML + "A->B:\n  emit.checkpoint.enabled: true\n",
     "A->B.emit.checkpoint.enabled", "did you mean 'emit.checkpoints.enabled'?"),
    ("flow-setting-on-cluster", YAML + "    topics: x\n", "B.topics",
     "cannot be set per cluster"),
    ("not-a-mapping", "- A\n- B\n", None, "expected a mapping of MM2 keys at the top"),
    ("empty-file", "# nothing\n", None, "found an empty file"),
    ("syntax", YAML + "A->B: [unclosed\n", "line 8", "invalid YAML"),
    ("duplicate-key", YAML + "replication.factor: 1\nreplication.factor: 2\n", "line 8",
     "appears twice"),
    ("duplicate-cluster", YAML + "  A:\n    bootstrap.servers: x\n", "line 7", "'A' appears twice"),
    ("clusters-not-mapping", "clusters: [A, B]\n", "clusters", "expected a mapping"),
    ("cluster-not-mapping", "clusters:\n  A: a:9092\n", "A", "expected a mapping"),
    ("flow-not-mapping", YAML + "A->B: true\n", "A->B", "expected a mapping of flow settings"),
    ("nested-value", YAML + "topics: {a: b}\n", "topics", "not a nested mapping"),
    ("wrong-type", YAML + "A->B:\n  enabled: maybe\n", "A->B.enabled", "expected true or false"),
    ("bool-as-int", YAML + "replication.factor: yes\n", "replication.factor",
     "expected an integer"),
    ("missing-bootstrap", YAML + "  C:\n    producer: {linger.ms: 1}\n", "C.bootstrap.servers",
     "missing"),
    ("eos-on-cluster", YAML + "    exactly.once.source.support: preparing\n"
     "exactly.once.support: required\nA->B: {enabled: true}\n", "exactly.once.support",
     "(B.exactly.once.source.support is preparing)"),
    ("eos-per-flow", YAML + "A->B:\n  enabled: true\n  exactly.once.support: required\n",
     "A->B.exactly.once.support", "required, but exactly-once is not enabled for flows into B"),
    ("eos-boundary-on-cluster", YAML + "    transaction.boundary: poll\n",
     "B.transaction.boundary", "cannot be set per cluster"),
    ("unicode-property-in-class", YAML + "topics: '[a[^b]&&\\p{InGreek}]'\n",
     "topics", "the Unicode property \\p{InGreek}"),
]  # fmt: skip


def check(err: ConfigError, path: Path, key: str | None, part: str) -> None:
    message = str(err)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    if key is not None:
        assert message.startswith(f"{path}: {key}: "), message
    assert part in message, message
    assert SECRET not in message and SECRET not in repr(err)
    assert err.key == key


@pytest.mark.parametrize(
    ("text", "key", "part"),
    [case[1:] for case in BAD_PROPERTIES],
    ids=[c[0] for c in BAD_PROPERTIES],
)
def test_bad_properties(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, key: str, part: str
) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check(info.value, path, key, part)
    assert SECRET not in caplog.text


@pytest.mark.parametrize(
    ("text", "key", "part"), [case[1:] for case in BAD_YAML], ids=[c[0] for c in BAD_YAML]
)
def test_bad_yaml(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str, key: str | None, part: str
) -> None:
    path = tmp_path / "mm2.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check(info.value, path, key, part)
    assert SECRET not in caplog.text


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.properties"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check(info.value, path, None, "no such file")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "mm2.json"
    path.write_text("{}")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    check(info.value, path, None, "use .properties (MM2 format) or .yaml/.yml")


def test_only_the_first_problem_is_reported_on_one_line(tmp_path: Path) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(PROPS + "A->B.replication.factor = x\nA->B.tasks.max = y\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).count(": ") >= 2 and "\n" not in str(info.value)
    assert "(and 1 more problem(s))" in str(info.value)


# --- secrets: held as SecretStr, shown nowhere, handed to librdkafka ---

SECRETS_PROPERTIES = f"""
clusters = A, B
A.bootstrap.servers = a:9093
A.security.protocol = SASL_SSL
A.sasl.mechanism = PLAIN
A.sasl.password = pw-plain-{SECRET}
A.ssl.key.password = pw-key-{SECRET}
B.bootstrap.servers = b:9093
B.security.protocol = SASL_SSL
B.sasl.mechanism = SCRAM-SHA-512
B.sasl.jaas.config = {SCRAM} required username="mirror" password="pw-jaas-{SECRET}";
B.consumer.ssl.key.password = pw-consumer-{SECRET}
B.ssl.keystore.password = pw-jks-{SECRET}
B.ssl.keystore.location = /keystore.jks
A->B.enabled = true
"""


def test_secrets_never_shown_but_given_to_librdkafka(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "mm2.properties"
    path.write_text(SECRETS_PROPERTIES)
    with caplog.at_level(logging.DEBUG):
        config = load_config(path)
        logging.getLogger("test").info("loaded %s", config)
    for shown in (repr(config), str(config), config.model_dump_json(), caplog.text):
        assert SECRET not in shown
    assert "B.ssl.keystore.password: ignored" in caplog.text  # JKS: warned, by key only

    a, b = config.cluster("A"), config.cluster("B")
    assert a.librdkafka("consumer")["sasl.password"] == f"pw-plain-{SECRET}"
    assert a.librdkafka("producer")["ssl.key.password"] == f"pw-key-{SECRET}"
    assert b.librdkafka("admin")["sasl.username"] == "mirror"
    assert b.librdkafka("admin")["sasl.password"] == f"pw-jaas-{SECRET}"
    assert b.librdkafka("consumer")["ssl.key.password"] == f"pw-consumer-{SECRET}"
    assert "ssl.key.password" not in b.librdkafka("producer")
    assert "ssl.keystore.password" not in b.librdkafka("consumer")


def test_secrets_in_yaml_role_overrides_are_hidden(tmp_path: Path) -> None:
    path = tmp_path / "mm2.yaml"
    path.write_text(YAML + f"    producer:\n      sasl.oauthbearer.client.secret: oidc-{SECRET}\n")
    config = load_config(path)
    assert SECRET not in repr(config) and SECRET not in config.model_dump_json()
    producer = config.cluster("B").librdkafka("producer")
    assert producer["sasl.oauthbearer.client.secret"] == f"oidc-{SECRET}"
    assert config.cluster("A").librdkafka("admin")["sasl.password"] == SECRET
