#!/usr/bin/env python3
"""Entry point: `python scripts/vast_e2e.py --profile mfu ...` (also installed as `vast-e2e`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vast_harness.cli import main  # noqa: E402 - after the path: the checkout's package, not an installed one

if __name__ == "__main__":
    main()
