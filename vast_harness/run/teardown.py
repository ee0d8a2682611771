"""TEARDOWN: whatever ended the work, pull what evidence there is time for, delete every instance this run
created, prove each absent, then sweep the run's labels for an instance it did not know it created.

Its prelude (the evidence pull, the switch's log, then the last price reads) ends by the meter's prelude
deadline: the DELETE keeps the rest of the teardown margin. After a signal the DELETE goes first.
"""

from __future__ import annotations

import contextlib
import time

from vast_harness.clock import FreezeWatch
from vast_harness.errors import ExitCode, VastError
from vast_harness.host.deadman import read_log
from vast_harness.instance.lifecycle import find_by_label, teardown_instance
from vast_harness.records import CreatedInstance, DeleteAck, InstanceTeardown, ProofRound
from vast_harness.run.instance_reads import LAST_PRICE_READ_RETRY_S
from vast_harness.run.instances import NotOurs
from vast_harness.run.state import RunState, Stage
from vast_harness.run.tools import RunTools, signalled

DEADMAN_LOG_READ_S = 3.0  # reading the switch's log back at teardown: brief, DELETE comes next
CANCEL_PRICE_READ_RETRY_S = 2.0  # the price read of a run a cap cancelled (a signal skips it: DELETE first)
STRAY_PRICE_READ_S = 3.0  # reading the price of an instance the label sweep found (then it is deleted)


def pull_evidence(t: RunTools, s: RunState, *, in_teardown: bool) -> None:
    """The host's evidence (host_work.py); in teardown after a signal, for `SIGNAL_PULL_MAX_S` at most."""
    if not in_teardown:
        s.stage = Stage.PULL
    if s.work is not None:
        hurried = in_teardown and signalled(t)
        s.work.pull_evidence(in_teardown=in_teardown, max_s=t.budget.SIGNAL_PULL_MAX_S if hurried else None)


def prelude(t: RunTools, s: RunState) -> None:
    """What comes before the first DELETE, each bounded by the prelude deadline; the link closed, then the
    last price reads, just before the DELETE."""
    s.stage = Stage.TEARDOWN
    pull_evidence(t, s, in_teardown=True)
    read_deadman_log(t, s)
    if s.session is not None:
        s.session.close()  # transport first: a stalled link cannot hold this
    final_price_reads(t, s)


def final_price_reads(t: RunTools, s: RunState) -> None:
    """Each live instance's price read once more, the last thing before its DELETE: a price that changes
    after it and that no later row shows bills unseen only until the DELETE (docs/limits.md), so the later
    the better. The accrual the run reports, and a fleet sums, is then what the host billed. A signal skips
    it (its DELETE goes first), and so does a run cancelled for anything but a cap (someone else deleted its
    instance); a run a cap cancelled retries its read only briefly. An instance no read has shown is skipped:
    the create answer may have named another's (its reads then hang or lie), and its DELETE, the ownership
    check and the label sweep need the margin more than an unknown price does."""
    if signalled(t) or (s.cancelled.is_set() and s.cancel_exit_code != ExitCode.CAP_REACHED):
        return
    retry_s = CANCEL_PRICE_READ_RETRY_S if s.cancelled.is_set() else LAST_PRICE_READ_RETRY_S
    for inst in t.book.live():
        if inst.seen:  # one no read has shown may not be ours (a create answer can name another's): DELETE first
            t.reads.last_price_read(inst, max_retry_s=retry_s)



def read_deadman_log(t: RunTools, s: RunState) -> None:
    """The switch's log (every attempt it made) into the evidence, read once more at teardown."""
    if s.session is None or s.deadman is None:
        return
    # Bounded by the meter's prelude deadline too. After a signal the DELETE goes first: the tail the check
    # read stands.
    timeout_s = 0.0 if signalled(t) else min(DEADMAN_LOG_READ_S, t.meter.prelude_deadline() - t.clock())
    text = (read_log(s.session, timeout_s=timeout_s) if s.session.is_active() and timeout_s > 0 else "") \
        or s.deadman.log_tail
    text = t.spec.redactor.text(text)  # any host process can append to the switch's log
    t.ev.guarded("deadman.log", lambda: (t.ev.dir / "deadman.log").write_text(text + "\n", encoding="utf-8"))


def delete_all(t: RunTools, s: RunState, t_last_step_end: float) -> None:
    """Every instance no teardown has handled yet: DELETE, absence proof; then the guard stops and the sweep
    runs. Timings: to the first DELETE's acknowledgement and to the proof, from the last step's end."""
    start = t.clock()
    t.phases.start("teardown")
    if t.book.created:
        t.out.info("tearing down: deleting every instance of this run and proving it absent…")
    if s.registration is not None:  # a second terminal's `status` says so, with the instances and proof rounds
        s.registration.update(phase="tearing down", instance_ids=sorted(i.instance_id for i in t.book.created))
    for inst in t.book.pending():
        report = teardown_one(t, s, inst)
        if report is None:  # not proven the run's: no DELETE of ours (the label sweep asks again if unread)
            continue
        acks = [d.t_ack_mono for d in report.deletes if d.acknowledged and d.t_ack_mono]
        if acks:  # to the DELETE's acknowledgement, not to the end of the absence proof
            s.timings.setdefault("delete_ack_after_last_step_s", round(acks[0] - t_last_step_end, 3))
        if report.proof and report.proof.rounds and acks:
            s.timings.setdefault("absence_proven_after_delete_s", round(report.proof.rounds[-1].t_mono - acks[0], 3))
    t.cap_guard.stop()
    sweep_labels(t, s)
    s.timings["teardown_s"] = round(t.clock() - start, 3)
    if s.key is not None:
        s.key.delete()


def teardown_one(t: RunTools, s: RunState, inst: CreatedInstance, *,
                 owner_until: float | None = None) -> InstanceTeardown | None:
    """DELETE one instance (taking the cap guard's answer as the first, if it sent one) and prove it absent. None
    when it is not proven the run's, and no DELETE of ours goes to it: the guard, deciding before it let go, or
    the ownership check found another label (disowned), or no read could show its row (it stays booked: the
    label sweep asks again). `owner_until`: an unread row is asked about every proof interval until then (a
    host that failed to boot, whose reads lag its create, is deleted before the next offer is rented). The
    instances that carry the run's label instead are deleted at once."""
    claim = t.instances.claim(inst)  # from here the guard leaves it to us
    if not claim.ours:
        return None
    if claim.ack is None:  # the guard's DELETE goes only to a row a read showed with the run's label: no re-read
        not_ours = _ask_owner(t, inst, owner_until)  # a create answer may have named another's
        if not_ours is not None:
            for instance_id in not_ours.label_rows:  # the run's own, whatever the create answered: deleted now
                _delete_stray(t, s, inst.label, instance_id)
            return None
    guard_ack = claim.ack
    deadline = t.clock() + s.teardown_budget_s
    # A full disk must not stop a DELETE or its proof: the ledger records a failed write and goes on.
    with FreezeWatch(t.clock) as freeze:  # a SIGSTOP or a suspend in the teardown does not spend its budget
        report = teardown_instance(t.client, t.ledger, run_id=s.run_id, label=inst.label,
                                   instance_id=inst.instance_id, interval_s=t.spec.proof_interval_s,
                                   deadline=deadline, created_mono=inst.t_created_mono,
                                   lag_window_s=s.read_lag_window_s, seen=inst.seen, clock=t.clock,
                                   land_by_mono=t.meter.hard_deadline(),
                                   while_deleting=lambda: t.reads.watch_while_deleting(inst),
                                   first_ack=guard_ack, on_ack=lambda ack: stop_billing_at(t, inst, ack),
                                   on_round=lambda r: _round_seen(t, s, inst, r), freeze=freeze)
    seen_before, inst.seen = inst.seen, report.seen
    acks = [d for d in report.deletes if d.acknowledged]
    ours = [d for d in acks if d.outcome == "deleted"]  # a DELETE of ours that deleted it
    # "Already gone" is someone else's delete only for an instance a read had shown and that none of our
    # DELETEs then deleted: a not-found answer while reads still lag the create is not.
    if acks and acks[0].outcome == "already_gone" and seen_before and not ours:
        t.reads.vanished(inst, "our first DELETE found it already gone")
    if acks and report.verdict == "gone":
        # Billing ends at the DELETE that deleted it: our last one that said "deleted" (an earlier one a read
        # then showed live deleted nothing, and the proof sent another), else the first that found it gone.
        inst.t_deleted_mono = (ours[-1] if ours else acks[0]).t_ack_mono or t.clock()
        if not ours and inst.instance_id in t.reads.gone_by:  # gone before our DELETE, by when it was due to go
            inst.t_deleted_mono = min(inst.t_deleted_mono, t.reads.gone_by[inst.instance_id])
        t.meter.end_instance_at(inst.instance_id, inst.t_deleted_mono)
    elif report.verdict != "gone":  # not proven: a DELETE that said "deleted" (deleting nothing) ends no bill
        t.meter.bill_until(inst.instance_id, t.clock())
    inst.absence = report.verdict
    t.book.torn_down(report)
    return report


def _ask_owner(t: RunTools, inst: CreatedInstance, until: float | None) -> NotOurs | None:
    """Whose `inst` is (`RunInstances.check_before_delete`), asked again every proof interval until `until` while
    no read can show its row."""
    while True:
        not_ours = t.instances.check_before_delete(inst)
        if not_ours is None or not_ours.row_label is not None or inst.instance_id in t.book.left_alone \
                or until is None or t.clock() + t.spec.proof_interval_s > until:
            return not_ours
        time.sleep(t.spec.proof_interval_s)


def stop_billing_at(t: RunTools, inst: CreatedInstance, ack: DeleteAck) -> None:
    """The meter stops at the DELETE that deleted the instance as soon as it is answered, not after the
    proof: the live view's dollars stop rising there. The same moment `teardown_one` settles on afterwards
    (an answer of "already gone" waits: a later DELETE of ours may be the one that deleted it)."""
    if ack.outcome == "deleted" and ack.t_ack_mono is not None:
        t.meter.stop_instance(inst.instance_id, ack.t_ack_mono)


def _round_seen(t: RunTools, s: RunState, inst: CreatedInstance, r: ProofRound) -> None:
    """An absence-proof round, into the registration: `status` shows the proof's progress from elsewhere. A
    round that sees the instance live after a DELETE said "deleted" puts it back on the meter: it bills on.
    Every row of it the round read re-prices the meter (a price no earlier read showed; never raises)."""
    if r.verdict == "present":
        t.meter.resume_instance(inst.instance_id)
    t.reads.on_proof_round(inst, r)
    if s.registration is not None:
        s.registration.update(proof_rounds=s.registration.reg.proof_rounds + 1, last_round=r.verdict)


def sweep_labels(t: RunTools, s: RunState) -> None:
    """Catch what the run did not know it created (a create whose answer was lost or interrupted, a 5xx
    that created, an instance that appeared late): every label this run sent, listed at once and every proof
    interval until the read-lag window after its create has passed (bounded by the teardown budget); what
    appears is deleted as soon as it does (red team r10: sleeping out the window first left a create a signal
    cut short billing 30 s, at 200x, 10x the cap). A label whose create answer named an instance not proven the
    run's is looked for until the budget ends, its named instance asked about again each time (`_await_label`):
    its own instance may lag longer than the window."""
    book = t.book
    known = book.known_ids()
    sent = book.attempts
    # Only labels a PUT was sent for (each attempt is recorded before its PUT): none sent, nothing to find.
    give_up = t.clock() + s.teardown_budget_s
    for label in sorted(book.labels()):
        if _awaiting(t, label) or (label in book.unresolved and book.not_ours(label)):
            found = _await_label(t, s, label, give_up)
        else:
            ready_at = min(sent.get(label, 0.0) + s.read_lag_window_s, give_up)
            found = find_by_label(t.client, label, attempts=2, wait_s=t.spec.proof_interval_s, sleep=time.sleep,
                                  until_mono=ready_at, clock=t.clock, give_up_mono=give_up)
        if found:
            book.settle(label)
        known |= book.known_ids()
        for instance_id in found:
            if instance_id not in known:
                _delete_stray(t, s, label, instance_id)
                known.add(instance_id)


def _awaiting(t: RunTools, label: str) -> list[CreatedInstance]:
    """`label`'s instances that a create answer named and no read has shown as the run's: no DELETE yet."""
    return [i for i in t.book.pending() if i.label == label and not (i.seen or i.label_seen)]


def _await_label(t: RunTools, s: RunState, label: str, give_up: float) -> list[int]:
    """Until `give_up`: the instance `label`'s create answer named asked about again (deleted once a read shows
    the run's label on it; left alone on another's), and the label listed, every proof interval, until an
    instance with the label is found and nothing named is still unread. What is still unread then is left alone
    (not proven the run's): said, and the create's outcome stays unknown (exit 3)."""
    found: list[int] = []
    while True:
        for inst in _awaiting(t, label):
            teardown_one(t, s, inst)  # ours: deleted and proven; not ours: disowned, the label's rows deleted
        found = find_by_label(t.client, label, attempts=1, wait_s=0.0, sleep=time.sleep, clock=t.clock,
                              give_up_mono=give_up)
        settled = bool(found) or label not in t.book.unresolved
        if (settled and not _awaiting(t, label)) or t.clock() + t.spec.proof_interval_s > give_up:
            break
        time.sleep(t.spec.proof_interval_s)
    for inst in _awaiting(t, label):
        t.instances.leave_alone(inst)
    return found


def _delete_stray(t: RunTools, s: RunState, label: str, instance_id: int) -> None:
    """An instance with this run's label that the run did not know: booked, metered from its PUT, deleted."""
    book = t.book
    t.out.warn(f"found instance {instance_id} with this run's label {label}; deleting it")
    t.ledger.append(s.run_id, "created", label, instance_id=instance_id, detail="found by sweep")
    # It billed from its PUT at its offer's price (the instance's own, when a read gives one).
    offer_id, dph_usd = book.offers.get(label, (-1, 0.0))
    with contextlib.suppress(VastError):
        read = t.client.get_instance(instance_id, max_retry_s=STRAY_PRICE_READ_S)
        if read is not None and read.dph_total:
            dph_usd = read.dph_total
    stray = CreatedInstance(instance_id=instance_id, label=label, offer_id=offer_id, machine_id=None,
                            dph_usd=dph_usd, t_created_mono=book.attempts.get(label, t.meter.t0),
                            status="found by label", seen=True)
    book.rented(stray)
    t.meter.start_instance(instance_id, dph_usd, stray.t_created_mono)
    for named in book.not_ours(label):  # the create's bill is this one's from its PUT, not the one its answer named
        t.meter.forget_instance(named)
    teardown_one(t, s, stray)
