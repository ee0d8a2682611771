"""An instance's life as functions: create, wait_ready, destroy, prove_absent, teardown.

Each takes a monotonic deadline or a bounded count: nothing here waits forever. Create is never retried
blindly; a create whose outcome is unknown is followed by a list by label (reads lag creates).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Literal

from pydantic import BaseModel, Field

from vast_harness.client import RawExchange, VastClient
from vast_harness.errors import ApiStatusError, HarnessError, OfferUnavailable, TransportError, VastError
from vast_harness.ledger import Ledger
from vast_harness.models import Instance

Sleep = Callable[[float], None]


class BootFailed(HarnessError):
    """The instance will not become ready (failed state, status_msg error, deadline, SSH never answered)."""


class CreateOutcome(BaseModel):
    status: Literal["created", "created_with_error", "unavailable", "found_after_unknown", "not_created"]
    instance_id: int | None = None
    detail: str = ""
    t_unix: float = Field(default_factory=time.time)


def find_by_label(client: VastClient, label: str, *, attempts: int, wait_s: float, sleep: Sleep) -> list[int]:
    """Ids of instances carrying `label`, tolerating read lag and transient errors for `attempts` tries."""
    for i in range(attempts):
        try:
            found = [inst.id for inst in client.list_instances(label=label)]
            if found:
                return found
        except VastError:
            pass
        if i + 1 < attempts:
            sleep(wait_s)
    return []


def create(
    client: VastClient, ledger: Ledger, *, run_id: str, label: str, offer_id: int, body: dict,
    lag_attempts: int = 6, lag_wait_s: float = 5.0, sleep: Sleep = time.sleep,
) -> CreateOutcome:
    ledger.append(run_id, "intent", label, offer_id=offer_id)
    try:
        result = client.create_instance(offer_id, body)
    except OfferUnavailable as exc:
        ledger.append(run_id, "create_failed", label, offer_id=offer_id, detail=str(exc)[:300])
        return CreateOutcome(status="unavailable", detail=str(exc))
    except ApiStatusError as exc:
        if exc.new_contract is not None:  # bid too low etc.: created stopped, bills storage until deleted
            ledger.append(run_id, "create_failed", label, offer_id=offer_id, instance_id=exc.new_contract,
                          detail=str(exc)[:300])
            return CreateOutcome(status="created_with_error", instance_id=exc.new_contract, detail=str(exc))
        ledger.append(run_id, "create_failed", label, offer_id=offer_id, detail=str(exc)[:300])
        # Some errors still create (e.g. a 5xx after the contract was written): look before leaving.
        found = find_by_label(client, label, attempts=2, wait_s=lag_wait_s, sleep=sleep)
        if found:
            ledger.append(run_id, "created", label, offer_id=offer_id, instance_id=found[0], detail="found by label")
            return CreateOutcome(status="found_after_unknown", instance_id=found[0], detail=str(exc))
        return CreateOutcome(status="not_created", detail=str(exc))
    except TransportError as exc:
        ledger.append(run_id, "create_unknown", label, offer_id=offer_id, detail=str(exc)[:300])
        found = find_by_label(client, label, attempts=lag_attempts, wait_s=lag_wait_s, sleep=sleep)
        if found:
            ledger.append(run_id, "created", label, offer_id=offer_id, instance_id=found[0], detail="found by label")
            return CreateOutcome(status="found_after_unknown", instance_id=found[0], detail=str(exc))
        return CreateOutcome(status="not_created", detail=f"{exc}; no instance with label {label} appeared")
    ledger.append(run_id, "created", label, offer_id=offer_id, instance_id=result.new_contract)
    return CreateOutcome(status="created", instance_id=result.new_contract)


def wait_ready(
    client: VastClient, instance_id: int, *, deadline: float, poll_s: float, null_grace_s: float,
    sleep: Sleep = time.sleep, on_poll: Callable[[Instance | None], None] | None = None,
) -> Instance:
    """Poll until running with an SSH endpoint; fail fast on failed states; `deadline` is monotonic."""
    started = time.monotonic()
    last = "no read yet"
    while True:
        try:
            inst = client.get_instance(instance_id)
        except VastError as exc:
            inst, last = None, f"read failed: {exc}"
        else:
            if on_poll:
                on_poll(inst)
            if inst is None:
                last = "instances: null"
                if time.monotonic() - started > null_grace_s:
                    raise BootFailed(f"instance {instance_id} not visible {null_grace_s:g} s after create")
            else:
                reason = inst.failed_reason
                if reason:
                    raise BootFailed(f"instance {instance_id} failed to boot: {reason}")
                if inst.is_ready:
                    return inst
                last = f"actual_status={inst.actual_status} status_msg={inst.status_msg!r}"
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BootFailed(f"instance {instance_id} not ready before the deadline ({last})")
        sleep(min(poll_s, remaining))


class DeleteAck(BaseModel):
    instance_id: int
    acknowledged: bool
    outcome: str  # deleted | already_gone | error text
    t_request_unix: float
    t_ack_unix: float | None = None


def destroy(client: VastClient, instance_id: int) -> DeleteAck:
    """DELETE with the client's retry policy (429/5xx/transport); never raises."""
    t0 = time.time()
    try:
        outcome = client.destroy_instance(instance_id)
    except VastError as exc:
        return DeleteAck(instance_id=instance_id, acknowledged=False, outcome=str(exc), t_request_unix=t0)
    return DeleteAck(instance_id=instance_id, acknowledged=True, outcome=outcome, t_request_unix=t0,
                     t_ack_unix=time.time())


Verdict = Literal["gone", "present", "unknown"]


class ProofRound(BaseModel):
    t_unix: float
    per_id: dict
    list_by_id: dict
    list_by_label: dict
    verdict: Verdict


class AbsenceProof(BaseModel):
    instance_id: int
    label: str
    interval_s: float
    rounds: list[ProofRound] = Field(default_factory=list)
    verdict: Verdict = "unknown"


def _list_exchange(client: VastClient, column: str, value: object) -> RawExchange:
    params = {"select_filters": json.dumps({column: {"eq": value}}), "limit": 25}
    return client.exchange("GET", "/api/v1/instances/", params=params)


def _per_id_verdict(x: RawExchange, instance_id: int) -> Verdict:
    if x.status != 200 or not isinstance(x.json, dict) or "instances" not in x.json:
        return "unknown"
    inst = x.json["instances"]
    if inst is None:
        return "gone"
    if isinstance(inst, dict) and inst.get("id") == instance_id:
        return "present"
    return "unknown"  # some other shape: never read as absence


def _list_verdict(x: RawExchange, instance_id: int, label: str) -> Verdict:
    if x.status != 200 or not isinstance(x.json, dict) or not isinstance(x.json.get("instances"), list):
        return "unknown"
    rows = x.json["instances"]
    if any(isinstance(r, dict) and (r.get("id") == instance_id or r.get("label") == label) for r in rows):
        return "present"
    total = x.json.get("total_instances")
    if rows or (total not in (None, 0)):
        return "unknown"  # rows we cannot attribute, or a count that disagrees: not a proof
    return "gone"


def _one_round(client: VastClient, instance_id: int, label: str) -> ProofRound:
    per_id = client.exchange("GET", f"/api/v0/instances/{instance_id}/")
    by_id = _list_exchange(client, "id", instance_id)
    by_label = _list_exchange(client, "label", label)
    verdicts = {_per_id_verdict(per_id, instance_id), _list_verdict(by_id, instance_id, label),
                _list_verdict(by_label, instance_id, label)}
    verdict: Verdict = "present" if "present" in verdicts else ("gone" if verdicts == {"gone"} else "unknown")
    return ProofRound(t_unix=time.time(), per_id=per_id.to_dict(), list_by_id=by_id.to_dict(),
                      list_by_label=by_label.to_dict(), verdict=verdict)


def prove_absent(
    client: VastClient, instance_id: int, label: str, *, interval_s: float, deadline: float,
    sleep: Sleep = time.sleep,
) -> AbsenceProof:
    """Invariant 2: two consecutive all-'gone' rounds at least `interval_s` apart, before `deadline`.

    Any non-200, timeout or unparsable body makes a round 'unknown' and restarts the count. If a round sees
    the instance, the verdict is 'present' (the caller deletes again).
    """
    proof = AbsenceProof(instance_id=instance_id, label=label, interval_s=interval_s)
    streak_start: float | None = None
    while True:
        r = _one_round(client, instance_id, label)
        proof.rounds.append(r)
        if r.verdict == "present":
            proof.verdict = "present"
            return proof
        if r.verdict == "gone":
            if streak_start is None:
                streak_start = r.t_unix
            elif r.t_unix - streak_start >= interval_s:
                proof.verdict = "gone"
                return proof
        else:
            streak_start = None
        if time.monotonic() + interval_s > deadline:
            proof.verdict = "unknown"
            return proof
        sleep(interval_s)


class InstanceTeardown(BaseModel):
    instance_id: int
    deletes: list[DeleteAck] = Field(default_factory=list)
    proof: AbsenceProof | None = None

    @property
    def verdict(self) -> Verdict:
        return self.proof.verdict if self.proof else "unknown"


def teardown_instance(
    client: VastClient, ledger: Ledger, *, run_id: str, label: str, instance_id: int, interval_s: float,
    deadline: float, sleep: Sleep = time.sleep, max_deletes: int = 3,
) -> InstanceTeardown:
    """Delete, then prove absent; delete again if a proof still sees it. Ledger gets every outcome."""
    report = InstanceTeardown(instance_id=instance_id)
    for _ in range(max_deletes):
        ack = destroy(client, instance_id)
        report.deletes.append(ack)
        if ack.acknowledged:
            ledger.append(run_id, "delete_ack", label, instance_id=instance_id, detail=ack.outcome)
        report.proof = prove_absent(client, instance_id, label, interval_s=interval_s, deadline=deadline, sleep=sleep)
        if report.proof.verdict != "present" or time.monotonic() > deadline:
            break
    ledger.append(run_id, "absence", label, instance_id=instance_id, verdict=report.verdict)
    return report
