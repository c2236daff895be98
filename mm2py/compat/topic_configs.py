"""Which topic configs a remote topic gets, as MM2's MirrorSourceConnector decides (pure).

Every source topic config that is not the broker's built-in default (and not
read-only, sensitive, a static broker setting or matched by
``config.properties.exclude``) is set on the remote topic; a config that is at
its default on the source loses any override on the remote topic, so the
target's own default applies (MM2's ``use.defaults.from=target``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from mm2py.compat.filters import compile_pattern_list

# Kafka's ConfigEntry.ConfigSource, as numbered on the wire (DescribeConfigs v1+).
SOURCE_TOPIC = 1  # DYNAMIC_TOPIC_CONFIG: set on the topic itself
SOURCE_STATIC_BROKER = 4  # STATIC_BROKER_CONFIG: the broker's server.properties
SOURCE_DEFAULT = 5  # DEFAULT_CONFIG: Kafka's built-in default


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
