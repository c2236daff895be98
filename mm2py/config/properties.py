"""A reader for Java ``.properties`` files, as ``java.util.Properties.load`` reads them."""

from __future__ import annotations

import re
from pathlib import Path

from mm2py.config.errors import ConfigError

_WHITESPACE = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def decode(data: bytes) -> str:
    """Decode a properties file: UTF-8 if it is valid UTF-8, else ISO-8859-1 (Java's charset)."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("latin-1")


def parse_properties(text: str, path: Path) -> list[tuple[str, str, int]]:
    """Parse properties text into (key, value, line number) in file order.

    Java's rules: ``#``/``!`` comments, ``key=value``, ``key: value`` or ``key value``,
    a trailing odd backslash continues the line, ``\\t \\n \\r \\f \\uXXXX`` escapes.
    Values are trimmed (MM2's ConfigDef trims every value). Stricter than Java in two
    places, both likely truncation or typos: a continuation at end of file and an
    empty key are errors.
    """
    lines = re.split(r"\r\n|\r|\n", text)
    entries: list[tuple[str, str, int]] = []
    i = 0
    while i < len(lines):
        number = i + 1
        logical = lines[i].lstrip(_WHITESPACE)
        i += 1
        if not logical or logical[0] in "#!":
            continue
        while _continues(logical):
            if i >= len(lines):
                raise ConfigError(
                    path,
                    f"line {number}",
                    "the file ends inside a line continued with a trailing backslash;"
                    " remove the backslash or complete the line",
                )
            logical = logical[:-1] + lines[i].lstrip(_WHITESPACE)
            i += 1
        raw_key, raw_value = _split(logical)
        key = _unescape(raw_key, path, number)
        if not key:
            raise ConfigError(path, f"line {number}", "missing key before the separator")
        entries.append((key, _unescape(raw_value, path, number).strip(), number))
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split(line: str) -> tuple[str, str]:
    """Split a logical line at the first unescaped ``=``, ``:`` or whitespace."""
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            i += 2
            continue
        if char in "=:" or char in _WHITESPACE:
            break
        i += 1
    key_end = i
    while i < len(line) and line[i] in _WHITESPACE:
        i += 1
    if i < len(line) and line[i] in "=:":
        i += 1
    return line[:key_end], line[i:].lstrip(_WHITESPACE)


def _unescape(text: str, path: Path, number: int) -> str:
    if "\\" not in text:
        return text
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char != "\\" or i + 1 >= len(text):
            out.append(char)
            i += 1
            continue
        escaped = text[i + 1]
        if escaped == "u":
            digits = text[i + 2 : i + 6]
            if not re.fullmatch(r"[0-9a-fA-F]{4}", digits):
                # Never echo the text: it may be a password.
                raise ConfigError(
                    path, f"line {number}", "malformed \\uXXXX escape; it needs four hex digits"
                )
            out.append(chr(int(digits, 16)))
            i += 6
        else:
            out.append(_ESCAPES.get(escaped, escaped))
            i += 2
    return "".join(out)
