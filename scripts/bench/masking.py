#!/usr/bin/env python3
"""What masking costs a host's output: `python scripts/bench/masking.py [--lines N]`.

Times `Redactor.line` (what every line a host prints goes through) over N random 100-character ASCII lines and
N/5 lines with one non-ASCII letter (these also get the "as a person reads it" view: redact.py), with two
secrets known, one of them non-ASCII. Prints seconds and microseconds per line.
"""

from __future__ import annotations

import argparse
import random
import string
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from vast_harness.redact import Redactor  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=100_000)
    n = ap.parse_args().lines
    redactor = Redactor(["hf_Zürich9xKq2Lm7Pw", "Tk9xQ2mW7pLz"])
    rng = random.Random(1)
    ascii_lines = ["".join(rng.choices(string.ascii_letters + " ", k=100)) for _ in range(n)]
    mixed = [line[:50] + "é" + line[50:] for line in ascii_lines[: max(1, n // 5)]]
    print(f"{'lines':<22}{'count':>8}{'seconds':>10}{'us/line':>9}")
    for name, lines in (("ASCII", ascii_lines), ("one non-ASCII letter", mixed)):
        start = time.perf_counter()
        for line in lines:
            redactor.line(line)
        took = time.perf_counter() - start
        print(f"{name:<22}{len(lines):>8}{took:>10.3f}{took / len(lines) * 1e6:>9.2f}")


if __name__ == "__main__":
    main()
