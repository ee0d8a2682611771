"""Every test gets its own harness state directory (ledger, live-run registrations): nothing a test does
reaches the real `~/.local/state/vast-harness`, in this process or in the CLI subprocesses it starts."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _harness_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "vh-state"
    monkeypatch.setenv("VAST_HARNESS_HOME", str(state))
    # resolve(environ={...}) reads no environment: point its default at the same directory
    monkeypatch.setattr("vast_harness.spec.resolve.user_state_dir", lambda environ=None: state)
    return state
