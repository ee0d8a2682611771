"""An instance's life as functions: create, wait_ready, destroy, teardown (its proof of absence: absence.py).

Each takes a monotonic deadline or a bounded count: nothing here waits forever. Every window (read lag, the
unseen-instance trust window, the proof interval) is measured on the monotonic clock too; wall-clock times
are recorded for the reader, never compared, so an NTP step cannot turn a lagging read into "gone". Create is
never retried blindly; a create whose outcome is unknown is followed by a list by label (reads lag creates).

Two Vast behaviours shape the teardown (docs/vast-behaviours.md):
  * a destroyed instance lingers: reads keep showing its row as `intended_status: destroyed` for a while.
    Such a row is "going": neither present (nothing to delete again) nor gone (not a proof).
  * reads lag creates: for a while after create, the per-id read, the v1 list and even DELETE may not see
    the instance. A DELETE or an absence proof inside that window (`Timings.read_lag_window_s`, passed in as
    `lag_window_s`) proves nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Literal, Protocol, Unpack

from pydantic import BaseModel

from vast_harness.clock import Clock, FreezeWatch, Sleep, now_s
from vast_harness.errors import (
    ApiStatusError,
    BootFailed,
    EndpointDeprecated,
    LedgerWriteError,
    OfferUnavailable,
    RateLimitError,
    TransportError,
    VastError,
)
from vast_harness.instance.absence import UNSEEN_TRUST_AFTER_S, is_lingering, prove_absent
from vast_harness.records import CreateOutcome, DeleteAck, InstanceTeardown, ProofRound
from vast_harness.state.ledger import NOTHING_CREATED, EntryFields, Event, Ledger, LedgerEntry
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import READY_STATUS, Instance


# A 5xx answer to a create says nothing about what the API did (the contract may have been written before the
# gateway failed). Not found by label through the lag window, it is *unresolved* (ledger create_unresolved,
# exit 3, reap keeps looking), never "not created": an instance whose reads lag longer would otherwise bill
# beside the next offer's, under a run that says exit 0.
def _outcome_unknown(status: int) -> bool:
    return status >= 500


def find_by_label(client: VastClient, label: str, *, attempts: int, wait_s: float, sleep: Sleep,
                  until_mono: float = 0.0, clock: Clock = now_s,
                  give_up_mono: float | None = None) -> list[int]:
    """Ids of instances carrying `label` (lingering destroyed rows excluded), tolerating read lag and
    transient errors for `attempts` tries and, when `until_mono` (on `clock`) is later, until then. With
    `give_up_mono`, every read (retries included) ends by then, and so does the search."""
    i = 0
    while True:
        within_s = None if give_up_mono is None else give_up_mono - clock()
        if within_s is not None and within_s <= 0:
            return []
        try:
            found = [inst.id for inst in client.list_instances(label=label, within_s=within_s)
                     if not is_lingering(inst)]
            if found:
                return found
        except VastError:
            pass
        i += 1
        if i >= attempts and clock() >= until_mono:
            return []
        sleep(max(0.0, min(wait_s, until_mono - clock())) if i >= attempts else wait_s)


class CreateRequest(BaseModel):
    """The body of `PUT /api/v0/asks/{offer}/` (create_instance.yaml): an SSH-direct container that boots into
    `onstart` (our key, the dead-man switch) and is refused, not queued, when the offer is gone."""

    image: str
    disk: float  # GB
    label: str
    onstart: str
    runtype: Literal["ssh_direct"] = "ssh_direct"
    client_id: Literal["me"] = "me"
    cancel_unavail: bool = True  # an offer taken meanwhile fails the create instead of renting it stopped
    target_state: Literal["running"] = "running"
    price: float | None = None  # a bid in $/h: an interruptible instance (create_instance.yaml); omitted on demand


def create(
    client: VastClient, ledger: Ledger, *, run_id: str, offer_id: int, request: CreateRequest,
    lag_window_s: float, lag_attempts: int = 6, lag_wait_s: float = 5.0, sleep: Sleep = time.sleep,
    clock: Clock = now_s, on_named: Callable[[int], None] | None = None, dph_usd: float | None = None,
) -> CreateOutcome:
    """PUT the create once (the client retries only a 429, which creates nothing). An unknown outcome is
    looked up by label until the read-lag window has passed; not found then, it is `unresolved` (ledger
    `create_unresolved`, which `reap` keeps looking for). An interrupt during the PUT is recorded the same
    way before it propagates. `on_named(instance_id)` is told as soon as an answer names an instance, before
    its ledger line is written (a disk slow to write it must not hide a billing instance from the cap guard).
    `dph_usd`: the offer's quoted price, on the intent line (`costs` estimates a run killed before its record)."""
    label = request.label
    named = on_named or (lambda _id: None)
    ledger.append(run_id, "intent", label, offer_id=offer_id, dph_usd=dph_usd)
    t_sent = clock()

    def unresolved(detail: str) -> CreateOutcome:
        ledger.append(run_id, "create_unresolved", label, offer_id=offer_id, detail=detail[:300])
        return CreateOutcome(status="unresolved", detail=detail)

    def look(exc: Exception, *, unknown: bool) -> CreateOutcome:
        found = find_by_label(client, label, attempts=lag_attempts if unknown else 2, wait_s=lag_wait_s,
                              sleep=sleep, until_mono=t_sent + lag_window_s, clock=clock)
        if found:
            named(found[0])
            ledger.append(run_id, "created", label, offer_id=offer_id, instance_id=found[0], detail="found by label")
            with contextlib.suppress(LedgerWriteError):  # lost, reap is only more careful with it
                ledger.append(run_id, "seen", label, instance_id=found[0], detail="in the list by label")
            return CreateOutcome(status="found_after_unknown", instance_id=found[0], detail=str(exc))
        if unknown:
            return unresolved(f"{exc}; no instance with label {label} appeared within {lag_window_s:g} s")
        return CreateOutcome(status="not_created", detail=str(exc))

    try:
        result = client.create_instance(offer_id, request.model_dump(exclude_none=True))
    except OfferUnavailable as exc:  # refused, not queued (cancel_unavail): nothing to look for later
        ledger.append(run_id, "create_failed", label, offer_id=offer_id, verdict=NOTHING_CREATED, detail=str(exc)[:300])
        return CreateOutcome(status="unavailable", detail=str(exc))
    except RateLimitError as exc:  # 429: nothing was created (the client already waited and retried)
        ledger.append(run_id, "create_failed", label, offer_id=offer_id, verdict=NOTHING_CREATED, detail=str(exc)[:300])
        return CreateOutcome(status="not_created", detail=str(exc))
    except ApiStatusError as exc:
        if exc.new_contract is not None:  # bid too low etc.: created stopped, bills storage until deleted
            named(exc.new_contract)
            ledger.append(run_id, "create_failed", label, offer_id=offer_id, instance_id=exc.new_contract,
                          detail=str(exc)[:300])
            return CreateOutcome(status="created_with_error", instance_id=exc.new_contract, detail=str(exc))
        ledger.append(run_id, "create_failed", label, offer_id=offer_id, detail=str(exc)[:300])
        # A 5xx may still have created (the contract was written before the gateway failed): look first.
        return look(exc, unknown=_outcome_unknown(exc.status))
    except TransportError as exc:
        ledger.append(run_id, "create_unknown", label, offer_id=offer_id, detail=str(exc)[:300])
        return look(exc, unknown=True)
    except BaseException as exc:  # Ctrl-C, SIGTERM, a bug: the server may still be creating
        unresolved(f"interrupted while the create was in flight ({type(exc).__name__})")
        raise
    named(result.new_contract)
    ledger.append(run_id, "created", label, offer_id=offer_id, instance_id=result.new_contract)
    return CreateOutcome(status="created", instance_id=result.new_contract)


def wait_ready(
    client: VastClient, instance_id: int, *, deadline: float | Callable[[], float], poll_s: float,
    null_grace_s: float, sleep: Sleep = time.sleep, on_poll: Callable[[Instance | None], None] | None = None,
    on_read_failed: Callable[[VastError], None] | None = None, read_retry_s: float | None = None,
    read_within_s: float | None = None, clock: Clock = now_s,
) -> Instance:
    """Poll until running with an SSH endpoint; fail fast on failed states. `deadline` is on `clock`; a callable
    is asked again at every poll (a price learnt while booting moves the cap's deadline earlier). A read that
    fails after `read_retry_s` of retries (default: until the deadline), or does not answer within
    `read_within_s` (a stall), is handed to `on_read_failed`, so the caller can learn from another read what
    this one did not say (the v1 list row's price)."""
    deadline_at = deadline if callable(deadline) else (lambda: deadline)
    started = clock()
    last = "no read yet"
    while True:
        try:  # a read in flight at the deadline ends there (its retries too): the cap's margin is not for it
            left_s = max(0.0, deadline_at() - clock())
            inst = client.get_instance(instance_id, max_retry_s=read_retry_s,
                                       within_s=left_s if read_within_s is None else min(left_s, read_within_s))
        except EndpointDeprecated:
            raise  # a retired path answers the same until the harness is updated: waiting cannot help
        except VastError as exc:
            inst, last = None, f"read failed: {exc}"
            if on_read_failed:
                on_read_failed(exc)
        else:
            if on_poll:
                on_poll(inst)
            if inst is not None:
                inst = with_list_ports(client, inst, within_s=max(0.0, deadline_at() - clock()))
            if inst is None:
                last = "instances: null"
                if clock() - started > null_grace_s:
                    raise BootFailed(f"instance {instance_id} not visible {null_grace_s:g} s after create")
            else:
                reason = inst.failed_reason
                if reason:
                    raise BootFailed(f"instance {instance_id} failed to boot: {reason}")
                if inst.is_ready:
                    return inst
                last = f"actual_status={inst.actual_status} status_msg={inst.status_msg!r}"
        remaining = deadline_at() - clock()
        if remaining <= 0:
            raise BootFailed(f"instance {instance_id} not ready before the deadline ({last})")
        sleep(min(poll_s, remaining))


def with_list_ports(client: VastClient, inst: Instance, *, within_s: float) -> Instance:
    """A running instance whose per-id read carries no `ports` (Vast's own QA tool: "The single-instance endpoint
    does not include Docker-style port mappings") with the ports of its v1 list row, read by id; unchanged when
    the list has none either or cannot be read (the proxy endpoint, if any, still serves). A list row of it that
    states a higher `dph_total` than the per-id read brings that too: the meter takes the higher (never lower)."""
    if inst.actual_status != READY_STATUS or inst.ports:
        return inst
    try:
        rows = [r for r in client.list_instances(instance_id=inst.id, within_s=within_s) if r.id == inst.id]
    except VastError:
        return inst
    update: dict[str, object] = {}
    higher = [r.dph_total for r in rows if r.dph_total is not None and (inst.dph_total or 0.0) < r.dph_total]
    if higher:
        update["dph_total"] = max(higher)
    row = next((r for r in rows if r.ports), None)
    if row is not None:
        update |= {"ports": row.ports, "public_ipaddr": inst.public_ipaddr or row.public_ipaddr}
    return inst.model_copy(update=update) if update else inst


def destroy(client: VastClient, instance_id: int, *, max_retry_s: float | None = None,
            land_by_mono: float | None = None, clock: Clock = now_s) -> DeleteAck:
    """DELETE with the client's retry policy (429/5xx/transport), bounded by `max_retry_s`, its attempts cut so
    a retry still lands by `land_by_mono` (on `clock`: the cap's deadline) while two fit; never raises."""
    t0 = time.time()
    land_within_s = None if land_by_mono is None else land_by_mono - clock()
    try:
        outcome = client.destroy_instance(instance_id, max_retry_s=max_retry_s, land_within_s=land_within_s)
    except Exception as exc:  # noqa: BLE001 - the client raises only typed errors; this is the backstop
        return DeleteAck(instance_id=instance_id, acknowledged=False, outcome=f"{type(exc).__name__}: {exc}"[:500],
                         t_request_unix=t0)
    return DeleteAck(instance_id=instance_id, acknowledged=True, outcome=outcome, t_request_unix=t0,
                     t_ack_unix=time.time(), t_ack_mono=clock())


class LedgerAppend(Protocol):
    """What teardown needs of a ledger: an append (a `Ledger`, which records a failed best-effort write and
    goes on, or reap's fan-out to every ledger that names the instance)."""

    def append(self, run_id: str, event: Event, label: str, **fields: Unpack[EntryFields]) -> LedgerEntry | None: ...


def teardown_instance(
    client: VastClient, ledger: LedgerAppend, *, run_id: str, label: str, instance_id: int, interval_s: float,
    deadline: float, sleep: Sleep = time.sleep, created_mono: float | None = None,
    lag_window_s: float, seen: bool = True, clock: Clock = now_s, land_by_mono: float | None = None,
    while_deleting: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
    first_ack: DeleteAck | None = None, on_ack: Callable[[DeleteAck], None] | None = None,
    on_round: Callable[[ProofRound], None] | None = None, freeze: FreezeWatch | None = None,
) -> InstanceTeardown:
    """Delete, then prove absent; delete again whenever a proof sees it live, until proven or `deadline`.

    `created_mono` (when known: the create on this process's monotonic clock; a reap maps the server-clock
    age of the create onto it) opens the read-lag window: a "not found" DELETE or an absence observed
    before `created_mono + lag_window_s` proves nothing, so the proof waits it out. For an instance that no
    read has shown yet (`seen` False: the create's answer named it, nothing since), the window is
    UNSEEN_TRUST_AFTER_S, until a DELETE acknowledges deleting it or a round shows it. The ledger gets every
    acknowledged DELETE, the first sight, and the verdict. `land_by_mono` (a run's cap deadline, on `clock`):
    the DELETE's attempts are cut so that a retry after a stalled one still lands by then (`destroy`).
    `first_ack`: a DELETE of this instance already sent for this run (the cap guard's, caps/guard.py): it is the
    teardown's first when it was answered; otherwise the teardown sends its own. `on_ack`: each acknowledged
    DELETE as it is answered, before the proof (a run's meter stops billing there, not after the proof).
    `on_round`: each absence-proof round as it ends (`absence.prove_absent`). `freeze` (a run's and a reap's):
    the budget bounds waiting on the API, not seconds the process was stopped (SIGSTOP, a suspend): `deadline`
    moves back by them, and a proof that ended unproven in a pass the process was stopped in is made again,
    its rounds kept, the DELETE sent again (an unanswered one carried over, as the guard's is).
    """
    report = InstanceTeardown(instance_id=instance_id)
    earlier_rounds: list[ProofRound] = []  # of a proof made again after the process was stopped

    def budget_end() -> float:
        return deadline + (freeze.frozen_s() if freeze is not None else 0.0)

    def window_end(seen_now: bool) -> float:
        if created_mono is None:
            return 0.0
        return created_mono + (lag_window_s if seen_now else max(lag_window_s, UNSEEN_TRUST_AFTER_S))

    while True:
        # The DELETE's retries leave the proof its two rounds: a DELETE that never answers must not eat the
        # whole budget and leave the reads no time to decide (jittered retries once did, at random).
        remaining = budget_end() - clock()
        unanswered_before = False
        if first_ack is not None and first_ack.acknowledged:
            ack, first_ack = first_ack, None
        else:
            if first_ack is not None:  # the guard's DELETE got no answer: it is on record, and ours goes now
                report.deletes.append(first_ack)
                first_ack, unanswered_before = None, True
            with while_deleting() if while_deleting else contextlib.nullcontext():  # e.g. the run's price watch
                ack = destroy(client, instance_id, max_retry_s=max(0.0, remaining - 2 * interval_s),
                              land_by_mono=land_by_mono, clock=clock)
            if unanswered_before and ack.outcome == "already_gone":  # that unanswered DELETE may have deleted it
                ack = ack.model_copy(update={"outcome": "already_gone_after_unanswered"})
        report.deletes.append(ack)
        if ack.acknowledged:
            ledger.append(run_id, "delete_ack", label, instance_id=instance_id, detail=ack.outcome)
            if on_ack is not None:
                on_ack(ack)
            seen = seen or ack.outcome == "deleted"  # it existed, as far as the API could tell
        frozen_before_s = freeze.frozen_s() if freeze is not None else 0.0
        proof = prove_absent(client, instance_id, label, interval_s=interval_s, deadline=budget_end(),
                             sleep=sleep, not_before_mono=window_end(seen),
                             not_before_once_seen_mono=window_end(True), clock=clock, on_round=on_round)
        report.proof = proof.model_copy(update={"rounds": earlier_rounds + proof.rounds}) if earlier_rounds else proof
        if report.proof.seen_by_reads and not seen:
            seen = True
            ledger.append(run_id, "seen", label, instance_id=instance_id, detail="in an absence-proof round")
        if report.proof.verdict in ("unknown", "going") and freeze is not None and \
                freeze.frozen_s() > frozen_before_s:  # its time went on seconds the process did not run
            earlier_rounds = report.proof.rounds
            if not ack.acknowledged:
                first_ack = report.deletes.pop()
            continue
        if report.proof.verdict != "present" or clock() + interval_s > budget_end():
            break
        sleep(min(interval_s, max(0.0, budget_end() - clock())))  # live again: pace the next DELETE
    report.seen = seen
    detail = None if seen else ("no read has shown this instance and no DELETE deleted it: null reads may be a "
                                "read lag; reap keeps it")
    ledger.append(run_id, "absence", label, instance_id=instance_id, verdict=report.verdict, detail=detail)
    return report
