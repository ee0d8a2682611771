"""Stage.RECEIPT: what the host's GPUs deliver, measured on the host and judged here, after the arrival and
dead-man checks and before any of the user's work (issue 44).

The host runs `vh-receipt` (host/receipt.py) within a budget the cap leaves room for; its record is judged against
the reference table, the offer's advertised figures and the profile's `[receipt]` (host/receipt_judge.py). A host
that fails raises ReceiptFailed, a BootFailed: the rent loop deletes it, proves it gone, excludes its machine and
rents the next offer, all within the caps (run/rent.py). Every second of it is billed at the host's price and
counted against both caps, like any phase; the record says how long it took and what it cost. Each receipt goes
into the run's record and evidence (`receipts/<instance>.json`, as the host sent it) and the machines' history
(state/machines.py), which skips a machine that failed before.
"""

from __future__ import annotations

from vast_harness.errors import BootFailed, CapReachedError, LedgerWriteError, ReceiptFailed, SshTransferError
from vast_harness.evidence.run import RECEIPTS_DIR, write_whole
from vast_harness.host.receipt import ReceiptRead, receipt_payload, run_receipt, upload_payload
from vast_harness.host.receipt_judge import Judgement, OfferFigures, judge
from vast_harness.masking import mask
from vast_harness.records import CreatedInstance, Receipt
from vast_harness.run.state import RunState, Stage
from vast_harness.run.tools import RunTools
from vast_harness.spec.references import shipped_references
from vast_harness.state.machines import MAX_FAILED_KEPT, FailedMeasure, MachineHistory, MachineLine, market_of
from vast_harness.vast.models import Offer

RECEIPT_ENV = "VH_RECEIPT"  # the steps' variable naming the receipt's file on the host (the mfu sweep reads it)


def take_receipt(t: RunTools, s: RunState, inst: CreatedInstance, offer: Offer) -> Receipt:
    """Measure and judge the host; ReceiptFailed when it fails, CapReachedError when the cap leaves no room."""
    s.stage = Stage.RECEIPT
    policy = t.spec.profile.receipt
    base = Receipt(instance_id=inst.instance_id, offer_id=offer.id, machine_id=offer.machine_id,
                   gpu_name=offer.gpu_name, num_gpus=offer.num_gpus, verdict="off", dph_usd=inst.dph_usd,
                   simulated=t.spec.sim, budget_s=policy.budget_s)
    if not policy.enabled:
        s.receipt = base
        return base
    assert s.session is not None
    t.phases.start("receipt")
    t.meter.check("the receipt")
    start, usd_before = t.clock(), t.meter.accrued_usd()
    timings = t.spec.timings
    left_s = t.meter.deadline() - start
    budget_s = round(min(policy.budget_s, left_s - timings.receipt_grace_s), 1)
    if budget_s < timings.receipt_min_s:
        raise CapReachedError(f"{t.meter.cap_reached()} before the receipt of instance {inst.instance_id}: "
                              f"{max(left_s, 0):.0f} s left, it needs at least "
                              f"{timings.receipt_min_s + timings.receipt_grace_s:g} s")
    try:
        upload_payload(s.session, receipt_payload(), deadline=t.meter.deadline(),
                       on_bytes=lambda n: t.meter.add_bytes(up=n), abandon=s.cancelled.is_set)
    except SshTransferError as exc:
        s.check_cancelled()
        if t.meter.cut_by_cap():
            raise CapReachedError(f"cap reached while the receipt's payload went to instance {inst.instance_id}: "
                                  f"{exc}") from exc
        raise BootFailed(f"instance {inst.instance_id}: the receipt's payload could not be sent: {exc}") from exc
    timeout_s = min(budget_s + timings.receipt_grace_s, t.meter.deadline() - t.clock())
    read = run_receipt(s.session, budget_s=budget_s, timeout_s=timeout_s, stop=s.cancelled,
                       on_bytes=lambda n: t.meter.add_bytes(down=n))
    s.check_cancelled()
    wall_s = round(t.clock() - start, 3)
    s.timings["receipt_s"] = wall_s
    if read.timed_out and t.meter.cut_by_cap():
        raise CapReachedError(f"cap reached while instance {inst.instance_id} took its receipt "
                              f"({read.seconds:.1f} s of a {budget_s:g} s budget)")
    if not read.answered and not read.timed_out:  # the link went, not the GPU: a boot failure, not a verdict
        raise BootFailed(f"instance {inst.instance_id} stopped answering during its receipt: {read.problem}")
    judged = _verdict(t, read, offer)
    notes = judged.notes + [f"host: {line}" for line in read.output[-4:] if line.startswith("receipt:")]
    receipt = base.model_copy(update={
        "budget_s": budget_s, "wall_s": wall_s, "billed_usd": round(t.meter.accrued_usd() - usd_before, 6),
        "file": _keep(t, inst, read), "verdict": judged.verdict, "reason": judged.reason, "checks": judged.checks,
        "host_wall_s": judged.host_wall_s, "burn_tflops_total": judged.burn_tflops_total, "notes": notes})
    _remember(t, s, receipt)
    if receipt.verdict == "failed":
        s.receipts_refused.append(receipt)
        t.notify.receipt_failed(inst, [c.line() for c in receipt.failed] or [receipt.reason],
                                gpu_name=offer.gpu_name, num_gpus=offer.num_gpus)  # queued, not waited on
        raise ReceiptFailed(f"instance {inst.instance_id} (offer {offer.id}, machine {offer.machine_id}, "
                            f"{offer.num_gpus}x {offer.gpu_name}) failed its receipt: {receipt.reason}")
    s.receipt = receipt
    if s.work is not None and read.host_path and receipt.verdict == "passed":
        s.work.step_env[RECEIPT_ENV] = read.host_path
    t.out.info(f"{receipt.headline()} in {wall_s:.1f} s (budget {budget_s:g} s), ${receipt.billed_usd:.4f} billed"
               + (" (simulated: from the offer)" if receipt.simulated else ""))
    for line in summary_lines(receipt):
        t.out.info(f"  {line}")
    return receipt


def _verdict(t: RunTools, read: ReceiptRead, offer: Offer) -> Judgement:
    """The judgement of what the host answered: not measured (the image cannot), failed (no usable record, or a
    gate not met), or passed."""
    policy = t.spec.profile.receipt
    if read.not_measured:
        if policy.gates_declared:
            return Judgement(verdict="failed", checks=[], reason=f"the profile gates on "
                             f"{', '.join(policy.declared_gates)} ([receipt]) and this host could not measure: "
                             f"{read.problem}")
        return Judgement(verdict="not_measured", checks=[], reason=read.problem)
    if read.doc is None:
        return Judgement(verdict="failed", checks=[], reason=read.problem or "no record")
    return judge(read.doc, OfferFigures.of(offer), policy, shipped_references())


def _keep(t: RunTools, inst: CreatedInstance, read: ReceiptRead) -> str | None:
    """The host's record as it answered, into the evidence (secrets masked); its path there, or None."""
    if not read.text:
        return None
    name = f"{RECEIPTS_DIR}/{inst.instance_id}.json"
    path = t.ev.dir / name

    def write() -> None:
        path.parent.mkdir(exist_ok=True, mode=0o700)
        write_whole(path, mask(read.text), errors="replace")

    t.ev.guarded(name, write)
    return name if path.is_file() else None


def _remember(t: RunTools, s: RunState, receipt: Receipt) -> None:
    """A line in the machines' history (best effort: said, never raised)."""
    if receipt.machine_id is None or receipt.verdict == "off":
        return
    failed = [FailedMeasure(measure=c.measure, gpu=c.gpu, measured=c.measured, expected=c.expected, unit=c.unit,
                            line=c.line()) for c in receipt.failed[:MAX_FAILED_KEPT]]
    line = MachineLine(event="receipt", api_url=market_of(t.spec.api_url, sim=t.spec.sim), machine_id=receipt.machine_id,
                       offer_id=receipt.offer_id, instance_id=receipt.instance_id, run_id=s.run_id,
                       gpu_name=receipt.gpu_name, num_gpus=receipt.num_gpus, verdict=receipt.verdict,
                       failed=failed, reason=receipt.reason[:500], simulated=receipt.simulated)
    try:
        MachineHistory(t.spec.state_dir).append(line)
    except LedgerWriteError as exc:
        t.out.warn(f"the machines' history was not written ({exc}): machine {receipt.machine_id} is not remembered")


def summary_lines(receipt: Receipt) -> list[str]:
    """Per GPU, the gated figures against their bounds: `GPU 0: matmul 697 TFLOP/s (101% of the reference), ...`."""
    lines = []
    for gpu in sorted({c.gpu for c in receipt.checks if c.gpu is not None}):
        parts = []
        for c in receipt.checks:
            if c.gpu != gpu or c.measured is None or c.against == "rule" or c.measure in ("pcie_link", "spread"):
                continue
            if c.basis and c.expected is not None:
                parts.append(f"{c.measure} {c.measured:.4g} {c.unit} ({c.measured / c.basis:.0%} of "
                             f"{'the reference' if c.against == 'reference' else 'the offer'})")
        if parts:
            lines.append(f"GPU {gpu}: " + ", ".join(parts))
    return lines
