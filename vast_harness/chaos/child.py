"""`python -m vast_harness.chaos.child JOB.json`: one guarded run in a process of its own (network and account
scenarios). `python -m vast_harness.chaos.child --cli [--wall-step S] [--sim-timings] -- ARGS...`: the real CLI (`vast-e2e
ARGS`), with the wall clock stepped by S seconds and the teardown floor scaled down like every chaos clock;
`--sim-timings`: a run against the scenario's simulator (`--api-url`) on the simulator's timing table, as
`--sim` would have it (a read-lag window of a second, not Vast's 30 s, which the scaled teardown cannot wait).

The network scenarios need what an in-process run cannot give: a run that can be killed when it hangs, and
its real stdout/stderr to search for tracebacks. The run is the CLI's (`GuardedRun` with the console
`Output`, its signal handling and exit code), with the scenario's steps and the chaos suite's scaled clocks,
which no CLI flag can set. Nothing here catches an exception: one that escapes is a finding.

The wall-clock step is an NTP step as this process sees it: `time.time` moves, `now_s` does not.
Only this process's clock moves; the simulator (the API server) keeps the true time.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from vast_harness.chaos.engine import TEARDOWN_BUDGET_S, ChildJob, _client, chaos_spec
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.profile import load_driver_policy

_real_time = time.time


def step_wall_clock(step_s: float) -> None:
    """From now on this process's wall clock reads `step_s` seconds off; its monotonic clock does not move."""
    time.time = lambda: _real_time() + step_s


def simulate_suspend(suspend_file: Path, *, blind: bool = False) -> None:
    """From now on a SIGSTOP ... SIGCONT of this process reads as a suspend of its machine: on SIGCONT the seconds
    stopped (written to `suspend_file` by whoever stopped it) are taken off `time.monotonic`, as CLOCK_MONOTONIC
    does not count a suspend; the wall clock and CLOCK_BOOTTIME counted them, as they do. `blind`: the run's own
    clock (`clock.now_s`) loses them too, as a control plane on `time.monotonic` did (the judge must see that)."""
    lost_s = [0.0]
    real_monotonic, real_gettime = time.monotonic, time.clock_gettime

    def on_resume(_signum: int, _frame: object) -> None:
        try:
            lost_s[0] += float(suspend_file.read_text() or 0.0)
        except (OSError, ValueError):
            pass

    signal.signal(signal.SIGCONT, on_resume)
    time.monotonic = lambda: real_monotonic() - lost_s[0]
    if blind:
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        time.clock_gettime = lambda clk: real_gettime(clk) - (lost_s[0] if clk == boottime else 0.0)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--cli":
        return _cli(argv[1:])
    job = ChildJob.model_validate_json(Path(argv[0]).read_text())
    spec = chaos_spec(api_url=job.api_url, evidence_dir=job.evidence_dir, steps=job.steps,
                      max_minutes=job.max_minutes, max_usd=job.max_usd, boot_retries=job.boot_retries,
                      proof_interval_s=job.proof_interval_s, state_dir=job.state_dir, command=job.command)
    # The wall clock steps (NTP) right after the create answered: while an instance is live and billing.
    wall_step_s = job.wall_step_s
    if job.suspend_file is not None:
        simulate_suspend(job.suspend_file, blind=job.suspend_blind)
    on_created = (lambda _inst: step_wall_clock(wall_step_s)) if wall_step_s else None
    with _client(job.api_url) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output(), on_created=on_created)
        run.state.teardown_budget_s = job.teardown_budget_s
        # The time cap counts from the run's own clock, which starts with the run (after the client is built:
        # on a loaded machine that alone took 1.6 s), not from this process's start.
        job.t0_file.write_text(repr(run.state.t0_unix))
        return run.execute().exit_code


def _cli(argv: list[str]) -> int:
    import vast_harness.caps.meter as meter
    from vast_harness.cli.app import main as cli_main

    if argv[:1] == ["--wall-step"]:
        step_wall_clock(float(argv[1]))
        argv = argv[2:]
    if argv[:1] == ["--sim-timings"]:
        from vast_harness.timings import Timings

        Timings.real = Timings.sim  # type: ignore[method-assign]
        argv = argv[1:]
    if argv[:1] == ["--"]:
        argv = argv[1:]
    meter.TEARDOWN_MIN_S = TEARDOWN_BUDGET_S  # one instance's delete + proof, scaled like the run's
    sys.argv = ["vast-e2e", *argv]
    try:
        cli_main()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
