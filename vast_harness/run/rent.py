"""The stages before the work: PREFLIGHT (nothing rented until it passes), RENT (create -> boot -> SSH
connect -> arrival), DEADMAN (the switch proven able to act) and RECEIPT (what the host delivers, run/receipt.py),
per host: the next offer after a host that does not come up or fails its receipt.

Every create is written down (the ledger, the book) before its PUT; a host that does not come up is deleted
and proven gone before the next offer is rented: never two instances at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from vast_harness.caps.meter import check_minimum_cap
from vast_harness.errors import (
    BootFailed,
    CapReachedError,
    ConfigError,
    CreateUnresolved,
    GpuMismatch,
    LedgerWriteError,
    NoOfferError,
    ReceiptFailed,
    SshConnectError,
    TeardownUnproven,
)
from vast_harness.host.bundle import Bundle, bundle_for
from vast_harness.host.deadman import DeadmanUnarmed, check_armed
from vast_harness.host.onstart import DEADMAN_SLEEP_MAX_S, build_onstart
from vast_harness.host.ssh import HostSession, endpoints_for, generate_run_key
from vast_harness.instance.lifecycle import CreateRequest, create, wait_ready
from vast_harness.market.offers import Candidate
from vast_harness.market.plan import account_credit_usd, choose_offers, plan_run
from vast_harness.records import CreatedInstance, WorkdirRecord
from vast_harness.run.arrival import check_arrival
from vast_harness.run.interrupt import (
    Outbid,
    boot_outbid,
    close_attempt,
    interruptions,
    open_attempt,
    outbid_of,
    record_host_home,
)
from vast_harness.run.key_attach import attach_run_key
from vast_harness.run.receipt import take_receipt
from vast_harness.run.rent_book import CreateOutcome, NotRented, Rented
from vast_harness.run.state import RunState, Stage
from vast_harness.run.teardown import teardown_one
from vast_harness.run.tools import RunTools
from vast_harness.spec.values import check_evidence_dir
from vast_harness.spec.workdir import left_out_lines
from vast_harness.state.registry import Registration, RunRegistry, make_label, this_host
from vast_harness.timings import TeardownBudget
from vast_harness.vast.models import Instance, Offer

# An offer sold twice is accepted for both buyers and "this error never propagates back" (SkyPilot PR 9117):
# the second buyer's instance just never becomes reachable. No message says so, so none is matched: the boot
# deadline ends it like any host that does not come up (deleted, machine excluded, a boot retry spent).
MAX_UNAVAILABLE_REPICKS = 3
NULL_GRACE_S = 60.0  # reads lag creates: tolerate `instances: null` this long after create
DEADMAN_CHECK_MAX_S = 60.0  # the dead-man check at the first SSH (it waits up to 50 s for the arm probe)
_T = TypeVar("_T")


def timed(t: RunTools, s: RunState, name: str, fn: Callable[[], _T]) -> _T:
    """Run `fn`, recording its seconds on the run's clock as timings[name_s], however it ends."""
    start = t.clock()
    try:
        return fn()
    finally:
        s.timings[f"{name}_s"] = round(t.clock() - start, 3)


# ------------------------------------------------------------------------------------------- PREFLIGHT
def preflight(t: RunTools, s: RunState, key_dir: Path) -> Bundle:
    """Refuse what cannot be kept before anything is rented; then register, plan, and make the run's key."""
    s.stage = Stage.PREFLIGHT
    t.phases.start("plan")
    check_minimum_cap(t.spec.caps.max_minutes, t.spec.timings, t.spec.profile.receipt)
    check_evidence_dir(t.spec.evidence_dir, "the evidence dir")  # full or read-only: rent nothing
    register(t, s)  # before anything is rented: from now on a reap sees this run as live
    bundle = bundle_for(t.spec)  # a `run`'s workdir, else the harness's own payload
    s.workdir = bundle.workdir
    for hint in t.spec.hints:
        t.out.warn(hint)
    warn_left_out(t, bundle.workdir)
    s.plan = plan = timed(t, s, "plan", lambda: plan_run(t.spec, t.client, t.drivers, bundle))
    t.ev.write_json("offer-quote.json", plan.summary())
    if t.ev.write_failures:  # a full or read-only evidence dir: rent nothing
        raise ConfigError(f"the evidence dir {t.ev.dir} cannot be written "
                          f"({'; '.join(t.ev.write_failures)}): nothing rented")
    s.check_cancelled()
    s.key = generate_run_key(key_dir)
    t.cap_guard.start()
    return bundle


def warn_left_out(t: RunTools, workdir: WorkdirRecord | None) -> None:
    """The files an upload left out by name (a key, a credential, the harness's own), said before it goes."""
    if workdir is not None and workdir.left_out:
        t.out.warn("left out of the upload: " + "; ".join(left_out_lines(workdir.left_out)))


def cap_deadline_unix(t: RunTools) -> tuple[float, str]:
    """When the time cap ends this run, on the API server's clock once it has answered (else the wall
    clock), and which clock it is: what the labels and the registration tell other processes."""
    end_mono = t.meter.t0 + t.spec.max_seconds
    server = t.server_clock.to_server(end_mono) if t.server_clock else None
    if server is not None:
        return server, "server"
    return time.time() + (end_mono - t.clock()), "local wall clock"


def register(t: RunTools, s: RunState) -> None:
    deadline, clock = cap_deadline_unix(t)
    target, spec = t.ledger.target, t.spec
    s.registration = RunRegistry(spec.state_dir).register(Registration(
        run_id=s.run_id, pid=os.getpid(), host=this_host(), started_unix=time.time(),
        api_url=spec.api_url, account=target.account if target else None, profile=spec.profile.name,
        gpu=", ".join(spec.filters.gpu_names) or None, max_usd=spec.caps.max_usd,
        max_minutes=spec.caps.max_minutes, deadline_unix=deadline,
        deadline_clock="server" if clock == "server" else "local wall clock"))


# ------------------------------------------------------------------------------------------- RENT
def candidates(t: RunTools, s: RunState) -> Iterator[Candidate]:
    """The plan's offers, then a fresh search that excludes the machines that failed to boot in this run."""
    assert s.plan is not None
    # An interruptible run's every host bills at most the $/h its worst case assumed (market/quote.py)
    max_dph = s.plan.chosen.quote.ceiling_dph_usd if t.spec.interruptible is not None else None
    for cand in [s.plan.chosen, *s.plan.alternatives]:
        if max_dph is not None and cand.quote.dph_at_disk_usd > max_dph + 1e-9:
            continue
        t.meter.check("renting")  # each create asks the clock first
        yield cand
    try:
        credit = account_credit_usd(t.client)
        choice = choose_offers(t.spec, t.client, t.drivers, bundle_for(t.spec), credit_usd=credit,
                               exclude_machine_ids=t.book.excluded_machines, max_dph_usd=max_dph)
    except NoOfferError:
        return
    for cand in choice.ranked:
        t.meter.check("renting")
        yield cand


def rent_and_connect(t: RunTools, s: RunState) -> None:
    """Rent offers in turn until one host boots, takes SSH, is the offer's, has its dead-man switch armed and
    passes its receipt; a host that does not is deleted and proven gone first (a dead-man switch that cannot act
    stops the run instead). Raises BootFailed / NoOfferError (by whether anything was rented) when none is left."""
    s.stage = Stage.RENT
    boots_left = t.spec.boot_retries + 1
    repicks_left = MAX_UNAVAILABLE_REPICKS
    tried: set[int] = set()
    start = t.clock()
    book = t.book
    last_failure: Exception | None = None
    for cand in candidates(t, s):
        if cand.offer.id in tried or cand.offer.machine_id in book.excluded_machines:
            continue
        tried.add(cand.offer.id)
        s.check_cancelled()
        outcome = create_one(t, s, cand, next_label(t, s))
        if isinstance(outcome, NotRented):
            repicks_left -= 1
            if repicks_left < 0:
                what = "every further offer was" if book.created else "every offer tried was"
                error = BootFailed if book.created else NoOfferError
                raise error(f"{what} taken or refused before it could be rented ({outcome.why})")
            continue
        inst = outcome.instance
        open_attempt(t, s, inst)
        if s.registration is not None:  # `status` names the instance while reads may not list it yet
            s.registration.update(instance_ids=sorted({*s.registration.reg.instance_ids, inst.instance_id}))
        try:
            if inst.status == "created_with_error":
                raise BootFailed(f"create answered an error but created instance {inst.instance_id} "
                                 f"(stopped, billing storage): {inst.detail}")
            if t.around_boot is not None:
                t.around_boot(inst, lambda: boot(t, s, inst, offer=cand.offer))
            else:
                boot(t, s, inst, offer=cand.offer)
            s.candidate = cand
            s.timings["rent_and_connect_s"] = round(t.clock() - start, 3)
            try:
                qualify(t, s, inst, cand.offer)
                record_host_home(t, s)
                if s.outbid_reason is not None:
                    raise BootFailed(f"outbid before any work: {s.outbid_reason}")
            except Exception as exc:  # an outbid while the switch or the receipt was checked is a boot's
                why = outbid_of(t, s, exc)
                if why is None:
                    raise
                raise BootFailed(f"outbid before any work: {why} (stopped)") from exc
            if t.spec.interruptible is not None:  # after an outbid host: the run goes on on this one
                t.notify.replaced(inst, s.attempts, interruption=interruptions(s))
            return
        except (BootFailed, SshConnectError) as exc:
            last_failure = exc
            drop_host(s)
            if boot_outbid(t, exc) or outbid_of(t, s, exc) is not None:
                # an outbid (its boot, its arrival check, its switch or receipt stopped because the instance was
                # paused), not the host: counted against --max-interruptions instead
                close_attempt(t, s, inst.instance_id, f"outbid during boot ({exc})")
                boots_left += 1
                s.recovered()
                interrupted = interruptions(s)
                assert t.spec.interruptible is not None
                t.notify.outbid(inst, str(exc), stage=s.stage.value, interruption=interrupted,
                                next="stop" if interrupted > t.spec.interruptible.max_interruptions else "replace")
                if interrupted > t.spec.interruptible.max_interruptions:
                    _after_failed_boot(t, s, inst, exc, boots_left)
                    raise Outbid(f"outbid {interrupted} times, more than --max-interruptions "
                                 f"{t.spec.interruptible.max_interruptions}") from None
            else:
                close_attempt(t, s, inst.instance_id, f"did not come up: {exc}")
            boots_left = _after_failed_boot(t, s, inst, exc, boots_left)
    if isinstance(last_failure, ReceiptFailed):  # the user's question is which measure failed: name it again
        raise BootFailed(f"no further offer to try; the last host failed its receipt: {last_failure}")
    ceiling = ("" if t.spec.interruptible is None or s.plan is None or s.plan.chosen.quote.ceiling_dph_usd is None
               else f" (an interruptible run rents no host above ${s.plan.chosen.quote.ceiling_dph_usd:.4f}/h, the "
                    "most its worst case allowed for)")
    if book.created:  # something was rented (and deleted): "nothing rented" (exit 5) would be untrue
        raise BootFailed(f"no further offer to try after boot failures{ceiling}")
    raise NoOfferError(f"no further offer to try after boot failures{ceiling}")


def reconnect(t: RunTools, s: RunState) -> None:
    """The run's host resumed after an outbid it waited out (`--on-outbid wait`): its container re-booted, so
    connect again and prove its dead-man switch armed again (its onstart re-ran, its deadline kept on the disk).
    The same machine: no arrival check or receipt again."""
    inst = t.book.latest()
    assert inst is not None
    s.stage = Stage.RENT
    boot(t, s, inst)
    s.stage = Stage.DEADMAN
    with t.reads.watch_prices(inst):
        timed(t, s, "deadman_check", lambda: check_deadman(t, s))
    record_host_home(t, s)


def qualify(t: RunTools, s: RunState, inst: CreatedInstance, offer: Offer) -> None:
    """Before any of the user's work on a host that came up: its dead-man switch proven armed (Stage.DEADMAN),
    then its receipt (Stage.RECEIPT), both while its price is watched. ReceiptFailed: the next offer."""
    with t.reads.watch_prices(inst):
        timed(t, s, "deadman_check", lambda: check_deadman(t, s))
        take_receipt(t, s, inst, offer)


def drop_host(s: RunState) -> None:
    """Forget a host that is being deleted (its session closed): the next one's work starts afresh."""
    if s.session is not None:
        s.session.close()
    s.session, s.work, s.candidate, s.host_gpus, s.deadman = None, None, None, None, None


def next_label(t: RunTools, s: RunState) -> str:
    """One label per create attempt, so a late instance of an earlier attempt is told apart; it carries the
    run's cap deadline (server clock), so a reap on another machine can tell a live run's host from an orphan."""
    deadline, clock = cap_deadline_unix(t)
    cap_left_s = t.meter.t0 + t.spec.max_seconds - t.clock()  # skew-free: reap adds it to the row's start_date
    label = make_label(s.run_id, len(t.book.attempts), deadline, left_s=cap_left_s)
    if s.registration is not None:
        s.registration.update(labels=[*s.registration.reg.labels, label], deadline_unix=deadline,
                              deadline_clock=clock)
    return label


def _after_failed_boot(t: RunTools, s: RunState, inst: CreatedInstance, exc: Exception, boots_left: int) -> int:
    """Delete the host that did not come up (or failed its receipt) and prove it gone; exclude its machine; one
    boot retry spent."""
    t.out.warn(f"instance {inst.instance_id} did not come up: {exc}" if not isinstance(exc, GpuMismatch | ReceiptFailed)
               else f"{exc}; deleting it")
    report = teardown_one(t, s, inst, owner_until=t.clock() + s.teardown_budget_s)
    if report is None:  # not proven the run's: never deleted as ours, and the create's outcome is unknown again
        why = ("is not this run's" if inst.instance_id in t.book.disowned or inst.instance_id in t.book.left_alone
               else "is not proven this run's (its label could not be read) and no DELETE went to it")
        raise CreateUnresolved(f"instance {inst.instance_id}, which the create answer named, {why}; whether the "
                               "create made an instance of ours is unknown", label=inst.label) from None
    if report.verdict != "gone":  # never two instances at once: the next create waits for a proof
        raise TeardownUnproven(
            f"instance {inst.instance_id} did not come up ({exc}) and its teardown is not proven "
            f"({report.verdict}); no further offer is rented while it may still bill") from None
    if s.registration is not None:  # proven gone: `status` no longer names it
        s.registration.update(instance_ids=[i for i in s.registration.reg.instance_ids if i != inst.instance_id])
    if inst.machine_id is not None:
        t.book.excluded_machines.add(inst.machine_id)
    boots_left -= 1
    if boots_left <= 0:
        what = "passed its receipt" if isinstance(exc, ReceiptFailed) else "came up"
        raise BootFailed(f"no host {what} after {t.spec.boot_retries + 1} attempt(s): {exc}") from None
    return boots_left


def create_one(t: RunTools, s: RunState, cand: Candidate, label: str) -> CreateOutcome:
    """Rented (the instance), or NotRented (why; the caller tries the next offer). An unknown outcome
    that no read settles raises CreateUnresolved (exit 3 unless the final sweep finds it)."""
    spec, book = t.spec, t.book
    assert s.key is not None
    deadman_s = spec.deadman_allowance_s
    if t.hold is not None:  # a kept host's switch: never past the hold's caps (a replacement's comes late in it)
        deadman_s = max(1, int(min(t.hold.switch_allowance_s,
                                   t.meter.hard_deadline() - t.budget.switch_s - t.clock())))
    request = CreateRequest(
        image=spec.profile.image_ref.create_form, disk=spec.profile.disk_gb, label=label,
        onstart=build_onstart(public_key=s.key.public_openssh, api_url=spec.api_url, deadman_after_s=deadman_s,
                              idle_after_s=t.hold.idle_first_s if t.hold else None,
                              recheck_s=t.hold.switch_recheck_s if t.hold else DEADMAN_SLEEP_MAX_S),
        price=cand.offer.bid_usd_per_h if spec.interruptible is not None else None,
    )
    t.phases.start("create")
    t.out.info(f"renting offer {cand.offer.id} ({cand.offer.num_gpus}x {cand.offer.gpu_name}, "
               f"${cand.quote.dph_at_disk_usd:.3f}/h) as {label}")
    t_put_mono = t.clock()  # billing may start as the PUT lands: the meter starts here, not at the answer
    # unresolved until an answer or a read settles it (an interrupt leaves it)
    book.attempt(label, t_put_mono, (cand.offer.id, cand.quote.dph_at_disk_usd))
    try:
        outcome = create(t.client, t.ledger, run_id=s.run_id, offer_id=cand.offer.id,
                         request=request, lag_wait_s=max(spec.poll_s, 0.2),
                         lag_window_s=s.read_lag_window_s, clock=t.clock,
                         on_named=lambda instance_id: t.instances.named(instance_id, label),
                         dph_usd=cand.quote.dph_at_disk_usd)
    except LedgerWriteError as exc:  # the intent never reached the disk, so no PUT was sent: nothing to look for
        book.withdraw(label)
        raise LedgerWriteError(f"{exc}: the create was not sent, nothing was rented") from None
    if outcome.status == "unresolved":
        raise CreateUnresolved(f"create of offer {cand.offer.id} has an unknown outcome: {outcome.detail}",
                               label=label)
    book.settle(label)
    if outcome.instance_id is None:
        t.out.warn(f"offer {cand.offer.id}: nothing rented ({outcome.status}): {outcome.detail}")
        return NotRented(f"offer {cand.offer.id}: {outcome.status}: {outcome.detail[:200]}")
    inst = CreatedInstance(instance_id=outcome.instance_id, label=label, offer_id=cand.offer.id,
                           machine_id=cand.offer.machine_id, dph_usd=cand.quote.dph_at_disk_usd,
                           t_created_mono=t_put_mono, status=outcome.status, detail=outcome.detail[:300],
                           seen=outcome.status == "found_after_unknown")  # found in the list by label
    book.rented(inst)
    start_meter(t, inst, cand)  # the money clock starts now, at this offer's price
    t.notify.rented(inst, gpu_name=cand.offer.gpu_name, num_gpus=cand.offer.num_gpus)
    if t.on_created is not None:
        t.on_created(inst)
    return Rented(inst)


def start_meter(t: RunTools, inst: CreatedInstance, cand: Candidate) -> None:
    q = cand.quote
    t.meter.set_transfer(inet_down_cost_usd_per_gb=cand.offer.inet_down_cost_usd_per_gb,
                         inet_up_cost_usd_per_gb=cand.offer.inet_up_cost_usd_per_gb,
                         expected_up_bytes=int(q.upload_gb * 1e9), expected_down_bytes=int(q.download_gb * 1e9))
    t.meter.start_instance(inst.instance_id, inst.dph_usd, inst.t_created_mono)


def boot(t: RunTools, s: RunState, inst: CreatedInstance, *, offer: Offer | None = None) -> None:
    """Wait for the instance to run, then connect over SSH, both by the boot's deadline; check that the host
    is the one `offer` said (run/arrival.py); make the host work."""
    t.phases.start("boot")
    spec, meter = t.spec, t.meter
    boot_deadline = meter.deadline(spec.profile.boot_timeout_s)
    assert s.key is not None
    try:
        # The deadline is asked again at every poll: a price learnt while booting moves the cap's earlier. A
        # poll's read is one attempt, cut after `read_within_s`; when it fails the list row tells the price.
        fixed_deadline = boot_deadline
        ready = wait_ready(t.client, inst.instance_id, deadline=lambda: min(fixed_deadline, meter.deadline()),
                           poll_s=spec.poll_s, null_grace_s=NULL_GRACE_S,
                           on_poll=lambda read: _on_poll(t, s, inst, read),
                           on_read_failed=lambda _exc: _on_failed_poll(t, s, inst),
                           read_retry_s=t.reads.read_retry_s, read_within_s=t.reads.read_within_s, clock=t.clock)
        t.reads.on_read(inst, ready)
        s.check_cancelled()
        # The price may have moved the deadline: SSH gets what is left of the boot's, never more.
        boot_deadline = min(boot_deadline, meter.deadline())
        attach_run_key(t.client, inst, s.key.public_openssh, within_s=boot_deadline - t.clock(), out=t.out)
        t.out.info(f"instance {inst.instance_id} running; connecting over SSH")
        session = HostSession.connect(endpoints_for(ready), s.key, deadline_monotonic=boot_deadline,
                                      retry_wait_s=min(2.0, max(spec.poll_s, 0.2)), clock=t.clock)
        if offer is not None:  # before any workload minute: a host that is not the offer's is refused
            try:
                s.host_gpus = check_arrival(t, s, inst, offer, session, deadline=boot_deadline)
            except BaseException:
                session.close()
                raise
        s.session = session
        s.session.stall_timeout_s = t.budget.sftp_stall_s
        s.work = t.host_work(s.session, spec=spec, meter=meter, ev=t.ev, out=t.out, run_id=s.run_id,
                             cancelled=s.cancelled, check_cancelled=s.check_cancelled,
                             hurry=lambda: t.signals.hurry, timings=s.timings, on_phase=t.phases.start)
    except (BootFailed, SshConnectError) as exc:
        # When the cap, not the boot timeout, cut the wait, the run stopped at its cap (exit 6): trying
        # another host would only spend past it. A connect gives up once an attempt no longer fits.
        ends_early_s = TeardownBudget.CONNECT_ATTEMPT_MIN_S if isinstance(exc, SshConnectError) else 0.0
        if meter.cut_by_cap(ends_early_s=ends_early_s):
            raise CapReachedError(f"cap reached while instance {inst.instance_id} was booting: {exc}") from exc
        raise


def _on_poll(t: RunTools, s: RunState, inst: CreatedInstance, read: Instance | None) -> None:
    t.instances.check_boot_read(inst, read)  # a row with another label, or none: not ours (CreateUnresolved)
    t.reads.check_gone(inst, read)
    s.check_cancelled()
    t.reads.on_read(inst, read)


def _on_failed_poll(t: RunTools, s: RunState, inst: CreatedInstance) -> None:
    """A boot poll that failed (5xx, 429, a stalled read): the v1 list row still states the price, and a higher
    one moves the boot's deadline (it asks the meter at every poll)."""
    t.reads.list_price(inst, within_s=t.reads.read_within_s)
    s.check_cancelled()


# ------------------------------------------------------------------------------------------- DEADMAN
def check_deadman(t: RunTools, s: RunState) -> None:
    """Prove the dead-man switch can act before any workload minute (host/deadman.py); fail closed unless
    --allow-unarmed-deadman. The host clock's skew and the deadline go into the evidence either way."""
    s.stage = Stage.DEADMAN
    inst = t.book.latest()
    assert s.session is not None and inst is not None
    timeout_s = min(DEADMAN_CHECK_MAX_S, t.meter.deadline() - t.clock())
    if timeout_s <= 1.0:
        raise CapReachedError("cap reached before the dead-man switch could be checked")
    allowance_s = t.hold.switch_allowance_s if t.hold else t.spec.deadman_allowance_s
    status = check_armed(s.session, instance_id=inst.instance_id, allowance_s=allowance_s,
                         elapsed_s=t.clock() - inst.t_created_mono, timeout_s=timeout_s,
                         allow_unarmed=t.spec.allow_unarmed_deadman)
    s.deadman = status
    if status.skew_large:
        t.out.warn(f"the host's clock is {status.host_clock_skew_s:+.0f} s from this machine's; the "
                   "dead-man switch counts on the host's clock only, so it still fires on time")
    if status.armed:
        t.out.info(status.line())
        return
    if t.meter.cut_by_cap():  # the cap, not the host, ended the check: exit 6 like any phase it cuts
        raise CapReachedError(f"{t.meter.cap_reached()} while the dead-man switch was being checked on "
                              f"instance {inst.instance_id}: {status.problem}")
    if not status.allowed_unarmed:
        raise DeadmanUnarmed(f"the dead-man switch cannot act on instance {inst.instance_id}: {status.problem}. "
                             "Without it nothing deletes the host if the harness dies, so the run stops here "
                             "(--allow-unarmed-deadman runs anyway and records it)")
    t.out.warn(status.line())
