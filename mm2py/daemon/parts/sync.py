"""Topic config sync and topic ACL sync of a flow A->B, as MM2's MirrorSourceConnector does them.

The decisions are pure functions over plain values (`ConfigValue`, `TopicAcl`):

- configs: every source topic config that is not the broker's built-in default
  (and not read-only, sensitive, a static broker setting or matched by
  ``config.properties.exclude``) is set on the remote topic; a config that is at
  its default on the source loses any override on the remote topic, so the
  target's own default applies (MM2's ``use.defaults.from=target``). Applied with
  incremental alter-configs, and only what differs is sent.
- ACLs: LITERAL topic ACLs of replicated topics are copied to the remote topic
  name; ALLOW WRITE is dropped (only replication writes to a remote topic), ALLOW
  ALL becomes ALLOW READ, DENY entries are copied as they are. ACLs are only
  added, never removed (as MM2).

`SyncPart` is the thin shell that reads both clusters and applies the result.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# The admin value types, from the modules that define them (the package does not
# re-export them for type checkers).
from confluent_kafka.admin._acl import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
)
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

from mm2py.compat.filters import compile_pattern_list
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.daemon.metrics import Metrics
from mm2py.daemon.part import FlowPart
from mm2py.kafka import clients
from mm2py.kafka.topics import ADMIN_TIMEOUT, partition_counts

log = logging.getLogger(__name__)

# Kafka's ConfigEntry.ConfigSource, as numbered on the wire (DescribeConfigs v1+).
SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG: set on the topic itself
SOURCE_STATIC_BROKER = 4  # STATIC_BROKER_CONFIG: the broker's server.properties
SOURCE_DEFAULT = 5  # DEFAULT_CONFIG: Kafka's built-in default


# -- topic configs (pure) ------------------------------------------------------


@dataclass(frozen=True)
class ConfigValue:
    """One entry of a topic's described configuration."""

    name: str
    value: str | None
    source: int
    read_only: bool = False
    sensitive: bool = False

    @property
    def is_default(self) -> bool:
        """Kafka's ConfigEntry.isDefault(): the built-in default, set nowhere."""
        return self.source == SOURCE_DEFAULT


class ConfigPropertyFilter:
    """MM2's DefaultConfigPropertyFilter: ``config.properties.exclude`` (whole-name regexes)."""

    def __init__(self, exclude: Iterable[str]) -> None:
        self._exclude = compile_pattern_list(exclude)

    def should_replicate(self, name: str) -> bool:
        return self._exclude is None or self._exclude.fullmatch(name) is None


def _syncable(entry: ConfigValue, prop_filter: ConfigPropertyFilter) -> bool:
    """What MM2's targetConfig keeps: writable, not secret, not broker-file, not excluded."""
    return (
        not entry.read_only
        and not entry.sensitive
        and entry.source != SOURCE_STATIC_BROKER
        and prop_filter.should_replicate(entry.name)
    )


def creation_configs(
    source: Iterable[ConfigValue], prop_filter: ConfigPropertyFilter
) -> dict[str, str]:
    """The configs a remote topic is created with: the source's non-default ones."""
    return {
        e.name: e.value
        for e in source
        if _syncable(e, prop_filter) and not e.is_default and e.value is not None
    }


@dataclass(frozen=True)
class ConfigChanges:
    """Incremental alter-config operations for one remote topic."""

    set: dict[str, str]
    delete: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.set or self.delete)

    def describe(self) -> str:
        """`set a=1, b=2; removed c` for a log line (topic configs are never secret)."""
        parts = []
        if self.set:
            parts.append("set " + ", ".join(f"{k}={v}" for k, v in sorted(self.set.items())))
        if self.delete:
            parts.append("removed " + ", ".join(sorted(self.delete)))
        return "; ".join(parts)


def config_changes(
    source: Iterable[ConfigValue],
    target: Iterable[ConfigValue],
    prop_filter: ConfigPropertyFilter,
) -> ConfigChanges:
    """What to alter on a remote topic so its configs follow the source topic's.

    As MM2's incremental sync: a non-default source value is SET, a default one is
    DELETEd from the remote topic (the target's default applies). Unlike MM2, only
    operations that change something are returned, so an unchanged topic costs no
    write on the target's controller.
    """
    current = {e.name: e for e in target}
    to_set: dict[str, str] = {}
    to_delete: list[str] = []
    for entry in source:
        if not _syncable(entry, prop_filter):
            continue
        there = current.get(entry.name)
        # The remote topic's own value; None when it follows the target's defaults.
        override = there.value if there is not None and there.source == SOURCE_TOPIC else None
        if entry.is_default:
            if override is not None:
                to_delete.append(entry.name)
        elif entry.value is not None and entry.value != override:
            to_set[entry.name] = entry.value
    return ConfigChanges(to_set, tuple(to_delete))


# -- topic ACLs (pure) --------------------------------------------------------------


@dataclass(frozen=True, order=True)
class TopicAcl:
    """One ACL binding on a topic resource (names as Kafka spells them: READ, ALLOW, ...)."""

    topic: str
    principal: str
    host: str
    operation: str
    permission: str
    pattern: str = "LITERAL"

    def __str__(self) -> str:
        return (
            f"{self.permission} {self.operation} for {self.principal} from {self.host} "
            f"on topic {self.topic}"
        )


def should_replicate_acl(acl: TopicAcl) -> bool:
    """MM2's shouldReplicateAcl: ALLOW WRITE never reaches a remote topic."""
    return not (acl.permission == "ALLOW" and acl.operation == "WRITE")


def target_acl(acl: TopicAcl, remote_topic: str) -> TopicAcl:
    """MM2's targetAclBinding: the remote name, ALLOW ALL downgraded to ALLOW READ."""
    operation = acl.operation
    if acl.permission == "ALLOW" and operation == "ALL":
        operation = "READ"
    return TopicAcl(remote_topic, acl.principal, acl.host, operation, acl.permission)


def target_acls(
    source: Iterable[TopicAcl],
    should_replicate_topic: Callable[[str], bool],
    remote_topic: Callable[[str], str],
) -> list[TopicAcl]:
    """The ACLs the target should have for the source's topic ACLs (sorted, no repeats)."""
    wanted = {
        target_acl(acl, remote_topic(acl.topic))
        for acl in source
        if acl.pattern == "LITERAL"
        and should_replicate_acl(acl)
        and should_replicate_topic(acl.topic)
    }
    return sorted(wanted)


def missing_acls(wanted: Iterable[TopicAcl], existing: Iterable[TopicAcl]) -> list[TopicAcl]:
    """The wanted ACLs the target does not have yet."""
    have = set(existing)
    return [acl for acl in wanted if acl not in have]


# -- admin I/O ------------------------------------------------------------------------

_ANY: Any = None  # the filter's wildcard (its stubs say str)
ANY_TOPIC_ACL = AclBindingFilter(
    ResourceType.TOPIC,
    _ANY,
    ResourcePatternType.ANY,
    _ANY,
    _ANY,
    AclOperation.ANY,
    AclPermissionType.ANY,
)


class SyncError(RuntimeError):
    """Configs or ACLs could not be read or written; says which cluster and why."""


def describe_topic_configs(
    admin: AdminClient, cluster_alias: str, topics: Iterable[str]
) -> dict[str, list[ConfigValue] | str]:
    """Each topic's configuration, or the reason it could not be read (never raises)."""
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in sorted(set(topics))]
    if not resources:
        return {}
    out: dict[str, list[ConfigValue] | str] = {}
    try:
        futures = admin.describe_configs(resources, request_timeout=ADMIN_TIMEOUT)
    except KafkaException as exc:
        reason = f"cannot read topic configs on cluster {cluster_alias}: {_reason(exc)}"
        return {r.name: reason for r in resources}
    for resource, future in futures.items():
        try:
            entries: Mapping[str, Any] = future.result(timeout=ADMIN_TIMEOUT)
        except KafkaException as exc:
            out[resource.name] = (
                f"cannot read the configs of topic {resource.name!r} on cluster "
                f"{cluster_alias}: {_reason(exc)}"
            )
            continue
        out[resource.name] = [_config_value(e) for e in entries.values()]
    return out


def _config_value(entry: Any) -> ConfigValue:
    return ConfigValue(
        entry.name,
        entry.value,
        int(entry.source),
        bool(entry.is_read_only),
        bool(entry.is_sensitive),
    )


def remote_topic_configs(
    admin: AdminClient,
    cluster_alias: str,
    topics: Iterable[str],
    prop_filter: ConfigPropertyFilter,
) -> dict[str, dict[str, str] | str]:
    """For new remote topics: each source topic's creation configs, or why they are unknown."""
    return {
        topic: entries if isinstance(entries, str) else creation_configs(entries, prop_filter)
        for topic, entries in describe_topic_configs(admin, cluster_alias, topics).items()
    }


def _topic_acl(binding: Any) -> TopicAcl:
    return TopicAcl(
        binding.name,
        binding.principal,
        binding.host,
        binding.operation.name,
        binding.permission_type.name,
        binding.resource_pattern_type.name,
    )


def _binding(acl: TopicAcl) -> AclBinding:
    return AclBinding(
        ResourceType.TOPIC,
        acl.topic,
        ResourcePatternType[acl.pattern],
        acl.principal,
        acl.host,
        AclOperation[acl.operation],
        AclPermissionType[acl.permission],
    )


def _describe_acls(admin: AdminClient) -> list[TopicAcl]:
    """Every topic ACL of a cluster. Raises KafkaException (SECURITY_DISABLED: no authorizer)."""
    bindings = admin.describe_acls(ANY_TOPIC_ACL, request_timeout=ADMIN_TIMEOUT).result(
        timeout=ADMIN_TIMEOUT
    )
    return [_topic_acl(b) for b in bindings]


def has_authorizer(admin: AdminClient) -> bool | None:
    """Whether a cluster's broker runs an authorizer; None if that cannot be told."""
    try:
        cluster = admin.describe_cluster(request_timeout=ADMIN_TIMEOUT).result(
            timeout=ADMIN_TIMEOUT
        )
        broker = str(cluster.nodes[0].id)
        resource = ConfigResource(ResourceType.BROKER, broker)
        configs = admin.describe_configs([resource], request_timeout=ADMIN_TIMEOUT)[
            resource
        ].result(timeout=ADMIN_TIMEOUT)
    except (KafkaException, IndexError):
        return None
    entry = configs.get("authorizer.class.name")
    return entry is None or bool(entry.value)


# -- the part -----------------------------------------------------------------------


class SyncPart(FlowPart):
    """Keeps the remote topics' configs and ACLs of one flow in step with the source."""

    name = "sync"

    def __init__(
        self,
        flow: FlowConfig,
        source: ClusterConfig,
        target: ClusterConfig,
        metrics: Metrics,
    ) -> None:
        super().__init__(flow, source, target, metrics)
        settings = flow.settings
        self.config_period = settings.period("sync.topic.configs")
        self.acl_period = settings.period("sync.topic.acls")
        self.prop_filter = ConfigPropertyFilter(settings.config_properties_exclude)
        self._no_source_authorizer_logged = False
        self._no_target_authorizer_logged = False
        self._source_authorizer_checked = False

    @staticmethod
    def wanted(flow: FlowConfig) -> bool:
        """Whether a flow syncs anything (configs or ACLs) periodically."""
        s = flow.settings
        return s.period("sync.topic.configs") is not None or s.period("sync.topic.acls") is not None

    def run(self) -> None:
        self._source_admin = clients.admin_client(self.source.librdkafka("admin"))
        self._target_admin = clients.admin_client(self.target.librdkafka("admin"))
        tasks: list[tuple[Callable[[], None], float]] = []
        if self.config_period is not None:
            tasks.append((self.sync_topic_configs, float(self.config_period)))
        if self.acl_period is not None:
            tasks.append((self.sync_topic_acls, float(self.acl_period)))
        due = [0.0] * len(tasks)
        while not self.stopping.is_set():
            now = time.monotonic()
            for i, (task, period) in enumerate(tasks):
                if now >= due[i]:
                    self._attempt(task)
                    due[i] = time.monotonic() + period
            if not due:
                return
            self.stopping.wait(max(min(due) - time.monotonic(), 0.0))

    def _attempt(self, task: Callable[[], None]) -> None:
        """Run one sync; a failure is logged, counted and retried at the next interval."""
        try:
            task()
        except (KafkaException, SyncError) as exc:
            self.errors.inc()
            log.warning("flow %s: %s; retrying at the next interval", self.flow.name, _reason(exc))

    # -- configs -------------------------------------------------------------------

    def _replicated_remote_topics(self) -> dict[str, str]:
        """Source topic -> remote topic, for replicated topics whose remote topic exists."""
        rt, flow = self.rules, self.flow
        try:
            source_topics = partition_counts(self._source_admin)
        except KafkaException as exc:
            raise SyncError(f"listing topics on {flow.source} failed: {_reason(exc)}") from None
        try:
            target_topics = partition_counts(self._target_admin)
        except KafkaException as exc:
            raise SyncError(f"listing topics on {flow.target} failed: {_reason(exc)}") from None
        pairs = {t: rt.remote_topic(t) for t in source_topics if rt.should_replicate(t)}
        return {t: r for t, r in pairs.items() if r in target_topics}

    def sync_topic_configs(self) -> None:
        """Set the remote topics' configs to the source topics' (only what differs)."""
        flow = self.flow
        pairs = self._replicated_remote_topics()
        if not pairs:
            return
        source = describe_topic_configs(self._source_admin, flow.source, pairs)
        target = describe_topic_configs(self._target_admin, flow.target, pairs.values())
        resources: dict[str, tuple[ConfigResource, ConfigChanges]] = {}
        for topic, remote in sorted(pairs.items()):
            src, dst = source.get(topic), target.get(remote)
            for problem in (src, dst):
                if isinstance(problem, str):
                    log.warning("flow %s: %s", flow.name, problem)
            if not isinstance(src, list) or not isinstance(dst, list):
                continue
            changes = config_changes(src, dst, self.prop_filter)
            if changes:
                resources[remote] = (_alter_resource(remote, changes), changes)
        if not resources:
            return
        futures = self._target_admin.incremental_alter_configs(
            [r for r, _ in resources.values()], request_timeout=ADMIN_TIMEOUT
        )
        failed = 0
        for resource, future in futures.items():
            changes = resources[resource.name][1]
            try:
                future.result(timeout=ADMIN_TIMEOUT)
            except KafkaException as exc:
                failed += 1
                log.warning(
                    "flow %s: cannot alter the configs of topic %s on cluster %s (%s): %s",
                    flow.name,
                    resource.name,
                    flow.target,
                    changes.describe(),
                    _reason(exc),
                )
                continue
            log.info(
                "flow %s: synced configs of %s on %s: %s",
                flow.name,
                resource.name,
                flow.target,
                changes.describe(),
            )
        if failed:
            self.errors.inc()

    # -- ACLs ------------------------------------------------------------------------

    def sync_topic_acls(self) -> None:
        """Add the ACLs the remote topics should have (by MM2's rules) to the target."""
        flow, rt = self.flow, self.rules
        try:
            source_acls = _describe_acls(self._source_admin)
        except KafkaException as exc:
            if _code(exc) == KafkaError.SECURITY_DISABLED:
                self._log_no_source_authorizer()
                return
            raise SyncError(
                f"cannot list the topic ACLs of cluster {flow.source}: {_reason(exc)}"
            ) from None
        if not source_acls:
            # librdkafka reports "no authorizer" as an empty answer; ask the broker once.
            if not self._source_authorizer_checked:
                self._source_authorizer_checked = True
                if has_authorizer(self._source_admin) is False:
                    self._log_no_source_authorizer()
            return
        wanted = target_acls(source_acls, rt.should_replicate, rt.remote_topic)
        if not wanted:
            return
        try:
            existing = _describe_acls(self._target_admin)
        except KafkaException as exc:
            if _code(exc) == KafkaError.SECURITY_DISABLED:
                self._log_no_target_authorizer()
                return
            raise SyncError(
                f"cannot list the topic ACLs of cluster {flow.target}: {_reason(exc)}"
            ) from None
        self._create_acls(missing_acls(wanted, existing))

    def _create_acls(self, acls: Sequence[TopicAcl]) -> None:
        if not acls:
            return
        flow = self.flow
        bindings = {_binding(acl): acl for acl in acls}
        futures = self._target_admin.create_acls(list(bindings), request_timeout=ADMIN_TIMEOUT)
        failed = 0
        for binding, future in futures.items():
            acl = bindings[binding]
            try:
                future.result(timeout=ADMIN_TIMEOUT)
            except KafkaException as exc:
                if _code(exc) == KafkaError.SECURITY_DISABLED:
                    self._log_no_target_authorizer()
                    return
                failed += 1
                log.warning(
                    "flow %s: cannot add ACL (%s) on cluster %s: %s",
                    flow.name,
                    acl,
                    flow.target,
                    _reason(exc),
                )
                continue
            log.info("flow %s: synced ACL to %s: %s", flow.name, flow.target, acl)
        if failed:
            self.errors.inc()

    def _log_no_source_authorizer(self) -> None:
        if not self._no_source_authorizer_logged:
            self._no_source_authorizer_logged = True
            log.info(
                "flow %s: cluster %s has no ACL authorizer, so no topic ACLs are synced; "
                "set %s.sync.topic.acls.enabled = false to stop checking",
                self.flow.name,
                self.flow.source,
                self.flow.name,
            )

    def _log_no_target_authorizer(self) -> None:
        if not self._no_target_authorizer_logged:
            self._no_target_authorizer_logged = True
            log.warning(
                "flow %s: cluster %s has no ACL authorizer, so topic ACLs from %s cannot be "
                "copied; set %s.sync.topic.acls.enabled = false to stop trying",
                self.flow.name,
                self.flow.target,
                self.flow.source,
                self.flow.name,
            )


def _reason(exc: Exception) -> str:
    """The message of a KafkaException (its KafkaError's text) or of any other error."""
    first = exc.args[0] if exc.args else exc
    return str(first.str()) if isinstance(first, KafkaError) else str(first)


def _code(exc: KafkaException) -> int | None:
    first = exc.args[0] if exc.args else None
    return int(first.code()) if isinstance(first, KafkaError) else None


def _alter_resource(topic: str, changes: ConfigChanges) -> ConfigResource:
    ops = [
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
        for name, value in sorted(changes.set.items())
    ]
    ops += [
        ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
        for name in changes.delete
    ]
    return ConfigResource(ResourceType.TOPIC, topic, incremental_configs=ops)
