"""`vast-e2e keep NAME`: push a kept host's idle deadline from now (never its cap's), and `vast-e2e down NAME`:
delete it with the proof of absence; each a run on the held instance (`run/hold.KeepStages`, `DownStages`)."""

from __future__ import annotations

import functools
from collections.abc import Callable

from vast_harness.console.output import Output
from vast_harness.errors import ExitCode
from vast_harness.kept.names import find
from vast_harness.kept.target import WATCH_WAIT_S, check_usable, held_spec, run_on_hold
from vast_harness.run.hold import DownStages, HoldStages, KeepStages
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.held import HeldHost, HeldStore, HoldBusy

DOWN_WAIT_S = 600.0  # a `down` behind another: longer than a teardown's whole budget on Vast


def keep_host(name: str, options: RunOptions, *, out: Output) -> int:
    store, record = find(name)
    try:
        lock = store.lock(name, "keep", wait_watch_s=WATCH_WAIT_S)
    except HoldBusy as busy:  # an exec keeps it alive: its heartbeat pushes the idle deadline, and its end does
        who = f"`{busy.busy.command}` (pid {busy.busy.pid})" if busy.busy else "another command"
        out.info(f"kept host {name}: {who} is working on it and pushes its idle deadline while it runs and as it "
                 "ends; nothing to do")
        return ExitCode.PASSED
    try:
        record = store.load(name) or record
        check_usable(store, record, "keep", locked=True)
        return _run(store, record, options, KeepStages(store, record), out)
    finally:
        lock.release()


def down_host(name: str, options: RunOptions, *, out: Output) -> int:
    """Delete kept host `name` and prove it absent; it never waits for an exec (whose host then goes). A second
    `down` meanwhile waits for the first, and says what it left."""
    store, record = find(name)
    with store.down_lock(name, wait_s=DOWN_WAIT_S, on_wait=out.info):
        fresh = store.load(name)
        if fresh is None:  # the other `down` ended the hold: deleted and proven absent (unproven keeps the record)
            message = f"kept host {name} was taken down by another `down` meanwhile: deleted and proven absent"
            if out.json_mode:
                out.emit_json({"run_id": record.hold_id, "exit_code": ExitCode.PASSED, "message": message,
                               "evidence_dir": record.evidence_dir})
            else:
                out.info(message)
            return ExitCode.PASSED
        return _down(store, fresh, options, out)


def _down(store: HeldStore, record: HeldHost, options: RunOptions, out: Output) -> int:
    name = record.name
    check_usable(store, record, "down")
    # The deletion never waits on the evidence disk: full or read-only, `down` warns and goes on, as `reap` does
    goes_on = f"deleting kept host {name} anyway; its evidence (the record, the logs) may not be written"
    spec_of = functools.partial(resolve, on_unwritable=out.warn, unwritable_goes_on=goes_on)
    return _run(store, record, options, DownStages(store, record), out, spec_of=spec_of,
                warn_instead=lambda problem: out.warn(f"{problem}; {goes_on}"))


def _run(store: HeldStore, record: HeldHost, options: RunOptions, stages: HoldStages, out: Output,
         spec_of: Callable[[RunOptions], RunSpec] = resolve,
         warn_instead: Callable[[str], None] | None = None) -> int:
    spec = held_spec(store, record, options.model_copy(update={"profile": "smoke", "command": None}), spec_of,
                     warn_instead)
    return run_on_hold(spec, record, stages, out)
