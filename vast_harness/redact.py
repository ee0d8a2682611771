"""A secret's value found and masked as `***`: in text, a line of a host's output, bytes and a file.

A secret is masked whatever its length or content: every occurrence of the value, and of each line of a
multi-line value (step output arrives line by line), becomes `***`, and so does each as JSON writes it (a
quote, a backslash or a non-ASCII letter escaped: `p\u00e4ss\"`), since the host's evidence is JSON, as
Python's `repr` and `unicode_escape` show it (`print(os.environ)`), and as HTML escapes it (a report). Longest
first, so a secret that contains another is masked whole. The same forms are what `found` looks for in a
file that is kept byte for byte (an artifact). Standard library only.
"""

from __future__ import annotations

import html
import json
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

MASK = "***"
# what a terminal does not show: CSI sequences (colour, erase line, cursor moves) and a lone ESC pair
_STYLE_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]")
_CHUNK_BYTES = 4 * 1024 * 1024
_NORMAL_FORMS: tuple[Literal["NFC", "NFD", "NFKC", "NFKD"], ...] = ("NFC", "NFD", "NFKC", "NFKD")
_OVERSTRIKE = re.compile(r"[^\b]\x08")  # a character struck over by a backspace: the next one is what shows
# Unicode's format characters (category Cf: zero-width space, soft hyphen, word joiner, bidi marks, tags), which
# draw nothing; listed rather than looked up per character (tests/harness/test_masking.py checks the list)
_FORMAT_CHARS = re.compile("[\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f"
                           "\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd"
                           "\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001"
                           "\U000e0020-\U000e007f]")


def written_forms(value: str) -> set[str]:
    """`value` and each of its lines, in each Unicode normal form (a program may print `ü` decomposed), each as
    it is written raw, by json.dumps (ASCII or not), by `repr`, by `unicode_escape` and by HTML escaping."""
    forms: set[str] = set()
    for line in [value, *(p for p in value.splitlines() if p.strip())]:
        for part in {unicodedata.normalize(nf, line) for nf in _NORMAL_FORMS} | {line}:
            forms |= {part, json.dumps(part)[1:-1], json.dumps(part, ensure_ascii=False)[1:-1], repr(part)[1:-1],
                      part.encode("unicode_escape").decode("ascii"), html.escape(part),
                      html.escape(part, quote=False)}
    return forms


class Redactor:
    """The values to mask (`values`, in order: `found` answers with their positions)."""

    def __init__(self, values: Iterable[str]) -> None:
        owner: dict[str, int] = {}
        for i, value in enumerate(values):
            if value:
                for form in written_forms(value):
                    owner.setdefault(form, i)
        self._text = sorted(owner, key=len, reverse=True)
        self._owner = [owner[n] for n in self._text]
        self._bytes = [n.encode("utf-8") for n in self._text]
        self._overlap = max((len(b) for b in self._bytes), default=1) - 1

    def __bool__(self) -> bool:
        return bool(self._text)

    def text(self, text: str) -> str:
        for needle in self._text:
            if needle in text:
                text = text.replace(needle, MASK)
        return text

    def line(self, line: str) -> str:
        """One line of a host's output, masked as stored and as shown: a value split by colour codes
        (`Zq9\\e[0mTop`) or drawn over itself with carriage returns (`xxxTop\\rZq9`) is whole only on a
        screen or after escapes are dropped. Such a line is kept as that view, masked; others byte for byte."""
        masked = self.text(line)
        if not self._text or (masked.isascii() and "\x1b" not in masked and "\r" not in masked
                              and "\b" not in masked):
            return masked
        view = _as_read(_as_drawn(_STYLE_CODES.sub("", masked)))
        shown = self.text(view)
        return shown if shown != view else masked

    def data(self, data: bytes) -> bytes:
        for needle in self._bytes:
            if needle in data:
                data = data.replace(needle, MASK.encode())
        return data

    def _chunks(self, path: Path) -> Iterator[bytes]:
        """The file in overlapping chunks (a large file is never read whole): each chunk starts with the last
        `overlap` bytes of the one before, so a value cut by a chunk boundary is whole in one of them."""
        with path.open("rb") as src:
            carry = b""
            while chunk := src.read(_CHUNK_BYTES):
                yield carry + chunk
                carry = (carry + chunk)[-self._overlap:] if self._overlap else b""

    def found(self, path: Path) -> set[int]:
        """The positions (in `values`) of every value the file holds in any of its written forms; the file is
        only read."""
        hits: set[int] = set()
        if not self._bytes:
            return hits
        for chunk in self._chunks(path):
            hits.update(self._owner[i] for i, needle in enumerate(self._bytes) if needle in chunk)
        return hits

    def file(self, path: Path) -> bool:
        """Mask secrets in a file in place, chunked (a large file is never read whole); True if it changed.
        The masked copy is written beside it and replaces it: the original is never left half-masked. The
        last `overlap` bytes of each round wait for the next one: a value cut by a chunk boundary is found."""
        if not self._bytes:
            return False
        tmp = path.with_name(path.name + ".redact")
        changed = False
        try:
            with path.open("rb") as src, tmp.open("wb") as dst:
                carry = b""
                while True:
                    chunk = src.read(_CHUNK_BYTES)
                    buf = carry + chunk
                    out = self.data(buf)
                    changed |= out != buf
                    if not chunk:
                        dst.write(out)
                        break
                    keep = min(self._overlap, len(out))
                    dst.write(out[: len(out) - keep])
                    carry = out[len(out) - keep:]
            if changed:
                os.replace(tmp, path)
            return changed
        finally:
            tmp.unlink(missing_ok=True)


def _as_read(line: str) -> str:
    """A line as a person reads it: a backspace overstrike (`s\\bs`, a pager's bold) as the one letter, the
    characters that draw nothing (zero-width space, soft hyphen, word joiner: Unicode's format category)
    dropped, compatibility forms (fullwidth `ｈｆ`) as their plain letters."""
    if "\b" in line:
        line = _OVERSTRIKE.sub("", line)
    if not line.isascii():
        line = unicodedata.normalize("NFKC", _FORMAT_CHARS.sub("", line))
    return line


def _as_drawn(line: str) -> str:
    """A line as a terminal leaves it: each carriage return goes back to column 0 and overwrites."""
    if "\r" not in line:
        return line
    cells: list[str] = []
    for segment in line.split("\r"):
        cells[: len(segment)] = list(segment)
    return "".join(cells)
