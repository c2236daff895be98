r"""Java regular expressions (``java.util.regex.Pattern``) run on Python's ``re``.

MM2's topic, group and config-property patterns are Java regexes. ``java_to_python``
rewrites one into a Python pattern with the same meaning, to be compiled with
``re.ASCII`` and used with ``fullmatch`` (Java's ``Matcher.matches()``). No I/O.

Invariants:
- a pattern is translated only when Python can express its meaning (named groups,
  ``\Q...\E``, inline flags anywhere, Java's line terminators, POSIX classes, class
  union and intersection, ...);
- anything else is a PatternError naming the part: what Java refuses, and what Python
  cannot express (``\p{L}``, ``\X``, ``\b{g}``, variable-length look-behind);
- the remaining differences (``\b`` ASCII, ``(?m)`` with ``\n`` only) cannot change what
  a filter selects among topic names. Design: docs/design/config.md.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field

__all__ = ["PatternError", "compile_java", "java_to_python"]


class PatternError(ValueError):
    """A pattern that Java refuses, or Java syntax mm2py cannot run; one line saying which."""


_WHITESPACE = " \t\n\x0b\f\r"  # what (?x) skips: Java's ASCII.isSpace
_TERMINATORS = "\n\r\x85\u2028\u2029"  # Java's line terminators (\r\n counts as one)
_FLAGS = "idmsuxU"
_QUANTIFIER = re.compile(r"\{(\d+)(,(\d*))?\}")
_GROUP_NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*")

Ranges = tuple[tuple[int, int], ...]
_LOWER: Ranges = ((0x61, 0x7A),)
_UPPER: Ranges = ((0x41, 0x5A),)
_DIGIT: Ranges = ((0x30, 0x39),)
_WORD: Ranges = (*_DIGIT, *_UPPER, (0x5F, 0x5F), *_LOWER)
_SPACE: Ranges = ((0x09, 0x0D), (0x20, 0x20))
# Java's POSIX classes are US-ASCII only unless (?U).
_POSIX: dict[str, Ranges] = {
    "Lower": _LOWER,
    "Upper": _UPPER,
    "ASCII": ((0x00, 0x7F),),
    "Alpha": (*_UPPER, *_LOWER),
    "Digit": _DIGIT,
    "Alnum": (*_DIGIT, *_UPPER, *_LOWER),
    "Punct": ((0x21, 0x2F), (0x3A, 0x40), (0x5B, 0x60), (0x7B, 0x7E)),
    "Graph": ((0x21, 0x7E),),
    "Print": ((0x20, 0x7E),),
    "Blank": ((0x09, 0x09), (0x20, 0x20)),
    "Cntrl": ((0x00, 0x1F), (0x7F, 0x7F)),
    "XDigit": (*_DIGIT, (0x41, 0x46), (0x61, 0x66)),
    "Space": _SPACE,
}
_HORIZONTAL: Ranges = (
    (0x09, 0x09),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x180E, 0x180E),
    (0x2000, 0x200A),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
)
_VERTICAL: Ranges = ((0x0A, 0x0D), (0x85, 0x85), (0x2028, 0x2029))
_ASCII_CLASSES = {"d": _DIGIT, "w": _WORD, "s": _SPACE}


def java_to_python(pattern: str) -> str:
    """The Python pattern (for ``re.compile(..., re.ASCII)``) that means what ``pattern``
    means to Java; PatternError if Java refuses it or Python cannot express it."""
    return _Translator(pattern).translate()


def compile_java(pattern: str) -> re.Pattern[str]:
    """Compile a Java regex for ``fullmatch``; PatternError (one line) if it cannot be used."""
    translated = java_to_python(pattern)
    try:
        return re.compile(translated, re.ASCII)
    except re.error as err:
        if "look-behind requires fixed-width" in err.msg:
            raise PatternError(
                f"regular expression {quoted(pattern)} uses a look-behind of varying length, which"
                " Java allows and Python cannot run; give each alternative its own look-behind,"
                " e.g. (?:(?<=a)|(?<=bc))"
            ) from None
        # A position would point into the translation, not into what the user wrote.
        where = f" at position {err.pos}" if translated == pattern and err.pos is not None else ""
        raise PatternError(
            f"invalid regular expression {quoted(pattern)}: {err.msg}{where}"
        ) from None


def quoted(pattern: str) -> str:
    """A pattern as the user wrote it, in quotes (escaped only if it has unprintable text)."""
    return f"'{pattern}'" if pattern.isprintable() else repr(pattern)


def _char(code: int) -> str:
    """One character as a Python regex atom, safe inside and outside classes."""
    char = chr(code)
    if char.isascii() and (char.isalnum() or char == "_"):
        return char
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _content(ranges: Ranges) -> str:
    """Ranges as the inside of a Python character class."""
    return "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in ranges)


@dataclass
class _Group:
    """One group of the Java pattern while it is being translated."""

    flags: frozenset[str]  # Java flags in effect at this point of the group
    opener: str | None = None  # the Python flag scope that (?f) opened, reopened after '|'
    open_scopes: int = 0  # Python flag scopes to close at the next '|' or ')'


@dataclass
class _Atom:
    """One element of a character class: a character, class content, or a 1-char regex."""

    char: int | None = None
    content: str | None = None
    expr: str | None = None


@dataclass
class _Operand:
    """One side of a class intersection: the union of its elements."""

    content: list[str] = field(default_factory=list)
    exprs: list[str] = field(default_factory=list)

    def empty(self) -> bool:
        return not self.content and not self.exprs

    def regex(self) -> str:
        parts = ([f"[{''.join(self.content)}]"] if self.content else []) + self.exprs
        return parts[0] if len(parts) == 1 else f"(?:{'|'.join(parts)})"


class _Translator:
    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.pos = 0
        self.out: list[str] = []
        self.groups = [_Group(frozenset())]
        self.captures = 0  # capturing groups opened so far, for Java's back-reference rule

    # --- errors ---

    def invalid(self, what: str) -> PatternError:
        return PatternError(f"invalid regular expression {quoted(self.pattern)}: {what}")

    def unsupported(self, what: str, hint: str) -> PatternError:
        return PatternError(
            f"regular expression {quoted(self.pattern)} uses {what}, which mm2py cannot translate"
            f" from Java; {hint}"
        )

    # --- state ---

    @property
    def flags(self) -> frozenset[str]:
        return self.groups[-1].flags

    def peek(self, offset: int = 0) -> str:
        index = self.pos + offset
        return self.pattern[index] if index < len(self.pattern) else ""

    def at(self, text: str) -> bool:
        return self.pattern.startswith(text, self.pos)

    def skip_space_and_comment(self) -> bool:
        """In (?x) mode, skip one whitespace character or a #-comment; True if skipped."""
        if "x" not in self.flags:
            return False
        if self.peek() in _WHITESPACE and self.peek():
            self.pos += 1
            return True
        if self.peek() == "#":
            end = self.pos
            while end < len(self.pattern) and self.pattern[end] not in self.terminators():
                end += 1
            self.pos = end + 1  # the comment and the line terminator that ends it
            return True
        return False

    def terminators(self) -> str:
        return "\n" if "d" in self.flags else _TERMINATORS

    # --- the pattern ---

    def translate(self) -> str:
        while self.pos < len(self.pattern):
            if not self.skip_space_and_comment():
                self.step()
        if len(self.groups) > 1:
            raise self.invalid("a group is not closed (missing ')')")
        self.out.append(")" * self.groups[0].open_scopes)
        return "".join(self.out)

    def step(self) -> None:
        char = self.peek()
        if char == "\\":
            self.out.append(self.escape())
        elif char == "[":
            self.out.append(self.char_class().regex())
        elif char == "(":
            self.open_group()
        elif char == ")":
            self.close_group()
        elif char == "|":
            group = self.groups[-1]
            self.out.append(")" * group.open_scopes + "|")
            group.open_scopes = 0
            if group.opener:
                self.out.append(group.opener)
                group.open_scopes = 1
            self.pos += 1
        elif char == "{":
            match = _QUANTIFIER.match(self.pattern, self.pos)
            if not match:
                raise self.invalid(
                    f"'{{' at position {self.pos} is not a repetition {{n}}, {{n,}} or {{n,m}}"
                    " (write \\{ for a brace; in a list, a comma starts the next pattern)"
                )
            if match.group(3) and int(match.group(3)) < int(match.group(1)):
                raise self.invalid(f"repetition {match.group(0)} has its bounds out of order")
            self.out.append(match.group(0))
            self.pos = match.end()
        elif char == ".":
            self.out.append(self.dot())
            self.pos += 1
        elif char == "$" and "m" not in self.flags:
            self.out.append(self.end_but_for_terminator())
            self.pos += 1
        else:
            self.out.append(char)
            self.pos += 1

    def dot(self) -> str:
        if "s" in self.flags:
            return r"[\s\S]"
        return f"[^{''.join(_char(ord(c)) for c in self.terminators())}]"

    def end_but_for_terminator(self) -> str:
        """Java's ``\\Z`` (and ``$`` outside (?m)): the end, or before a final terminator."""
        if "d" in self.flags:
            return r"(?=\n?\Z)"
        return r"(?=(?:\r\n|(?<!\r)\n|[\r\x85\u2028\u2029])?\Z)"

    def python_scope(self, flags: frozenset[str]) -> str:
        """A Python flag scope with exactly the effect of Java ``flags`` on what Python
        handles itself: case (i, u/U) and ^/$ in (?m). Others are translated here."""
        on = "".join(f for f in "im" if f in flags)
        off = "".join(f for f in "im" if f not in flags)
        charset = "u" if flags & {"u", "U"} else "a"
        return f"(?{charset}{on}-{off}:" if off else f"(?{charset}{on}:"

    def open_group(self) -> None:
        group = self.groups[-1]
        rest = self.pattern[self.pos :]
        for lead in ("(?<=", "(?<!", "(?=", "(?!", "(?:", "(?>"):
            if rest.startswith(lead):
                self.push(lead, len(lead))
                return
        if rest.startswith("(?<"):
            start = self.pos + 3
            end = self.pattern.find(">", start)
            name = self.pattern[start:end] if end >= 0 else ""
            if not _GROUP_NAME.fullmatch(name):
                raise self.invalid(
                    f"bad group name at position {self.pos}; a name is a letter, then letters"
                    " or digits"
                )
            self.captures += 1
            self.push(f"(?P<{name}>", end + 1 - self.pos)
            return
        if rest.startswith("(?"):
            flags = re.match(r"\(\?([A-Za-z]*)(?:-([A-Za-z]*))?([:)])", rest)
            if not flags:
                raise self.invalid(f"unknown group construct at position {self.pos}")
            on, off = flags.group(1), flags.group(2) or ""
            unknown = sorted(set(on + off) - set(_FLAGS))
            if unknown:
                raise self.invalid(
                    f"unknown inline flag {unknown[0]!r} (Java's are {', '.join(_FLAGS)})"
                )
            new = (group.flags | set(on)) - set(off)
            opener = self.python_scope(new)
            if flags.group(3) == ":":
                self.push(opener, flags.end(), new)
                return
            # (?i) alone: Java applies it to the rest of the enclosing group.
            self.out.append(opener)
            group.flags, group.opener = new, opener
            group.open_scopes += 1
            self.pos += flags.end()
            return
        self.captures += 1
        self.push("(", 1)

    def push(self, text: str, length: int, flags: frozenset[str] | None = None) -> None:
        self.out.append(text)
        self.groups.append(_Group(self.flags if flags is None else flags))
        self.pos += length

    def close_group(self) -> None:
        if len(self.groups) == 1:
            raise self.invalid(f"')' at position {self.pos} closes no group")
        group = self.groups.pop()
        self.out.append(")" * group.open_scopes + ")")
        self.pos += 1

    # --- escapes ---

    def escape(self) -> str:
        """Translate the escape at ``self.pos`` (outside a character class)."""
        letter = self.peek(1)
        if not letter:
            raise self.invalid("it ends with a lone backslash")
        if letter == "Q":
            return "".join(_char(ord(c)) for c in self.quoted())
        if letter == "k":
            match = re.compile(r"\\k<([A-Za-z][A-Za-z0-9]*)>").match(self.pattern, self.pos)
            if not match:
                raise self.invalid(f"\\k at position {self.pos} needs a group name: \\k<name>")
            self.pos = match.end()
            return f"(?P={match.group(1)})"
        if letter in "123456789":
            return self.back_reference()
        simple = {"z": r"\Z", "G": r"\A", "A": r"\A", "B": r"\B"}
        if letter in simple:
            self.pos += 2
            return simple[letter]
        if letter == "Z":
            self.pos += 2
            return self.end_but_for_terminator()
        if letter == "b":
            if self.peek(2) == "{":
                raise self.unsupported("\\b{g} (grapheme boundaries)", "remove it")
            self.pos += 2
            return r"\b"
        if letter == "R":
            self.pos += 2
            return r"(?>\r\n|[\n\x0b\f\r\x85\u2028\u2029])"
        if letter == "X":
            raise self.unsupported("\\X (grapheme clusters)", "match the characters instead")
        atom = self.class_escape(inside_class=False)
        if atom.char is not None:
            return _char(atom.char)
        if atom.content is not None:
            return f"[{atom.content}]"
        assert atom.expr is not None
        return atom.expr

    def quoted(self) -> str:
        """The text of ``\\Q...\\E`` (to the end when there is no ``\\E``), as in Java."""
        end = self.pattern.find("\\E", self.pos + 2)
        text = self.pattern[self.pos + 2 : end if end >= 0 else len(self.pattern)]
        self.pos = end + 2 if end >= 0 else len(self.pattern)
        return text

    def back_reference(self) -> str:
        """``\\12``: Java takes the longest number of a group opened so far (at least one digit)."""
        digits = re.compile(r"\d+").match(self.pattern, self.pos + 1)
        assert digits is not None
        number = digits.group(0)
        while len(number) > 1 and int(number) > self.captures:
            number = number[:-1]
        self.pos += 1 + len(number)
        return f"(?:\\{number})"

    def class_escape(self, *, inside_class: bool) -> _Atom:
        """An escape that stands for one character or a set of characters."""
        letter = self.peek(1)
        self.pos += 2
        if letter in "dws" or letter in "DWS":
            ranges = _ASCII_CLASSES[letter.lower()]
            if "u" in self.flags and "U" not in self.flags:
                # Python's (?u) makes \w Unicode; Java's (?u) changes only case folding.
                return _Atom(content=_content(ranges)) if letter.islower() else _negated(ranges)
            return _Atom(content=f"\\{letter}")
        if letter in "hH":
            return _Atom(content=_content(_HORIZONTAL)) if letter == "h" else _negated(_HORIZONTAL)
        if letter in "vV":
            return _Atom(content=_content(_VERTICAL)) if letter == "v" else _negated(_VERTICAL)
        if letter in "pP":
            ranges = self.property_class()
            return _Atom(content=_content(ranges)) if letter == "p" else _negated(ranges)
        simple = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "a": 0x07, "e": 0x1B}
        if letter in simple:
            return _Atom(char=simple[letter])
        if letter == "c":
            control = self.peek()
            if not control:
                raise self.invalid("\\c at the end needs a character")
            self.pos += 1
            return _Atom(char=ord(control) ^ 0x40)
        if letter == "0":
            return _Atom(char=self.octal())
        if letter == "x":
            return _Atom(char=self.hex_escape())
        if letter == "u":
            return _Atom(char=self.fixed_hex(4, "\\u"))
        if letter == "N":
            return _Atom(char=self.named_char())
        if letter == "Q" and inside_class:
            self.pos -= 2
            text = self.quoted()
            return _Atom(content="".join(_char(ord(c)) for c in text))
        if letter.isascii() and letter.isalnum():
            where = " inside a character class" if inside_class else ""
            raise self.invalid(f"\\{letter}{where} is not an escape Java knows")
        return _Atom(char=ord(letter))  # \. \- \\ and other punctuation: the character

    def property_class(self) -> Ranges:
        if self.peek() != "{":
            name = self.peek()
            raise self.unsupported(
                f"the Unicode property \\p{name}", "spell the characters out, e.g. [a-zA-Z]"
            )
        end = self.pattern.find("}", self.pos)
        if end < 0:
            raise self.invalid("\\p{ is not closed with }")
        name = self.pattern[self.pos + 1 : end]
        self.pos = end + 1
        posix = _POSIX.get(name)
        if posix is None or "U" in self.flags:
            raise self.unsupported(
                f"the Unicode property \\p{{{name}}}",
                "use a POSIX class (\\p{Alpha}, \\p{Lower}, \\p{Digit}, ...) or spell the"
                " characters out",
            )
        return posix

    def octal(self) -> int:
        digits = re.compile(r"[0-3][0-7]{0,2}|[4-7][0-7]?").match(self.pattern, self.pos)
        if not digits:
            raise self.invalid("\\0 needs octal digits (\\0n, \\0nn or \\0mnn)")
        self.pos = digits.end()
        return int(digits.group(0), 8)

    def hex_escape(self) -> int:
        if self.peek() != "{":
            return self.fixed_hex(2, "\\x")
        match = re.compile(r"\{([0-9A-Fa-f]+)\}").match(self.pattern, self.pos)
        if not match or int(match.group(1), 16) > 0x10FFFF:
            raise self.invalid("\\x{...} needs a hexadecimal code point up to 10FFFF")
        self.pos = match.end()
        return int(match.group(1), 16)

    def fixed_hex(self, count: int, name: str) -> int:
        digits = self.pattern[self.pos : self.pos + count]
        if not re.fullmatch(f"[0-9A-Fa-f]{{{count}}}", digits):
            raise self.invalid(f"{name} needs {count} hexadecimal digits")
        self.pos += count
        return int(digits, 16)

    def named_char(self) -> int:
        end = self.pattern.find("}", self.pos)
        if self.peek() != "{" or end < 0:
            raise self.invalid("\\N needs a character name: \\N{NAME}")
        name = self.pattern[self.pos + 1 : end]
        try:
            char = unicodedata.lookup(name)
        except KeyError:
            raise self.invalid(f"unknown character name {name!r}") from None
        self.pos = end + 1
        return ord(char)

    # --- character classes ---

    def char_class(self) -> _Class:
        """Parse ``[...]`` at ``self.pos``: union, intersection and negation as Java has them."""
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        self.pos += negated
        operands = [_Operand()]
        first = True
        while True:
            if self.pos >= len(self.pattern):
                raise self.invalid(f"the character class at position {start} is not closed")
            if self.skip_space_and_comment():
                continue
            char = self.peek()
            if char == "]" and not first:
                self.pos += 1
                break
            first = False
            if char == "[":
                nested = self.char_class()
                if nested.content is not None:
                    operands[-1].content.append(nested.content)
                else:
                    operands[-1].exprs.append(nested.regex())
                continue
            if self.at("&&"):
                self.pos += 2
                operands.append(_Operand())
                continue
            self.class_element(operands[-1])
        # Java ignores an empty side: [a&&] is [a].
        sides = [side for side in operands if not side.empty()]
        if not sides:
            raise self.invalid(f"the character class at position {start} is empty")
        if len(sides) == 1 and not sides[0].exprs:
            content = "".join(sides[0].content)
            return _Class(content=None, expr=f"[^{content}]") if negated else _Class(content)
        *ahead, last = [side.regex() for side in sides]
        positive = "".join(f"(?={regex})" for regex in ahead) + last
        if len(sides) > 1:
            positive = f"(?:{positive})"
        # Java negates the whole union or intersection: [^a[b]] is neither a nor b.
        return _Class(None, rf"(?:(?!{positive})[\s\S])" if negated else positive)

    def class_element(self, side: _Operand) -> None:
        """One character, range or set inside a class, added to ``side``."""
        atom = self.class_atom()
        if atom.char is not None and self.peek() == "-" and self.peek(1) not in ("]", "[", ""):
            start = self.pos
            self.pos += 1
            high = self.class_atom()
            if high.char is None:
                raise self.invalid(f"the range at position {start} does not end in a character")
            if high.char < atom.char:
                raise self.invalid(f"the range at position {start} is out of order")
            side.content.append(f"{_char(atom.char)}-{_char(high.char)}")
        elif atom.char is not None:
            side.content.append(_char(atom.char))
        elif atom.content is not None:
            side.content.append(atom.content)
        else:
            assert atom.expr is not None
            side.exprs.append(atom.expr)

    def class_atom(self) -> _Atom:
        if self.peek() == "\\":
            if not self.peek(1):
                raise self.invalid("it ends with a lone backslash")
            return self.class_escape(inside_class=True)
        char = self.peek()
        self.pos += 1
        return _Atom(char=ord(char))


@dataclass
class _Class:
    """A translated character class: its content (when it can join another class) and regex."""

    content: str | None
    expr: str | None = None

    def regex(self) -> str:
        if self.expr is not None:
            return self.expr
        return f"[{self.content}]"


def _negated(ranges: Ranges) -> _Atom:
    return _Atom(expr=f"[^{_content(ranges)}]")
