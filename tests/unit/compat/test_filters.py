"""Topic and group filters behave exactly like MM2's DefaultTopicFilter/DefaultGroupFilter.

Expected values come from MM2's own tests and from running MM2 4.1.1's filters
on the same configuration strings.
"""

from __future__ import annotations

import pytest

from mm2py.compat.filters import (
    DEFAULT_GROUPS_EXCLUDE,
    DEFAULT_GROUPS_INCLUDE,
    DEFAULT_TOPICS_EXCLUDE,
    DEFAULT_TOPICS_INCLUDE,
    GROUPS_EXCLUDE_DEFAULT,
    GROUPS_INCLUDE_DEFAULT,
    TOPICS_EXCLUDE_DEFAULT,
    TOPICS_INCLUDE_DEFAULT,
    GroupFilter,
    TopicFilter,
    compile_pattern_list,
    parse_list,
    should_checkpoint_group,
)


def test_default_strings_parse_to_default_lists() -> None:
    assert tuple(parse_list(TOPICS_INCLUDE_DEFAULT)) == DEFAULT_TOPICS_INCLUDE
    assert tuple(parse_list(TOPICS_EXCLUDE_DEFAULT)) == DEFAULT_TOPICS_EXCLUDE
    assert tuple(parse_list(GROUPS_INCLUDE_DEFAULT)) == DEFAULT_GROUPS_INCLUDE
    assert tuple(parse_list(GROUPS_EXCLUDE_DEFAULT)) == DEFAULT_GROUPS_EXCLUDE
    assert DEFAULT_TOPICS_EXCLUDE == (r"mm2.*\.internal", r".*\.replica", "__.*")
    assert DEFAULT_GROUPS_EXCLUDE == ("console-consumer-.*", "connect-.*", "__.*")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("", []),
        ("   ", []),
        ("a", ["a"]),
        ("a, b", ["a", "b"]),
        (" a ,\tb ", ["a", "b"]),
        ("a,b,", ["a", "b", ""]),
        (",a", ["", "a"]),
        (r"mm2.*\.internal, .*\.replica, __.*", [r"mm2.*\.internal", r".*\.replica", "__.*"]),
    ],
)
def test_parse_list_like_configdef(value: str, expected: list[str]) -> None:
    assert parse_list(value) == expected


# --- default topic filter -----------------------------------------------------------


@pytest.mark.parametrize(
    ("topic", "expected"),
    [
        ("t", True),
        ("topic", True),
        ("A.t", True),
        ("heartbeats", True),
        ("foo.replica", False),
        ("__x", False),
        ("__consumer_offsets", False),
        ("mm2-offsets.A.internal", False),
        ("mm2-offset-syncs.B.internal", False),
        ("mm2x.internal", False),
        # Since Kafka 4.0 the default exclude only covers MM2's own `.internal`
        # topics; other `.internal`/`-internal` names pass the filter.
        ("x.internal", True),
        ("x-internal", True),
        ("A.checkpoints.internal", True),
        ("foo.replicas", True),
    ],
)
def test_default_topic_filter(topic: str, expected: bool) -> None:
    assert TopicFilter().should_replicate_topic(topic) is expected


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        ("grp", True),
        ("my-app", True),
        ("console-consumer-1", False),
        ("connect-x", False),
        ("connect-", False),
        ("__x", False),
        ("x-connect-y", True),
        ("console-consumer", True),
    ],
)
def test_default_group_filter(group: str, expected: bool) -> None:
    assert GroupFilter().should_replicate_group(group) is expected


# --- matching semantics -------------------------------------------------------------


def test_match_is_a_full_match_not_a_search() -> None:
    only_top = TopicFilter(["top"], [])
    assert only_top.should_replicate_topic("top")
    assert not only_top.should_replicate_topic("topic")
    assert not only_top.should_replicate_topic("stop")
    assert TopicFilter(["top.*"], []).should_replicate_topic("topic")


def test_list_items_are_alternatives() -> None:
    f = TopicFilter(["a", "b"], [])
    assert f.should_replicate_topic("a")
    assert f.should_replicate_topic("b")
    assert not f.should_replicate_topic("ab")
    assert not f.should_replicate_topic("a,b")
    # Each alternative must match the whole name by itself.
    assert not TopicFilter(["a|b"], []).should_replicate_topic("ab")


def test_exclude_wins_over_include() -> None:
    f = TopicFilter([r"foo\.bar", "baz"], [r".*\.bar"])
    assert not f.should_replicate_topic("foo.bar")
    assert f.should_replicate_topic("baz")
    assert not f.should_replicate_topic("fooxbar")
    assert not TopicFilter(["a|b"], ["b"]).should_replicate_topic("b")
    assert TopicFilter(["a|b"], ["b"]).should_replicate_topic("a")


def test_empty_include_matches_nothing() -> None:
    assert not TopicFilter([], []).should_replicate_topic("t")
    assert not TopicFilter([], []).should_replicate_topic("")
    assert not GroupFilter([], []).should_replicate_group("grp")
    assert not TopicFilter(parse_list(""), []).should_replicate_topic("t")


def test_empty_exclude_excludes_nothing() -> None:
    f = TopicFilter([".*"], [])
    for topic in ("__consumer_offsets", "foo.replica", "mm2-offsets.A.internal", "t"):
        assert f.should_replicate_topic(topic)
    assert GroupFilter([".*"], []).should_replicate_group("console-consumer-1")


def test_trailing_comma_adds_an_empty_alternative() -> None:
    # "a,b," parses to ["a", "b", ""]; the empty item matches only the empty name.
    f = TopicFilter(parse_list("a,b,"), [])
    assert f.should_replicate_topic("a")
    assert f.should_replicate_topic("")
    assert not f.should_replicate_topic("c")


def test_java_character_classes_are_ascii_only() -> None:
    digits = TopicFilter([r"\d+"], [])
    assert digits.should_replicate_topic("123")
    assert not digits.should_replicate_topic("\u0661\u0662")  # Arabic-Indic digits
    words = TopicFilter([r"\w+"], [])
    assert words.should_replicate_topic("t_1")
    assert not words.should_replicate_topic("t\u00e9st")
    assert not words.should_replicate_topic("a.b")


def test_inline_case_insensitive_flag() -> None:
    f = TopicFilter(["(?i)ABC"], [])
    assert f.should_replicate_topic("abc")
    assert f.should_replicate_topic("ABC")
    assert not f.should_replicate_topic("abcd")


def test_java_quoting_and_named_groups() -> None:
    quoted = TopicFilter([r"\Qa.b\E"], [])
    assert quoted.should_replicate_topic("a.b")
    assert not quoted.should_replicate_topic("axb")
    assert TopicFilter([r"\Qa.b"], []).should_replicate_topic("a.b")  # \E is optional
    named = TopicFilter([r"(?<x>a)\k<x>"], [])
    assert named.should_replicate_topic("aa")
    assert not named.should_replicate_topic("ab")
    lookbehind = TopicFilter([r".*(?<!x)"], [])
    assert lookbehind.should_replicate_topic("ab")
    assert not lookbehind.should_replicate_topic("ax")


def test_invalid_regex_is_a_value_error_naming_the_pattern() -> None:
    with pytest.raises(ValueError, match=r"\[a-"):
        TopicFilter(["[a-"], [])
    with pytest.raises(ValueError, match=r"invalid regular expression '\(unclosed'"):
        GroupFilter([".*"], ["(unclosed"])


def test_compile_pattern_list() -> None:
    assert compile_pattern_list([]) is None
    pattern = compile_pattern_list(["a", "b.*"])
    assert pattern is not None
    assert pattern.fullmatch("bcd")
    assert not pattern.fullmatch("cb")


def test_filters_keep_their_patterns_and_compare_by_value() -> None:
    f = TopicFilter(["a"], ["b"])
    assert f.include == ("a",)
    assert f.exclude == ("b",)
    assert f == TopicFilter(("a",), ("b",))
    assert f != TopicFilter(["a"], [])
    assert f != GroupFilter(["a"], ["b"])
    assert hash(f) == hash(TopicFilter(["a"], ["b"]))
    assert TopicFilter() == TopicFilter(DEFAULT_TOPICS_INCLUDE, DEFAULT_TOPICS_EXCLUDE)
    assert repr(f) == "TopicFilter(include=['a'], exclude=['b'])"


# --- checkpoint connector group selection -------------------------------------------


def test_should_checkpoint_group() -> None:
    groups = GroupFilter()
    topics = TopicFilter(["orders.*"], [])
    assert should_checkpoint_group(groups, topics, "app", ["orders", "other"])
    # No committed offsets for a wanted topic: the group is ignored.
    assert not should_checkpoint_group(groups, topics, "app", ["other"])
    assert not should_checkpoint_group(groups, topics, "app", [])
    # Excluded groups are ignored whatever they consumed.
    assert not should_checkpoint_group(groups, topics, "console-consumer-7", ["orders"])
    # Only the filter counts here: internal-looking topics are fine if selected.
    assert should_checkpoint_group(groups, TopicFilter([".*"], []), "app", ["__x"])
