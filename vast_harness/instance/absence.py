"""The absence rules: when reads of an instance prove it gone, and the proof itself.

An instance is gone only on parsed evidence: the per-id read says not found, the v1 list by id and by label
show no live row, in two rounds `interval_s` apart, and not before the read-lag window after its create closed
(a null read of an instance no read has shown yet proves nothing until it is `UNSEEN_TRUST_AFTER_S` old).
A row Vast keeps as `destroyed`/`terminated` is lingering, not live. Everything else is `present` or
`unknown`, never `gone`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from vast_harness.clock import Clock, Sleep, now_s
from vast_harness.records import AbsenceProof, ProofRound, Verdict
from vast_harness.timings import TeardownBudget
from vast_harness.vast.client import RawExchange, VastClient
from vast_harness.vast.models import Instance, UnreadableShape, per_id_row

LINGERING_STATUSES = frozenset({"destroyed", "terminated"})  # vast-cli's instance_exist counts these as gone


def is_lingering(inst: Instance | dict[str, Any]) -> bool:
    """A destroyed instance's row that reads still show for a while (not billing, not yet gone)."""
    if isinstance(inst, dict):
        intended, actual = inst.get("intended_status"), inst.get("actual_status")
    else:
        intended, actual = inst.intended_status, inst.actual_status
    return intended in LINGERING_STATUSES or actual in LINGERING_STATUSES


# No read lag we know of lasts this long. An instance whose id a create returned but that no read has shown and
# no DELETE has acknowledged deleting may be hidden by a lag longer than the read-lag window: until this long after
# its create, null reads and not-found DELETEs prove nothing for it (exit 3; `reap` keeps it).
UNSEEN_TRUST_AFTER_S = 3600.0


def _per_id_verdict(x: RawExchange, instance_id: int) -> Verdict:
    if x.status != 200:
        return "unknown"
    try:  # an object or a one-element list (models.per_id_row); null or [] is not found
        _shape, inst = per_id_row(x.json, instance_id)
    except UnreadableShape:
        return "unknown"  # some other shape: never read as absence
    if inst is None:
        return "gone"
    if inst.get("id") == instance_id:
        return "going" if is_lingering(inst) else "present"
    return "unknown"


def _list_verdict(x: RawExchange, instance_id: int, label: str) -> Verdict:
    if x.status != 200 or not isinstance(x.json, dict) or not isinstance(x.json.get("instances"), list):
        return "unknown"
    rows = x.json["instances"]
    ours = [r for r in rows if isinstance(r, dict) and (r.get("id") == instance_id or r.get("label") == label)]
    if ours:
        return "going" if all(is_lingering(r) for r in ours) else "present"
    total = x.json.get("total_instances")
    if rows or (total not in (None, 0)) or x.json.get("next_token"):
        return "unknown"  # rows we cannot attribute, a count that disagrees, more pages: not a proof
    return "gone"


def _one_round(client: VastClient, instance_id: int, label: str, not_before_mono: float,
               clock: Clock = now_s, deadline: float | None = None) -> ProofRound:
    """Three reads, each ending by `deadline` (on `clock`): one that hangs must not hold the teardown past its
    budget; a read cut there is 'unknown'."""
    def left() -> float | None:  # a round that began before the deadline gets at least a short answer
        return None if deadline is None else max(TeardownBudget.PROOF_READ_MIN_S, deadline - clock())

    per_id = client.read_instance_raw(instance_id, within_s=left())
    by_id = client.list_instances_raw(instance_id=instance_id, within_s=left())
    by_label = client.list_instances_raw(label=label, within_s=left())
    verdicts = {_per_id_verdict(per_id, instance_id), _list_verdict(by_id, instance_id, label),
                _list_verdict(by_label, instance_id, label)}
    verdict: Verdict = ("present" if "present" in verdicts else "going" if "going" in verdicts
                        else "gone" if verdicts == {"gone"} else "unknown")
    t = clock()
    return ProofRound(t_unix=time.time(), t_mono=t, per_id=per_id.to_dict(), list_by_id=by_id.to_dict(),
                      list_by_label=by_label.to_dict(), verdict=verdict, in_lag_window=t < not_before_mono)


def prove_absent(
    client: VastClient, instance_id: int, label: str, *, interval_s: float, deadline: float,
    sleep: Sleep = time.sleep, not_before_mono: float = 0.0, not_before_once_seen_mono: float | None = None,
    clock: Clock = now_s, on_round: Callable[[ProofRound], None] | None = None,
) -> AbsenceProof:
    """Two consecutive all-'gone' rounds at least `interval_s` apart, both at or after `not_before_mono`
    (the end of the read-lag window), before `deadline`; all three on the monotonic clock. Once a round shows
    the instance (live or lingering), the window is `not_before_once_seen_mono` when given (an instance reads
    can show is past any lag).

    Any non-200, timeout or unparsable body makes a round 'unknown' and restarts the count; a lingering
    destroyed row ('going') restarts it too and the proof keeps going until the deadline. If a round sees
    the instance live, the verdict is 'present' (the caller deletes again). `deadline`, the read-lag window and
    the rounds' spacing are all on `clock` (monotonic seconds; a test's fake clock); wall time is only recorded.
    `on_round`: told each round as it ends (the run's registration shows it to `status`).
    """
    proof = AbsenceProof(instance_id=instance_id, label=label, interval_s=interval_s)
    _set_window(proof, not_before_mono, clock)
    streak_start: float | None = None
    while True:
        r = _one_round(client, instance_id, label, proof.not_before_mono, clock, deadline)
        proof.rounds.append(r)
        if on_round is not None:
            on_round(r)
        if r.verdict in ("present", "going") and not proof.seen_by_reads:
            proof.seen_by_reads = True
            if not_before_once_seen_mono is not None:
                _set_window(proof, min(proof.not_before_mono, not_before_once_seen_mono), clock)
        if r.verdict == "present":
            proof.verdict = "present"
            return proof
        if r.verdict == "gone" and not r.in_lag_window:
            if streak_start is None:
                streak_start = r.t_mono
            elif r.t_mono - streak_start >= interval_s:
                proof.verdict = "gone"
                return proof
        else:
            streak_start = None
        wait_s = interval_s
        if r.in_lag_window:  # nothing read now counts: sleep to the window's end (polling for a late row)
            wait_s = max(interval_s, min(proof.not_before_mono - clock(), max(interval_s, 1.0)))
        if clock() + wait_s > deadline:
            proof.verdict = "going" if r.verdict == "going" else "unknown"
            return proof
        sleep(wait_s)


def _set_window(proof: AbsenceProof, not_before_mono: float, clock: Clock = now_s) -> None:
    proof.not_before_mono = not_before_mono
    # recorded on the wall clock too, for a reader of absence-proof.json (0: no window)
    proof.not_before_unix = time.time() + (not_before_mono - clock()) if not_before_mono > 0 else 0.0
