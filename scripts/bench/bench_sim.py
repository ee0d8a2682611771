"""Benchmark the simulator: start-up, search latency over 5,000 offers, SSH round trip (< 30 s)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root

from vast_harness.sim.bench import main  # noqa: E402 - after the path: the checkout's package

if __name__ == "__main__":
    main()
