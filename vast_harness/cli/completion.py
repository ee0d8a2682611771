"""What shell completion (`--install-completion`) offers beyond flag names: the shipped profiles and the profile
files here, the runs `logs` and `report` can read, and `--rank-by`'s values. Each is cheap and reads files
only; a completion that fails offers nothing rather than an error in the user's shell."""

from __future__ import annotations

import os
from pathlib import Path

RANK_BY_VALUES = ("dph", "usd-per-mtok")


def complete_profile(incomplete: str) -> list[str]:
    """The shipped profile names, then `*.toml` files under the directory being typed."""
    from vast_harness.spec.profile import PROFILE_NAMES

    names = [n for n in PROFILE_NAMES if n.startswith(incomplete)]
    folder, _, stem = incomplete.rpartition("/")
    try:
        base = Path(folder or ".")
        names += sorted(str(p) if folder else p.name for p in base.glob(f"{stem}*.toml") if p.is_file())
    except OSError:
        pass
    return names


def complete_run(incomplete: str) -> list[str]:
    """The run ids in the evidence directory (the config file's evidence_dir, else the state directory), newest
    first."""
    try:
        from vast_harness.spec.user import UserConfig
        from vast_harness.state.runs import default_evidence_dir, run_dirs

        user, _ = UserConfig.load(os.environ)
        where = Path(user.evidence_dir).expanduser() if user.evidence_dir else default_evidence_dir()
        return [p.name for p in reversed(run_dirs(where)) if p.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - a completion must never print a traceback into the shell
        return []


def complete_rank_by(incomplete: str) -> list[str]:
    return [v for v in RANK_BY_VALUES if v.startswith(incomplete)]
