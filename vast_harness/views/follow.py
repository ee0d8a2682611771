"""`vast-e2e logs -f [RUN]`: follow a run that is still going, from another terminal, until it ends.

The run appends each step's output to `steps/<name>.log` as it arrives (evidence/run.py); this prints what
lands there, whole lines only, escaped and shown as a terminal would (`logs.shown_text`), each log under its
step's header. It ends on the run's own signals, never on a timer:

- its record (`harness-result.json`), written once its teardown is over: the run ended;
- else its owner is gone: the registration (state/registry.py) no longer locked and its process
  (state/process.py) not running, or no registration at all and no process of its ledger lines still
  running: a run killed with -9 ends the follow with a line that says so (and that `reap` cleans up).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from vast_harness.console.output import Output
from vast_harness.console.terminal import terminal_safe
from vast_harness.errors import ConfigError
from vast_harness.evidence.host_data import read_json
from vast_harness.state.ledger import LEDGER_FILE, Ledger
from vast_harness.state.registry import RunRegistry
from vast_harness.state.runs import RESULT_NAME
from vast_harness.views.logs import shown_text, step_logs

FOLLOW_POLL_S = 0.5  # how often new bytes and the run's end are looked for


def run_end(run_dir: Path, state_dirs: list[Path]) -> str | None:
    """Why the run in `run_dir` is over, or None while it runs. `state_dirs`: where its registration and its
    ledger lines may be (the user's state dir and its --sim part)."""
    run_id = run_dir.name
    if (run_dir / RESULT_NAME).is_file():
        doc, _ = read_json(run_dir / RESULT_NAME)
        code = doc.get("exit_code") if isinstance(doc, dict) else None
        return f"run {run_id} ended" + (f" with exit {code}" if isinstance(code, int) else "")
    for state in state_dirs:
        run = RunRegistry(state).scan().get(run_id)
        if run is None:
            continue
        if run.liveness != "dead":  # live here, or on another machine (whose lock cannot be seen from here)
            return None
        return (f"run {run_id} stopped without its record: its process is gone (killed?); `vast-e2e reap` "
                "deletes and proves absent what it may have left")
    for state in state_dirs:
        for entry in Ledger(state / LEDGER_FILE).entries():
            if entry.run_id == run_id and entry.process is not None and entry.process.running() is not False:
                return None  # registration lost, process still there (registry.py: liveness by the process too)
    return (f"run {run_id} is not running and left no record (no registration and no live process); "
            "`vast-e2e reap` deletes and proves absent what it may have left")


def follow_logs(out: Output, run_dir: Path, state_dirs: list[Path], *, raw: bool = False,
                poll_s: float = FOLLOW_POLL_S, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print every step log of the run as it grows until the run ends (`run_end`); 0 then, whatever the
    run's own exit (the follow did its job; `status` or the record says how the run went)."""
    if out.json_mode:
        raise ConfigError("logs --follow prints lines as they come: it takes no --json (use `logs RUN --json` "
                          "once the run ended)")
    offsets: dict[Path, int] = {}
    partial: dict[Path, bytes] = {}
    current: list[Path | None] = [None]

    def show(path: Path, data: bytes) -> None:
        if current[0] != path:
            out.stdout.write(f"==> step {terminal_safe(path.stem)} <==\n")
            current[0] = path
        out.stdout.write(shown_text(data, raw=raw))
        out.stdout.flush()

    def drain(*, final: bool) -> None:
        for path in step_logs(run_dir):
            try:
                with path.open("rb") as fh:
                    fh.seek(offsets.get(path, 0))
                    new = fh.read()
            except OSError:
                continue
            offsets[path] = offsets.get(path, 0) + len(new)
            data = partial.pop(path, b"") + new
            whole, sep, rest = data.rpartition(b"\n")
            if rest and not final:
                partial[path] = rest  # half a line: wait for its end (or the run's)
                data = whole + sep
            if data:
                show(path, data if data.endswith(b"\n") else data + b"\n")

    while True:
        ended = run_end(run_dir, state_dirs)  # asked before the last read: nothing written before it is missed
        drain(final=ended is not None)
        if ended is not None:
            out.info(ended)
            return 0
        sleep(poll_s)
