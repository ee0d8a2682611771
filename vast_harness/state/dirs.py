"""Where a user's harness state lives: one directory per user, whatever the current directory.

    $VAST_HARNESS_HOME                        when set
    $XDG_STATE_HOME/vast-harness/             else, when absolute (XDG Base Directory, on every platform)
    the platform's user state directory       else (platformdirs): ~/.local/state/vast-harness/ on Linux,
                                              ~/Library/Application Support/vast-harness/ on macOS

It holds the write-ahead ledger (`ledger.jsonl`, every run's create intents and outcomes, so `reap` from any
directory finds what a killed run may have rented), the live-run registrations (`live/`, registry.py) and, by
default, the runs' evidence (`<run_id>/`). `--evidence-dir` moves the evidence, never the ledger. Ledgers of
older versions (`./.evidence/vast/ledger.jsonl`, or one in an `--evidence-dir`) are still read by `reap`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import platformdirs

STATE_ENV = "VAST_HARNESS_HOME"
APP_DIR = "vast-harness"
LEGACY_EVIDENCE_DIR = Path(".evidence") / "vast"  # the default before the state directory
SIM_SUBDIR = "sim"  # --sim runs' own state (ledger, registrations, evidence) inside the state directory


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The two variables on top are read from `environ` (default: the process environment; tests pass their
    own); the platform's place comes from platformdirs, which reads the process environment itself."""
    env = os.environ if environ is None else environ
    home = env.get(STATE_ENV, "").strip()
    if home:
        return Path(home).expanduser()
    xdg = env.get("XDG_STATE_HOME", "").strip()
    if xdg and Path(xdg).is_absolute():  # the spec says a relative value is invalid and must be ignored
        return Path(xdg) / APP_DIR
    return platformdirs.user_state_path(APP_DIR, appauthor=False)


def legacy_ledgers(state: Path, *, evidence_dir: Path | None, cwd: Path | None = None) -> list[Path]:
    """Ledgers other than the state directory's that `reap` still reads: `./.evidence/vast/ledger.jsonl`
    (the old default) and the `--evidence-dir`'s, when they exist and are not the state directory's."""
    from vast_harness.state.ledger import LEDGER_FILE

    cwd = Path.cwd() if cwd is None else cwd
    own = _real(state / LEDGER_FILE)
    found: list[Path] = []
    for candidate in (cwd / LEGACY_EVIDENCE_DIR / LEDGER_FILE, (evidence_dir or state) / LEDGER_FILE):
        if candidate.is_file() and _real(candidate) != own and _real(candidate) not in {_real(p) for p in found}:
            found.append(candidate)
    return found


def _real(path: Path) -> Path:
    try:
        return path.resolve()
    except OSError:
        return path.absolute()
