"""Typed configuration: clusters, flows and MM2's per-flow settings with MM2's defaults.

Field aliases are MM2's dotted keys; Python names are the same keys in snake_case.
Defaults are MM2's (connect/mirror MirrorSourceConfig, MirrorCheckpointConfig,
MirrorHeartbeatConfig, MirrorConnectorConfig, Connect's DistributedConfig).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
)

from mm2py.compat.filters import (
    DEFAULT_GROUPS_EXCLUDE,
    DEFAULT_TOPICS_EXCLUDE,
    compile_pattern_list,
)
from mm2py.config.errors import ConfigError

ClientRole = Literal["consumer", "producer", "admin"]
# How a flow copies: at-least-once ("off") or exactly-once, as asked by exactly.once.support.
ExactlyOnceMode = Literal["off", "requested", "required"]
# Unless transaction.boundary(.interval.ms) says otherwise, a task commits as soon as it has
# copied what the source had (its last batch was not full: Connect's poll boundary, a
# transaction per batch), and, while it is behind, at least this often: the stall of each
# commit (the next transaction registers its partitions before it sends; measured in
# docs/benchmarks.md) is spread over a second of records, and a reader waits about one
# commit, not the interval.
DEFAULT_TRANSACTION_INTERVAL_MS = 1000
# The brokers abort a transaction left open this long after it began, unless its
# writer's successor fences it first: Connect's producer default, which MM2's tasks get
# unless the target's producer settings say otherwise.
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000
ClientValue = str | SecretStr
PeriodicTask = Literal[
    "refresh.topics",
    "refresh.groups",
    "sync.topic.configs",
    "sync.topic.acls",
    "emit.heartbeats",
    "emit.checkpoints",
    "sync.group.offsets",
]

_SECRET_MARKERS = (
    "password",
    "secret",
    "passphrase",
    "jaas",
    "key.pem",
    "oauthbearer.config",
    "user.info",  # a schema registry's basic.auth.user.info (user:password)
    "auth.token",  # a schema registry's bearer.auth.token
)


def is_secret_key(key: str) -> bool:
    """True for client keys whose values must never be shown (passwords, private keys)."""
    lowered = key.lower()
    return any(marker in lowered for marker in _SECRET_MARKERS)


# --- value parsers: MM2 (Java ConfigDef) semantics for strings, native YAML types as-is ---


def parse_bool(value: object) -> bool:
    """Parse a boolean as Java's ConfigDef does: only true/false, any case."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ValueError("expected true or false")


def _parse_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
        return int(value.strip())
    raise ValueError("expected an integer")


def parse_list(value: object) -> list[str]:
    """Parse an MM2 LIST: comma-separated string (items trimmed, empty ones dropped) or a list."""
    if isinstance(value, str):
        items = value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str | int) for v in value):
        items = [str(v) for v in value]
    else:
        raise ValueError("expected a comma-separated list")
    return [item.strip() for item in items if item.strip()]


def _compile_all(patterns: list[str]) -> list[str]:
    # MM2 compiles the list joined with '|' as one Java regex; so does the filter later.
    compile_pattern_list(patterns)  # PatternError (a ValueError) names the bad part
    return patterns


# MM2 treats any negative interval as "disabled" and fails on 0 (a zero scheduling period);
# we accept MM2's documented -1 and reject the other values as likely mistakes.
def _check_interval(seconds: int) -> int:
    if seconds == -1 or seconds >= 1:
        return seconds
    raise ValueError("must be at least 1 second, or -1 to disable")


# Replication factors and partition counts: -1 asks the broker for its default (KIP-464).
def _check_count_or_default(count: int) -> int:
    if count == -1 or 1 <= count <= 32767:
        return count
    raise ValueError("must be between 1 and 32767, or -1 for the broker default")


def _check_at_least(minimum: int) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        return value

    return check


_MIRROR_PACKAGE = "org.apache.kafka.connect.mirror."
_POLICIES = ("DefaultReplicationPolicy", "IdentityReplicationPolicy")


def _policy_name(value: object) -> str:
    name = value.strip() if isinstance(value, str) else ""
    name = name.removeprefix(_MIRROR_PACKAGE)
    if name not in _POLICIES:
        raise ValueError(
            f"unsupported replication policy; use {_MIRROR_PACKAGE}DefaultReplicationPolicy"
            f" or {_MIRROR_PACKAGE}IdentityReplicationPolicy (custom Java policies cannot run)"
        )
    return name


def _non_empty(value: str) -> str:
    if not value:
        raise ValueError("must not be empty")
    return value


def _strip(value: object) -> object:
    return value.strip() if isinstance(value, str) else value


def _upper(value: object) -> object:
    return value.strip().upper() if isinstance(value, str) else value


Bool = Annotated[bool, BeforeValidator(parse_bool)]
Count = Annotated[int, BeforeValidator(_parse_int), AfterValidator(_check_at_least(0))]
Interval = Annotated[int, BeforeValidator(_parse_int), AfterValidator(_check_interval)]
CountOrBrokerDefault = Annotated[
    int, BeforeValidator(_parse_int), AfterValidator(_check_count_or_default)
]
Patterns = Annotated[list[str], BeforeValidator(parse_list), AfterValidator(_compile_all)]
Text = Annotated[str, BeforeValidator(_strip)]

DEFAULT_CONFIG_PROPERTIES_EXCLUDE = (
    "follower\\.replication\\.throttled\\.replicas",
    "leader\\.replication\\.throttled\\.replicas",
    "message\\.timestamp\\.difference\\.max\\.ms",
    "message\\.timestamp\\.type",
    "unclean\\.leader\\.election\\.enable",
    "min\\.insync\\.replicas",
)


class FlowSettings(BaseModel):
    """MM2's settings for one flow A->B: global keys overridden by ``A->B.<key>``."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    topics: Patterns = Field(default_factory=lambda: [".*"], alias="topics")
    topics_exclude: Patterns = Field(
        default_factory=lambda: list(DEFAULT_TOPICS_EXCLUDE), alias="topics.exclude"
    )
    groups: Patterns = Field(default_factory=lambda: [".*"], alias="groups")
    groups_exclude: Patterns = Field(
        default_factory=lambda: list(DEFAULT_GROUPS_EXCLUDE), alias="groups.exclude"
    )
    config_properties_exclude: Patterns = Field(
        default_factory=lambda: list(DEFAULT_CONFIG_PROPERTIES_EXCLUDE),
        alias="config.properties.exclude",
    )
    # The short class name; mm2py implements these two.
    replication_policy_class: Annotated[
        Literal["DefaultReplicationPolicy", "IdentityReplicationPolicy"],
        BeforeValidator(_policy_name),
    ] = Field("DefaultReplicationPolicy", alias="replication.policy.class")
    replication_policy_separator: Annotated[str, AfterValidator(_non_empty)] = Field(
        ".", alias="replication.policy.separator"
    )
    # False keeps pre-3.0 internal topic names (mm2-offset-syncs.B.internal whatever the separator).
    replication_policy_internal_topic_separator_enabled: Bool = Field(
        True, alias="replication.policy.internal.topic.separator.enabled"
    )
    replication_factor: CountOrBrokerDefault = Field(2, alias="replication.factor")
    tasks_max: Annotated[int, BeforeValidator(_parse_int), AfterValidator(_check_at_least(1))] = (
        Field(1, alias="tasks.max")
    )

    refresh_topics_enabled: Bool = Field(True, alias="refresh.topics.enabled")
    refresh_topics_interval_seconds: Interval = Field(600, alias="refresh.topics.interval.seconds")
    refresh_groups_enabled: Bool = Field(True, alias="refresh.groups.enabled")
    refresh_groups_interval_seconds: Interval = Field(600, alias="refresh.groups.interval.seconds")
    sync_topic_configs_enabled: Bool = Field(True, alias="sync.topic.configs.enabled")
    sync_topic_configs_interval_seconds: Interval = Field(
        600, alias="sync.topic.configs.interval.seconds"
    )
    sync_topic_acls_enabled: Bool = Field(True, alias="sync.topic.acls.enabled")
    sync_topic_acls_interval_seconds: Interval = Field(
        600, alias="sync.topic.acls.interval.seconds"
    )
    emit_heartbeats_enabled: Bool = Field(True, alias="emit.heartbeats.enabled")
    emit_heartbeats_interval_seconds: Interval = Field(1, alias="emit.heartbeats.interval.seconds")
    emit_checkpoints_enabled: Bool = Field(True, alias="emit.checkpoints.enabled")
    emit_checkpoints_interval_seconds: Interval = Field(
        60, alias="emit.checkpoints.interval.seconds"
    )
    sync_group_offsets_enabled: Bool = Field(False, alias="sync.group.offsets.enabled")
    sync_group_offsets_interval_seconds: Interval = Field(
        60, alias="sync.group.offsets.interval.seconds"
    )
    emit_offset_syncs_enabled: Bool = Field(True, alias="emit.offset-syncs.enabled")
    offset_lag_max: Count = Field(100, alias="offset.lag.max")
    offset_syncs_topic_location: Annotated[Literal["source", "target"], BeforeValidator(_strip)] = (
        Field("source", alias="offset-syncs.topic.location")
    )
    # Read through consumer_poll_timeout / admin_timeout (seconds).
    consumer_poll_timeout_ms: Count = Field(1000, alias="consumer.poll.timeout.ms")
    admin_timeout_ms: Annotated[
        int, BeforeValidator(_parse_int), AfterValidator(_check_at_least(1))
    ] = Field(60000, alias="admin.timeout.ms")
    # mm2py's own (no MM2 key): how long a cluster may give no answer before its
    # parts show UNREACHABLE and /health fails. Read through unreachable_grace.
    cluster_unreachable_grace_ms: Annotated[
        int, BeforeValidator(_parse_int), AfterValidator(_check_at_least(1000))
    ] = Field(30000, alias="cluster.unreachable.grace.ms")

    # mm2py's own (no MM2 key): the group protocol the nodes of an mm2py cluster share a
    # flow's tasks with (mm2py.runtime.assignment); auto: `consumer` where the target's
    # brokers serve it (Kafka 4.x), else `classic`.
    cluster_group_protocol: Annotated[
        Literal["auto", "consumer", "classic"], BeforeValidator(_strip)
    ] = Field("auto", alias="cluster.group.protocol")
    # mm2py's own: that group's id is `<prefix>-<source>-><target>`; nodes with the same
    # config share it. Two deployments of one flow that must not share tasks set their own.
    cluster_group_prefix: Annotated[str, BeforeValidator(_strip), AfterValidator(_non_empty)] = (
        Field("mm2py", alias="cluster.group.prefix")
    )

    # mm2py's own (no MM2 key): series of the replication metrics per partition rather
    # than per topic (docs/metrics.md).
    metrics_partition_labels: Bool = Field(False, alias="metrics.partition.labels")
    # mm2py's own: also export MM2's metrics under the names the Prometheus JMX exporter
    # gives them (docs/metrics.md); per partition, so off unless asked.
    metrics_mm2_names_enabled: Bool = Field(False, alias="metrics.mm2.names.enabled")

    # Exactly-once (mm2py.config.exactly_once), resolved by the loader from MM2's keys:
    # "off" unless the target's exactly.once.source.support is enabled; no key of its own.
    exactly_once: ExactlyOnceMode = "off"
    # The exactly.once.support key as written where it was set (A->B.exactly.once.support),
    # for the messages that name it.
    exactly_once_key: str = "exactly.once.support"
    # Connect's key; 0 with transaction.boundary = poll (a transaction per batch).
    transaction_boundary_interval_ms: Count = Field(
        DEFAULT_TRANSACTION_INTERVAL_MS, alias="transaction.boundary.interval.ms"
    )
    # The target producer's transaction.timeout.ms (``B.producer.transaction.timeout.ms``,
    # as MM2's tasks take it), resolved by the loader; no key of its own.
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS

    # mm2py's own (no MM2 key): copy the schemas of replicated topics from the source's
    # schema registry to the target's and give framed keys and values the target's ids
    # (mm2py.replication.schemas); needs <alias>.schema.registry.url for both clusters.
    schema_registry_sync_enabled: Bool = Field(False, alias="schema.registry.sync.enabled")
    # What a record whose schema id cannot be resolved does: stop its partition (fail) or
    # be copied with its bytes as they are (copy).
    schema_registry_unresolved_ids: Annotated[Literal["fail", "copy"], BeforeValidator(_strip)] = (
        Field("fail", alias="schema.registry.unresolved.ids")
    )

    # mm2py's own (issue 29): how the source part copies records. `record` reads and
    # produces each record; `batch` passes the source's record batches through as they
    # are; `auto` chooses batch wherever it keeps every guarantee (docs/running.md).
    replication_copy_mode: Annotated[
        Literal["auto", "batch", "record"], BeforeValidator(_strip)
    ] = Field("auto", alias="replication.copy.mode")
    # The copier the loader chose from the mode (mm2py.config.copy_mode), no key of its
    # own; under `auto`, why a flow got the record copier.
    copier: Literal["batch", "record"] = "record"
    copier_reason: str = ""

    heartbeats_topic_replication_factor: CountOrBrokerDefault = Field(
        3, alias="heartbeats.topic.replication.factor"
    )
    checkpoints_topic_replication_factor: CountOrBrokerDefault = Field(
        3, alias="checkpoints.topic.replication.factor"
    )
    offset_syncs_topic_replication_factor: CountOrBrokerDefault = Field(
        3, alias="offset-syncs.topic.replication.factor"
    )

    # Connect worker keys (MM2 also reads them from the target cluster: B.offset.storage.*).
    offset_storage_topic: Text | None = Field(None, alias="offset.storage.topic")
    offset_storage_replication_factor: CountOrBrokerDefault = Field(
        3, alias="offset.storage.replication.factor"
    )
    offset_storage_partitions: CountOrBrokerDefault = Field(25, alias="offset.storage.partitions")
    config_storage_replication_factor: CountOrBrokerDefault = Field(
        3, alias="config.storage.replication.factor"
    )
    status_storage_replication_factor: CountOrBrokerDefault = Field(
        3, alias="status.storage.replication.factor"
    )

    def resolved(self, **values: object) -> FlowSettings:
        """A copy with `values` (by field name) that the loader or the start-up checks
        worked out: unlike model_copy, they are not counted among the keys the config
        file set (model_fields_set, which the Connect API shows under MM2's names)."""
        return FlowSettings.model_construct(self.model_fields_set, **{**dict(self), **values})

    @property
    def commit_when_caught_up(self) -> bool:
        """Exactly-once: commit as soon as the source is read to its end, not only every
        interval (the default: DEFAULT_TRANSACTION_INTERVAL_MS); False when the config
        sets ``transaction.boundary.interval.ms``, which then says when, as in MM2."""
        return "transaction_boundary_interval_ms" not in self.model_fields_set

    @property
    def copies_batches(self) -> bool:
        """Whether the source part passes record batches through: the copier the loader
        chose (mm2py.config.copy_mode)."""
        return self.copier == "batch"

    @property
    def admin_timeout(self) -> float:
        """Seconds an admin call may take (MM2's admin.timeout.ms, default 60 s)."""
        return self.admin_timeout_ms / 1000

    @property
    def unreachable_grace(self) -> float:
        """Seconds without an answer before a cluster counts as unreachable (default 30 s)."""
        return self.cluster_unreachable_grace_ms / 1000

    @property
    def consumer_poll_timeout(self) -> float:
        """Seconds one poll of the source may wait (MM2's consumer.poll.timeout.ms, 1 s)."""
        return self.consumer_poll_timeout_ms / 1000

    def period(self, task: PeriodicTask) -> int | None:
        """Seconds between runs of an MM2 periodic task, or None when it is disabled."""
        prefix = task.replace(".", "_")
        enabled: bool = getattr(self, f"{prefix}_enabled")
        interval: int = getattr(self, f"{prefix}_interval_seconds")
        return interval if enabled and interval > 0 else None


FLOW_KEYS = frozenset(field.alias for field in FlowSettings.model_fields.values() if field.alias)
WORKER_KEYS = frozenset(key for key in FLOW_KEYS if ".storage." in key)


class ClusterConfig(BaseModel):
    """One Kafka cluster: its alias and librdkafka client properties, common and per role."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    alias: str
    bootstrap_servers: Annotated[str, AfterValidator(_non_empty)] = Field(alias="bootstrap.servers")
    security_protocol: Annotated[
        Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], BeforeValidator(_upper)
    ] = Field("PLAINTEXT", alias="security.protocol")
    sasl_mechanism: Annotated[
        Literal["GSSAPI", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None,
        BeforeValidator(_upper),
    ] = Field(None, alias="sasl.mechanism")
    sasl_username: str | None = Field(None, alias="sasl.username")
    sasl_password: SecretStr | None = Field(None, alias="sasl.password")
    ssl_ca_location: str | None = Field(None, alias="ssl.ca.location")
    ssl_certificate_location: str | None = Field(None, alias="ssl.certificate.location")
    ssl_key_location: str | None = Field(None, alias="ssl.key.location")
    ssl_key_password: SecretStr | None = Field(None, alias="ssl.key.password")
    # Other librdkafka properties for every client of this cluster, then per-role overrides.
    properties: dict[str, ClientValue] = Field(default_factory=dict)
    consumer: dict[str, ClientValue] = Field(default_factory=dict)
    producer: dict[str, ClientValue] = Field(default_factory=dict)
    admin: dict[str, ClientValue] = Field(default_factory=dict)
    # ``<alias>.schema.registry.*``: the schema registry client's settings (url,
    # basic.auth.user.info, ssl.*, ...), by their names without the prefix.
    schema_registry: dict[str, ClientValue] = Field(default_factory=dict)

    @field_validator("properties", "consumer", "producer", "admin", "schema_registry")
    @classmethod
    def _hide_secrets(cls, props: dict[str, ClientValue]) -> dict[str, ClientValue]:
        return {
            key: SecretStr(value) if isinstance(value, str) and is_secret_key(key) else value
            for key, value in props.items()
        }

    def librdkafka(self, role: ClientRole) -> dict[str, str]:
        """The full librdkafka configuration for one client role, secrets revealed.

        Common properties first, then the role's overrides (``A.consumer.*`` etc.).
        This is the only place a librdkafka dict is assembled.
        """
        conf: dict[str, str] = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if field.alias and value is not None:
                conf[field.alias] = _reveal(value)
        overrides: dict[str, ClientValue] = getattr(self, role)
        for props in (self.properties, overrides):
            conf.update({key: _reveal(value) for key, value in props.items()})
        return conf

    @property
    def schema_registry_url(self) -> str | None:
        """The schema registry's URL (``<alias>.schema.registry.url``), if set."""
        url = self.schema_registry.get("url")
        return _reveal(url) if url is not None else None

    def schema_registry_client(self) -> dict[str, str]:
        """The schema registry client's configuration, secrets revealed (the only place
        it is assembled)."""
        return {key: _reveal(value) for key, value in self.schema_registry.items()}


TYPED_CLIENT_KEYS = frozenset(
    field.alias for field in ClusterConfig.model_fields.values() if field.alias
)


def _reveal(value: ClientValue) -> str:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


class FlowConfig(BaseModel):
    """One ordered pair of clusters, source->target, with its settings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: str
    target: str
    enabled: bool = False  # MM2: A->B.enabled, false unless set
    settings: FlowSettings

    @property
    def name(self) -> str:
        """The flow as MM2 writes it: ``A->B``."""
        return f"{self.source}->{self.target}"

    @property
    def heartbeats_enabled(self) -> bool:
        """Whether MM2 would emit heartbeats for this pair (even when replication is off)."""
        return self.settings.period("emit.heartbeats") is not None

    @property
    def offsets_topic(self) -> str:
        """The Connect offsets topic on the target: offset.storage.topic or MM2's default."""
        return self.settings.offset_storage_topic or f"mm2-offsets.{self.source}.internal"

    @property
    def mirrormaker2_configs_topic(self) -> str:
        """The Connect config topic MM2's dedicated mode keeps on the target for this flow
        (MM2's default name; mm2py has none): there when MM2 ran the flow."""
        return f"mm2-configs.{self.source}.internal"


class MirrorConfig(BaseModel):
    """A whole mm2py configuration: clusters and every ordered pair of them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: Path
    clusters: dict[str, ClusterConfig]
    # Every ordered pair of distinct clusters, in the order of `clusters`.
    flows: list[FlowConfig]
    # The REST address (`host:port`) from MM2's `listeners`; `--listen` wins.
    listen: str | None = None

    def cluster(self, alias: str) -> ClusterConfig:
        """The cluster with this alias; ConfigError if there is none."""
        try:
            return self.clusters[alias]
        except KeyError:
            known = ", ".join(self.clusters)
            raise ConfigError(self.path, alias, f"no such cluster; known: {known}") from None

    def flow(self, source: str, target: str) -> FlowConfig:
        """The flow source->target (enabled or not); ConfigError if there is none."""
        for flow in self.flows:
            if (flow.source, flow.target) == (source, target):
                return flow
        known = ", ".join(self.clusters)
        raise ConfigError(self.path, f"{source}->{target}", f"no such flow; clusters are: {known}")

    def enabled_flows(self, targets: Sequence[str] | None = None) -> list[FlowConfig]:
        """Flows that replicate (``A->B.enabled = true``); with `targets`, only those into
        one of these clusters (as MM2's ``--clusters``)."""
        return [f for f in self.flows if f.enabled and (not targets or f.target in targets)]

    def heartbeat_flows(self, targets: Sequence[str] | None = None) -> list[FlowConfig]:
        """Flows that emit heartbeats into their target (with `targets`, only into one of
        these clusters).

        As in MM2 (MirrorMakerConfig.clusterPairs), this includes pairs whose replication
        is disabled: heartbeats run for every ordered pair unless emit.heartbeats.enabled
        is false globally or for that pair.
        """
        return [
            f for f in self.flows if f.heartbeats_enabled and (not targets or f.target in targets)
        ]
