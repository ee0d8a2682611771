"""`vast-e2e exec NAME -- CMD`: run a command on a kept host (`run/hold.ExecStages`): what changed in the workdir
uploaded, the command run as the step `exec-N`, the `--artifact` files pulled; the host stays held."""

from __future__ import annotations

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError
from vast_harness.kept.names import find
from vast_harness.kept.target import WATCH_WAIT_S, check_usable, held_spec, run_on_hold
from vast_harness.run.hold import ExecStages, HeldHostWork, exec_line
from vast_harness.spec.resolve import RunOptions, RunSpec


def exec_spec(spec: RunSpec, number: int) -> RunSpec:
    """The command's step as an exec runs it: named `exec-N`, its process group written on the host."""
    steps = [step.model_copy(update={"name": f"exec-{number}", "run": exec_line(step.run)})
             for step in spec.profile.steps if step.name == "run"]
    profile = spec.profile.model_copy(update={"steps": steps})
    return spec.model_copy(update={"profile": profile})


def exec_on(name: str, options: RunOptions, *, full_upload: bool, out: Output) -> int:
    """Run `options.command` on kept host `name`; the exit code (a step's: 0, 1; 6 when the cap ended the hold;
    130 interrupted, the host kept; 2 for a name that is not usable, or busy with another exec)."""
    store, record = find(name)
    # a second exec meanwhile is refused, naming this one; the watcher handling an outbid is waited for
    lock = store.lock(name, "exec", wait_watch_s=WATCH_WAIT_S)
    try:
        fresh = store.load(name)
        if fresh is None:
            raise ConfigError(f"kept host {name!r} ended meanwhile")
        record = fresh
        check_usable(store, record, "exec", locked=True)
        workdir = options.workdir if options.workdir is not None else record.workdir
        if workdir is None:
            raise ConfigError(f"kept host {name!r} was set up without a workdir; give --workdir")
        spec = held_spec(store, record, options.model_copy(update={
            "workdir": workdir, "exclude": options.exclude if options.exclude is not None else record.exclude or None,
            "include": options.include if options.include is not None else record.include or None,
            "workdir_max_mb": options.workdir_max_mb if options.workdir_max_mb is not None else record.workdir_max_mb}))
        spec = exec_spec(spec, record.execs + 1)
        return run_on_hold(spec, record, ExecStages(store, record, full_upload=full_upload), out,
                           host_work=HeldHostWork)
    finally:
        lock.release()
