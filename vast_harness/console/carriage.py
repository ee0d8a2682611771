"""A line a step redraws with carriage returns (a progress bar: tqdm, HF Trainer, Lightning), as the console
shows it: its latest segment, the text after the last `\\r`, as a terminal would leave it.

Step output is read in lines up to `\\n`; a progress bar only ends its line when it finishes, so without this
it showed nothing for the whole step and then one line of `\\x0d…\\x1b[32m` escapes. `shown_segment` is what
a line (finished or still being drawn) shows; `CarriageLine` hands the console the latest segment of the line
being drawn, at most once per `min_interval_s` (a bar redraws ~10 times a second). Colour (SGR) and
erase-in-line codes are dropped, being what bars print to look right; anything else the host sent (cursor
moves, OSC, bare ESC) is left for `terminal_safe` to show escaped, which every printed line goes through.
The step log keeps the bytes as sent: only what is shown is changed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from vast_harness.clock import now_s

LIVE_PROGRESS_EVERY_S = 0.25  # in the live region: its refresh rate
PROGRESS_LINE_EVERY_S = 10.0  # printed as a line (a pipe, a CI log): a bar at 10 draws a second is 1 line in 100

# CSI ... m (colour, bold) and CSI ... K (erase in line): dropped whole, parameters and all. Anything else is
# shown escaped later, and a sequence left half-formed by this (an ESC from `\x1b\x1b[31m`) is escaped too.
_STYLE_CODES = re.compile(r"\x1b\[[0-9;:]*[mK]")


def without_style_codes(text: str) -> str:
    return _STYLE_CODES.sub("", text)


def shown_segment(line: str) -> str:
    """What a terminal leaves on screen of `line`: its last segment after a `\\r` that shows anything
    (a bar that ends with `\\r` keeps its last drawing), colour and erase codes dropped."""
    if "\r" not in line:
        return without_style_codes(line)
    for segment in reversed(line.split("\r")):
        visible = without_style_codes(segment)
        if visible.strip():
            return visible
    return ""


class CarriageLine:
    """One stream's line being drawn: `update(pending)` with the unfinished line after each read returns the
    latest segment a `\\r` has ended, to show now, or None (none yet, nothing new, or the last one was shown
    too recently);
    `line_ended()` when the line is finished (it is shown whole, as a line, by the caller)."""

    def __init__(self, *, min_interval_s: float, clock: Callable[[], float] = now_s) -> None:
        self.min_interval_s, self._clock = min_interval_s, clock
        self._shown_at = -math.inf
        self._shown = ""

    def update(self, pending: str) -> str | None:
        now = self._clock()
        if now - self._shown_at < self.min_interval_s:
            return None
        # Only drawings a later `\r` ended: the one being written may stop inside a secret the redactor, which
        # sees whole strings, would not recognise yet (a bar redrawn with a leading `\r` shows one draw late).
        segment = shown_segment(pending[: max(0, pending.rfind("\r"))])
        if not segment or segment == self._shown:
            return None
        self._shown_at, self._shown = now, segment
        return segment

    def line_ended(self) -> None:
        self._shown = ""
