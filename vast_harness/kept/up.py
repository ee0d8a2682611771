"""`vast-e2e up NAME`: rent a host as a run does, upload the workdir, run `--setup` once, and keep the host
(`run/hold.UpStages`); the hold's caps are the run's flags, and its idle deadline `--idle-minutes`."""

from __future__ import annotations

import secrets
from pathlib import Path

from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.kept.names import refuse_held
from vast_harness.kept.simproc import DetachedSim, start_detached_sim, stop_sim
from vast_harness.kept.target import KEPT_PROFILE, ensure_watcher, first_idle_s
from vast_harness.run.hold import HOST_CLOCK_STEP_S, IDLE_MIN_S, PUSH_ROOM_S, UpStages, hold_terms
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.known_secrets import key_file_text, key_sha256
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec
from vast_harness.spec.values import check_number
from vast_harness.state.held import HeldBid, HeldHost, HeldStore, Instant, check_name
from vast_harness.state.ledger import account_fingerprint, new_run_id
from vast_harness.vast.client import VastClient

DEFAULT_IDLE_MINUTES = 10.0  # without an exec or keep for this long, the host's switch deletes it


def up_spec(spec: RunSpec, name: str) -> RunSpec:
    """`run`'s spec for the setup alone: the `--setup` steps, no command (an `exec` brings those)."""
    steps = [step for step in spec.profile.steps if step.name != "run"]
    profile = spec.profile.model_copy(update={"steps": steps, "description": f"vast-e2e up {name}",
                                              "name": KEPT_PROFILE})
    return spec.model_copy(update={"profile": profile})


def idle_minutes_for(spec: RunSpec, given: float | None) -> float:
    """`--idle-minutes`, at least the floor the switch can honour (`IDLE_MIN_S`), at most the time cap (default:
    10, or the cap when shorter)."""
    idle = given if given is not None else min(DEFAULT_IDLE_MINUTES, spec.caps.max_minutes)
    check_number("--idle-minutes", idle, low=0, high=spec.caps.max_minutes, low_inclusive=False)
    if idle * 60.0 < IDLE_MIN_S:
        raise ConfigError(f"--idle-minutes must be at least {IDLE_MIN_S / 60.0:.4g} ({IDLE_MIN_S:g} s), got {idle:g}: "
                          "the switch re-reads its idle deadline every idle/4, and each push of it needs up to "
                          f"{PUSH_ROOM_S:g} s and the host's whole seconds before the last one runs out; shorter, it "
                          "deletes the host between two pushes while a command still works on it")
    return idle


def held_bid(spec: RunSpec) -> HeldBid | None:
    """`up --interruptible`'s terms as the hold's record keeps them (the ceiling and the worst case: the plan's)."""
    terms = spec.interruptible
    if terms is None:
        return None
    return HeldBid(bid_usd_per_h=terms.bid_usd_per_h, max_interruptions=terms.max_interruptions,
                   checkpoint=terms.checkpoint, wait_minutes=terms.wait_minutes,
                   checkpoint_max_mb=terms.checkpoint_max_mb)


def up_host(spec: RunSpec, name: str, *, idle_minutes: float, out: Output, options: RunOptions | None = None) -> int:
    """Rent, set up and keep `name`'s host; the exit code (0: held). Nothing is held unless all of it passed:
    anything else deletes what was rented, as a run does."""
    check_name(name)
    refuse_held(name)
    store = HeldStore(spec.state_dir)
    hold_id = new_run_id()
    sim: DetachedSim | None = None
    target = spec
    if spec.sim:
        sim = start_detached_sim(store.dir, hold_id, timings=spec.timings, lifetime_s=spec.max_seconds)
        target = spec.model_copy(update={"api_url": sim.url, "api_key": SecretStr("sim-" + secrets.token_hex(16))})
    assert target.api_key is not None
    wd = spec.profile.workdir
    key_path = Path(options.key_file).expanduser().absolute() if options is not None and options.key_file else None
    given_key = key_file_text(key_path)
    record = HeldHost(name=name, hold_id=hold_id, sim=spec.sim, api_url=target.api_url,
                      account=account_fingerprint(target.api_key.get_secret_value()),
                      sim_key=target.api_key.get_secret_value() if sim else None,
                      key_file=str(key_path) if given_key else None,
                      key_file_sha256=key_sha256(given_key) if given_key else None,
                      sim_pid=sim.pid if sim else None, sim_pid_start=sim.pid_start if sim else None,
                      evidence_dir=str(spec.evidence_dir / hold_id), max_usd=spec.caps.max_usd,
                      max_minutes=spec.caps.max_minutes, idle_minutes=idle_minutes, t0=Instant.now(),
                      cap_deadline=Instant.now(spec.max_seconds), workdir=wd.path if wd else None,
                      exclude=list(wd.exclude) if wd else [], include=list(wd.include) if wd else [],
                      workdir_max_mb=wd.max_mb if wd else None,
                      # the host's deadlines are whole seconds, twice truncated: ours are that much earlier
                      switch_lead_s=spec.timings.teardown_budget.switch_s + 2 * HOST_CLOCK_STEP_S,
                      setup=[step.run for step in spec.profile.steps], bid=held_bid(spec),
                      up_options=options.model_dump(mode="json", exclude_none=True)
                      if options is not None and spec.interruptible is not None else {})
    idle_first_s = first_idle_s(spec, record.idle_s)
    stages = UpStages(store, record, idle_first_s=idle_first_s)
    held = False
    try:
        with VastClient(target.api_key.get_secret_value(), base_url=target.api_url,
                        pacing_scale=target.pacing_scale) as client:
            run = GuardedRun(target, client, load_driver_policy(), out, run_id=hold_id, stages=stages,
                             hold=hold_terms(record, target.timings.teardown_budget, idle_first_s=idle_first_s,
                                             adopt=False),
                             on_created=stages.on_created, discard_if_refused=True)
            record.t0 = Instant.at_mono(run.meter.t0)  # the hold's time cap counts from its meter's start
            record.cap_deadline = record.t0.plus(record.max_seconds)
            result = run.execute()
        now = store.load(name) if stages.claimed else None
        held = now is not None and now.hold_id == hold_id and now.state == "held"
        if held and record.bid is not None:
            ensure_watcher(store, name, pacing_scale=target.pacing_scale)
        if result.exit_code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) and not held:
            out.error(f"kept host {name} is not held (its hold ended before `up` returned): exit 1, not 0")
            return ExitCode.FAILED  # 0 (or 4) means held, and nothing is
        return result.exit_code
    except ConfigError:
        raise
    finally:
        if sim is not None and not held:
            stop_sim(sim)
