"""What the terminal may be shown: the one sanitiser for everything a host, the API or a user supplied.

`terminal_safe` shows every control character escaped (ESC, 8-bit CSI, BEL, CR, newline, DEL, bidi
overrides, and what renders as nothing), so a step's output cannot write the clipboard (OSC 52), retitle the
window, move the cursor up and forge a result line, or clear the screen. `safe_text` and `line` make rich
`Text` that is never parsed as markup. Step logs keep the bytes as sent; only what is shown is escaped. A key or
a secret is masked first (masking.py), before escaping could change its form and before rich could wrap it
across two lines.
"""

from __future__ import annotations

import re

from rich.text import Text

from vast_harness.masking import mask

# C0 but TAB, DEL, C1 (0x9b is an 8-bit CSI; 0x85 a newline to some readers), the line and paragraph separators
# (U+2028/9: newlines to some terminals and pagers), and every format character of Unicode 15 (category Cf:
# bidi controls that reorder what a line appears to say, zero-width and invisible characters, the soft hyphen,
# tag characters), plus what renders as nothing though it is not Cf: the combining grapheme joiner, the Hangul
# fillers, variation selectors and noncharacters. What a host prints may only show what it contains.
_UNSAFE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\xad\u034f\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891"
                     "\u08e2\u115f\u1160\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f"
                     "\u3164\ufdd0-\ufdef\ufe00-\ufe0f\ufeff\uffa0\ufff9-\ufffb\ufffe\uffff"
                     "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
                     "\U000e0001\U000e0020-\U000e007f\U000e0100-\U000e01ef]")


def _escaped(found: re.Match[str]) -> str:
    code = ord(found.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: str) -> str:
    """The one sanitiser for the console: keys and secrets masked, control characters shown escaped (`\\x1b`),
    everything else as is."""
    return _UNSAFE.sub(_escaped, mask(text))


def safe_text(value: object, style: str = "") -> Text:
    """Anything user-, host- or server-supplied becomes a Text: control characters escaped, never parsed as
    markup (`[/x]`), never an emoji code."""
    return Text(terminal_safe(str(value)), style=style)


def safe_cells(*values: object) -> list[Text]:
    """A table row: every value a `safe_text` (a Text already made from literals or by safe_text is kept)."""
    return [v if isinstance(v, Text) else safe_text(v) for v in values]


def line(*parts: str | tuple[str, str] | Text) -> Text:
    """Styled literals as (text, style) tuples, values as plain strings: nothing inside is markup, and every
    string part goes through `terminal_safe` (a Text part was made by `safe_text` or from literals)."""
    return Text.assemble(*(terminal_safe(p) if isinstance(p, str) else
                           (terminal_safe(p[0]), p[1]) if isinstance(p, tuple) else p for p in parts))
