"""Java regexes (MM2's topic and group patterns) match what Java's Pattern.matches() matches.

Every expected result in MATCHES was produced by Java 17's java.util.regex;
tests/integration/test_java_regex_parity.py checks them against a JVM again.
"""

from __future__ import annotations

import re

import pytest

from mm2py.compat.filters import GroupFilter, TopicFilter, compile_pattern_list
from mm2py.compat.java_regex import PatternError, compile_java, java_to_python

# (Java pattern, names Java matches in full, names it does not)
MATCHES: list[tuple[str, list[str], list[str]]] = [
    # named groups and back-references
    ("(?<name>orders)", ["orders"], ["order", "ordersx"]),
    (r"(?<x>a)-\k<x>", ["a-a"], ["a-b"]),
    (r"(a)\10", ["aa0"], ["aa"]),  # no group 10: Java reads \1 then 0
    # quoting; a quantifier after \E applies to the last quoted character
    (r"\Qorders.eu\E", ["orders.eu"], ["ordersxeu"]),
    (r"\Qorders.", ["orders."], ["ordersx"]),
    (r"\Qab\E+", ["abb"], ["abab"]),
    # inline flags anywhere, up to the end of their group, across alternatives
    ("orders|(?i)payments", ["PAYMENTS", "orders"], ["ORDERS"]),
    ("ab(?i)c|d", ["abC", "D"], ["abD", "ABc"]),
    ("(a(?i)b|c)d", ["aBd", "Cd"], ["cD"]),
    ("(?i)a(?-i)b", ["Ab"], ["AB"]),
    ("(?i:a)b", ["Ab"], ["aB"]),
    ("(?i)é", ["é"], ["É"]),  # case folding is ASCII-only without (?u)
    ("(?iu)é", ["É"], []),
    (r"(?u)\w", ["a"], ["é"]),  # (?u) changes case folding only, not \w
    (r"(?U)\w", ["é"], []),
    (r"(?x) orders - \d+  # a comment", ["orders-12"], ["orders - 12"]),
    ("(?x)[a b]", ["b"], [" "]),
    # possessive quantifiers and atomic groups
    ("a*+a", [], ["aa", "a"]),
    ("(?>a|ab)c", ["ac"], ["abc"]),
    ("a{2,}+", ["aa", "aaa"], ["a"]),
    (r"orders-\d{1}", ["orders-1"], ["orders-12"]),
    # line terminators and anchors
    (".*", ["", "any.topic"], ["a\nb", "a\rb"]),
    ("(?s).*", ["a\nb", "a\rb"], []),
    ("(?d).*", ["a\rb"], ["a\nb"]),
    ("orders$", ["orders"], ["orders\n"]),
    (r"orders\z", ["orders"], []),
    (r"\Aorders\Z", ["orders"], []),
    # character classes: intersection, union, negation of the whole
    ("[a-z&&[^aeiou]]+", ["xyz"], ["abc"]),
    ("[^a-z&&[aeiou]]", ["b", "B"], ["a"]),
    ("[a-c[x-z]]", ["b", "y"], ["m"]),
    ("[^a[b]]", ["c"], ["a", "b"]),
    ("[a[^b]]", ["a", "c"], ["b"]),
    ("[]a]", ["]", "a"], ["b"]),
    (r"[\w&&[^_]]+", ["ab1"], ["a_b"]),
    # POSIX classes (ASCII), \h \v, code point escapes
    (r"\p{Lower}+\p{Digit}", ["abc1"], ["Abc1"]),
    (r"(?i)\p{Lower}", ["A"], []),
    (r"[^\p{Alpha}]", ["1"], ["a"]),
    (r"[\P{Alpha}_]+", ["1_"], ["a"]),
    (r"\p{Punct}", ["!", "_", "~"], ["a"]),
    (r"\h\v", [" \n", "\t\r"], ["a\n"]),
    (r"\x{41}\x42\u0043\0104", ["ABCD"], []),
    # MM2's own default
    (r"mm2.*\.internal", ["mm2-offsets.A.internal", "mm2.internal"], ["mm2internal"]),
]


@pytest.mark.parametrize(("pattern", "yes", "no"), MATCHES, ids=[m[0] for m in MATCHES])
def test_java_regexes_match_what_java_matches(pattern: str, yes: list[str], no: list[str]) -> None:
    compiled = compile_java(pattern)
    assert [name for name in yes if not compiled.fullmatch(name)] == []
    assert [name for name in no if compiled.fullmatch(name)] == []


# (pattern, part of the one-line message) for what Java refuses or Python cannot run
REFUSED: list[tuple[str, str]] = [
    (r"\p{L}+", r"the Unicode property \p{L}"),
    (r"\pL", r"the Unicode property \pL"),
    (r"\p{IsAlphabetic}", r"\p{IsAlphabetic}"),
    (r"(?U)\p{Lower}", r"\p{Lower}"),  # Unicode under (?U), which Python lacks
    (r"\X", "grapheme clusters"),
    (r"a\b{g}", "grapheme boundaries"),
    (".*(?<=a|bc)", "look-behind of varying length"),
    # Java refuses these too
    ("a{1", "is not a repetition"),  # what `a{1,3}` becomes once the list splits it
    ("a{,3}", "is not a repetition"),
    ("{a}", "is not a repetition"),
    ("a{3,1}", "out of order"),
    ("[z-a]", "out of order"),
    (r"\0", "octal digits"),
    (r"a\Eb", r"\E is not an escape Java knows"),
    ("(?q)a", "unknown inline flag 'q'"),
    ("(?P<n>a)", "unknown group construct"),  # Python's spelling; Java has (?<n>...)
    ("(a", "not closed"),
    ("a)", "closes no group"),
    ("[a", "not closed"),
    ("a\\", "lone backslash"),
]


@pytest.mark.parametrize(("pattern", "part"), REFUSED, ids=[r[0] for r in REFUSED])
def test_untranslatable_or_invalid_patterns_are_refused(pattern: str, part: str) -> None:
    with pytest.raises(PatternError) as err:
        compile_java(pattern)
    message = str(err.value)
    assert part in message
    assert f"'{pattern}'" in message  # as written, backslashes not doubled
    assert "\n" not in message


def test_translation_keeps_plain_patterns_readable() -> None:
    assert java_to_python("orders") == "orders"
    assert java_to_python("(?<name>orders)") == "(?P<name>orders)"
    # The translation needs no global flag beyond re.ASCII, and warns about nothing.
    for pattern, _, _ in MATCHES:
        with_flags = re.compile(java_to_python(pattern), re.ASCII)
        assert with_flags.flags & re.ASCII


def test_a_list_is_one_joined_regex_as_in_mm2() -> None:
    # MM2 splits `topics = (orders,payments)` at the comma, then joins with '|'.
    both = TopicFilter(["(orders", "payments)"], [])
    assert both.should_replicate_topic("orders")
    assert both.should_replicate_topic("payments")
    assert not both.should_replicate_topic("orders|payments")
    # Inline flags in one item reach the next ones, as in Java's joined regex.
    groups = GroupFilter(["app", "(?i)batch", "etl"], [])
    assert groups.should_replicate_group("BATCH") and groups.should_replicate_group("ETL")
    assert not groups.should_replicate_group("APP")


def test_the_pattern_at_fault_is_named() -> None:
    with pytest.raises(PatternError, match=r"'\\p\{L\}'"):
        compile_pattern_list(["orders", r"\p{L}"])
    # `topics = a{1,3}` is split by the list; the message says why the brace fails.
    with pytest.raises(PatternError, match=r"'a\{1'.*a comma starts the next pattern"):
        compile_pattern_list(["a{1", "3}"])
    # No single item at fault: the joined regex is named.
    with pytest.raises(PatternError, match=r"'\(\?<n>a\)\|\(\?<n>b\)'"):
        compile_pattern_list(["(?<n>a)", "(?<n>b)"])
