"""Judge a host's receipt: its figures against the reference table, the offer's own advertised figures and the
rules of the profile's `[receipt]` (spec/receipt.py), each comparison a `ReceiptCheck`. Pure: the receipt is a
parsed JSON document the host wrote (hostile text in: every number through `evidence.host_data.number`), the
offer's figures and the policy come in, the verdict goes out; the harness never trusts the host's own verdict.

What can be compared with what, and the defaults, are spec/receipt.py's `MEASURES`; a GPU with no reference is
recorded, never failed; a measure a GPU cannot report (ECC on a GeForce card, clock-event reasons on an old
driver) is `not_measured`, never failed. A gated figure that a GPU with torch must be able to produce (matmul,
burn, the copies) and did not is a failure: the receipt broke on that GPU.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from vast_harness.evidence.host_data import number
from vast_harness.records import ReceiptCheck, ReceiptVerdict
from vast_harness.spec.receipt import MEASURES, MeasureRule, ReceiptPolicy
from vast_harness.spec.references import References
from vast_harness.vast.models import Offer

SCHEMA, VERSION = "vh-receipt", 1  # what remote/receipt writes
MAX_FIGURE = 1e7  # TFLOP/s or GB/s: anything above is not a measurement
# Gated figures every GPU with a working torch produces: missing, the receipt broke on that GPU.
MUST_MEASURE = ("matmul", "burn", "hbm_copy", "h2d", "d2h")
# Clock-event reasons that mean the GPU delivers less than it should (remote/receipt/smi.py BAD_EVENT_REASONS).
BAD_EVENT_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


class OfferFigures(BaseModel):
    """What the offer advertised, as the receipt compares it: Vast's own figures for the host."""

    gpu_name: str
    num_gpus: int
    pcie_bw_gbps: float | None = None  # CPU to GPU (search_offers.yaml)
    pci_gen: float | None = None
    gpu_mem_bw_gbps: float | None = None
    total_flops: float | None = None  # summed over the GPUs; precision undocumented
    bw_nvlink_gbps: float | None = None

    @classmethod
    def of(cls, offer: Offer) -> OfferFigures:
        return cls(gpu_name=offer.gpu_name, num_gpus=offer.num_gpus, pcie_bw_gbps=offer.pcie_bw_gbps,
                   pci_gen=offer.pci_gen, gpu_mem_bw_gbps=offer.gpu_mem_bw_gbps, total_flops=offer.total_flops,
                   bw_nvlink_gbps=offer.bw_nvlink_gbps)

    def advertised(self, field: str) -> float | None:
        """A positive figure, else None (an offer that says 0 or nothing advertised nothing to compare with)."""
        value = getattr(self, field)
        return value if isinstance(value, int | float) and 0 < value < MAX_FIGURE else None


class Judgement(BaseModel):
    verdict: ReceiptVerdict
    checks: list[ReceiptCheck]
    reason: str = ""
    burn_tflops_total: float | None = None
    host_wall_s: float | None = None
    notes: list[str] = []


def _figure(raw: Any) -> float | None:
    return number(raw, low=0.0, high=MAX_FIGURE).value


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _at(doc: Any, *path: str) -> Any:
    for key in path:
        doc = _dict(doc).get(key)
    return doc


class _Checks:
    """The checks of one receipt, made in order; `compare` is the one place a figure meets its bound."""

    def __init__(self, policy: ReceiptPolicy) -> None:
        self.policy = policy
        self.rows: list[ReceiptCheck] = []

    def rule(self, measure: str) -> MeasureRule | None:
        rule = self.policy.rule(measure)
        return None if rule.action == "off" else rule

    def compare(self, measure: str, gpu: int | None, against: str, measured: float | None, *,
                basis: float | None, fraction: float | None, source: str, at_most: bool = False,
                unit: str | None = None, missing: str = "") -> None:
        rule = self.rule(measure)
        if rule is None:
            return
        expected = None if basis is None or fraction is None else round(basis * fraction, 4)
        gate = rule.action == "gate"
        row = ReceiptCheck(measure=measure, gpu=gpu, against=against, measured=measured,  # type: ignore[arg-type]
                           expected=expected, basis=basis, fraction=fraction,
                           unit=MEASURES[measure].unit if unit is None else unit, source=source,
                           action="gate" if gate else "record", at_most=at_most)
        if measured is None:
            must = gate and expected is not None and measure in MUST_MEASURE
            row.verdict = "fail" if must else "not_measured"
            row.detail = f"not measured{': ' + missing if missing else ''}"
        elif expected is None:
            row.verdict = "shown"
        else:
            ok = measured <= expected if at_most else measured >= expected
            if gate:
                row.verdict = "pass" if ok else "fail"
            else:
                row.verdict = "shown"
                row.detail = "" if ok else "past the bound: recorded only"
        self.rows.append(row)


def judge(doc: Any, offer: OfferFigures, policy: ReceiptPolicy, refs: References) -> Judgement:
    """The host's receipt `doc` judged; a document that is not a receipt fails (the host broke or lied)."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA or doc.get("version") != VERSION:
        what = f"schema {_dict(doc).get('schema')!r} version {_dict(doc).get('version')!r}" if isinstance(doc, dict) \
            else "not a JSON object"
        return Judgement(verdict="failed", checks=[], reason=f"not a receipt ({what})")
    gpus = [g for g in doc.get("gpus") or [] if isinstance(g, dict)] if isinstance(doc.get("gpus"), list) else []
    notes = [str(n)[:300] for n in doc.get("notes") or [] if isinstance(n, str)][:20] \
        if isinstance(doc.get("notes"), list) else []
    wall = number(doc.get("wall_s"), low=0.0, high=1e6).value
    if doc.get("error") or not gpus:
        why = str(doc.get("error") or "no GPU measured")[:500]
        return Judgement(verdict="failed", checks=[], reason=f"the receipt broke on the host: {why}",
                         host_wall_s=wall, notes=notes)
    if len(gpus) != offer.num_gpus:
        return Judgement(verdict="failed", checks=[], host_wall_s=wall, notes=notes,
                         reason=f"the receipt measured {len(gpus)} GPU(s), the offer has {offer.num_gpus}")
    c = _Checks(policy)
    for i, g in enumerate(gpus):
        _gpu_checks(c, i, g, offer, refs)
    burns = [_figure(_at(g, "burn", "tflops_median")) for g in gpus]
    if len(gpus) > 1:
        _host_checks(c, doc, burns, offer)
    total = round(sum(b for b in burns if b is not None), 2) if all(b is not None for b in burns) else None
    failed = [row for row in c.rows if row.verdict == "fail"]
    return Judgement(verdict="failed" if failed else "passed", checks=c.rows, burn_tflops_total=total,
                     reason="; ".join(row.line() for row in failed), host_wall_s=wall, notes=notes)


def _reference_source(refs: References, offer: OfferFigures, measure: str) -> tuple[float | None, str]:
    row = refs.for_gpu(offer.gpu_name)
    ref = row.measure(measure) if row else None
    if ref is not None and ref.value is not None:
        return ref.value, ref.source or ""
    public = f"; public {ref.public:g} {ref.unit} ({ref.public_source}): shown only" if ref and ref.public else ""
    return None, f"no reference of this receipt's method for {offer.gpu_name}{public}: recorded, never failed"


def _gpu_checks(c: _Checks, i: int, g: dict[str, Any], offer: OfferFigures, refs: References) -> None:
    n = max(1, offer.num_gpus)
    figures = {"matmul": _figure(_at(g, "matmul", "tflops")), "burn": _figure(_at(g, "burn", "tflops_median")),
               "hbm_copy": _figure(_at(g, "hbm_copy", "median")), "h2d": _figure(_at(g, "h2d", "median")),
               "d2h": _figure(_at(g, "d2h", "median"))}
    shapes = _at(g, "matmul", "shapes")
    shape_errors = [s.get("error") for s in shapes if isinstance(s, dict) and s.get("error")] \
        if isinstance(shapes, list) else []
    errors = {"matmul": shape_errors[0] if shape_errors else None, "burn": _at(g, "burn", "error"),
              "hbm_copy": _at(g, "hbm_copy", "error"), "h2d": _at(g, "h2d", "error"), "d2h": _at(g, "d2h", "error")}
    link = _dict(g.get("pcie_link"))
    gen_max, width_max = (number(link.get(k), low=0, high=64).value for k in ("gen_max", "width_max"))
    gen_load, width_load = (number(link.get(k), low=0, high=64).value for k in ("gen_under_load",
                                                                                "width_under_load"))
    link_refs = refs.for_link(int(gen_max) if gen_max else None, int(width_max) if width_max else None)
    offer_basis = {"matmul": (offer.advertised("total_flops"), "total_flops"),
                   "hbm_copy": (offer.advertised("gpu_mem_bw_gbps"), "gpu_mem_bw"),
                   "h2d": (offer.advertised("pcie_bw_gbps"), "pcie_bw"),  # CPU to GPU (search_offers.yaml)
                   "d2h": (offer.advertised("pcie_bw_gbps"), "pcie_bw")}  # the same link, the other way
    for measure, measured in figures.items():
        rule = c.rule(measure)
        if rule is None:
            continue
        missing = str(errors.get(measure) or "")[:200]
        if measure in ("h2d", "d2h"):
            lref = link_refs.measure(measure) if link_refs else None
            basis = lref.value if lref else None
            source = (lref.source or "") if lref and lref.value else \
                f"no reference for a Gen{int(gen_max or 0)} x{int(width_max or 0)} link"
        else:
            basis, source = _reference_source(refs, offer, measure)
        c.compare(measure, i, "reference", measured, basis=basis, fraction=rule.min_of_reference, source=source,
                  missing=missing)
        if measure in offer_basis:
            value, field = offer_basis[measure]
            per_gpu = value / n if value is not None and measure == "matmul" else value
            c.compare(measure, i, "offer", measured, basis=per_gpu, fraction=rule.min_of_offer, missing=missing,
                      source=f"the offer's {field}" + (" per GPU" if measure == "matmul" else "")
                      if per_gpu is not None else f"the offer advertises no {field}")
    if c.rule("pcie_link") is not None:
        read = link.get("sampler_error") or (f"{link.get('samples')} samples" if link else "not read")
        c.compare("pcie_link", i, "rule", gen_load, basis=gen_max, fraction=1.0 if gen_max else None, unit="gen",
                  source="the generation the driver reports as the link's most", missing=str(read)[:200])
        c.compare("pcie_link", i, "rule", width_load, basis=width_max, fraction=1.0 if width_max else None,
                  unit="lanes", source="the width the driver reports as the link's most", missing=str(read)[:200])
        pci_gen = offer.advertised("pci_gen")
        c.compare("pcie_link", i, "offer", gen_load, basis=pci_gen, fraction=1.0 if pci_gen else None, unit="gen",
                  source="the offer's pci_gen" if pci_gen else "the offer advertises no pci_gen")
    if c.rule("ecc") is not None:
        _ecc_check(c, i, g)
    rule = c.rule("throttle")
    if rule is not None:
        burn = _dict(g.get("burn"))
        shares = _dict(burn.get("event_reasons_share"))
        bad = {k: number(shares.get(k), low=0, high=1, low_inclusive=True).value or 0.0 for k in BAD_EVENT_REASONS}
        worst = max(bad, key=lambda k: bad[k])
        measured = bad[worst] if burn.get("event_reasons_read") is True else None
        c.compare("throttle", i, "rule", measured, basis=1.0, fraction=rule.max_share, at_most=True,
                  source=f"samples of the burn with {worst if bad[worst] else 'a HW or thermal slowdown'} active"
                  + (f" (a SW power cap in {number(shares.get('sw_power_cap'), low=0, high=1).value:.0%}: normal)"
                     if number(shares.get("sw_power_cap"), low=0, high=1).value else ""),
                  missing="this driver reports no clock-event reasons")


def _ecc_check(c: _Checks, i: int, g: dict[str, Any]) -> None:
    after, before, remap = _dict(g.get("ecc_after")), _dict(g.get("ecc_before")), _dict(g.get("remap"))
    mode = after.get("ecc.mode.current")
    errors = [number(d.get("ecc.errors.uncorrected.volatile.total"), low=0, high=1e12, low_inclusive=True).value
              for d in (before, after)]
    remap_bad = [k for k in ("remapped_rows.failure", "remapped_rows.pending") if str(remap.get(k)).lower() == "yes"]
    if mode != "Enabled" or errors[1] is None:
        c.compare("ecc", i, "rule", None, basis=0.0, fraction=1.0, at_most=True, source="no uncorrectable error",
                  missing=f"ECC mode {mode or 'not reported'}")
        return
    measured = max(e for e in errors if e is not None) + (1.0 if remap_bad else 0.0)
    c.compare("ecc", i, "rule", measured, basis=0.0, fraction=1.0, at_most=True,
              source="uncorrectable volatile ECC errors" + (f", {', '.join(remap_bad)}" if remap_bad else "")
              + ": none allowed")


def _host_checks(c: _Checks, doc: dict[str, Any], burns: list[float | None], offer: OfferFigures) -> None:
    rule = c.rule("spread")
    known = [b for b in burns if b is not None]
    if rule is not None and known:
        best = max(known)
        for i, b in enumerate(burns):
            c.compare("spread", i, "best_gpu", b, basis=best, fraction=rule.min_of_best,
                      source="the sustained burn of the host's best GPU", unit="TFLOP/s")
    rule = c.rule("p2p")
    if rule is not None:
        pairs = [p for p in doc.get("p2p") or [] if isinstance(p, dict)] if isinstance(doc.get("p2p"), list) else []
        rates = [_figure(p.get("gbps")) for p in pairs]
        slowest = min((r for r in rates if r is not None), default=None)
        nvlink = offer.advertised("bw_nvlink_gbps")
        c.compare("p2p", None, "offer", slowest, basis=nvlink, fraction=rule.min_of_offer,
                  source="the offer's bw_nvlink" if nvlink else "the offer advertises no bw_nvlink",
                  missing="no GPU pair measured")
    if c.rule("allreduce") is not None:
        ar = _dict(doc.get("allreduce"))
        busbw = _figure(ar.get("busbw_gbps"))
        correct = ar.get("correct") is True
        c.compare("allreduce", None, "rule", busbw if correct else None, basis=None, fraction=None,
                  source="the all-reduce's bus bandwidth", missing=str(ar.get("error") or "no correct sum")[:200])
        if ar and not correct and c.rows[-1].action == "gate":  # a wrong sum is a broken host, whatever its speed
            c.rows[-1].verdict = "fail"
            c.rows[-1].detail = f"the all-reduce's sum was wrong or it did not finish ({ar.get('error') or 'wrong'})"
