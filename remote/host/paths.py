"""Where the workload's data is: `profiles/` always sits beside the `remote/` package.

That holds in all three places the workload lives: a checkout, the bundle unpacked on the rented host, and
the copy packaged in the harness wheel (`vast_harness/_data/`). Standard library only, like all of remote/.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the directory holding remote/, profiles/ and scripts/
REMOTE_DIR = ROOT / "remote"
PROFILES_DIR = ROOT / "profiles"
MODEL_PROFILES_DIR = PROFILES_DIR / "models"
HARNESS_PROFILES_DIR = PROFILES_DIR / "harness"
