"""load_config: mm2.properties or YAML -> MirrorConfig, through one shared builder.

Both formats become the same flat MM2 keys first, so they give the same model:

- ``clusters``: the cluster aliases.
- ``A.<client key>``, ``A.consumer|producer|admin.<client key>``: A's clients.
- ``A->B.enabled``, ``A->B.<flow key>``: one flow, over the global ``<flow key>``.
- top-level ``security.protocol``, ``ssl.*``, ``sasl.*``: defaults for every cluster's
  clients (MM2's clusterProps), overridden by ``A.*``.
- ``offset.storage.*``-style Connect worker keys may also be set on the target cluster
  (``B.offset.storage.replication.factor``); global ones win, as in MM2's workerConfig.
- exactly-once keys (``B.exactly.once.source.support``, ``exactly.once.support``,
  ``transaction.boundary``) resolve into each flow's ``exactly_once`` and
  ``transaction_boundary_interval_ms`` (mm2py.config.exactly_once).
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from mm2py.compat.filters import PatternError
from mm2py.config import copy_mode
from mm2py.config.client_props import to_librdkafka
from mm2py.config.errors import ConfigError
from mm2py.config.exactly_once import (
    BOUNDARY_KEY,
    INTERVAL_KEY,
    LEVEL_KEY,
    SUPPORT_KEY,
    TIMEOUT_KEY,
    Setting,
    boundary_interval_ms,
    interval_problem,
    parse_timeout_ms,
    parse_word,
    resolve,
)
from mm2py.config.exactly_once import KEYS as EXACTLY_ONCE_KEYS
from mm2py.config.listeners import rest_address
from mm2py.config.loops import check_identity_loops
from mm2py.config.models import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    FLOW_KEYS,
    TYPED_CLIENT_KEYS,
    WORKER_KEYS,
    ClusterConfig,
    FlowConfig,
    FlowSettings,
    MirrorConfig,
    is_secret_key,
    parse_bool,
    parse_list,
)
from mm2py.config.properties import decode, parse_properties
from mm2py.config.unsupported import MM2_ONLY, NOT_HONOURED
from mm2py.config.yaml_loader import parse_yaml

log = logging.getLogger(__name__)

_ROLES = ("consumer", "producer", "admin")
_ALIAS = re.compile(r"[A-Za-z0-9._-]+")
# <alias>.schema.registry.<client key>: that cluster's schema registry client.
_REGISTRY_PREFIX = "schema.registry."
_REGISTRY_SYNC_KEY = "schema.registry.sync.enabled"
_COPY_MODE_KEY = "replication.copy.mode"
# Pre-4.0 names MM2 still translated; the new name wins when both are set.
_DEPRECATED = {
    "topics.blacklist": "topics.exclude",
    "groups.blacklist": "groups.exclude",
    "config.properties.blacklist": "config.properties.exclude",
}
# Java plug-in points: only MM2's own implementations can be honoured.
_JAVA_CLASSES = {
    "topic.filter.class": "org.apache.kafka.connect.mirror.DefaultTopicFilter",
    "group.filter.class": "org.apache.kafka.connect.mirror.DefaultGroupFilter",
    "config.property.filter.class": "org.apache.kafka.connect.mirror.DefaultConfigPropertyFilter",
    "forwarding.admin.class": "org.apache.kafka.clients.admin.ForwardingAdmin",
}
# MM2_ONLY keys with no setting of mm2py's (the others are FlowSettings fields): taken
# here, noted by note_unused, never passed on as client properties.
CONNECT_WORKER_ONLY = MM2_ONLY.keys() - FLOW_KEYS
_GLOBAL_KEYS = (
    FLOW_KEYS
    | {"clusters", "enabled", "listeners", *EXACTLY_ONCE_KEYS}
    | _DEPRECATED.keys()
    | _JAVA_CLASSES.keys()
)


def load_config(path: str | Path) -> MirrorConfig:
    """Load an MM2 ``.properties`` file or an mm2py ``.yaml``/``.yml`` file.

    Raises ConfigError (one line: ``<file>: <key>: <problem>``) for anything wrong,
    including a missing file or an unknown suffix.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".properties", ".yaml", ".yml"):
        raise ConfigError(
            path, None, "unknown file type; use .properties (MM2 format) or .yaml/.yml"
        )
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(path, None, "no such file") from None
    except OSError as exc:
        raise ConfigError(path, None, f"cannot read the file: {exc.strerror}") from None
    if suffix == ".properties":
        flat: dict[str, object] = {}
        for key, value, number in parse_properties(decode(data), path):
            if key in flat:
                log.warning("%s: line %d: %s is set again; the last value wins", path, number, key)
            flat[key] = value
        return build_config(flat, path, strict=False)
    return build_config(parse_yaml(decode(data), path, _global_key_problem), path, strict=True)


def _global_key_problem(key: str) -> str | None:
    """None if ``key`` may appear at the top of a config file, else what is wrong."""
    if key in _GLOBAL_KEYS or _is_common_client_key(key):
        return None
    return "unknown key" + _did_you_mean(key, _GLOBAL_KEYS)


def _is_common_client_key(key: str) -> bool:
    # MM2's CLIENT_CONFIG_DEF: bootstrap, security, SSL and SASL settings.
    return key in ("bootstrap.servers", "security.protocol") or key.startswith(("ssl.", "sasl."))


def _did_you_mean(key: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(candidates), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass
class _RawCluster:
    common: dict[str, str] = field(default_factory=dict)
    roles: dict[str, dict[str, str]] = field(default_factory=lambda: {r: {} for r in _ROLES})
    worker: dict[str, object] = field(default_factory=dict)
    schema_registry: dict[str, str] = field(default_factory=dict)


@dataclass
class _RawFlow:
    enabled: object = None
    settings: dict[str, object] = field(default_factory=dict)


class _Builder:
    """Sorts flat MM2 keys into clusters, flows and global settings, then validates."""

    def __init__(self, path: Path, strict: bool) -> None:
        self.path = path
        self.strict = strict  # YAML: unknown keys are errors; properties: warnings
        self.aliases: list[str] = []
        self.clusters: dict[str, _RawCluster] = {}
        self.flows: dict[tuple[str, str], _RawFlow] = {}
        self.settings: dict[str, object] = {}
        self.client_defaults: dict[str, str] = {}
        self.enabled_default: object = None
        self.listen: str | None = None  # from MM2's `listeners`
        # Where each flow/worker key is set, as written: (shown key, value).
        self.places: dict[str, list[tuple[str, object]]] = {}
        # Said once per load after a successful build: (level, reason) -> shown keys.
        self.notes: dict[tuple[int, str], list[str]] = {}
        # Exactly-once keys by (scope, key): scope "" (global), "B" or "A->B".
        self.exactly_once: dict[tuple[str, str], Setting] = {}
        # The clusters' configurations, built before the flows that read them.
        self.built: dict[str, ClusterConfig] = {}

    def fail(self, key: str | None, message: str) -> NoReturn:
        raise ConfigError(self.path, key, message)

    def unknown(self, key: str, problem: str) -> None:
        if self.strict:
            self.fail(key, problem)
        log.warning("%s: %s: ignored: %s", self.path, key, problem)

    def build(self, flat: Mapping[str, object]) -> MirrorConfig:
        self.aliases = self.cluster_aliases(flat.get("clusters"))
        self.clusters = {alias: _RawCluster() for alias in self.aliases}
        for key, value in flat.items():
            if key != "clusters":
                self.sort(key, value)
        self.validate_settings(self.settings, {key: key for key in self.settings})
        self.built = {alias: self.cluster(alias) for alias in self.aliases}
        config = MirrorConfig(
            path=self.path,
            clusters=self.built,
            listen=self.listen,
            flows=[
                self.flow(source, target)
                for source in self.aliases
                for target in self.aliases
                if source != target
            ],
        )
        check_identity_loops(config)
        self.note_unused()
        for (level, reason), shown in self.notes.items():
            log.log(level, "%s: %s: %s", self.path, ", ".join(dict.fromkeys(shown)), reason)
        return config

    def cluster_aliases(self, value: object) -> list[str]:
        try:
            aliases = parse_list(value if value is not None else "")
        except ValueError:
            self.fail("clusters", "expected a comma-separated list of cluster aliases")
        if not aliases:
            self.fail("clusters", "no clusters listed; list their aliases, e.g. clusters = A, B")
        for alias in aliases:
            if not _ALIAS.fullmatch(alias):
                self.fail(
                    "clusters",
                    f"invalid cluster alias {alias!r}; use letters, digits, '.', '_' or '-'"
                    " (no spaces, no '->')",
                )
            if aliases.count(alias) > 1:
                self.fail("clusters", f"cluster alias {alias!r} is listed twice")
        return aliases

    def alias_prefix(self, key: str) -> str | None:
        """The (longest) cluster alias that ``key`` starts with, followed by a dot."""
        matches = [alias for alias in self.aliases if key.startswith(alias + ".")]
        return max(matches, key=len) if matches else None

    def sort(self, key: str, value: object) -> None:
        if key == "config.providers":
            self.fail(
                key,
                "config providers (${provider:...} references) are not supported;"
                " write the values into the file",
            )
        if "->" in key:
            self.sort_flow_key(key, value)
        elif key == "enabled":
            self.enabled_default = value
        elif key == "listeners":
            self.set_listeners(value)
        elif key in FLOW_KEYS or key in _DEPRECATED:
            self.set_setting(self.settings, key, key, value)
        elif key in _JAVA_CLASSES:
            self.check_class(key, key, value)
        elif key in EXACTLY_ONCE_KEYS:
            self.set_exactly_once("", key, key, value)
        elif key in CONNECT_WORKER_ONLY:
            self.place(key, key, value)  # noted: note_unused
        elif alias := self.alias_prefix(key):
            self.sort_cluster_key(alias, key[len(alias) + 1 :], value)
        elif _is_common_client_key(key):
            self.client_defaults[key] = _client_value(value)
        else:
            hint = _did_you_mean(key, _GLOBAL_KEYS)
            if not hint and key.endswith(".bootstrap.servers"):
                hint = f"; is {key.split('.')[0]!r} missing from clusters?"
            self.unknown(key, "unknown key" + hint)

    def sort_flow_key(self, key: str, value: object) -> None:
        source, _, rest = key.partition("->")
        target = self.alias_prefix(rest)
        known = ", ".join(self.aliases)
        if source not in self.aliases:
            self.fail(key, f"cluster {source!r} is not listed in clusters ({known})")
        if target is None:
            named = rest.split(".")[0]
            if rest in self.aliases:
                self.fail(key, f"missing setting name, e.g. {source}->{rest}.enabled")
            self.fail(key, f"cluster {named!r} is not listed in clusters ({known})")
        if source == target:
            self.fail(key, "a flow needs two different clusters")
        sub = rest[len(target) + 1 :]
        flow = self.flows.setdefault((source, target), _RawFlow())
        if sub == "enabled":
            flow.enabled = value
        elif sub in FLOW_KEYS or sub in _DEPRECATED:
            self.set_setting(flow.settings, sub, key, value)
        elif sub in _JAVA_CLASSES:
            self.check_class(sub, key, value)
        elif sub in EXACTLY_ONCE_KEYS:
            self.set_exactly_once(f"{source}->{target}", sub, key, value)
        elif sub.split(".")[0] in _ROLES:
            self.unknown(
                key,
                f"per-flow client settings are not supported; set {source}.{sub} or {target}.{sub}",
            )
        else:
            self.unknown(key, "unknown flow setting" + _did_you_mean(sub, FLOW_KEYS | {"enabled"}))

    def sort_cluster_key(self, alias: str, sub: str, value: object) -> None:
        raw = self.clusters[alias]
        role = sub.split(".")[0]
        if sub.startswith(_REGISTRY_PREFIX):
            raw.schema_registry[sub[len(_REGISTRY_PREFIX) :]] = _client_value(value)
        elif role in _ROLES and "." in sub:
            raw.roles[role][sub[len(role) + 1 :]] = _client_value(value)
        elif sub in WORKER_KEYS:
            raw.worker[sub] = value
            self.place(sub, f"{alias}.{sub}", value)
        elif sub in CONNECT_WORKER_ONLY:
            self.place(sub, f"{alias}.{sub}", value)
        elif sub in (SUPPORT_KEY, LEVEL_KEY):
            # MM2's documented form: B.exactly.once.source.support for flows into B.
            self.set_exactly_once(alias, sub, f"{alias}.{sub}", value)
        elif sub in FLOW_KEYS or sub in ("enabled", BOUNDARY_KEY):
            # MM2 has no per-cluster flow settings; it would pass this to A's clients.
            self.unknown(
                f"{alias}.{sub}",
                f"flow settings cannot be set per cluster; set {sub} or {alias}->X.{sub}",
            )
        else:
            raw.common[sub] = _client_value(value)

    def set_listeners(self, value: object) -> None:
        try:
            self.listen, unused = rest_address(value)
        except ValueError as exc:
            self.fail("listeners", str(exc))
        if unused:
            log.warning(
                "%s: listeners: mm2py serves only %s; not served: %s",
                self.path,
                self.listen,
                ", ".join(unused),
            )

    def set_setting(self, into: dict[str, object], key: str, shown: str, value: object) -> None:
        if key in _DEPRECATED:
            new = _DEPRECATED[key]
            log.warning("%s: %s is deprecated; use %s", self.path, shown, new)
            into.setdefault(new, value)
        else:
            into[key] = value
            self.place(key, shown, value)

    def place(self, key: str, shown: str, value: object) -> None:
        """Record that `key` was set, as `shown` in the file, to `value`."""
        self.places.setdefault(key, []).append((shown, value))

    def check_class(self, key: str, shown: str, value: object) -> None:
        default = _JAVA_CLASSES[key]
        if str(value).strip() not in (default, default.rsplit(".", 1)[1]):
            self.fail(shown, f"custom Java classes are not supported; remove it to use {default}")

    def set_exactly_once(self, scope: str, key: str, shown: str, value: object) -> None:
        """Keep an exactly-once key (one of EXACTLY_ONCE_KEYS) set in `scope`; a bad value fails."""
        try:
            word = parse_word(key, value)
        except ValueError as exc:
            got = f" (got {value!r})" if str(exc).startswith("expected") else ""
            self.fail(shown, f"{exc}{got}")
        self.exactly_once[(scope, key)] = Setting(word, shown)
        if word == "preparing":
            reason = "preparing: copies at-least-once, as MM2 does while preparing; set enabled"
            self.notes.setdefault((logging.INFO, reason + " for exactly-once"), []).append(shown)

    def exactly_once_setting(self, key: str, source: str, target: str) -> Setting | None:
        """Where `key` is set for source->target: the flow's, the target's, the global one."""
        for scope in (f"{source}->{target}", target, ""):
            if (scope, key) in self.exactly_once:
                return self.exactly_once[(scope, key)]
        return None

    def transaction_timeout(self, target: str) -> Setting | None:
        """The transaction.timeout.ms the target's producers are configured with, in ms
        (checked: a bad value fails the load naming where it was set), if any."""
        raw = self.clusters[target]
        for props, shown in (
            (raw.roles["producer"], f"{target}.producer.{TIMEOUT_KEY}"),
            (raw.common, f"{target}.{TIMEOUT_KEY}"),
        ):
            if TIMEOUT_KEY in props:
                try:
                    ms = parse_timeout_ms(props[TIMEOUT_KEY])
                except ValueError as exc:
                    self.fail(shown, str(exc))
                return Setting(str(ms), shown)
        return None

    def source_isolation(self, source: str) -> Setting | None:
        """The isolation.level the source's consumer is configured with, if any."""
        raw = self.clusters[source]
        for props, shown in (
            (raw.roles["consumer"], f"{source}.consumer.isolation.level"),
            (raw.common, f"{source}.isolation.level"),
        ):
            if "isolation.level" in props:
                return Setting(props["isolation.level"].strip().lower(), shown)
        return None

    def resolve_exactly_once(
        self, source: str, target: str, enabled: bool, settings: FlowSettings, shown: dict[str, str]
    ) -> FlowSettings:
        """`settings` with the flow's exactly-once mode and commit interval; a flow that
        replicates and cannot have the exactly-once it requires fails the load."""
        name = f"{source}->{target}"
        resolved = resolve(
            name,
            target,
            self.exactly_once_setting(SUPPORT_KEY, source, target),
            self.exactly_once_setting(LEVEL_KEY, source, target),
            self.source_isolation(source),
        )
        boundary = self.exactly_once_setting(BOUNDARY_KEY, source, target)
        interval = boundary_interval_ms(boundary, settings.transaction_boundary_interval_ms)
        timeout = self.transaction_timeout(target)
        timeout_ms = int(timeout.value) if timeout else DEFAULT_TRANSACTION_TIMEOUT_MS
        if enabled:
            if resolved.error is not None:
                self.fail(resolved.error.key, resolved.error.message)
            interval_key = shown.get(INTERVAL_KEY, INTERVAL_KEY)
            too_long = interval_problem(
                interval, interval_key, timeout_ms, timeout.shown if timeout else None
            )
            if resolved.mode != "off" and too_long is not None:
                self.fail(interval_key, too_long)
            if resolved.warning is not None:
                note = (logging.WARNING, resolved.warning.message)
                self.notes.setdefault(note, []).append(resolved.warning.key)
            if boundary is not None and interval == 0 and INTERVAL_KEY in shown:
                reason = (
                    f"ignored: {boundary.shown} = poll commits a transaction after every batch;"
                    f" set it to interval to commit every {INTERVAL_KEY}"
                )
                self.notes.setdefault((logging.WARNING, reason), []).append(shown[INTERVAL_KEY])
        return settings.resolved(
            exactly_once=resolved.mode,
            exactly_once_key=resolved.key,
            transaction_boundary_interval_ms=interval,
            transaction_timeout_ms=timeout_ms,
        )

    def note_unused(self) -> None:
        """Note the keys mm2py accepts without acting on them (see config.unsupported)."""
        for key, reason in NOT_HONOURED.items():
            # One task per flow is what mm2py does: tasks.max = 1 is honoured.
            shown = [
                where
                for where, value in self.places.get(key, [])
                if key != "tasks.max" or int(str(value).strip()) > 1
            ]
            if shown:
                self.notes[(logging.WARNING, reason)] = shown
        for key, reason in MM2_ONLY.items():
            if key in self.places:  # keys with one reason share its line
                where = [shown for shown, _ in self.places[key]]
                self.notes.setdefault((logging.INFO, reason), []).extend(where)

    def validate_settings(self, values: dict[str, object], shown: dict[str, str]) -> FlowSettings:
        try:
            return FlowSettings.model_validate(values)
        except ValidationError as exc:
            self.raise_validation(exc, shown, show_input=True)

    def flow(self, source: str, target: str) -> FlowConfig:
        raw = self.flows.get((source, target), _RawFlow())
        values: dict[str, object] = {}
        shown: dict[str, str] = {}
        layers = (
            (self.clusters[target].worker, f"{target}."),
            (self.settings, ""),
            (raw.settings, f"{source}->{target}."),
        )
        for layer, prefix in layers:
            values.update(layer)
            shown.update({key: prefix + key for key in layer})
        settings = self.validate_settings(values, shown)
        enabled_key = f"{source}->{target}.enabled" if raw.enabled is not None else "enabled"
        enabled = raw.enabled if raw.enabled is not None else self.enabled_default
        try:
            is_enabled = parse_bool(enabled) if enabled is not None else False
        except ValueError as exc:
            self.fail(enabled_key, f"{exc} (got {enabled!r})")
        settings = self.resolve_exactly_once(source, target, is_enabled, settings, shown)
        if is_enabled and settings.schema_registry_sync_enabled:
            missing = [
                f"{alias}.{_REGISTRY_PREFIX}url"
                for alias in (source, target)
                if not self.clusters[alias].schema_registry.get("url")
            ]
            if missing:
                self.fail(
                    shown.get(_REGISTRY_SYNC_KEY, _REGISTRY_SYNC_KEY),
                    f"flow {source}->{target} copies schemas between the clusters' schema "
                    f"registries but {' and '.join(missing)} is not set; set it or set "
                    f"{source}->{target}.{_REGISTRY_SYNC_KEY} = false",
                )
        settings = self.choose_copier(source, target, is_enabled, settings, shown)
        separator = settings.replication_policy_separator
        for alias in (source, target):
            if separator in alias:
                self.fail(
                    "clusters",
                    f"cluster alias {alias!r} contains the replication.policy.separator"
                    f" {separator!r}, so remote topic names would be ambiguous; rename it",
                )
        return FlowConfig(source=source, target=target, enabled=is_enabled, settings=settings)

    def choose_copier(
        self, source: str, target: str, enabled: bool, settings: FlowSettings, shown: dict[str, str]
    ) -> FlowSettings:
        """`settings` with the copier `replication.copy.mode` gives the flow
        (mm2py.config.copy_mode); `batch` where it cannot keep the flow's guarantees fails
        the load of an enabled flow."""
        name = f"{source}->{target}"
        try:
            choice = copy_mode.choose(name, settings, self.built[source], self.built[target], shown)
        except copy_mode.BatchRefused as refused:
            if enabled:
                key = shown.get(_COPY_MODE_KEY, _COPY_MODE_KEY)
                obstacle = refused.obstacle
                self.fail(
                    key,
                    f"batch cannot copy flow {name}: {obstacle.key}: {obstacle.why};"
                    f" set {key} = record or auto",
                )
            choice = copy_mode.CopyChoice("record", str(refused))
        return settings.resolved(copier=choice.copier, copier_reason=choice.reason)

    def cluster(self, alias: str) -> ClusterConfig:
        raw = self.clusters[alias]
        common = to_librdkafka(self.client_defaults, "", self.path)
        common |= to_librdkafka(raw.common, f"{alias}.", self.path)
        if not common.get("bootstrap.servers"):
            self.fail(
                f"{alias}.bootstrap.servers",
                f"missing; every cluster needs one, e.g. {alias}.bootstrap.servers = host:9092",
            )
        data: dict[str, object] = {
            role: to_librdkafka(raw.roles[role], f"{alias}.{role}.", self.path) for role in _ROLES
        }
        data["alias"] = alias
        data["schema_registry"] = dict(raw.schema_registry)
        data["properties"] = {k: v for k, v in common.items() if k not in TYPED_CLIENT_KEYS}
        data.update({k: v for k, v in common.items() if k in TYPED_CLIENT_KEYS})
        try:
            return ClusterConfig.model_validate(data)
        except ValidationError as exc:
            shown = {key: f"{alias}.{key}" for key in TYPED_CLIENT_KEYS}
            self.raise_validation(exc, shown, show_input=False)

    def raise_validation(
        self, exc: ValidationError, shown: dict[str, str], *, show_input: bool
    ) -> NoReturn:
        """Re-raise pydantic's first error as one ConfigError line naming the MM2 key."""
        errors = exc.errors()
        first = errors[0]
        loc = str(first["loc"][0]) if first["loc"] else ""
        key = shown.get(loc, loc)
        message = first["msg"].removeprefix("Value error, ")
        value = first.get("input")
        # A pattern error already quotes the pattern at fault, as the user wrote it.
        quoted = isinstance(first.get("ctx", {}).get("error"), PatternError)
        if (
            show_input
            and not quoted
            and not is_secret_key(loc)
            and isinstance(value, str | int | float)
        ):
            message += f" (got {value!r})"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more problem(s))"
        self.fail(key, message)


def _client_value(value: object) -> str:
    """A client property as the string librdkafka takes (YAML may give bool/int/list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(item).strip() for item in value)
    return str(value).strip()


def build_config(flat: Mapping[str, object], path: Path, *, strict: bool) -> MirrorConfig:
    """Build the model from flat MM2 keys; ``strict`` makes unknown keys errors, not warnings."""
    return _Builder(path, strict).build(flat)
