"""Dollars as the harness prints them in a sentence: whole cents with two decimals, anything finer with four
(as the accrued figures are printed everywhere), so that a comparison never reads "$0.01 > $0.01"
(0.0128 against a 0.01 cap) nor a sub-cent cap "$0.00"."""

from __future__ import annotations

import math


def usd(value: float) -> str:
    """`$3.00`, `$0.05`, `$0.0128`, `$0.0010`; a value that is not a finite number is shown as it is, and one
    no account holds (an API's figure gone wrong, -$1.6e+304) in three significant digits, not 300."""
    if not math.isfinite(value):
        return f"${value}"
    if abs(value) >= 1e12:
        return f"${value:.3g}"
    cents = value * 100
    return f"${value:.2f}" if abs(cents - round(cents)) < 1e-6 else f"${value:.4f}"


def per_hour(dph_usd: float) -> str:
    """An hourly price as messages say it: `$0.3080/h`; one no host charges (a corrupt row's $1e306/h) in three
    significant digits, not 300."""
    return f"${dph_usd:.4f}/h" if abs(dph_usd) < 1e9 else f"${dph_usd:.3g}/h"
