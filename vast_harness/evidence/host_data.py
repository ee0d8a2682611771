"""What a rented host wrote, read tolerantly: the one reader for host-written JSON and the numbers in it.

A host is not trusted. Its `remote/*.json` may hold `"mfu": "abc"`, `10**400` (an int no float holds),
`Infinity`/`NaN` (Python's json accepts them), a 100,000-deep nesting (RecursionError in the parser), or be
huge. None of that may crash a report, the fleet or a later ranking: a file that does not parse is skipped
with the reason, a number that is not finite and in range is `invalid` with the reason, and the figures
derived from it are absent. Standard library only, no harness imports (a leaf, like resources.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

MAX_HOST_JSON_BYTES = 16 * 1024 * 1024  # a workload record is a few KiB; anything this big is not one

# Plausible ranges: outside them a figure is a bug or a lie, never something to rank by.
MFU_RANGE = (0.0, 1.0)
TOKENS_PER_S_RANGE = (0.0, 1e10)
PEAK_TFLOPS_RANGE = (0.0, 1e6)
COUNT_RANGE = (1, 1 << 20)  # world size, micro-batch


class HostNumber(NamedTuple):
    """A host-written number: `value` when finite and in range, else None with `invalid` saying why."""

    value: float | None
    invalid: str = ""  # "" when valid or simply absent


def number(raw: Any, *, low: float, high: float, integer: bool = False, low_inclusive: bool = False) -> HostNumber:
    """Checks a JSON value as a number in (low, high] (or [low, high]); never raises."""
    if raw is None:
        return HostNumber(None)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        return HostNumber(None, f"not a number ({_brief(raw)})")
    if integer and isinstance(raw, float) and not raw.is_integer():
        return HostNumber(None, f"not a whole number ({_brief(raw)})")
    try:
        value = float(raw)
    except OverflowError:  # an int like 10**400
        return HostNumber(None, "out of range (too large for a float)")
    if not math.isfinite(value):
        return HostNumber(None, f"not finite ({value})")
    above_low = value >= low if low_inclusive else value > low
    if not (above_low and value <= high):
        return HostNumber(None, f"out of range ({value:.6g}, expected {'[' if low_inclusive else '('}{low:g}, "
                                f"{high:g}])")
    return HostNumber(value)


def finite_or_none(value: float | None) -> float | None:
    """For JSON the harness writes: never `Infinity`/`NaN` (not JSON, and a later reader's crash)."""
    return value if value is not None and math.isfinite(value) else None


def _brief(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def read_json(path: Path, *, max_bytes: int = MAX_HOST_JSON_BYTES) -> tuple[Any, str]:
    """(the parsed document, "") or (None, why it was not read). Never raises."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return None, f"{size} bytes, over the {max_bytes}-byte limit"
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"unreadable ({type(exc).__name__})"
    try:
        return json.loads(text), ""
    except RecursionError:
        return None, "nested too deeply"
    except ValueError as exc:  # JSONDecodeError, and an int over Python's digit limit
        return None, f"not JSON ({str(exc)[:80]})"


@dataclass
class WorkloadFigures:
    """One workload record (`vast-harness/mfu/*`) with every figure checked; `invalid` lists what was not."""

    name: str
    mfu: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    peak_tflops: float | None = None
    world_size: int | None = None
    micro_batch: int | None = None
    reduction: str | None = None
    compiled: bool | None = None
    attention_backend: str | None = None
    replay_match: bool | None = None
    device: str | None = None
    gpu_name: str | None = None
    invalid: list[str] = field(default_factory=list)


def _text(raw: Any) -> str | None:
    return raw[:200] if isinstance(raw, str) else None


def is_workload_record(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("schema"), str) and doc["schema"].startswith("vast-harness/mfu")


def workload_figures(name: str, doc: dict[str, Any]) -> WorkloadFigures:
    """The checked figures of one workload record. Never raises, whatever the host wrote."""
    w = WorkloadFigures(name=name)

    def checked(key: str, low: float, high: float, *, integer: bool = False) -> float | None:
        n = number(doc.get(key), low=low, high=high, integer=integer)
        if n.invalid:
            w.invalid.append(f"{key}: {n.invalid}")
        return n.value

    w.mfu = checked("mfu", *MFU_RANGE)
    w.tokens_per_s = checked("tokens_per_s", *TOKENS_PER_S_RANGE)
    w.tokens_per_s_per_gpu = checked("tokens_per_s_per_gpu", *TOKENS_PER_S_RANGE)
    w.peak_tflops = checked("peak_tflops", *PEAK_TFLOPS_RANGE)
    world = checked("world_size", COUNT_RANGE[0] - 1, COUNT_RANGE[1], integer=True)
    mb = checked("micro_batch", COUNT_RANGE[0] - 1, COUNT_RANGE[1], integer=True)
    w.world_size = None if world is None else int(world)
    w.micro_batch = None if mb is None else int(mb)
    w.reduction, w.attention_backend, w.device = (_text(doc.get(k)) for k in ("reduction", "attention_backend",
                                                                               "device"))
    flags = doc.get("flags")
    w.compiled = flags.get("compile") if isinstance(flags, dict) and isinstance(flags.get("compile"), bool) else None
    w.replay_match = doc.get("replay_match") if isinstance(doc.get("replay_match"), bool) else None
    versions, ranks = doc.get("versions"), doc.get("ranks")
    gpu = versions.get("gpu_name") if isinstance(versions, dict) else None
    if not isinstance(gpu, str) and isinstance(ranks, list) and ranks and isinstance(ranks[0], dict):
        gpu = ranks[0].get("name")
    w.gpu_name = _text(gpu)
    return w


def load_workloads(directory: Path) -> tuple[list[WorkloadFigures], list[str]]:
    """Every workload record in `directory/*.json`, checked, and one line per file that could not be read."""
    found: list[WorkloadFigures] = []
    unreadable: list[str] = []
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return found, unreadable
    for path in paths:
        doc, problem = read_json(path)
        if problem:
            unreadable.append(f"{path.name}: {problem}")
        elif is_workload_record(doc):
            found.append(workload_figures(path.name, doc))
    return found, unreadable


def json_safe(obj: Any) -> Any:
    """A copy fit for strict JSON: non-finite floats become None (json.dumps would write `Infinity`)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def usd_per_mtok(dph_usd: float | None, tokens_per_s_total: float | None) -> float | None:
    """Dollars per million training tokens: $/h / (tokens/s × 3600 / 1e6)."""
    if not dph_usd or not tokens_per_s_total or tokens_per_s_total <= 0:
        return None
    return dph_usd / (tokens_per_s_total * 3600.0 / 1e6)
