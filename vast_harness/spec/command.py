"""`vast-e2e run -- CMD`: the user's command as a profile, so the guarded run is the same as a profile's.

The synthetic profile uploads the workdir, runs each `--setup` command and then the command in it, and pulls
the `--artifact` globs back; everything else (caps, ledger, dead-man, teardown, evidence) is the profile run's.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from vast_harness.errors import ConfigError
from vast_harness.spec.profile import PROFILES_DIR, Caps, Filters, HarnessProfile, ImageRef, Step, Workdir, load_profile
from vast_harness.spec.workdir import DEFAULT_WORKDIR_MAX_MB, MAX_WORKDIR_MAX_MB, check_glob
from vast_harness.timings import MAX_MINUTES_LIMIT

COMMAND_PROFILE_NAME = "run"
# Caps when neither a flag nor the config file gives one: small on purpose; raise them for real training.
RUN_DEFAULT_MAX_USD = 1.0
RUN_DEFAULT_MAX_MINUTES = 30.0
RUN_DEFAULT_DISK_GB = 40.0
MAX_GPU_RAM_GB = 2_000.0
# A user's command may run as long as the time cap allows: the cap, not a step timeout, ends it (exit 6).
# `with_cap_timeouts` brings this down to the run's own time cap once the caps are known.
_NO_STEP_TIMEOUT_S = MAX_MINUTES_LIMIT * 60.0


class CommandRun(BaseModel):
    """What `run` was given beyond the shared run options (docs/run.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    command: list[str]
    workdir: str = "."
    setup: list[str] = []
    artifacts: list[str] = []
    exclude: list[str] = []
    include: list[str] = []
    workdir_max_mb: float | None = None
    image: str | None = None


def command_line(argv: Sequence[str]) -> str:
    """The shell line that runs `argv` exactly as given (each word quoted): `-- sh -c '...'` for shell syntax."""
    return shlex.join(argv)


def command_profile(run: CommandRun, *, profiles_dir: Path = PROFILES_DIR) -> HarnessProfile:
    """The profile `run` executes; ConfigError naming the flag for anything wrong, before any network call."""
    if not run.command or not run.command[0].strip():
        raise ConfigError("run: no command given; put it after --: vast-e2e run [OPTIONS] -- CMD [ARGS...]")
    if not run.workdir.strip():  # not the current directory by accident: that is "."
        raise ConfigError("--workdir is empty: give a folder ('.' for the current one)")
    for i, line in enumerate(run.setup, 1):
        if not line.strip():
            raise ConfigError(f"--setup #{i} is empty; give a shell command such as 'pip install -r requirements.txt'")
    if run.workdir_max_mb is not None and not 0 < run.workdir_max_mb <= MAX_WORKDIR_MAX_MB:
        raise ConfigError(f"--workdir-max-mb must be > 0 and at most {MAX_WORKDIR_MAX_MB:g}, got {run.workdir_max_mb:g}")
    for flag, globs in (("--artifact", run.artifacts), ("--exclude", run.exclude), ("--include", run.include)):
        for glob in globs:
            check_glob(flag, glob)
    smoke = load_profile("smoke", profiles_dir)  # its image, and whether its digest was checked, by default
    image = run.image if run.image is not None else smoke.image
    try:
        ref = ImageRef.parse(image)
    except ValueError as exc:
        raise ConfigError(f"--image: {exc}") from None
    if ref.cuda is None:
        raise ConfigError(f"--image {image!r}: the tag names no CUDA version (cudaX.Y); offers are matched to the "
                          "image's CUDA, so pick a tag that says it, e.g. pytorch/pytorch:2.11.0-cuda12.8-cudnn9-runtime")
    steps = [Step(name=f"setup-{i}", run=line, timeout_s=_NO_STEP_TIMEOUT_S, workload=False)
             for i, line in enumerate(run.setup, 1)]
    steps.append(Step(name="run", run=command_line(run.command), timeout_s=_NO_STEP_TIMEOUT_S))
    try:
        return HarnessProfile(
            name=COMMAND_PROFILE_NAME,
            description=f"vast-e2e run -- {command_line(run.command)}",
            image=image,
            image_digest_verified=smoke.image_digest_verified and image == smoke.image,
            image_cuda=float(ref.cuda),
            disk_gb=RUN_DEFAULT_DISK_GB,
            caps=Caps(max_usd=RUN_DEFAULT_MAX_USD, max_minutes=RUN_DEFAULT_MAX_MINUTES),
            filters=Filters(),
            steps=steps,
            workdir=Workdir(path=run.workdir, exclude=run.exclude, include=run.include,
                            max_mb=run.workdir_max_mb if run.workdir_max_mb is not None else DEFAULT_WORKDIR_MAX_MB),
            artifacts=run.artifacts,
            require_gpu=False,  # the user's command decides what it needs; `fleet --sim` swaps nothing in
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        flag = {"artifacts": "--artifact", "workdir": "--workdir/--exclude/--include"}.get(where.split(".")[0], where)
        raise ConfigError(f"{flag}: {first['msg'].removeprefix('Value error, ')}") from None


def with_cap_timeouts(profile: HarnessProfile, max_seconds: float) -> HarnessProfile:
    """The command profile whose steps may run until the time cap (what the dry run shows and the run uses)."""
    steps = [step.model_copy(update={"timeout_s": min(step.timeout_s, max_seconds)}) for step in profile.steps]
    return profile.model_copy(update={"steps": steps})
