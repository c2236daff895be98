"""Refuse two-way identity replication whose topic filters overlap (records would loop).

With IdentityReplicationPolicy a remote topic keeps its name, so with A->B and B->A both
enabled a topic both flows select travels A->B->A->B... for ever. MM2 accepts such a
config; mm2py refuses it.

Rule: refused when both directions between two clusters are enabled, at least one uses
the identity policy, and a topic name exists that both flows would copy. Candidates are
built from both flows' ``topics`` patterns (their literal beginnings and endings); one
counts when both flows' filters select it and it is not internal or heartbeats.
Invariant: every overlap of the usual kinds is found; exotic patterns that overlap only
in odd places may pass. Design: docs/design/config.md.
"""

from __future__ import annotations

from collections.abc import Iterable

from mm2py.compat.filters import TopicFilter
from mm2py.compat.policy import policy_from_name
from mm2py.config.errors import ConfigError
from mm2py.config.models import FlowConfig, MirrorConfig

# Regex syntax; `.` is not listed because it matches itself, so `orders.eu` is a name.
_META = set("[]()*+?{}|^$\\")
_FILLERS = ("", "x", "-x", ".x", "_x", "0")


def _literal_prefix(pattern: str) -> str:
    """The fixed text a Java regex starts with (``\\.`` and other escaped punctuation kept)."""
    out: list[str] = []
    i = 1 if pattern.startswith("^") else 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
            continue
        if char in _META:
            break
        out.append(char)
        i += 1
    # A quantifier applies to the character before it: `ab?` fixes only `a`.
    if i < len(pattern) and pattern[i] in "*+?{" and out:
        out.pop()
    return "".join(out)


def _literal_suffix(pattern: str) -> str:
    """The fixed text a Java regex ends with (unescaped; empty when unsure)."""
    out: list[str] = []
    i = len(pattern) - 1
    if i >= 0 and pattern[i] == "$" and not pattern[:i].endswith("\\"):
        i -= 1
    while i >= 0:
        char = pattern[i]
        escaped = i >= 1 and pattern[i - 1] == "\\"
        if escaped and not char.isalnum():
            out.append(char)
            i -= 2
            continue
        if char in _META or escaped:
            break
        out.append(char)
        i -= 1
    return "".join(reversed(out))


def candidate_topics(patterns: Iterable[str]) -> list[str]:
    """Topic names that the given ``topics`` patterns are likely to select.

    Every literal beginning joined to every literal ending (of any of the patterns)
    with a little in between, so ``.*-events`` and ``click.*`` give ``click-events``.
    """
    patterns = list(patterns)
    prefixes = ["", *dict.fromkeys(_literal_prefix(p) for p in patterns)]
    suffixes = ["", *dict.fromkeys(_literal_suffix(p) for p in patterns)]
    names = [p + f + s for p in prefixes for s in suffixes for f in _FILLERS]
    return [n for n in dict.fromkeys(names) if n]


def shared_topic(first: FlowConfig, second: FlowConfig) -> str | None:
    """A topic name both flows would copy, if one is found among the candidates."""
    policy = policy_from_name(first.settings.replication_policy_class)
    filters = [TopicFilter(f.settings.topics, f.settings.topics_exclude) for f in (first, second)]
    for name in candidate_topics([*first.settings.topics, *second.settings.topics]):
        if policy.is_internal_topic(name) or policy.is_heartbeats_topic(name):
            continue
        if all(f.should_replicate_topic(name) for f in filters):
            return name
    return None


def _identity(flow: FlowConfig) -> bool:
    return flow.settings.replication_policy_class == "IdentityReplicationPolicy"


def check_identity_loops(config: MirrorConfig) -> None:
    """Raise ConfigError for a two-way identity pair whose topic filters overlap."""
    enabled = {(f.source, f.target): f for f in config.enabled_flows()}
    for (source, target), flow in enabled.items():
        back = enabled.get((target, source))
        if back is None or source > target or not (_identity(flow) or _identity(back)):
            continue
        name = shared_topic(flow, back)
        if name is not None:
            raise ConfigError(
                config.path,
                f"{source}->{target}.topics",
                f"{source}->{target} and {target}->{source} are both enabled with "
                f"IdentityReplicationPolicy and both would copy topic {name!r}, so its records "
                f"would loop between {source} and {target} for ever (identity names cannot show "
                f"where a topic came from); make {source}->{target}.topics and "
                f"{target}->{source}.topics disjoint, disable one direction, or use "
                "DefaultReplicationPolicy",
            )
