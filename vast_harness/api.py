"""The Python entry point: `run_workload(...)` is `vast-e2e run -- CMD` for notebooks and CI (docs/run.md).

It takes the command's options as keyword arguments, runs the same guarded run (caps, ledger, registration,
dead-man, cap guard, teardown, evidence, report) and returns a typed `WorkloadResult` with the run's record. It
prints nothing unless `echo=True`. Bad input raises `ConfigError` (its `exit_code` is 2) before anything is
rented, as the command exits 2; the key and the secrets are masked in its text as in everything else (told to
the process's masker first, forgotten when the call returns). `api_target` (the embedded simulator for
`sim=True`) is shared with the CLI.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import ParamSpec

from pydantic import BaseModel, ConfigDict, SecretStr, ValidationError

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode, NoOfferError
from vast_harness.masking import MASKER, clip
from vast_harness.records import RunRecord
from vast_harness.spec.known_secrets import teach_inputs
from vast_harness.spec.profile import validation_message
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve

P = ParamSpec("P")
SIM_OFFERS = 1000  # a market large enough that every profile finds offers
RESULT_FILE = "harness-result.json"


@contextlib.contextmanager
def api_target(spec: RunSpec) -> Iterator[RunSpec]:
    """The spec pointed at the API it should use: the embedded simulator with --sim, else as given. The
    simulator boots and enforces Vast's rate limits as the spec's timings (Timings.sim()) say."""
    if not spec.sim:
        yield spec
        return
    from vast_harness.sim import SimServer  # imported only when asked for

    timings = spec.timings
    with SimServer(seed=0, boot_seconds=timings.min_boot_s, rate_scale=timings.pacing_scale,
                   num_offers=SIM_OFFERS) as sim:
        key = SecretStr("sim-" + secrets.token_hex(16))
        yield spec.model_copy(update={"api_url": sim.url, "api_key": key})


class WorkloadResult(BaseModel):
    """What `run_workload` returns: the exit code the command would exit with, and where the evidence is."""

    model_config = ConfigDict(frozen=True)

    exit_code: ExitCode
    message: str = ""
    run_id: str | None = None  # None for a dry run
    evidence_dir: Path | None = None  # <evidence-dir>/<run_id>: harness-result.json, steps/, artifacts/, report
    record: RunRecord | None = None  # harness-result.json, read back (None if it could not be written)
    plan: dict[str, object] | None = None  # a dry run's plan: the offer, the steps, the worst case
    console: str = ""  # what the command would have printed (echo=False)

    @property
    def passed(self) -> bool:
        return self.exit_code == ExitCode.PASSED

    @property
    def artifacts_dir(self) -> Path | None:
        return self.evidence_dir / "artifacts" if self.evidence_dir is not None else None


def _masked(run: Callable[P, WorkloadResult]) -> Callable[P, WorkloadResult]:
    """The call in a masker scope of its own, told its key and secrets before any argument is checked."""

    @functools.wraps(run)
    def call(*args: P.args, **kwargs: P.kwargs) -> WorkloadResult:
        with MASKER.scoped():
            key_file, given = kwargs.get("key_file"), kwargs.get("remote_secrets")
            items = given.items() if isinstance(given, Mapping) else ()
            urls = kwargs.get("notify")
            teach_inputs(environ=os.environ, key_file=key_file if isinstance(key_file, (str, Path)) else None,
                         secret_items=[f"{k}={v}" for k, v in items if isinstance(k, str) and isinstance(v, str)],
                         notify_urls=[u for u in urls if isinstance(u, str)] if isinstance(urls, (list, tuple)) else ())
            try:
                return run(*args, **kwargs)
            except ValidationError as exc:  # pydantic's text quotes the value given: a ConfigError says it without
                raise ConfigError(validation_message("run_workload", exc)) from None

    return call


@_masked
def run_workload(
    command: Sequence[str],
    *,
    workdir: str | Path = ".",
    setup: Sequence[str] = (),
    artifacts: Sequence[str] = (),
    exclude: Sequence[str] = (),
    include: Sequence[str] = (),
    workdir_max_mb: float | None = None,
    image: str | None = None,
    gpus: Sequence[str] = (),
    num_gpus: int | None = None,
    min_gpu_ram_gb: float | None = None,
    max_usd: float | None = None,
    max_minutes: float | None = None,
    remote_env: Mapping[str, str] | None = None,
    remote_secrets: Mapping[str, str] | None = None,
    sim: bool = False,
    api_url: str | None = None,
    key_file: str | Path | None = None,
    evidence_dir: str | Path | None = None,
    boot_retries: int | None = None,
    notify: Sequence[str] = (),
    dry_run: bool = False,
    echo: bool = False,
) -> WorkloadResult:
    """Rent, upload `workdir`, run `setup` then `command` there, pull `artifacts`, delete and prove absence.

    The keyword arguments are `vast-e2e run`'s options (docs/run.md); `remote_secrets` are given by value and
    masked everywhere the harness writes. Raises ConfigError (exit_code 2) for bad input, before renting."""
    _check_words(command=command, setup=setup, artifacts=artifacts, exclude=exclude, gpus=gpus, include=include,
                 notify=notify)
    _check_scalars(numbers={"max_usd": max_usd, "max_minutes": max_minutes, "workdir_max_mb": workdir_max_mb,
                            "min_gpu_ram_gb": min_gpu_ram_gb},
                   whole={"num_gpus": num_gpus, "boot_retries": boot_retries},
                   flags={"sim": sim, "dry_run": dry_run, "echo": echo},
                   paths={"key_file": key_file, "evidence_dir": evidence_dir}, workdir=workdir,
                   texts={"image": image, "api_url": api_url})
    for name, given in (("remote_env", remote_env), ("remote_secrets", remote_secrets)):
        if given is not None and not (isinstance(given, Mapping)
                                      and all(isinstance(k, str) and isinstance(v, str) for k, v in given.items())):
            raise ConfigError(f"run_workload: {name} must map names to strings, got {clip(repr(given), 80)}"
                              if name == "remote_env" else "run_workload: remote_secrets must map names to strings")
    try:
        options = RunOptions(
            command=list(command), workdir=os.fspath(workdir), setup=list(setup) or None,
            artifact=list(artifacts) or None, exclude=list(exclude) or None, include=list(include) or None,
            workdir_max_mb=workdir_max_mb, image=image, gpu=list(gpus) or None, num_gpus=num_gpus,
            min_gpu_ram_gb=min_gpu_ram_gb, max_usd=max_usd, max_minutes=max_minutes,
            remote_env=[f"{k}={v}" for k, v in (remote_env or {}).items()] or None,
            remote_secret=[f"{k}={v}" for k, v in (remote_secrets or {}).items()] or None,
            sim=sim, api_url=api_url, key_file=key_file, evidence_dir=evidence_dir, boot_retries=boot_retries,
            notify=list(notify) or None, dry_run=dry_run,
        )
    except ValidationError as exc:  # a type the checks above let through: still bad input, named
        first = exc.errors()[0]
        raise ConfigError(f"run_workload: {'.'.join(str(p) for p in first['loc'])} {first['msg']}") from None
    spec = resolve(options)
    sink = io.StringIO()
    # Output binds its streams when made: without echo the run's output goes to the sink (result.console)
    with contextlib.ExitStack() as quiet:
        if not echo:
            quiet.enter_context(contextlib.redirect_stdout(sink))
            quiet.enter_context(contextlib.redirect_stderr(sink))
        out = Output(progress=False)
    from vast_harness.spec.profile import load_driver_policy
    from vast_harness.vast.client import VastClient

    drivers = load_driver_policy()
    with api_target(spec) as target:
        assert target.api_key is not None
        with VastClient(target.api_key.get_secret_value(), base_url=target.api_url,
                        pacing_scale=target.pacing_scale) as client:
            if target.dry_run:
                from vast_harness.caps.meter import check_minimum_cap
                from vast_harness.host.bundle import bundle_for
                from vast_harness.market.plan import plan_run

                check_minimum_cap(target.caps.max_minutes, target.timings, target.profile.receipt)
                try:
                    plan = plan_run(target, client, drivers, bundle_for(target))
                except NoOfferError as exc:  # the run would exit 5 here: so does its preview, with the reasons
                    why = [f"offer {r.offer.id} ({r.offer.gpu_name}): {'; '.join(r.reasons)}" for r in exc.rejected]
                    return WorkloadResult(exit_code=ExitCode.NO_OFFER, message=str(exc),
                                          console=sink.getvalue() + "\n".join([str(exc), *why]) + "\n")
                return WorkloadResult(exit_code=ExitCode.PASSED, plan=plan.summary(), console=sink.getvalue())
            from vast_harness.run.runner import GuardedRun

            run = GuardedRun(target, client, drivers, out)
            result = run.execute()
    return WorkloadResult(exit_code=result.exit_code, message=result.message, run_id=result.run_id,
                          evidence_dir=run.ev.dir, record=_read_record(run.ev.dir / RESULT_FILE),
                          console=sink.getvalue())


def _check_words(**given: object) -> None:
    """A list of strings for each list argument: a bare string would be split into its characters (a step
    `p y t h o n`, globs `m`, `e`, …) and rent a host for a run that cannot work. ConfigError, exit 2, before."""
    for name, value in given.items():
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
                isinstance(w, str) for w in value):
            raise ConfigError(f"run_workload: {name} must be a list of strings, got {clip(repr(value), 80)}"
                              + (f" (did you mean [{value!r}]?)" if isinstance(value, str) else ""))


def _check_scalars(*, numbers: Mapping[str, object], whole: Mapping[str, object], flags: Mapping[str, object],
                   paths: Mapping[str, object], texts: Mapping[str, object], workdir: object) -> None:
    """Each argument of the type its flag parses to: pydantic would turn `True` into a $1 cap, "3" into 3, and
    refuse "abc" with its own ValidationError. ConfigError (exit 2) naming the argument instead, before anything."""
    for name, value in numbers.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ConfigError(f"run_workload: {name} must be a number, got {value!r:.80}")
    for name, value in whole.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"run_workload: {name} must be a whole number, got {value!r:.80}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise ConfigError(f"run_workload: {name} must be True or False, got {value!r:.80}")
    for name, value in {"workdir": workdir, **paths}.items():
        if (value is not None or name == "workdir") and not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"run_workload: {name} must be a path (str or Path), got {value!r:.80}")
    for name, value in texts.items():
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"run_workload: {name} must be a string, got {value!r:.80}")


def _read_record(path: Path) -> RunRecord | None:
    try:
        return RunRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None
