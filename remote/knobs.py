"""Every `VH_*` environment variable the workload reads: parsed once, typed and documented, in this module only.

The variables are grouped by the part that reads them, one frozen dataclass each: `kernels()`, `training()`,
`mps()` and `host()`. An area is parsed on first use and kept for the process; a bad value raises `KnobError`
naming the variable and what it takes, and so does an unknown variable under a prefix the workload owns
(`VH_CE_BLOK` would otherwise change nothing, silently). Areas are parsed apart so that a process reading
one (an MPS client proving its attachment) is not stopped by a typo in another; `check_all()` parses every
area where a run starts (`remote.training.train`: exit 2 before any work). `reload()` forgets what was parsed
(tests change the environment between cases); `override()` replaces values inside a block (the kernel bench
times each `VH_MLP_*` setting in one process).

Nothing else in `remote/` spells a `VH_` name (`tests/remote/test_knobs.py` scans for one), so this file is
the complete list. The harness's user-facing `HT_*` variables are read by `scripts/vast_mfu_remote.sh`, a
shell script, and stay there; `remote.host.fit` reads `HT_FIT` (the harness's memory-fit decisions) and
`HT_ACT_CKPT`. Standard library only: `remote.mps` and `remote.checks` import it too.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal, TypeVar

KERNEL_PREFIXES = ("VH_KERNELS", "VH_CE_", "VH_SWIGLU_", "VH_ADAMW_", "VH_NORM_", "VH_ROPE_", "VH_MLP_")
"""The kernel knobs' names start with one of these: a run whose environment holds one did not run with the
profile's settings (`remote.checks.mfu` refuses such a run as a bench's `ours`)."""
MPS_MODE = "VH_MPS_MODE"
MPS_CLIENT_DIR = "VH_MPS_CLIENT_DIR"
MASKED_ENV = "VH_MASKED_ENV"


class KnobError(ValueError):
    """A `VH_*` variable holds a value it cannot take, or names a knob that does not exist."""


# --- parsers: (variable name, raw value) -> typed value, or KnobError naming both -----------------------


def _int(name: str, raw: str) -> int:
    try:
        return int(raw.strip())
    except ValueError:
        raise KnobError(f"{name}={raw!r} is not an integer") from None


def _count(name: str, raw: str) -> int:
    value = _int(name, raw)
    if value < 0:
        raise KnobError(f"{name}={raw!r} must be >= 0")
    return value


def _positive(name: str, raw: str) -> int:
    value = _int(name, raw)
    if value < 1:
        raise KnobError(f"{name}={raw!r} must be >= 1")
    return value


def _pow2(name: str, raw: str) -> int:
    """Tile sizes and warp counts: Triton's `tl.arange` and launch need a power of two."""
    value = _int(name, raw)
    if value < 1 or value & (value - 1):
        raise KnobError(f"{name}={raw!r} must be a power of two (1, 2, 4, ...)")
    return value


def _flag(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "on", "yes"):
        return True
    if value in ("0", "false", "off", "no"):
        return False
    raise KnobError(f"{name}={raw!r}: expected 1/0 (or true/false, on/off, yes/no)")


def _choice(*options: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in options:
            raise KnobError(f"{name}={raw!r}; known: {', '.join(options)}")
        return value

    return parse


def _text(name: str, raw: str) -> str:
    return raw


def _words(name: str, raw: str) -> frozenset[str]:
    return frozenset(raw.split())


MLP_CHECK_GROUPS = ("untuned", "tuned", "fused-tuned")


def _mlp_check(name: str, raw: str) -> tuple[str, ...]:
    groups = tuple(g.strip() for g in raw.split(",") if g.strip())
    unknown = [g for g in groups if g not in MLP_CHECK_GROUPS]
    if unknown or not groups:
        raise KnobError(f"{name}={raw!r}: a comma list of {', '.join(MLP_CHECK_GROUPS)}")
    return groups


@dataclass(frozen=True)
class KernelSelection:
    """`VH_KERNELS` as given: the default set or not, plus names. Which names exist is the kernel registry's
    knowledge (`remote.kernels.registry`), so `resolve` checks them against the list it is handed."""

    default: bool = True
    names: frozenset[str] = frozenset()

    def resolve(self, known: tuple[str, ...], default: tuple[str, ...]) -> frozenset[str]:
        unknown = sorted(self.names - set(known))
        if unknown:
            raise KnobError(f"VH_KERNELS names unknown kernel(s) {unknown}; known: {', '.join(known)}, all, none")
        return (frozenset(default) if self.default else frozenset()) | self.names


def _selection(name: str, raw: str) -> KernelSelection:
    value = raw.strip().lower()
    if value in ("", "none", "off", "0"):
        return KernelSelection(default=False)
    if value in ("all", "on", "1"):
        return KernelSelection()
    names = {n.strip() for n in value.split(",") if n.strip()}
    return KernelSelection(default="all" in names, names=frozenset(names - {"all"}))  # `all,mlp`: default + mlp


def _knob(env: str, parse: Callable[[str, str], Any], default: Any, *, empty_is_value: bool = False) -> Any:
    """A dataclass field read from `env` (unset, or empty unless `empty_is_value`: the default)."""
    return field(default=default, metadata={"env": env, "parse": parse, "empty_is_value": empty_is_value})


Area = TypeVar("Area", bound="_Area")


@dataclass(frozen=True)
class _Area:
    PREFIXES: ClassVar[tuple[str, ...]]
    """Every variable whose name starts with one of these belongs to the area (an unknown one is an error)."""

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """Field name -> its variable."""
        return {f.name: f.metadata["env"] for f in fields(cls)}

    @classmethod
    def from_env(cls: type[Area], environ: Mapping[str, str]) -> Area:
        by_env = {f.metadata["env"]: f for f in fields(cls)}
        unknown = sorted(k for k in environ if k.startswith(cls.PREFIXES) and k not in by_env)
        if unknown:
            raise KnobError(f"{', '.join(unknown)}: no such knob; the workload reads {', '.join(sorted(by_env))}")
        values: dict[str, Any] = {}
        for env, f in by_env.items():
            raw = environ.get(env)
            if raw is None or (not raw.strip() and not f.metadata["empty_is_value"]):
                continue
            values[f.name] = f.metadata["parse"](env, raw)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class KernelKnobs(_Area):
    """The hand-written kernels (`remote.kernels`): which run, and how each is launched on the GPU.

    The launch knobs set the GPU launch only: on CPU (tests, under Triton's interpreter) each kernel uses wide
    tiles of its own, since the interpreter pays per program."""

    PREFIXES: ClassVar[tuple[str, ...]] = KERNEL_PREFIXES

    selection: KernelSelection = _knob("VH_KERNELS", _selection, KernelSelection(), empty_is_value=True)
    """VH_KERNELS: a comma list of kernel names, `all` (the default set; `all,NAME` adds an opt-in kernel) or
    `none` (also empty, `off`, `0`). The names are the registry's (`python -m remote.kernels.registry`)."""
    on_cpu: bool = _knob("VH_KERNELS_CPU", _flag, False)
    """VH_KERNELS_CPU=1: with TRITON_INTERPRET=1, run the Triton kernels on CPU tensors (tests only)."""
    ce_chunk: int = _knob("VH_CE_CHUNK", _count, 0)
    """VH_CE_CHUNK: tokens per loss chunk (0 or unset: the profile's `ce_chunk_tokens`)."""
    ce_rows: int = _knob("VH_CE_ROWS", _pow2, 1)
    """VH_CE_ROWS: logit rows per program of the loss kernel."""
    ce_block: int = _knob("VH_CE_BLOCK", _pow2, 4096)
    """VH_CE_BLOCK: vocabulary columns per tile of the loss kernel."""
    ce_warps: int = _knob("VH_CE_WARPS", _pow2, 8)
    """VH_CE_WARPS: warps per program of the loss kernel."""
    ce_programs: int = _knob("VH_CE_PROGRAMS", _count, 0)
    """VH_CE_PROGRAMS: a persistent grid of this many programs (0: one program per row tile)."""
    swiglu_rows: int = _knob("VH_SWIGLU_ROWS", _pow2, 1)
    """VH_SWIGLU_ROWS: rows per program of the SwiGLU kernels."""
    swiglu_block: int = _knob("VH_SWIGLU_BLOCK", _pow2, 1024)
    """VH_SWIGLU_BLOCK: columns per program of the SwiGLU kernels."""
    swiglu_warps: int = _knob("VH_SWIGLU_WARPS", _pow2, 4)
    """VH_SWIGLU_WARPS: warps per program of the SwiGLU kernels."""
    adamw_block: int = _knob("VH_ADAMW_BLOCK", _pow2, 2048)
    """VH_ADAMW_BLOCK: elements per program of the fused AdamW."""
    adamw_warps: int = _knob("VH_ADAMW_WARPS", _pow2, 8)
    """VH_ADAMW_WARPS: warps per program of the fused AdamW."""
    norm_rows: int = _knob("VH_NORM_ROWS", _pow2, 1)
    """VH_NORM_ROWS: rows per program of the RMSNorm forward."""
    norm_warps: int = _knob("VH_NORM_WARPS", _pow2, 8)
    """VH_NORM_WARPS: warps per program of the RMSNorm kernels."""
    norm_bwd_rows: int = _knob("VH_NORM_BWD_ROWS", _pow2, 1)
    """VH_NORM_BWD_ROWS: rows per loop iteration of the RMSNorm backward."""
    norm_programs: int = _knob("VH_NORM_PROGRAMS", _count, 0)
    """VH_NORM_PROGRAMS: programs of the RMSNorm backward, each owning a block of rows (0: 4 per SM)."""
    rope_tokens: int = _knob("VH_ROPE_TOKENS", _pow2, 1)
    """VH_ROPE_TOKENS: tokens per program of the RoPE kernel."""
    rope_warps: int = _knob("VH_ROPE_WARPS", _pow2, 4)
    """VH_ROPE_WARPS: warps per program of the RoPE kernel."""
    mlp_gemms: Literal["fused", "all"] = _knob("VH_MLP_GEMMS", _choice("fused", "all"), "fused")
    """VH_MLP_GEMMS: `fused` runs quack for the two GEMMs with an epilogue and cuBLAS for the other four; `all`
    runs all six MLP GEMMs on quack."""
    mlp_tuned: bool = _knob("VH_MLP_TUNED", _flag, False)
    """VH_MLP_TUNED=1: quack autotunes its GEMM configs per shape (never under deterministic algorithms: a timed
    choice may differ between a run and its replay)."""
    mlp_check: tuple[str, ...] = _knob("VH_MLP_CHECK", _mlp_check, ("untuned", "tuned"))
    """VH_MLP_CHECK: which groups of mlp settings `python -m remote.kernels.check` times (untuned, tuned,
    fused-tuned)."""

    def chunk_tokens(self, profile_default: int) -> int:
        return self.ce_chunk or profile_default


@dataclass(frozen=True, kw_only=True)
class TrainingKnobs(_Area):
    """The training round (`remote.training`): the reduction's add order and profiling."""

    PREFIXES: ClassVar[tuple[str, ...]] = ("VH_REDUCE_ORDER", "VH_TORCH_")

    reduce_order: Literal["rank", "backend"] | None = _knob("VH_REDUCE_ORDER", _choice("rank", "backend"), None)
    """VH_REDUCE_ORDER: the zero2 owner reduction's add order, `rank` or `backend` (unset: rank under gloo,
    backend under NCCL; docs/mfu.md says what each guarantees)."""
    profile_out: str | None = _knob("VH_TORCH_PROFILE_OUT", _text, None)
    """VH_TORCH_PROFILE_OUT=FILE: profile the last steps with torch.profiler, a per-op table appended to FILE
    (rank 0; it perturbs the timed steps)."""
    profile_steps: int = _knob("VH_TORCH_PROFILE_STEPS", _positive, 2)
    """VH_TORCH_PROFILE_STEPS: how many of the last steps the profiler covers."""
    trace_out: str | None = _knob("VH_TORCH_TRACE_OUT", _text, None)
    """VH_TORCH_TRACE_OUT=FILE: also write the profiled steps' Chrome trace (`remote.accounting.steptrace`
    splits it by step)."""


@dataclass(frozen=True, kw_only=True)
class MpsKnobs(_Area):
    """CUDA MPS (`remote.mps`): set by the wrapper for the command it runs, read by every CUDA process in it."""

    PREFIXES: ClassVar[tuple[str, ...]] = ("VH_MPS_",)

    mode: Literal["on", "off"] | None = _knob(MPS_MODE, _choice("on", "off"), None)
    """VH_MPS_MODE: `on` under `python -m remote.mps` (each CUDA process must prove it attached), `off` (it must
    prove it did not); unset: the training round does not check."""
    client_dir: str | None = _knob(MPS_CLIENT_DIR, _text, None)
    """VH_MPS_CLIENT_DIR: where each process writes its attachment record for the wrapper to cross-check."""
    control_bin: str | None = _knob("VH_MPS_CONTROL_BIN", _text, None)
    """VH_MPS_CONTROL_BIN: the nvidia-cuda-mps-control binary, when it is not on PATH or in the driver dirs."""


@dataclass(frozen=True, kw_only=True)
class HostKnobs(_Area):
    """What the harness tells the host about the run (`remote.host`)."""

    PREFIXES: ClassVar[tuple[str, ...]] = (MASKED_ENV,)

    masked_env: frozenset[str] = _knob(MASKED_ENV, _words, frozenset())
    """VH_MASKED_ENV: space-separated names of the run's `--remote-secret` variables, whose values evidence
    records as "***" (set by the harness)."""


AREAS: tuple[type[_Area], ...] = (KernelKnobs, TrainingKnobs, MpsKnobs, HostKnobs)
_PARSED: dict[type[_Area], _Area] = {}


def _get(area: type[Area]) -> Area:
    if area not in _PARSED:
        _PARSED[area] = area.from_env(os.environ)
    value = _PARSED[area]
    assert isinstance(value, area)
    return value


def kernels() -> KernelKnobs:
    return _get(KernelKnobs)


def training() -> TrainingKnobs:
    return _get(TrainingKnobs)


def mps() -> MpsKnobs:
    return _get(MpsKnobs)


def host() -> HostKnobs:
    return _get(HostKnobs)


def check_all() -> None:
    """Parse every area now: a bad value stops here, not halfway through a run."""
    for area in AREAS:
        _get(area)


def reload() -> None:
    """Forget what was parsed: the next read sees the environment as it is then."""
    _PARSED.clear()


@contextmanager
def override(**changes: Any) -> Iterator[None]:
    """Inside the block, the fields named (as in the areas: `mlp_gemms="all"`) read as given."""
    saved = dict(_PARSED)
    try:
        for area in AREAS:
            mine = {k: v for k, v in changes.items() if k in area.env_names()}
            if mine:
                _PARSED[area] = dataclasses.replace(_get(area), **mine)
        unknown = set(changes) - {n for area in AREAS for n in area.env_names()}
        if unknown:
            raise TypeError(f"override: no knob field(s) {sorted(unknown)}")
        yield
    finally:
        _PARSED.clear()
        _PARSED.update(saved)


def given(*areas: type[_Area], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of these areas (every area when none is named) as set in the environment, unparsed and
    sorted by name: what evidence records, even a value the parse would refuse."""
    env = os.environ if environ is None else environ
    prefixes = tuple(p for area in (areas or AREAS) for p in area.PREFIXES)
    return {k: v for k, v in sorted(env.items()) if k.startswith(prefixes)}


def mps_client_env(client_dir: str) -> dict[str, str]:
    """What the MPS wrapper adds to its command's environment: every CUDA process proves it attached."""
    return {MPS_MODE: "on", MPS_CLIENT_DIR: client_dir}


def mps_mode_env(mode: Literal["on", "off"]) -> dict[str, str]:
    """The MPS mode for a child process (the MPS benchmark's arms)."""
    return {MPS_MODE: mode}


def names() -> list[str]:
    """Every variable the workload reads, sorted."""
    return sorted(env for area in AREAS for env in area.env_names().values())


def describe() -> str:
    """One line per variable with its documentation (`python -m remote.knobs`)."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for area in AREAS:
        tree = ast.parse(textwrap.dedent(inspect.getsource(area)))
        body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
        for node, nxt in zip(body, body[1:], strict=False):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
                docs[area.env_names().get(node.target.id, "")] = " ".join(str(nxt.value.value).split())
    return "\n".join(docs.get(name, name) for name in names())


if __name__ == "__main__":
    print(describe())
