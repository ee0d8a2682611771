#!/usr/bin/env python3
"""Entry point: `python scripts/vast_e2e.py --profile mfu ...` (also installed as `vast-e2e`)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:
    from vast_harness.cli import main
except ModuleNotFoundError as exc:  # a Python without the project's dependencies (typer, pydantic, httpx...)
    sys.stderr.write(f"error: {exc}: run this with the project's environment: `uv run python "
                     "scripts/vast_e2e.py ...` or `uv run vast-e2e ...` (uv installs everything from uv.lock)\n")
    sys.exit(2)

if __name__ == "__main__":
    main()
