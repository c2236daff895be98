"""mm2py's Java regexes agree with a real JVM: same names matched, same patterns refused.

Runs java.util.regex (the JDK that runs MM2 here) over the unit tests' vectors and more
patterns, each against a set of names. Needs `java` on PATH, no Kafka.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mm2py.compat.java_regex import PatternError, compile_java
from tests.unit.compat.test_java_regex import MATCHES, REFUSED

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs java on PATH"),
]

# Reads lines of hex code points: a pattern, then names; prints 1/0 per name or ERR.
MATCHER = """
import java.io.*;
import java.util.regex.*;

public class Matcher {
    static String decode(String hex) {
        StringBuilder text = new StringBuilder();
        if (hex.isEmpty()) return "";
        for (String c : hex.split(",")) text.appendCodePoint(Integer.parseInt(c, 16));
        return text.toString();
    }
    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, "UTF-8"));
        for (String line; (line = in.readLine()) != null; ) {
            String[] fields = line.split("\\t", -1);
            StringBuilder out = new StringBuilder();
            try {
                Pattern pattern = Pattern.compile(decode(fields[0]));
                for (int i = 1; i < fields.length; i++)
                    out.append(pattern.matcher(decode(fields[i])).matches() ? '1' : '0');
            } catch (PatternSyntaxException e) {
                out.append("ERR");
            }
            System.out.println(out);
        }
    }
}
"""

NAMES = [
    *("", "a", "A", "b", "B", "c", "ab", "aB", "abc", "abC", "D", "orders", "ORDERS", "Orders"),
    *("orders.eu", "orders-eu", "a.b", "axb", "\n", "a\n", "a\r", "a\r\n", "\r", "\x85", "é"),
    *("É", "_", "-", "&", "]", "[", "{", "}", " ", "\t", "1", "12", "aa", "aaa", "x", "#"),
    *("a b", "a{1", "\x01", "\x1b", "ÿ", "\u00a0", "\x0b", "0", "aa0", "abab", "abb", "\\"),
    *("!", "~", "`", "topic1", "t_1", "mm2-offsets.A.internal", "__consumer_offsets"),
]

MORE = [
    *(r"a|(?i)b|c", r"(?i)A(?-i)b", r"(?s:.)a", r"\Ga", r"a\b", r"\ba\b", r"a\Bb", "[^abc]"),
    *("[a-]", "[-a]", r"[a\-z]", "[&&a]", "[a&&]", "[a-z&&[^b]&&[^c]]", "[^a[^b]]", "[a&b]"),
    *("(?i)[a-c&&B]", "(?x)[a-c && b]", "(?x)[a #]", r"(?x)a\ b", r"[a\Q]\E]", r"\P{Lower}"),
    *(r"\p{Alnum}+", r"\p{XDigit}+", r"\p{Space}", r"\p{Cntrl}", r"\p{Graph}", r"\p{Print}"),
    *(r"\cA", r"\e", r"\012", r"\08", r"\R", r"a\R", r"\H", r"\V", r"[\h]", r"[\H]", r"[\v]"),
    *(r"(a)\1", r"(a)(b)\2", r"\D", r"\W", r"\S", r"[\D]", r"[\w-]", r"[\W]", r"(?u)[\W]"),
    *(r"(?u)\W", r"(?u)\d", "(?-u)a", "(?iu)a(?-u)b", "(?<=a)b", ".*(?<=a)", "(?=a)a"),
    *("(?!b).", "(?:a|b)+", "(a|b)*c", "(?m)a$", "(?m)^a", "^a$", "a|", "|a", "a||b", "("),
    *(")", "[^]", "[]", "(?<1a>x)", "(?#c)a", r"\N{LATIN SMALL LETTER A}", r"\N{NO SUCH}"),
    *(r"\k<n>", "(?<n>a)(?<n>b)", "orders(?:-eu)?", "[a-\\d]", "a**", r"\y", r"\-", r"\\"),
    *(r"[\\]", r"[\]]", r"[\[]", "[[]", "(?i)[^a]", "(?i)[A-C]", r"(?i)\x41", "(?ix) a"),
]


def _encode(text: str) -> str:
    return ",".join(f"{ord(char):x}" for char in text)


def _java(tmp_path: Path, rows: list[list[str]]) -> list[str]:
    """Java's answer for each row: a pattern, then the names to match in full."""
    source = tmp_path / "Matcher.java"
    source.write_text(MATCHER)
    done = subprocess.run(
        ["java", str(source)],
        input="".join("\t".join(map(_encode, row)) + "\n" for row in rows),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.splitlines()


def _python(pattern: str) -> str:
    compiled = compile_java(pattern)
    return "".join("1" if compiled.fullmatch(name) else "0" for name in NAMES)


def test_mm2py_matches_and_refuses_what_java_does(tmp_path: Path) -> None:
    patterns = [p for p, _, _ in MATCHES] + [p for p, _ in REFUSED] + MORE
    java = dict(zip(patterns, _java(tmp_path, [[p, *NAMES] for p in patterns]), strict=True))
    differ: list[str] = []
    for pattern in patterns:
        try:
            mine = _python(pattern)
        except PatternError as err:
            # Java refuses it too, or it is one of the few things Python cannot run.
            untranslatable = "mm2py cannot translate" in str(err) or "Python cannot run" in str(err)
            if java[pattern] != "ERR" and not untranslatable:
                differ.append(f"{pattern!r}: Java runs it, mm2py says {err}")
            continue
        if java[pattern] != mine:
            names = [n for n, j, m in zip(NAMES, java[pattern], mine, strict=False) if j != m]
            differ.append(f"{pattern!r}: Java {java[pattern][:3]}..., differs on {names!r}")
    assert differ == []


def test_the_unit_vectors_are_javas_results(tmp_path: Path) -> None:
    answers = _java(tmp_path, [[p, *yes, *no] for p, yes, no in MATCHES])
    assert answers == ["1" * len(yes) + "0" * len(no) for _, yes, no in MATCHES]
