"""The watcher of an interruptible kept host (`up --interruptible`): a detached process that reads the held
instance while no command of the hold runs, so an outbid between commands bills no storage for long.

Between commands the host's dead-man switch dies with its paused container: nothing on the host deletes a husk.
The watcher reads the instance every `interval` (paced for Vast's rate limits; the client's own retries are
tenacity's) while the hold's lock is free. On a paused read it takes the lock and hands the husk to
`run/hold.WatchStages` (per `--on-outbid`: waited for, or salvaged, deleted, proven gone and the hold marked
`outbid`, the next exec renting; past --max-interruptions, the hold ends). It stops at the hold's end (`down`
stops it, as does the end of the hold by any command), at the hold's deadline, or when another watcher runs.
Its pid and start are in the hold's record; a command that finds it gone starts it again. Its output goes to
`<state>/held/watch-NAME.log`. What it does not cover (no process of yours running): docs/limits.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from vast_harness.console.output import Output
from vast_harness.errors import HarnessError, VastError
from vast_harness.kept.target import held_spec, run_on_hold
from vast_harness.kept.watcher_proc import WATCH_INTERVAL_S, watcher_running
from vast_harness.run.hold import WatchStages
from vast_harness.spec.resolve import RunOptions
from vast_harness.state.held import HeldHost, HeldStore, HoldBusy
from vast_harness.state.process import process_start
from vast_harness.vast.client import VastClient

READ_S = 10.0


def claim(store: HeldStore, name: str) -> bool:
    """This process is the hold's watcher (its pid in the record), unless another watcher runs."""
    me, started = os.getpid(), process_start(os.getpid())
    won = False

    def change(r: HeldHost) -> None:
        nonlocal won
        if watcher_running(r) and r.watcher_pid != me:
            return
        r.watcher_pid, r.watcher_pid_start, won = me, started, True

    store.update(name, change)
    return won


def watch(store: HeldStore, name: str, *, every_s: float, pacing_scale: float, out: Output) -> int:
    """The watcher's loop; its exit status (0: the hold ended or another watcher runs)."""
    if not claim(store, name):
        out.info(f"kept host {name}: another watcher runs; this one exits")
        return 0
    stop = False

    def on_term(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    while not stop:
        time.sleep(every_s)
        record = store.load(name)
        if record is None or record.state == "ending" or record.watcher_pid != os.getpid():
            return 0
        if record.expired():  # its switch deletes it at its deadline; `reap` proves it gone
            out.info(f"kept host {name}: past its deadline; the watcher stops")
            return 0
        if record.state != "held" or record.instance_id is None or store.busy(name) is not None:
            continue  # outbid already (nothing billed), or a command at work (its own price watch reads it)
        with contextlib.suppress(HarnessError, VastError, OSError):
            look(store, record, pacing_scale=pacing_scale, out=out)
    return 0


def look(store: HeldStore, record: HeldHost, *, pacing_scale: float, out: Output) -> None:
    """One read of the held instance; a paused one is handled under the hold's lock (`WatchStages`)."""
    spec = held_spec(store, record, RunOptions(profile="smoke", pacing_scale=pacing_scale),
                     warn_instead=out.warn)  # an outbid husk is deleted all the same
    assert spec.api_key is not None and record.instance_id is not None
    with VastClient(spec.api_key.get_secret_value(), base_url=spec.api_url, pacing_scale=spec.pacing_scale) as client:
        read = client.get_instance(record.instance_id, max_retry_s=READ_S, within_s=READ_S)
    if read is None or read.paused is None:
        return
    try:
        lock = store.lock(record.name, "watch")
    except HoldBusy:
        return  # a command started meanwhile: it reads the instance first and handles the outbid
    try:
        fresh = store.load(record.name)
        if fresh is None or fresh.state != "held" or fresh.instance_id != record.instance_id:
            return
        out.warn(f"kept host {record.name}: instance {record.instance_id} {read.paused} while no command runs")
        run_on_hold(spec, fresh, WatchStages(store, fresh, why=f"instance {record.instance_id} {read.paused}"), out)
    finally:
        lock.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vast_harness.kept.watch")
    parser.add_argument("name")
    parser.add_argument("--state-dir", required=True, type=Path)
    parser.add_argument("--interval", type=float, default=WATCH_INTERVAL_S)
    parser.add_argument("--pacing-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    out = Output(progress=False)
    return watch(HeldStore(args.state_dir), args.name, every_s=args.interval, pacing_scale=args.pacing_scale,
                 out=out)


if __name__ == "__main__":
    sys.exit(main())
