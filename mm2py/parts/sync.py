"""Topic config sync and topic ACL sync of a flow A->B, as MM2's MirrorSourceConnector does them.

The decisions are pure (mm2py.compat.topic_configs and mm2py.compat.acls):

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
from collections.abc import Sequence
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

from mm2py.compat.acls import TopicAcl, missing_acls, target_acls
from mm2py.compat.topic_configs import (
    ConfigChanges,
    ConfigPropertyFilter,
    config_changes,
)
from mm2py.config import ClusterConfig, FlowConfig
from mm2py.kafka import clients
from mm2py.kafka.clients import ADMIN_TIMEOUT, error_text
from mm2py.kafka.configs import describe_topic_configs
from mm2py.kafka.topics import partition_counts
from mm2py.runtime.metrics import Metrics
from mm2py.runtime.part import FlowPart
from mm2py.runtime.scheduler import Scheduler

log = logging.getLogger(__name__)

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


def describe_topic_acls(admin: AdminClient, timeout: float) -> list[TopicAcl]:
    """Every topic ACL of a cluster. Raises KafkaException (SECURITY_DISABLED: no authorizer)."""
    bindings = admin.describe_acls(ANY_TOPIC_ACL, request_timeout=timeout).result(timeout=timeout)
    return [_topic_acl(b) for b in bindings]


def has_authorizer(admin: AdminClient, timeout: float = ADMIN_TIMEOUT) -> bool | None:
    """Whether a cluster's broker runs an authorizer; None if that cannot be told."""
    try:
        broker = str(min(clients.cluster_metadata(admin, timeout).brokers))
        resource = ConfigResource(ResourceType.BROKER, broker)
        configs = admin.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout=timeout
        )
    except (KafkaException, ValueError):  # ValueError: no broker listed
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
        self._timeout = settings.admin_timeout
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
        # A failed sync is logged, counted and tried again at the next interval.
        scheduler = Scheduler(f"flow {self.flow.name}", self.errors)
        retry_on = (KafkaException, SyncError)
        if self.config_period is not None:
            scheduler.add(
                "syncing topic configs",
                self.sync_topic_configs,
                self.config_period,
                retry_on=retry_on,
            )
        if self.acl_period is not None:
            scheduler.add(
                "syncing topic ACLs", self.sync_topic_acls, self.acl_period, retry_on=retry_on
            )
        scheduler.run(self.stopping)

    # -- configs -------------------------------------------------------------------

    def _replicated_remote_topics(self) -> dict[str, str]:
        """Source topic -> remote topic, for replicated topics whose remote topic exists."""
        rt, flow = self.rules, self.flow
        try:
            source_topics = partition_counts(self._source_admin, self._timeout)
        except KafkaException as exc:
            raise SyncError(f"listing topics on {flow.source} failed: {error_text(exc)}") from None
        try:
            target_topics = partition_counts(self._target_admin, self._timeout)
        except KafkaException as exc:
            raise SyncError(f"listing topics on {flow.target} failed: {error_text(exc)}") from None
        pairs = {t: rt.remote_topic(t) for t in source_topics if rt.should_replicate(t)}
        return {t: r for t, r in pairs.items() if r in target_topics}

    def sync_topic_configs(self) -> None:
        """Set the remote topics' configs to the source topics' (only what differs)."""
        flow = self.flow
        pairs = self._replicated_remote_topics()
        if not pairs:
            return
        source = describe_topic_configs(self._source_admin, flow.source, pairs, self._timeout)
        target = describe_topic_configs(
            self._target_admin, flow.target, pairs.values(), self._timeout
        )
        resources: dict[str, tuple[ConfigResource, ConfigChanges]] = {}
        for problem in [*source.unreadable.values(), *target.unreadable.values()]:
            log.warning("flow %s: %s", flow.name, problem)
        for topic, remote in sorted(pairs.items()):
            src, dst = source.found.get(topic), target.found.get(remote)
            if src is None or dst is None:
                continue
            changes = config_changes(src, dst, self.prop_filter)
            if changes:
                resources[remote] = (_alter_resource(remote, changes), changes)
        if not resources:
            return
        futures = self._target_admin.incremental_alter_configs(
            [r for r, _ in resources.values()], request_timeout=self._timeout
        )
        failed = 0
        for resource, future in futures.items():
            changes = resources[resource.name][1]
            try:
                future.result(timeout=self._timeout)
            except KafkaException as exc:
                failed += 1
                log.warning(
                    "flow %s: cannot alter the configs of topic %s on cluster %s (%s): %s",
                    flow.name,
                    resource.name,
                    flow.target,
                    changes.describe(),
                    error_text(exc),
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
            source_acls = describe_topic_acls(self._source_admin, self._timeout)
        except KafkaException as exc:
            if _code(exc) == KafkaError.SECURITY_DISABLED:
                self._log_no_source_authorizer()
                return
            raise SyncError(
                f"cannot list the topic ACLs of cluster {flow.source}: {error_text(exc)}"
            ) from None
        if not source_acls:
            # librdkafka reports "no authorizer" as an empty answer; ask the broker once.
            if not self._source_authorizer_checked:
                self._source_authorizer_checked = True
                if has_authorizer(self._source_admin, self._timeout) is False:
                    self._log_no_source_authorizer()
            return
        wanted = target_acls(source_acls, rt.should_replicate, rt.remote_topic)
        if not wanted:
            return
        try:
            existing = describe_topic_acls(self._target_admin, self._timeout)
        except KafkaException as exc:
            if _code(exc) == KafkaError.SECURITY_DISABLED:
                self._log_no_target_authorizer()
                return
            raise SyncError(
                f"cannot list the topic ACLs of cluster {flow.target}: {error_text(exc)}"
            ) from None
        self._create_acls(missing_acls(wanted, existing))

    def _create_acls(self, acls: Sequence[TopicAcl]) -> None:
        if not acls:
            return
        flow = self.flow
        bindings = {_binding(acl): acl for acl in acls}
        futures = self._target_admin.create_acls(list(bindings), request_timeout=self._timeout)
        failed = 0
        for binding, future in futures.items():
            acl = bindings[binding]
            try:
                future.result(timeout=self._timeout)
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
                    error_text(exc),
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
