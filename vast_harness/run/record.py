"""The run record (harness-result.json), built in one place from the run's tools and state."""

from __future__ import annotations

import dataclasses
import platform
import sys

from vast_harness.caps.meter import minimum_cap_s, usd_up
from vast_harness.evidence.run import overall_absence
from vast_harness.market.plan import offer_summary
from vast_harness.records import ByteCounts, HostKeyRecord, RecordCaps, RunRecord
from vast_harness.run.state import RunState
from vast_harness.run.tools import RunTools
from vast_harness.run.verdict import ExitFacts


def exit_facts(t: RunTools) -> ExitFacts:
    """What the exit-code decision reads, read now (a write that fails later is named by a later read)."""
    return ExitFacts(unproven=t.book.unproven(), unresolved=sorted(t.book.unresolved), vanished=dict(t.book.vanished),
                     left_alone=dict(t.book.left_alone),
                     over_cap=t.meter.over_cap(), write_failures=write_failures(t),
                     unqualified_ok=t.spec.unqualified_ok)


def write_failures(t: RunTools) -> list[str]:
    """Every evidence or ledger write that did not reach the disk (each keeps its own list of them)."""
    return t.ev.write_failures + [f"ledger {f}" for f in t.ledger.write_failures]


def build_record(t: RunTools, s: RunState, code: int, message: str) -> RunRecord:
    spec, plan, meter, session = t.spec, s.plan, t.meter, s.session
    cand = s.candidate or (plan.chosen if plan else None)
    steps = s.steps_before + (s.work.steps if s.work else [])
    workload_s = sum(step.seconds for step in steps if step.workload)
    return RunRecord(
        run_id=s.run_id, profile=spec.profile.name, image=spec.profile.image, api_url=spec.api_url,
        sim=spec.sim, offer=offer_summary(cand) if cand else None,  # the offer whose host came up, once one did
        driver_qualified=cand.driver_qualified if cand else None, any_driver=spec.any_driver,
        caps=RecordCaps(max_usd=spec.caps.max_usd, max_minutes=spec.caps.max_minutes,
                        teardown_margin_s=spec.teardown_margin_s,
                        minimum_cap_s=minimum_cap_s(spec.timings, spec.profile.receipt)),
        worst_case_usd=s.hold_worst_case_usd if s.hold_worst_case_usd is not None
        else cand.quote.worst_case_usd if cand else None,
        accrued_usd=usd_up(meter.accrued_usd()), over_cap=meter.over_cap(),
        bytes=ByteCounts(uploaded=meter.bytes_up, downloaded=meter.bytes_down),
        bundle_sha256=plan.bundle_sha256 if plan else None,
        host_key=(HostKeyRecord(fingerprint=session.host_key_fingerprint, type=session.host_key_type,
                                endpoint=str(session.endpoint)) if session else None),
        remote_env=spec.shown_remote_env, remote_secrets=sorted(spec.remote_secrets),
        instances=[i.recorded() for i in t.book.created],
        price_changes=[p.model_copy() for p in meter.price_changes],
        steps=steps, pull=s.work.pull if s.work else None,
        timings=s.timings | {"workload_steps_s": round(workload_s, 3)},
        phases=[r.model_copy() for r in t.phases.records],
        absence=overall_absence(t.book.teardowns, t.book.unresolved, not_ours=not_ours_of(t)),
        api_calls=dataclasses.asdict(t.client.stats),
        evidence_write_failures=write_failures(t),
        deadman=s.deadman.model_dump() if s.deadman else None,
        image_sent=spec.profile.image_ref.create_form,
        image_expect_override=spec.image_expect_override.model_dump() if spec.image_expect_override else None,
        workdir=s.workdir, artifacts=s.work.artifacts if s.work else None,
        host_gpus=s.host_gpus, gpu_refused=[g.model_copy() for g in s.gpu_refused],
        receipt=s.receipt, receipts_refused=[r.model_copy() for r in s.receipts_refused],
        attempts=[a.model_copy() for a in s.attempts],
        exit_code=code, message=message,
        harness={"python": sys.version.split()[0], "platform": platform.platform()},
    )


def not_ours_of(t: RunTools) -> dict[int, str]:
    """What a create answer named that the run never took for its own, and why (it was never deleted as ours)."""
    book = t.book
    out = {i: f"its row carries {f'the label {lab!r}' if lab else 'no label'}" for i, lab in book.disowned.items()}
    return out | dict(book.left_alone)
