"""Topic and consumer-group filters with MirrorMaker 2's semantics.

MM2's ``DefaultTopicFilter`` and ``DefaultGroupFilter`` join the include list
and the exclude list each into one Java regex (``a|b|c``) and select a name when
the include regex matches the *whole* name and the exclude regex does not. An
empty list matches nothing: ``topics=`` (empty) replicates no topic, and
``topics.exclude=`` excludes none. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mm2py.compat.java_regex import PatternError, compile_java

__all__ = [
    "DEFAULT_GROUPS_EXCLUDE",
    "DEFAULT_GROUPS_INCLUDE",
    "DEFAULT_TOPICS_EXCLUDE",
    "DEFAULT_TOPICS_INCLUDE",
    "GROUPS_EXCLUDE_DEFAULT",
    "GROUPS_INCLUDE_DEFAULT",
    "TOPICS_EXCLUDE_DEFAULT",
    "TOPICS_INCLUDE_DEFAULT",
    "GroupFilter",
    "PatternError",
    "TopicFilter",
    "compile_pattern_list",
    "parse_list",
    "should_checkpoint_group",
]

# MM2 4.x defaults as the raw property strings (`topics`, `topics.exclude`,
# `groups`, `groups.exclude`) ...
TOPICS_INCLUDE_DEFAULT = ".*"
TOPICS_EXCLUDE_DEFAULT = r"mm2.*\.internal, .*\.replica, __.*"
GROUPS_INCLUDE_DEFAULT = ".*"
GROUPS_EXCLUDE_DEFAULT = "console-consumer-.*, connect-.*, __.*"

# ... and as the lists they parse to.
DEFAULT_TOPICS_INCLUDE: tuple[str, ...] = (".*",)
DEFAULT_TOPICS_EXCLUDE: tuple[str, ...] = (r"mm2.*\.internal", r".*\.replica", "__.*")
DEFAULT_GROUPS_INCLUDE: tuple[str, ...] = (".*",)
DEFAULT_GROUPS_EXCLUDE: tuple[str, ...] = ("console-consumer-.*", "connect-.*", "__.*")

# Java's String.trim() strips every char <= U+0020, not Unicode whitespace.
_JAVA_TRIM_CHARS = "".join(chr(c) for c in range(0x21))
_COMMA_WITH_WHITESPACE = re.compile(r"\s*,\s*", re.ASCII)


def parse_list(value: str) -> list[str]:
    """Parse a comma-separated property value the way Kafka's ConfigDef LIST does.

    Trims the value, returns ``[]`` for an empty value, else splits on commas
    with any surrounding whitespace (empty items are kept, as in Java).
    """
    trimmed = value.strip(_JAVA_TRIM_CHARS)
    if not trimmed:
        return []
    return _COMMA_WITH_WHITESPACE.split(trimmed)


def compile_pattern_list(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """Join Java regexes with ``|`` and compile them as MM2 does; None if empty.

    The joined regex is what MM2 compiles, so ``(orders,payments)`` (split by the
    list, joined again) works as in MM2. Java's syntax is translated by
    :mod:`mm2py.compat.java_regex` and compiled with ``re.ASCII``, because Java's
    ``\\w``, ``\\d``, ``\\s`` and ``(?i)`` are ASCII-only by default. Raises
    PatternError (a ValueError) naming the pattern at fault when Java would refuse
    the list or mm2py cannot translate it.
    """
    items = list(patterns)
    if not items:
        # The empty regex would match everything; MM2 treats an empty list as
        # matching nothing.
        return None
    try:
        return compile_java("|".join(items))
    except PatternError:
        if len(items) == 1:
            raise
        # Name the one pattern at fault when there is one, else the list as MM2 joins it.
        for item in items:
            compile_java(item)
        raise


class _IncludeExcludeFilter:
    """A name is selected when it fully matches an include and no exclude pattern."""

    __slots__ = ("_exclude", "_exclude_re", "_include", "_include_re")

    def __init__(self, include: Iterable[str], exclude: Iterable[str]) -> None:
        self._include = tuple(include)
        self._exclude = tuple(exclude)
        self._include_re = compile_pattern_list(self._include)
        self._exclude_re = compile_pattern_list(self._exclude)

    @property
    def include(self) -> tuple[str, ...]:
        """The include patterns, as given."""
        return self._include

    @property
    def exclude(self) -> tuple[str, ...]:
        """The exclude patterns, as given."""
        return self._exclude

    def _selects(self, name: str) -> bool:
        # fullmatch, because Java's Matcher.matches() must consume the whole name.
        included = self._include_re is not None and self._include_re.fullmatch(name) is not None
        excluded = self._exclude_re is not None and self._exclude_re.fullmatch(name) is not None
        return included and not excluded

    def rejection(self, name: str) -> str | None:
        """Why the filter does not select `name`: "no match" (no include pattern
        matches it) or "exclude" (an exclude pattern does); None when it selects it."""
        if self._include_re is None or self._include_re.fullmatch(name) is None:
            return "no match"
        if self._exclude_re is not None and self._exclude_re.fullmatch(name) is not None:
            return "exclude"
        return None

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(include={list(self._include)!r}, exclude={list(self._exclude)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _IncludeExcludeFilter) or type(other) is not type(self):
            return NotImplemented
        return (self._include, self._exclude) == (other._include, other._exclude)

    def __hash__(self) -> int:
        return hash((type(self), self._include, self._exclude))


class TopicFilter(_IncludeExcludeFilter):
    """MM2's ``DefaultTopicFilter``: ``topics`` / ``topics.exclude``.

    Only the filter: :func:`mm2py.compat.policy.should_replicate_topic` adds MM2's other
    rules (heartbeats always flow, internal topics and cycles never do).
    """

    __slots__ = ()

    def __init__(
        self,
        include: Sequence[str] = DEFAULT_TOPICS_INCLUDE,
        exclude: Sequence[str] = DEFAULT_TOPICS_EXCLUDE,
    ) -> None:
        super().__init__(include, exclude)

    def should_replicate_topic(self, topic: str) -> bool:
        """True if ``topic`` fully matches an include and no exclude pattern."""
        return self._selects(topic)


class GroupFilter(_IncludeExcludeFilter):
    """MM2's ``DefaultGroupFilter``: ``groups`` / ``groups.exclude``."""

    __slots__ = ()

    def __init__(
        self,
        include: Sequence[str] = DEFAULT_GROUPS_INCLUDE,
        exclude: Sequence[str] = DEFAULT_GROUPS_EXCLUDE,
    ) -> None:
        super().__init__(include, exclude)

    def should_replicate_group(self, group: str) -> bool:
        """True if ``group`` fully matches an include and no exclude pattern."""
        return self._selects(group)


def should_checkpoint_group(
    group_filter: GroupFilter,
    topic_filter: TopicFilter,
    group: str,
    committed_topics: Iterable[str],
) -> bool:
    """Whether MM2's checkpoint connector picks up ``group``.

    The group must pass the group filter and have committed offsets for at least
    one topic that passes the topic filter (only the filter: no internal-topic or
    cycle check, unlike the source side).
    """
    return group_filter.should_replicate_group(group) and any(
        topic_filter.should_replicate_topic(topic) for topic in committed_topics
    )
