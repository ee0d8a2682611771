"""Secrets masked everywhere the harness writes: console, step logs, pulled evidence,
reports, JSON. Settings (`--remote-env`) are not secrets and are shown and stored as given.

A secret is masked whatever its length or content: every occurrence of the value, and of each line of a
multi-line value (step output arrives line by line), becomes `***`, and so does each as JSON writes it (a
quote, a backslash or a non-ASCII letter escaped: `p\u00e4ss\"`), since the host's evidence is JSON, and as
Python's `repr` and `unicode_escape` show it (`print(os.environ)`). Longest
first, so a secret that contains another is masked whole. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

MASK = "***"
# what a terminal does not show: CSI sequences (colour, erase line, cursor moves) and a lone ESC pair
_STYLE_CODES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]")
_CHUNK_BYTES = 4 * 1024 * 1024


class Redactor:
    def __init__(self, values: Iterable[str]) -> None:
        needles: set[str] = set()
        for value in values:
            if value:
                for part in [value, *(p for p in value.splitlines() if p.strip())]:
                    needles.add(part)
                    needles.add(json.dumps(part)[1:-1])  # as json.dumps writes it into a file: \u00e4, \"
                    needles.add(json.dumps(part, ensure_ascii=False)[1:-1])
                    needles.add(repr(part)[1:-1])  # as print(os.environ) or print(a_dict) shows it
                    needles.add(part.encode("unicode_escape").decode("ascii"))
        self._text = sorted(needles, key=len, reverse=True)
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
        if not self._text or ("\x1b" not in masked and "\r" not in masked):
            return masked
        view = _as_drawn(_STYLE_CODES.sub("", masked))
        shown = self.text(view)
        return shown if shown != view else masked

    def data(self, data: bytes) -> bytes:
        for needle in self._bytes:
            if needle in data:
                data = data.replace(needle, MASK.encode())
        return data

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


def _as_drawn(line: str) -> str:
    """A line as a terminal leaves it: each carriage return goes back to column 0 and overwrites."""
    if "\r" not in line:
        return line
    cells: list[str] = []
    for segment in line.split("\r"):
        cells[: len(segment)] = list(segment)
    return "".join(cells)
