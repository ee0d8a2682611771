"""The memory fit: which of a profile's 1B runs a GPU can hold, read from the run's own settings.

A step declares the runs it makes (`fit = "mfu-sweep" | "mfu-replay" | "proof-round"` in `[[steps]]`); their
settings are the `HT_*` variables the step's script reads (profile `[remote_env]`, then `--remote-env`):

    mfu-sweep     HT_MFU_WORLDS x HT_MFU_MB x HT_MFU_COMPILE, HT_MFU_REDUCTION (scripts/vast_mfu_remote.sh)
    mfu-replay    the first of HT_MFU_WORLDS, the model profile's micro-batch, eager, zero2o, deterministic
    proof-round   HT_PROOF_WORLD, the model profile's micro-batch, eager, zero2o, deterministic

and HT_ACT_CKPT says what may be done where a run does not fit as asked: `0` nothing, `1` activation
checkpointing always (so does `--act-ckpt` in HT_MFU_EXTRA), `auto` checkpointing only where the run needs it.
The replay and the proof round, which measure bits and not speed, may also compile (`1`, `auto`). Each run's
need is `spec/memory.py`'s. On a GPU a run takes the first of its options that fits; a point of a sweep of
several that fits in none is dropped (the sweep goes on without it, and says so); any other run that fits in
none rejects the offer, naming the largest micro-batch that would fit.

The same decision is made twice: on every offer before renting (`market/requires.py`), and on the host that
arrived (`remote/host/fit.py`, reading `HT_FIT`: each run's options and needs, which `host_value` writes and
`resolve` exports to the steps) against its own nvidia-smi `memory.total`, the unit of Vast's `gpu_ram`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from vast_harness.errors import ConfigError
from vast_harness.spec.memory import REDUCTIONS, ModelShape, Reduction, RunShape, load_model_shape, need_gib
from vast_harness.spec.requires import MIB_PER_GIB

FitKind = Literal["mfu-sweep", "mfu-replay", "proof-round"]
Option = Literal["none", "ckpt", "compile+ckpt"]  # what the host adds to the run's own flags
OPTION_WORDS: dict[Option, str] = {"none": "as asked", "ckpt": "activation checkpointing",
                                   "compile+ckpt": "compile and activation checkpointing"}
CKPT_MODES = ("0", "1", "auto")
# What HT_ACT_CKPT allows, in order of preference: a sweep point keeps its compile setting (it is what the sweep
# measures); the replay and the proof round measure bits, not speed, so they may compile to fit.
SWEEP_OPTIONS: dict[str, tuple[Option, ...]] = {"0": ("none",), "1": ("ckpt",), "auto": ("none", "ckpt")}
ROUND_OPTIONS: dict[str, tuple[Option, ...]] = {"0": ("none",), "1": ("ckpt", "compile+ckpt"),
                                                "auto": ("none", "ckpt", "compile+ckpt")}
MODEL_PREFIX = "mfu-dense-1b-dp"
HOST_VAR = "HT_FIT"  # the fit as the host reads it (remote/host/fit.py)
# Every setting the fit reads (the steps read them too: a secret of one of these names would run unseen)
FIT_SETTINGS = ("HT_MFU_WORLDS", "HT_MFU_MB", "HT_MFU_COMPILE", "HT_MFU_REDUCTION", "HT_MFU_EXTRA", "HT_ACT_CKPT",
                "HT_PROOF_WORLD", "VH_CE_CHUNK", "VH_REDUCE_ORDER")
# The sweep script's defaults, when a variable is not set (scripts/vast_mfu_remote.sh)
SWEEP_DEFAULTS = {"HT_MFU_WORLDS": "1 2", "HT_MFU_MB": "8 16", "HT_MFU_COMPILE": "1", "HT_MFU_REDUCTION": "zero2o"}
MAX_MICRO_BATCH = 4096
_UINT = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class WorkloadRun:
    """One run a step makes, with what may be done to fit it, in order of preference."""

    tag: str  # its key in HT_FIT: "dp2-mb8-compile" (a sweep point), "replay", "proof-round"
    step: str
    model: ModelShape
    world: int
    micro_batch: int
    reduction: Reduction
    compile: bool  # as asked
    options: tuple[Option, ...]
    droppable: bool  # a point of a sweep of several: where it fits in no option, the rest still runs
    ce_chunk_tokens: int | None = None
    rank_order: bool = False

    def shape(self, option: Option, micro_batch: int | None = None) -> RunShape:
        return RunShape(world=self.world, micro_batch=micro_batch or self.micro_batch, reduction=self.reduction,
                        compile=self.compile or option == "compile+ckpt", act_ckpt=option != "none",
                        ce_chunk_tokens=self.ce_chunk_tokens, rank_order=self.rank_order)

    def need_gib(self, option: Option, micro_batch: int | None = None) -> float:
        return need_gib(self.model, self.shape(option, micro_batch))

    def needs(self) -> dict[Option, float]:
        return {o: self.need_gib(o) for o in self.options}

    def least_gib(self) -> float:
        return min(self.needs().values())

    def label(self) -> str:
        """How a person reads it: "micro-batch 8 (dp2, compile)", "the replay (dp2, micro-batch 8)"."""
        if self.tag in ("replay", "proof-round"):
            what = "the replay" if self.tag == "replay" else "the proof round"
            return f"{what} (dp{self.world}, micro-batch {self.micro_batch})"
        return f"micro-batch {self.micro_batch} (dp{self.world}, {'compile' if self.compile else 'eager'})"

    def largest_fitting(self, gpu_gib: float, options: tuple[Option, ...] | None = None,
                        below: int | None = None) -> tuple[int, Option] | None:
        """The largest micro-batch under `below` (default: this run's) that fits `gpu_gib` in one of `options`
        (default: its own), and how; None: not even 1."""
        options = options or self.options
        low, high = 0, (below or self.micro_batch) - 1  # the need grows with the micro-batch: bisect
        while low < high:
            mid = (low + high + 1) // 2
            if any(self.need_gib(o, mid) <= gpu_gib for o in options):
                low = mid
            else:
                high = mid - 1
        if low < 1:
            return None
        return low, next(o for o in options if self.need_gib(o, low) <= gpu_gib)


@dataclass(frozen=True)
class Placement:
    """A run on one GPU: the option it takes (None: it fits in none) and what that needs."""

    run: WorkloadRun
    option: Option | None
    need_gib: float  # the chosen option's need; with none, the least of its options'
    largest: tuple[int, Option] | None = None  # with none: the largest micro-batch that would fit

    def runs_as(self) -> str:
        if self.option is None:
            return "does not fit"
        flags = ["compile" if self.run.compile or self.option == "compile+ckpt" else "eager"]
        return ", ".join(flags + (["act-ckpt"] if self.option != "none" else []))

    def why_not(self, gpu_gib: float) -> str:
        """Why it does not fit, naming the need, the memory and the largest micro-batch that would."""
        levers = [o for o in self.run.options if o != "none"]
        even = f" even with {OPTION_WORDS[levers[-1]]}" if levers else ""
        text = f"{self.run.label()} needs {self.need_gib:.1f} GiB per GPU{even}; {gpu_gib:.1f} GiB here"
        if self.run.tag in ("replay", "proof-round"):
            return text
        if self.largest is None:
            return text + ": not even micro-batch 1 fits"
        mb, option = self.largest
        how = f" ({OPTION_WORDS[option]})" if option != "none" else ""
        return text + f": the largest micro-batch that fits is {mb}{how}"

    def row(self) -> dict[str, object]:
        """As `--json` shows it."""
        return {"run": self.run.tag, "step": self.run.step, "world": self.run.world,
                "micro_batch": self.run.micro_batch, "runs_as": self.runs_as(), "option": self.option,
                "need_gib": self.need_gib, "needs_gib": self.run.needs(), "dropped": self.option is None,
                "largest_micro_batch": self.largest[0] if self.largest else None}


@dataclass(frozen=True)
class GpuFit:
    """The profile's runs on one GPU of `gpu_gib`."""

    gpu_gib: float
    placements: tuple[Placement, ...]

    @property
    def dropped(self) -> list[Placement]:
        """Sweep points that fit in no option: left out on this GPU."""
        return [p for p in self.placements if p.option is None and p.run.droppable]

    def reasons(self) -> list[str]:
        """Why an offer with this GPU cannot run the profile (empty: it can)."""
        blocking = [p.why_not(self.gpu_gib) for p in self.placements if p.option is None and not p.run.droppable]
        sweep = [p for p in self.placements if p.run.droppable]
        if sweep and all(p.option is None for p in sweep):
            least = min(sweep, key=lambda p: p.need_gib)
            blocking.append(f"no point of the sweep fits: the smallest, {least.why_not(self.gpu_gib)}")
        return blocking


@dataclass(frozen=True)
class WorkloadFit:
    runs: tuple[WorkloadRun, ...]

    def on(self, gpu_ram_mib: float) -> GpuFit:
        """The fit on a GPU of `gpu_ram_mib` (Vast's `gpu_ram`, nvidia-smi's `memory.total`)."""
        return _fit_on(self, gpu_ram_mib)

    @property
    def floor_gib(self) -> float:
        """The least GPU memory that runs the profile: every required run and one sweep point."""
        run = self.floor_run()
        return run.least_gib() if run is not None else 0.0

    def floor_run(self) -> WorkloadRun | None:
        """The run that sets the floor: the hungriest required run, or the sweep's smallest point."""
        required = [r for r in self.runs if not r.droppable]
        sweep = [r for r in self.runs if r.droppable]
        candidates = required + ([min(sweep, key=WorkloadRun.least_gib)] if sweep else [])
        return max(candidates, key=WorkloadRun.least_gib, default=None)

    def shortfall(self, largest_gib: float, largest_gpu: str) -> str | None:
        """Said when even the largest GPU offered cannot run the profile: what needs what (None: it can)."""
        run = self.floor_run()
        if run is None or run.least_gib() <= largest_gib:
            return None
        levers = [o for o in run.options if o != "none"]
        even = f" even with {OPTION_WORDS[levers[-1]]}" if levers else ""
        return (f"{run.label()} needs {run.least_gib():.1f} GiB per GPU{even}; the largest GPU offered has "
                f"{largest_gib:.1f} GiB ({largest_gpu})")

    def host_value(self) -> str:
        """HT_FIT: `TAG=OPTION:GIB[,OPTION:GIB...]` per run, space-separated (remote/host/fit.py)."""
        return " ".join(f"{r.tag}=" + ",".join(f"{o}:{g:.1f}" for o, g in r.needs().items()) for r in self.runs)

    def largest(self, gpu_ram_mib: float) -> dict[str, dict[Option, int | None]]:
        """Per sweep group (world and compile), the largest micro-batch a GPU of `gpu_ram_mib` holds, as asked and
        with each option HT_ACT_CKPT allows (None: not even 1)."""
        gib = gpu_ram_mib / MIB_PER_GIB
        out: dict[str, dict[Option, int | None]] = {}
        for run in self.runs:
            group = f"dp{run.world} {'compile' if run.compile else 'eager'}"
            if not run.tag.startswith("dp") or group in out:
                continue
            out[group] = {}
            for option in run.options:
                found = run.largest_fitting(gib, (option,), below=MAX_MICRO_BATCH + 1)
                out[group][option] = found[0] if found else None
        return out

    def describe(self) -> list[str]:
        """One line per run: what it is and what each option needs."""
        return [f"{r.tag}: {r.label()} needs " + ", ".join(
            f"{g:.1f} GiB {OPTION_WORDS[o]}" for o, g in r.needs().items()) for r in self.runs]


@lru_cache(maxsize=1024)
def _fit_on(fit: WorkloadFit, gpu_ram_mib: float) -> GpuFit:
    gib = gpu_ram_mib / MIB_PER_GIB
    placements = []
    for run in fit.runs:
        needs = run.needs()
        chosen = next((o for o in run.options if needs[o] <= gib), None)
        if chosen is not None:
            placements.append(Placement(run=run, option=chosen, need_gib=needs[chosen]))
        else:
            placements.append(Placement(run=run, option=None, need_gib=min(needs.values()),
                                        largest=run.largest_fitting(gib)))
    return GpuFit(gpu_gib=gib, placements=tuple(placements))


# --- the settings -----------------------------------------------------------------------------------------


def _uints(env: Mapping[str, str], name: str, example: str) -> list[int]:
    raw = env.get(name, SWEEP_DEFAULTS.get(name, ""))
    words = raw.split()
    if not words or not all(_UINT.match(w) and 1 <= int(w) <= MAX_MICRO_BATCH for w in words):
        raise ConfigError(f"{name}={raw!r}: a list of positive integers separated by spaces (at most "
                          f"{MAX_MICRO_BATCH}), e.g. {name}='{example}'")
    return list(dict.fromkeys(int(w) for w in words))


def _ckpt_mode(env: Mapping[str, str]) -> str:
    mode = env.get("HT_ACT_CKPT", "0").strip().lower()
    if mode not in CKPT_MODES:
        raise ConfigError(f"HT_ACT_CKPT={env['HT_ACT_CKPT']!r}: 0 (never), 1 (always) or auto (where a run needs it)")
    return "1" if "--act-ckpt" in env.get("HT_MFU_EXTRA", "").split() else mode


def _model(world: int, name: str, num_gpus: int) -> ModelShape:
    if world > num_gpus:
        raise ConfigError(f"{name}: world size {world} needs {world} GPUs; the offer has {num_gpus} (--num-gpus)")
    try:
        return load_model_shape(f"{MODEL_PREFIX}{world}")
    except ConfigError:
        raise ConfigError(f"{name}: no model profile for world size {world} (profiles/models/{MODEL_PREFIX}"
                          f"{world}.toml); the 1B runs at 1, 2, 4 or 8") from None


def _knobs(env: Mapping[str, str]) -> tuple[int | None, bool]:
    """The workload knobs the memory depends on: VH_CE_CHUNK (tokens per loss chunk; 0: the profile's) and
    VH_REDUCE_ORDER=rank (remote/knobs.py parses them on the host; refused there if malformed)."""
    raw = env.get("VH_CE_CHUNK", "").strip()
    chunk = int(raw) if _UINT.match(raw) and int(raw) > 0 else None
    return chunk, env.get("VH_REDUCE_ORDER", "").strip().lower() == "rank"


def _reduction(env: Mapping[str, str]) -> Reduction:
    raw = env.get("HT_MFU_REDUCTION", SWEEP_DEFAULTS["HT_MFU_REDUCTION"]).strip()
    for reduction in REDUCTIONS:
        if raw == reduction:
            return reduction
    raise ConfigError(f"HT_MFU_REDUCTION={raw!r}: one of {', '.join(REDUCTIONS)}")


def _round(kind: FitKind, step: str, world: int, model: ModelShape, mode: str,
           knobs: tuple[int | None, bool]) -> WorkloadRun:
    return WorkloadRun(tag="replay" if kind == "mfu-replay" else "proof-round", step=step, model=model, world=world,
                       micro_batch=model.micro_batch, reduction="zero2o", compile=False, options=ROUND_OPTIONS[mode],
                       droppable=False, ce_chunk_tokens=knobs[0], rank_order=knobs[1])


def workload_fit(steps: Iterable[tuple[str, FitKind | None]], env: Mapping[str, str], num_gpus: int
                 ) -> WorkloadFit | None:
    """The fit of a profile whose steps are (name, fit kind) pairs, under the run's settings `env`; None when no
    step declares runs. A malformed setting is a ConfigError naming it (exit 2, before any network call)."""
    declared = [(name, kind) for name, kind in steps if kind is not None]
    if not declared:
        return None
    mode = _ckpt_mode(env)
    knobs = _knobs(env)
    runs: list[WorkloadRun] = []
    for step, kind in declared:
        if kind == "proof-round":
            world = _uints(env, "HT_PROOF_WORLD", "1")
            if len(world) != 1:
                raise ConfigError(f"HT_PROOF_WORLD={env.get('HT_PROOF_WORLD')!r}: one world size, e.g. 2")
            runs.append(_round(kind, step, world[0], _model(world[0], "HT_PROOF_WORLD", num_gpus), mode, knobs))
            continue
        worlds = _uints(env, "HT_MFU_WORLDS", "2")
        if kind == "mfu-replay":
            runs.append(_round(kind, step, worlds[0], _model(worlds[0], "HT_MFU_WORLDS", num_gpus), mode, knobs))
            continue
        mbs = _uints(env, "HT_MFU_MB", "8 16")
        compiles = env.get("HT_MFU_COMPILE", SWEEP_DEFAULTS["HT_MFU_COMPILE"]).split()
        if not compiles or any(c not in ("0", "1") for c in compiles):
            raise ConfigError(f"HT_MFU_COMPILE={env.get('HT_MFU_COMPILE')!r}: 1 (compile), 0 (eager) or both, "
                              "e.g. '1 0'")
        reduction = _reduction(env)
        points = [(w, mb, c == "1") for w in worlds for mb in mbs for c in dict.fromkeys(compiles)]
        for w, mb, compiled in points:
            runs.append(WorkloadRun(tag=f"dp{w}-mb{mb}-{'compile' if compiled else 'eager'}", step=step,
                                    model=_model(w, "HT_MFU_WORLDS", num_gpus), world=w, micro_batch=mb,
                                    reduction=reduction, compile=compiled, options=SWEEP_OPTIONS[mode],
                                    droppable=len(points) > 1, ce_chunk_tokens=knobs[0], rank_order=knobs[1]))
    return WorkloadFit(runs=tuple(runs))
