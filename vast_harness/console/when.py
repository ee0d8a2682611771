"""A moment as the harness prints it in a sentence: UTC to the second, as the dead-man line says it."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def utc(epoch_s: float) -> str:
    """`2027-01-15T08:00:00Z`; a value no date can be (not finite, out of range) is shown as it is."""
    if not math.isfinite(epoch_s):
        return str(epoch_s)
    try:
        return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return f"{epoch_s:.0f}"
