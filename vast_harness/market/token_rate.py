"""`vast-e2e offers --rank-by usd-per-mtok`: rank offers by what a training token costs, before renting.

Measured tokens/s per GPU type come from committed GPU evidence (`.evidence/h200*/**/mfu*.json`, `dp*.json`:
the workload's JSON names the GPU) and from the user's own fleet results (`<evidence-dir>/fleet-*/
fleet-result.json`, real runs only: a simulated run measures a CPU). Per GPU name and world size the fastest
measurement counts. An offer with no measurement for its GPU is ranked after the measured ones, by $/h, and
says so. $/Mtok = $/h / (tokens/s × 3600 / 1e6), tokens/s at the offer's GPU count (a measurement at another
count is scaled per GPU, and says so).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.table import Table

from vast_harness.console.output import Output
from vast_harness.console.terminal import line, safe_cells
from vast_harness.evidence.host_data import (
    TOKENS_PER_S_RANGE,
    is_workload_record,
    number,
    read_json,
    usd_per_mtok,
    workload_figures,
)
from vast_harness.market.offers import Candidate, OfferChoice
from vast_harness.resources import data_root

COMMITTED_GLOBS = (".evidence/h200*/**/mfu*.json", ".evidence/h200*/**/dp*.json")
_IGNORED = {"nvidia", "geforce", "tesla", "hbm3", "hbm3e", "sxm", "sxm4", "sxm5"}
_MEMORY = re.compile(r"^\d+gb$")


def gpu_key(name: str) -> frozenset[str]:
    """Names as offers and drivers spell them, compared by their distinguishing words: 'NVIDIA H100 80GB HBM3'
    and 'H100 SXM' match, 'H100 PCIe' and 'H200 NVL' do not match 'H100'/'H200'."""
    words = re.split(r"[\s_-]+", name.lower().strip())
    return frozenset(w for w in words if w and w not in _IGNORED and not _MEMORY.match(w))


@dataclass
class Measurement:
    gpu_name: str
    world_size: int
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    source: str


def _from_workload_json(path: Path, root: Path) -> Measurement | None:
    doc, _ = read_json(path)
    if not is_workload_record(doc):
        return None
    w = workload_figures(path.name, doc)
    if w.device != "cuda" or not w.gpu_name or w.tokens_per_s is None or w.tokens_per_s_per_gpu is None:
        return None
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    return Measurement(w.gpu_name, w.world_size or 1, w.tokens_per_s, w.tokens_per_s_per_gpu, w.mfu, rel)


def _from_fleet_results(evidence_dir: Path) -> list[Measurement]:
    """Rows of the user's real fleet results; a figure that is not finite and in range is skipped."""
    found = []
    for path in sorted(evidence_dir.glob("fleet-*/fleet-result.json")):
        doc, _ = read_json(path)
        if not isinstance(doc, dict) or doc.get("sim", True) is not False:  # a simulated fleet measured a CPU
            continue
        rows = doc.get("rows")
        for row in rows if isinstance(rows, list) else []:
            if not isinstance(row, dict) or not isinstance(row.get("gpu"), str):
                continue
            tps = number(row.get("tokens_per_s"), low=0.0, high=TOKENS_PER_S_RANGE[1]).value
            per_gpu = number(row.get("tokens_per_s_per_gpu"), low=0.0, high=TOKENS_PER_S_RANGE[1]).value
            if tps is None or per_gpu is None:
                continue
            world = max(1, min(1 << 20, round(tps / per_gpu)))
            mfu = number(row.get("mfu"), low=0.0, high=1.0).value
            found.append(Measurement(row["gpu"][:200], world, tps, per_gpu, mfu, str(path)))
    return found


def load_measurements(evidence_dir: Path | None, root: Path | None = None) -> list[Measurement]:
    """The fastest measurement per (GPU, world size) from committed evidence and the user's fleet results."""
    root = root or data_root()  # the checkout (an installed wheel carries no committed evidence)
    found: list[Measurement] = []
    for pattern in COMMITTED_GLOBS:
        for path in sorted(root.glob(pattern)):
            m = _from_workload_json(path, root)
            if m:
                found.append(m)
    if evidence_dir is not None:
        found += _from_fleet_results(evidence_dir)
    best: dict[tuple[frozenset[str], int], Measurement] = {}
    for m in found:
        k = (gpu_key(m.gpu_name), m.world_size)
        if k not in best or m.tokens_per_s > best[k].tokens_per_s:
            best[k] = m
    return list(best.values())


@dataclass
class RankedOffer:
    candidate: Candidate
    usd_per_mtok: float | None
    tokens_per_s: float | None
    basis: str  # which figure, from where; or why $/h


def rank_by_usd_per_mtok(choice: OfferChoice, measurements: list[Measurement]) -> list[RankedOffer]:
    ranked = []
    for c in choice.ranked:
        key = gpu_key(c.offer.gpu_name)
        same = [m for m in measurements if gpu_key(m.gpu_name) == key]
        exact = [m for m in same if m.world_size == c.offer.num_gpus]
        dph = c.quote.dph_at_disk_usd
        if exact:
            m = max(exact, key=lambda m: m.tokens_per_s)
            tps, basis = m.tokens_per_s, f"{m.gpu_name} ×{m.world_size}: {m.tokens_per_s:,.0f} tok/s ({m.source})"
        elif same:
            m = max(same, key=lambda m: m.tokens_per_s_per_gpu)
            tps = m.tokens_per_s_per_gpu * c.offer.num_gpus
            basis = (f"{m.gpu_name}: {m.tokens_per_s_per_gpu:,.0f} tok/s per GPU × {c.offer.num_gpus} (scaled from "
                     f"×{m.world_size}; {m.source})")
        else:
            ranked.append(RankedOffer(c, None, None, f"no measurement for {c.offer.gpu_name}: ranked by $/h"))
            continue
        ranked.append(RankedOffer(c, usd_per_mtok(dph, tps), tps, basis))
    return sorted(ranked, key=lambda r: (r.usd_per_mtok is None, r.usd_per_mtok or 0.0,
                                         r.candidate.quote.dph_at_disk_usd))


def print_ranked(out: Output, ranked: list[RankedOffer], measurements: list[Measurement]) -> None:
    if out.json_mode:
        out.emit_json({"rank_by": "usd-per-mtok", "ranked": [
            {"id": r.candidate.offer.id, "gpu": r.candidate.offer.gpu_name, "n": r.candidate.offer.num_gpus,
             "dph": round(r.candidate.quote.dph_at_disk_usd, 4), "tokens_per_s": r.tokens_per_s,
             "usd_per_mtok": None if r.usd_per_mtok is None else round(r.usd_per_mtok, 6), "basis": r.basis,
             "worst_case_usd": round(r.candidate.quote.worst_case_usd, 4)} for r in ranked],
            "measurements": [asdict(m) for m in measurements]})
        return
    t = Table(title=f"Offers ranked by $ per million training tokens ({len(ranked)})", header_style="bold")
    for col in ("rank", "id", "GPU", "n", "$/h", "tok/s", "$/Mtok", "basis"):
        t.add_column(col, overflow="fold")
    for i, r in enumerate(ranked, 1):
        o = r.candidate.offer
        t.add_row(*safe_cells(i, o.id, o.gpu_name, o.num_gpus, f"{r.candidate.quote.dph_at_disk_usd:.4f}",
                              "–" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}",
                              "–" if r.usd_per_mtok is None else f"{r.usd_per_mtok:.4f}", r.basis))
    out.out.print(t)
    unmeasured = sorted({r.candidate.offer.gpu_name for r in ranked if r.usd_per_mtok is None})
    if unmeasured:
        out.out.print(line((f"No measured tokens/s for {', '.join(unmeasured)}: those offers are ranked after the "
                            "measured ones, by $/h.", "yellow")))
    out.out.print(line((f"{len(measurements)} measurement(s) considered (fastest per GPU and GPU count), from "
                        "committed evidence (.evidence/h200*) and this evidence directory's real fleet results.", "dim")))
