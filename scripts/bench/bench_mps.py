#!/usr/bin/env python3
"""MPS on/off benchmark on one GPU: see remote/mps/bench.py for what it measures and prints."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from remote.mps.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
