"""`vast-e2e reap`: delete and prove absent every instance a run may have left billing.

Two sources, because either alone can miss one: the ledger (every instance a run recorded and never proved
gone, and every create whose outcome is unknown, looked up by label) and the live list (every instance whose
label carries the project's prefix). The ledger's ids are deleted whatever the list does. Only instances of
this reap's own target (API URL and account) are touched: with another account's key a per-id `null` means
"not visible to this key", not "gone", so those are reported as unproven. Exit 0 only when all are proven
absent and every scan answered. Also removes the one-time SSH keys that killed runs left in the temp dir.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

from vast_harness.client import VastClient
from vast_harness.config import LABEL_PREFIX, RunSpec
from vast_harness.errors import ExitCode, VastError
from vast_harness.evidence import RunEvidence
from vast_harness.ledger import Ledger, LedgerEntry, new_run_id
from vast_harness.lifecycle import UNSEEN_TRUST_AFTER_S, InstanceTeardown, teardown_instance
from vast_harness.meter import teardown_budget_s
from vast_harness.output import Output

# A label is marked swept (no longer searched) only once its intent is older than any read lag we know of.
LABEL_SWEEP_AFTER_S = UNSEEN_TRUST_AFTER_S
# Key dirs of runs from before the pid was in the name: removed once older than any run can last.
LEGACY_KEY_DIR_AGE_S = 8 * 24 * 3600.0
_KEY_DIR_PID = re.compile(r"^vh-key-(\d+)-")


class ReapOutcome(BaseModel):
    reports: list[InstanceTeardown] = Field(default_factory=list)
    labels: dict[int, str] = Field(default_factory=dict)
    not_proven: list[str] = Field(default_factory=list)  # one line per thing reap could not prove
    foreign: list[int] = Field(default_factory=list)
    unresolved_labels: list[str] = Field(default_factory=list)  # creates of unknown outcome, no instance seen yet
    unseen: dict[int, float] = Field(default_factory=dict)  # ledger ids no read has shown -> their create's t_unix
    key_dirs_removed: list[str] = Field(default_factory=list)
    interrupted: bool = False

    @property
    def unproven_ids(self) -> list[int]:
        return sorted({r.instance_id for r in self.reports if r.verdict != "gone"} |
                      {i for i in self.labels if i not in {r.instance_id for r in self.reports}} | set(self.foreign))

    @property
    def ok(self) -> bool:
        return not self.not_proven and not self.unproven_ids and not self.interrupted


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    return True


def remove_stale_key_dirs(tmp_dir: Path | None = None, *, now: float | None = None) -> list[Path]:
    """Remove `vh-key-*` dirs (one-time SSH private keys) whose run process is gone."""
    tmp_dir = Path(tmp_dir or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed: list[Path] = []
    for path in sorted(tmp_dir.glob("vh-key-*")):
        try:
            st = path.lstat()
        except OSError:
            continue
        if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
            continue
        m = _KEY_DIR_PID.match(path.name)
        if m:
            if _pid_alive(int(m.group(1))):
                continue
        elif now - st.st_mtime < LEGACY_KEY_DIR_AGE_S:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


def _describe(entry: LedgerEntry) -> str:
    return entry.target.describe() if entry.target else "an unrecorded target"


def _collect(client: VastClient, ledger: Ledger, out: Output, result: ReapOutcome, run_id: str) -> None:
    """Fill `result.labels` (instance id -> label) with everything this key must delete."""
    view = ledger.view()
    for bad in view.bad_lines:
        out.warn(f"ledger {ledger.path} line {bad.line_no} skipped: {bad.reason}")
    mine = ledger.target

    def own(entry: LedgerEntry) -> bool:
        return entry.target is None or mine is None or entry.target == mine  # lines without a target: legacy

    for instance_id, entry in sorted(view.pending.items()):
        if own(entry):
            result.labels[instance_id] = entry.label
            if instance_id not in view.seen:  # the create named it, no read showed it: a lag may still hide it
                result.unseen[instance_id] = entry.t_unix
        else:
            result.foreign.append(instance_id)
            result.not_proven.append(f"instance {instance_id} ({entry.label}) belongs to {_describe(entry)}: it "
                                     "cannot be proven absent with this key/URL; reap with that key and --api-url")
    for label, entry in sorted(view.unresolved.items()):
        if not own(entry):
            result.not_proven.append(f"label {label} (create outcome unknown) belongs to {_describe(entry)}: "
                                     "cannot look for it with this key/URL")
            continue
        try:
            found = [i.id for i in client.list_instances(label=label)]
        except VastError as exc:
            result.not_proven.append(f"label {label} (create outcome unknown): could not list it: {exc}")
            continue
        for instance_id in found:
            result.labels.setdefault(instance_id, label)
        age_s = time.time() - entry.t_unix
        if not found and age_s > LABEL_SWEEP_AFTER_S:
            ledger.append(run_id, "label_swept", label, detail="no instance with this label long after its create")
        elif not found:
            # Not seen is not gone: reads lag creates, and a create whose answer was lost may still land. Say so
            # (exit 3) until the label is older than any lag we allow for; never "all proven absent".
            result.unresolved_labels.append(label)
            result.not_proven.append(f"label {label}: a create {age_s:.0f} s ago has an unknown outcome and no "
                                     f"instance carries the label yet; run reap again later (it keeps looking "
                                     f"until {LABEL_SWEEP_AFTER_S / 3600:g} h after the create)")
    try:
        for inst in client.list_instances():
            if (inst.label or "").startswith(LABEL_PREFIX):
                result.labels.setdefault(inst.id, inst.label or "")
            result.unseen.pop(inst.id, None)  # listed: seen now
    except VastError as exc:
        result.not_proven.append(f"could not list live instances (the {LABEL_PREFIX}* scan did not run): {exc}")


def reap_all(spec: RunSpec, client: VastClient, out: Output) -> ExitCode:
    ledger = Ledger.for_spec(spec)
    run_id = new_run_id("reap-", unique=False)
    result = ReapOutcome()
    result.key_dirs_removed = [str(p) for p in remove_stale_key_dirs()]
    if result.key_dirs_removed:
        out.info(f"removed {len(result.key_dirs_removed)} one-time SSH key dir(s) left by killed runs")
    scanned = False
    try:
        _collect(client, ledger, out, result, run_id)
        scanned = True
        for instance_id, label in sorted(result.labels.items()):
            out.info(f"deleting instance {instance_id} ({label})")
            deadline = time.monotonic() + teardown_budget_s(spec.proof_interval_s)
            unseen_since = result.unseen.get(instance_id)
            report = teardown_instance(client, ledger, run_id=run_id, label=label, instance_id=instance_id,
                                       interval_s=spec.proof_interval_s, deadline=deadline,
                                       created_unix=unseen_since, seen=unseen_since is None)
            result.reports.append(report)
            if not report.seen and report.verdict != "gone" and unseen_since is not None:
                result.not_proven.append(
                    f"instance {instance_id} ({label}): its create named it {time.time() - unseen_since:.0f} s ago "
                    f"but no read has shown it and every DELETE answered not found; reads may lag a create, so "
                    f"this is not proof it is gone: run reap again later (null reads count once it is "
                    f"{UNSEEN_TRUST_AFTER_S / 3600:g} h old)")
    except KeyboardInterrupt:
        result.interrupted = True
        if not scanned:
            result.not_proven.append("reap interrupted before its ledger and label scans finished; run "
                                     "`vast-e2e reap` again")
        left = [i for i in sorted(result.labels) if i not in {r.instance_id for r in result.reports if r.proof}]
        if left:
            result.not_proven.append(f"reap interrupted while deleting: instance(s) {left} not proven absent; "
                                     "run `vast-e2e reap` again")
        result.reports = [r for r in result.reports if r.proof]
    try:
        ev = RunEvidence(spec.evidence_dir / run_id)
        ev.write_json("absence-proof.json", {"interval_s": spec.proof_interval_s,
                                             "instances": [r.model_dump() for r in result.reports],
                                             "not_proven": result.not_proven})
        ev.write_manifest()
        evidence_dir = str(ev.dir)
    except OSError as exc:  # evidence is best effort; the verdicts below still stand
        out.warn(f"could not write reap evidence under {spec.evidence_dir}: {exc}")
        evidence_dir = None
    if out.json_mode:
        out.emit_json({"reaped": {r.instance_id: r.verdict for r in result.reports}, "unproven": result.unproven_ids,
                       "not_proven": result.not_proven, "key_dirs_removed": result.key_dirs_removed,
                       "evidence_dir": evidence_dir, "exit_code": _code(result)})
    else:
        rows = [(r.instance_id, result.labels.get(r.instance_id, ""), len(r.deletes), r.verdict)
                for r in result.reports]
        out.reap_report(rows, result.not_proven, ok=result.ok)
    return _code(result)


def _code(result: ReapOutcome) -> ExitCode:
    if result.not_proven or result.unproven_ids:
        return ExitCode.NOT_PROVEN_GONE  # something may still bill
    return ExitCode.INTERRUPTED if result.interrupted else ExitCode.PASSED
