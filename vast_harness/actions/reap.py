"""`vast-e2e reap`: delete and prove absent every instance a dead run left billing; never a live run's.

Two sources, because either alone can miss one: the ledgers (the user's, in the state dir, and any older
one: every instance a run recorded and never proved gone, and every create whose outcome is unknown, looked
up by label) and the live list (every instance whose label carries the project's prefix). Each instance is
then judged (`views/orphans.py`, the judgement `status` shows): an **orphan** (its run is known dead, or its own cap deadline has passed) is deleted
and proven absent; a **live** run's instance (its registration is locked on this machine, or its label's
deadline is still ahead on the API server's clock) is listed and left alone, unless `--include-live` (after a
confirmation). Only instances of this reap's own target (API URL and account) are proven: with another
account's key a per-id `null` means "not visible to this key", not "gone", so those are reported as
unproven, and so are ledger lines that carry no target. Exit 0 when every orphan is proven gone and every
scan answered, whatever live runs it left. Also removes the one-time SSH keys that killed runs left behind.

A ledger's id is deleted only once a read has shown its row with the label the ledger gives it (a run's own read,
recorded as `seen`, or this reap's: the list, else a look at the row until the teardown budget ends,
instance/ownership.py): a create answer can name another's instance, and a row no read can show proves nothing.
One whose row carries another label, or that stays unread, is left alone, and the label is looked for instead: an
instance that carries it is the create's own, and is deleted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Unpack

from pydantic import BaseModel, Field

from vast_harness.caps.meter import finite_positive, plausible_dph, teardown_budget_s
from vast_harness.clock import FreezeWatch, now_s
from vast_harness.console.output import Output
from vast_harness.console.terminal import terminal_safe
from vast_harness.errors import AuthError, ExitCode, VastError
from vast_harness.evidence.run import RunEvidence
from vast_harness.host.ssh import RUN_KEY_DIR_GLOB, run_key_dir_pid
from vast_harness.instance.absence import UNSEEN_TRUST_AFTER_S, is_lingering, prove_absent
from vast_harness.instance.lifecycle import teardown_instance
from vast_harness.instance.ownership import Owner, await_owner
from vast_harness.records import InstanceTeardown
from vast_harness.run.hold import close_hold_record, finish_hold, switch_ended_unix
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.dirs import legacy_ledgers
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.ledger import EntryFields, Event, Ledger, LedgerEntry, LedgerView, new_run_id, target_of
from vast_harness.state.process import ProcessId, pid_exists, this_host
from vast_harness.state.registry import LABEL_PREFIX, LiveRun, RunRegistry, parse_label
from vast_harness.state.runs import REAP_PREFIX
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance
from vast_harness.views.orphans import LiveInstance, judge

# A label is marked swept (no longer searched) only once its intent is older than any read lag we know of.
LABEL_SWEEP_AFTER_S = UNSEEN_TRUST_AFTER_S
# Key dirs of runs from before the pid was in the name: removed once older than any run can last.
LEGACY_KEY_DIR_AGE_S = 8 * 24 * 3600.0
OWNERSHIP_LOOK_S = 3.0  # one look at an unread ledger id's row and its label's rows (await_owner)


class ReapOutcome(BaseModel):
    reports: list[InstanceTeardown] = Field(default_factory=list)
    labels: dict[int, str] = Field(default_factory=dict)  # the orphans to delete
    not_proven: list[str] = Field(default_factory=list)  # one line per thing reap could not prove
    foreign: list[int] = Field(default_factory=list)
    unresolved_labels: list[str] = Field(default_factory=list)  # creates of unknown outcome, no instance seen yet
    # ledger ids no read has shown (their label unread: read before any DELETE) -> their create's age (s)
    unseen: dict[int, float] = Field(default_factory=dict)
    # ledger ids whose row carries another label -> (the ledger's label, the row's, the ledger's run): never deleted
    foreign_rows: dict[int, tuple[str, str, str]] = Field(default_factory=dict)
    live: list[LiveInstance] = Field(default_factory=list)
    orphan_why: dict[int, str] = Field(default_factory=dict)
    husks: list[int] = Field(default_factory=list)  # orphans that are outbid interruptible instances, paused
    listed_dph_usd: dict[int, float] = Field(default_factory=dict)  # an orphan's $/h as its list row states it
    ledgers_read: list[str] = Field(default_factory=list)
    key_dirs_removed: list[str] = Field(default_factory=list)
    interrupted: bool = False

    @property
    def unproven_ids(self) -> list[int]:
        return sorted({r.instance_id for r in self.reports if r.verdict != "gone"} |
                      {i for i in self.labels if i not in {r.instance_id for r in self.reports}} | set(self.foreign))

    @property
    def ok(self) -> bool:
        return not self.not_proven and not self.unproven_ids and not self.interrupted


def remove_stale_key_dirs(tmp_dir: Path | None = None, *, now: float | None = None) -> list[Path]:
    """Remove runs' one-time SSH key dirs (`vh-key-*`, private keys) whose run process is gone."""
    tmp_dir = Path(tmp_dir or tempfile.gettempdir())
    now = time.time() if now is None else now
    removed: list[Path] = []
    for path in sorted(tmp_dir.glob(RUN_KEY_DIR_GLOB)):
        try:
            st = path.lstat()
        except OSError:
            continue
        if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
            continue
        pid = run_key_dir_pid(path.name)
        if pid is not None:
            if pid_exists(pid):
                continue
        elif now - st.st_mtime < LEGACY_KEY_DIR_AGE_S:
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            removed.append(path)
    return removed


class _Sources:
    """Every ledger reap reads (the state dir's first), and for each line which ledger it came from, so the
    reap's own lines (delete_ack, absence, label_swept) settle it where it was written."""

    def __init__(self, spec: RunSpec, server_clock: Callable[[], float | None]) -> None:
        self.primary = Ledger.for_spec(spec, server_clock)
        others = legacy_ledgers(spec.state_dir, evidence_dir=spec.evidence_dir)
        self.ledgers = [self.primary, *(Ledger(p, target_of(spec), server_clock) for p in others)]
        self.views: list[tuple[Ledger, LedgerView]] = [(ledger, ledger.view()) for ledger in self.ledgers]

    def where(self, *, instance_id: int | None = None, label: str | None = None) -> list[Ledger]:
        out = [self.primary]
        for ledger, view in self.views[1:]:
            if (instance_id is not None and instance_id in view.pending) or (label is not None and label in view.unresolved):
                out.append(ledger)
        return out

    def outbid_ids(self) -> set[int]:
        """Instances a run recorded as outbid (`outbid` lines): a husk if still there."""
        return {e.instance_id for ledger in self.ledgers for e in ledger.entries()
                if e.event == "outbid" and e.instance_id is not None}

    def run_ids(self) -> set[str]:
        """Runs this user's ledgers know: runs of this machine (or of this state dir)."""
        return {e.run_id for ledger in self.ledgers for e in ledger.entries()}

    def processes(self) -> dict[str, ProcessId]:
        """The process each known run's latest ledger line names (lines of older versions name none)."""
        out: dict[str, ProcessId] = {}
        for ledger in self.ledgers:
            for e in ledger.entries():
                if e.process is not None:
                    out[e.run_id] = e.process
        return out


class _FanOut:
    """A LedgerAppend that writes to each ledger naming the instance or label."""

    def __init__(self, ledgers: list[Ledger]) -> None:
        self._ledgers = ledgers

    def append(self, run_id: str, event: Event, label: str, **fields: Unpack[EntryFields]) -> LedgerEntry | None:
        entry = None
        for ledger in self._ledgers:
            entry = ledger.append(run_id, event, label, **fields)
        return entry


def create_age_s(entry: LedgerEntry, server_now: float | None) -> float:
    """How long ago a ledger line was written: the smallest of the readings both ends can give (the API server's
    clock then and now, this machine's wall clock then and now). A create is settled as old only when every
    clock agrees: one `Date` header 2 h off, or a wall clock stepped ahead, must not make it look older than it
    is (an old create's null reads are trusted; a young one's are not)."""
    local = time.time() - entry.t_unix
    readings = [local]
    if server_now is not None:
        readings.append(server_now - (entry.server_unix if entry.server_unix is not None else entry.t_unix))
    return min(readings)


def _live_instance(instance_id: int, label: str, run_id: str | None, why: str, row: Instance | None,
                   runs: dict[str, LiveRun], server_now: float | None) -> LiveInstance:
    info = parse_label(label)
    run_id = run_id or (info.run_id if info else None)
    run = runs.get(run_id or "")
    accrued = None
    if row is not None and row.dph_total is not None and row.start_date is not None and server_now is not None:
        accrued = row.dph_total * max(0.0, server_now - row.start_date) / 3600.0
    return LiveInstance(instance_id=instance_id, label=label, run_id=run_id, why=why,
                        host=run.reg.host if run and run.reg else ("this machine" if run else "elsewhere"),
                        dph_usd=row.dph_total if row else None, accrued_usd=accrued,
                        deadline_unix=info.deadline_unix if info and info.deadline_unix else
                        (run.reg.deadline_unix if run and run.reg else None))


def husk_of(row: Instance | None, *, outbid_by_its_run: bool) -> str | None:
    """What makes an instance a husk, or None: an interruptible (bid) instance that reads paused (outbid: its
    disk kept, storage billing, and it may resume by itself), or one its run recorded as outbid and still reads
    paused. docs/interruptible.md."""
    if row is None or row.paused is None or not (row.is_bid or outbid_by_its_run):
        return None
    return (f"husk: an {'interruptible' if row.is_bid else 'outbid'} instance paused ({row.paused}), its storage "
            "billing, and it may resume by itself")


def _describe(entry: LedgerEntry) -> str:
    return entry.target.describe() if entry.target else "an unrecorded target (a line without an API/account stamp)"


def _collect(client: VastClient, src: _Sources, out: Output, result: ReapOutcome, run_id: str, *,
             runs: dict[str, LiveRun], include_live: bool, held: dict[str, HeldHost] | None = None) -> None:
    """Fill `result.labels` (instance id -> label) with every orphan this key must delete; `result.live` with
    the live runs' instances it leaves alone."""
    for ledger, view in src.views:
        for bad in view.bad_lines:
            out.warn(f"ledger {ledger.path} line {bad.line_no} skipped: {bad.reason}")
            if bad.line_no == 0:  # the whole ledger: whatever it names may still bill, unseen by this reap
                result.not_proven.append(f"ledger {ledger.path} could not be read ({bad.reason}): the instances "
                                         "and creates it names are not known to this reap")
    mine = src.primary.target
    rows: dict[int, Instance] = {}
    try:  # first: its Date header gives the server's clock that every age below is judged by
        rows = {inst.id: inst for inst in client.list_instances()}
        listed = True
    except VastError as exc:
        if isinstance(exc, AuthError) and not any(view.pending or view.unresolved for _, view in src.views):
            raise  # nothing was read and nothing is known to bill: a key to fix (exit 2), not "may still bill"
        listed = False
        result.not_proven.append(f"could not list live instances (the {LABEL_PREFIX}* scan did not run): {exc}")
    # A deadline or an age counts as passed only when the server's clock and this machine's both say so: one
    # `Date` header hours ahead must not make a live run's instance an orphan.
    server_now = client.server_clock.now()
    server_now = None if server_now is None else min(server_now, time.time())
    known_runs = src.run_ids()
    processes = src.processes()
    outbid = src.outbid_ids()

    def decide(instance_id: int, label: str, owner_run: str | None) -> bool:
        """True when reap deletes it; records a live one."""
        kind, why = judge(owner_run, label, rows.get(instance_id), runs=runs, known_runs=known_runs,
                          server_now=server_now, processes=processes, held=held)
        if kind == "live" and not include_live:
            if not any(li.instance_id == instance_id for li in result.live):
                result.live.append(_live_instance(instance_id, label, owner_run, why, rows.get(instance_id), runs,
                                                  server_now))
            return False
        result.orphan_why[instance_id] = why if kind == "orphan" else f"live, deleted by --include-live: {why}"
        row = rows.get(instance_id)
        husk = husk_of(row, outbid_by_its_run=instance_id in outbid)
        if husk is not None and instance_id not in result.husks:
            result.husks.append(instance_id)
            result.orphan_why[instance_id] = f"{husk}; {result.orphan_why[instance_id]}"
        if row is not None and finite_positive(row.dph_total):
            assert row.dph_total is not None
            result.listed_dph_usd[instance_id] = plausible_dph(row.dph_total)
        return True

    seen: set[int] = set().union(*(v.seen for _, v in src.views))
    for _, view in src.views:
        for instance_id, entry in sorted(view.pending.items()):
            if instance_id in result.labels or instance_id in result.foreign:
                continue
            own = entry.target == mine if entry.target is not None else instance_id in rows
            if not own:
                result.foreign.append(instance_id)
                result.not_proven.append(f"instance {instance_id} ({entry.label}) belongs to {_describe(entry)}: it "
                                         "cannot be proven absent with this key/URL; reap with that key and --api-url")
                continue
            row = rows.get(instance_id)
            if not entry.label.startswith(LABEL_PREFIX):  # the harness labels every instance it makes vh-...
                result.not_proven.append(
                    f"instance {instance_id} is named by the ledger under the label {entry.label!r}, which no run of "
                    "this harness makes: not deleted; if it is yours to delete, delete it by hand")
                continue
            if row is not None and (row.label or "") != entry.label:
                # Only what carries the run's own label is deleted as the run's: a forged or mistaken ledger
                # line (or a create answer that named another instance) must not delete the user's own. The
                # label is looked for below: an instance that carries it is the create's own.
                result.foreign_rows[instance_id] = (entry.label, row.label or "", entry.run_id)
                continue
            if not decide(instance_id, entry.label, entry.run_id):
                continue
            result.labels[instance_id] = entry.label
            if instance_id not in seen and instance_id not in rows:  # named by a create, never shown by a read
                result.unseen[instance_id] = create_age_s(entry, server_now)
    for ledger, view in src.views:
        for label, entry in sorted(view.unresolved.items()):
            if label in result.unresolved_labels:
                continue
            if entry.target != mine:
                result.not_proven.append(f"label {label} (create outcome unknown) belongs to {_describe(entry)}: "
                                         "cannot look for it with this key/URL")
                continue
            if not label.startswith(LABEL_PREFIX):
                result.not_proven.append(f"label {label!r} (create outcome unknown) is not one this harness makes: "
                                         "instances carrying it are not looked for or deleted")
                continue
            run = runs.get(entry.run_id)
            if run is not None and run.liveness == "live" and not include_live:
                continue  # its run is still settling it
            try:
                found = [i.id for i in client.list_instances(label=label) if not is_lingering(i) and i.label == label]
            except VastError as exc:
                result.not_proven.append(f"label {label} (create outcome unknown): could not list it: {exc}")
                continue
            for instance_id in found:
                if instance_id not in result.labels and decide(instance_id, label, entry.run_id):
                    result.labels[instance_id] = label
            age_s = create_age_s(entry, server_now)
            if not found and age_s > LABEL_SWEEP_AFTER_S:
                _FanOut([ledger]).append(run_id, "label_swept", label,
                                         detail="no instance with this label long after its create")
            elif not found:
                # Not seen is not gone: reads lag creates, and a create whose answer was lost may still land. Say
                # so (exit 3) until the label is older than any lag we allow for; never "all proven absent".
                result.unresolved_labels.append(label)
                result.not_proven.append(f"label {label}: a create {age_s:.0f} s ago has an unknown outcome and no "
                                         f"instance carries the label yet; run reap again later (it keeps looking "
                                         f"until {LABEL_SWEEP_AFTER_S / 3600:g} h after the create)")
    for instance_id, (label, row_label, owner_run) in sorted(result.foreign_rows.items()):
        on_label = _label_instances(client, label) or []
        for other in on_label:
            if other not in result.labels and decide(other, label, owner_run):
                result.labels[other] = label
        if not on_label:
            result.not_proven.append(
                f"instance {instance_id} is named by the ledger as {label!r} but its row carries the label "
                f"{row_label!r}: not deleted (it is not this run's); if it is yours to delete, delete it by hand")
            continue
        _disown(src, run_id, instance_id, label, f"its row carries the label {row_label!r}; the run's label is on "
                f"instance {', '.join(str(i) for i in on_label)}", out)
    if listed:
        for inst in rows.values():
            label = inst.label or ""
            if label.startswith(LABEL_PREFIX) and inst.id not in result.labels and not is_lingering(inst) \
                    and decide(inst.id, label, None):
                result.labels[inst.id] = label


def _label_instances(client: VastClient, label: str) -> list[int] | None:
    """The live instances whose rows carry `label` (None when the list cannot be read)."""
    try:
        return [i.id for i in client.list_instances(label=label) if not is_lingering(i) and i.label == label]
    except VastError:
        return None


def _disown(src: _Sources, run_id: str, instance_id: int, label: str, why: str, out: Output) -> None:
    """A ledger id that is not the create's (the label is on another instance): never deleted, and a `disowned`
    line settles it, so no later reap asks again."""
    _FanOut(src.where(instance_id=instance_id, label=label)).append(run_id, "disowned", label,
                                                                    instance_id=instance_id, detail=why)
    out.warn(f"instance {instance_id}, which the ledger names as {label!r}, is not that create's: {why}; left alone")


def _unread_line(instance_id: int, label: str, age_s: float) -> str:
    return (f"instance {instance_id} ({label}) named by the create answer; its label could not be read; left alone "
            f"(not proven ours): its create was {age_s:.0f} s ago and reads may lag a create, so no DELETE went to "
            f"it and no instance carries the label yet; run `vast-e2e reap` again later")


def _settle_unread(client: VastClient, spec: RunSpec, src: _Sources, result: ReapOutcome, run_id: str,
                   instance_id: int, label: str, age_s: float, out: Output) -> tuple[bool, list[int]]:
    """Before any DELETE of a ledger id no read has shown: look at its row and its label's rows until the teardown
    budget ends (one look when the create is older than any read lag). (True, []) when a read shows it with its
    label: the caller deletes it. Otherwise it is left alone and said (off `result.labels`; one older than any
    read lag that still shows no row is proven absent by reads alone), and the instances that carry its label
    (the create's own) come back to be deleted."""
    patient = age_s <= UNSEEN_TRUST_AFTER_S
    until = now_s() + (teardown_budget_s(spec.proof_interval_s) if patient else 0.0)
    owner: Owner = await_owner(client, instance_id, label, until_mono=until, interval_s=spec.proof_interval_s,
                               look_s=OWNERSHIP_LOOK_S)
    ledgers = _FanOut(src.where(instance_id=instance_id, label=label))
    result.unseen.pop(instance_id, None)
    if owner.kind == "ours":
        ledgers.append(run_id, "seen", label, instance_id=instance_id, detail="in the reap's ownership read")
        return True, []
    result.labels.pop(instance_id, None)
    if owner.label_rows:  # the label is on another instance: that one is the create's own, this one is not
        why = (f"its row carries the label {owner.row_label!r}" if owner.kind == "theirs"
               else "its label could not be read")
        _disown(src, run_id, instance_id, label, f"{why}; the run's label is on instance "
                f"{', '.join(str(i) for i in owner.label_rows)}", out)
        for other in owner.label_rows:
            result.orphan_why.setdefault(other, result.orphan_why.get(instance_id, "orphan"))
        return False, list(owner.label_rows)
    if owner.kind == "theirs":
        result.not_proven.append(
            f"instance {instance_id} is named by the ledger as {label!r} but its row carries the label "
            f"{owner.row_label!r}: not deleted (it is not this run's); if it is yours to delete, delete it by hand")
    elif not patient:  # older than any read lag and still no row: absent, proven by reads alone (no DELETE)
        result.reports.append(_prove_unread(client, spec, ledgers, run_id, instance_id, label))
        result.labels[instance_id] = label
    else:
        result.not_proven.append(_unread_line(instance_id, label, age_s))
    return False, []


def _prove_unread(client: VastClient, spec: RunSpec, ledgers: _FanOut, run_id: str, instance_id: int,
                  label: str) -> InstanceTeardown:
    """An id its create named over `UNSEEN_TRUST_AFTER_S` ago that no read has ever shown: its null reads count
    now, so it is proven absent without a DELETE (which could only go to an instance not proven ours)."""
    proof = prove_absent(client, instance_id, label, interval_s=spec.proof_interval_s,
                         deadline=now_s() + teardown_budget_s(spec.proof_interval_s))
    ledgers.append(run_id, "absence", label, instance_id=instance_id, verdict=proof.verdict,
                   detail="no read ever showed it and no DELETE was sent: proven absent by reads alone")
    return InstanceTeardown(instance_id=instance_id, proof=proof, seen=False)


def reap_all(spec: RunSpec, client: VastClient, out: Output, *, include_live: bool = False,
             confirm: Callable[[list[LiveInstance]], bool] | None = None) -> ExitCode:
    """Delete and prove absent every orphan; list live runs' instances (with `include_live`, delete them too
    once `confirm` agrees, having seen them)."""
    src = _Sources(spec, client.server_clock.now)
    result = ReapOutcome(ledgers_read=[str(ledger.path) for ledger in src.ledgers if ledger.path.exists()])
    out.info("ledgers read: " + (", ".join(result.ledgers_read) or f"none yet ({src.primary.path})"))
    run_id = new_run_id(REAP_PREFIX)  # unique: two reaps in one second once shared (and overwrote) one proof file
    registry = RunRegistry(spec.state_dir)
    runs = registry.scan()
    for skipped in registry.skipped:
        out.warn(skipped)
    store = HeldStore(spec.state_dir)  # kept hosts: live until their own deadline, whatever process holds them
    held = {record.hold_id: record for record in store.all()}
    for skipped in store.skipped:
        out.warn(skipped)
    result.key_dirs_removed = [str(p) for p in remove_stale_key_dirs()]
    if result.key_dirs_removed:
        out.info(f"removed {len(result.key_dirs_removed)} one-time SSH key dir(s) left by killed runs")
    scanned = False
    try:
        if include_live:
            probe = ReapOutcome()
            _collect(client, src, Output(quiet=True, json_mode=True), probe, run_id, runs=runs, include_live=False,
                     held=held)
            if probe.live and not (confirm is not None and confirm(probe.live)):
                out.warn("--include-live not confirmed: live runs are left alone")
                include_live = False
        _collect(client, src, out, result, run_id, runs=runs, include_live=include_live, held=held)
        scanned = True
        for live in result.live:
            out.info(live.line())
        todo = sorted(result.labels.items())
        while todo:
            instance_id, label = todo.pop(0)
            age_s = result.unseen.get(instance_id)
            if age_s is not None:  # no read has shown its label: read it before any DELETE
                ours, found = _settle_unread(client, spec, src, result, run_id, instance_id, label, age_s, out)
                for other in found:  # the create's own, found by its label
                    if other not in result.labels:
                        result.labels[other] = label
                        todo.append((other, label))
                if not ours:
                    continue
            what = "husk" if instance_id in result.husks else "instance"
            out.info(f"deleting {what} {instance_id} ({label}): {result.orphan_why.get(instance_id, 'orphan')}")
            deadline = now_s() + teardown_budget_s(spec.proof_interval_s)
            if instance_id in result.listed_dph_usd:  # a killed run may never have read it: `costs` estimates at it
                _FanOut(src.where(instance_id=instance_id, label=label)).append(
                    run_id, "repriced", label, instance_id=instance_id, dph_usd=result.listed_dph_usd[instance_id],
                    detail="the price its v1 list row stated when the reap read it")
            with FreezeWatch() as freeze:  # a reap stopped (SIGSTOP, a suspend) in its teardown proves on resume
                report = teardown_instance(client, _FanOut(src.where(instance_id=instance_id, label=label)),
                                           run_id=run_id, label=label, instance_id=instance_id,
                                           interval_s=spec.proof_interval_s, deadline=deadline,
                                           lag_window_s=spec.timings.read_lag_window_s,
                                           seen=True, freeze=freeze)  # a read has shown it with its label
            result.reports.append(report)
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
    _end_holds(store, held, result, out)
    if result.ok:
        _forget_dead(registry, runs, result)
    # Nothing to delete, nothing unproven, no live run seen: no evidence directory (an empty one per reap would
    # pile up beside the runs).
    nothing = not result.reports and not result.not_proven and not result.unproven_ids and not result.interrupted
    evidence_dir = None if nothing and not result.live else _write_evidence(spec, run_id, result, out)
    if out.json_mode:
        out.emit_json({"reaped": {r.instance_id: r.verdict for r in result.reports}, "unproven": result.unproven_ids,
                       "not_proven": result.not_proven, "live": [li.model_dump() for li in result.live],
                       "husks": sorted(result.husks),
                       "ledgers_read": result.ledgers_read, "key_dirs_removed": result.key_dirs_removed,
                       "evidence_dir": evidence_dir, "exit_code": _code(result)})
    elif nothing:  # a sentence, not an empty table
        out.out.print(terminal_safe(f"nothing to reap: no orphan in the {len(result.ledgers_read)} ledger(s) read or "
                                    "among the account's vh- instances"))
    else:
        rows = [(r.instance_id, result.labels.get(r.instance_id, "") + (" (husk)" if r.instance_id in result.husks
                                                                          else ""), len(r.deletes), r.verdict)
                for r in result.reports]
        out.reap_report(rows, result.not_proven, ok=result.ok)
    if result.live and not out.json_mode:
        out.info(f"{len(result.live)} live run instance(s) left alone (see above)")
    return _code(result)


def _end_holds(store: HeldStore, held: dict[str, HeldHost], result: ReapOutcome, out: Output) -> None:
    """A kept host this reap proved gone (past its deadline, its switch or this reap deleted it): its hold ends,
    its record billed to when it went (`close_hold_record`). A hold that never got an instance ends once past its
    deadline with no create of it left unknown."""
    reports = {r.instance_id: r for r in result.reports if r.verdict == "gone"}
    for record in held.values():
        if record.machine != this_host() or store.busy(record.name) is not None:
            continue  # another machine's, or a command of the hold is at work on it
        report = reports.get(record.instance_id) if record.instance_id is not None else None
        if report is not None:
            ours = next((d for d in report.deletes if d.acknowledged and d.outcome == "deleted"), None)
            ended = ours.t_ack_unix if ours and ours.t_ack_unix else switch_ended_unix(record)
            how = ("deleted by reap" if ours else "deleted by its dead-man switch") + ", proven absent by reap"
            close_hold_record(record, ended_unix=ended, how=how)
            finish_hold(store, record, proven=True, message=how)
            out.info(f"kept host {record.name}: the hold ended ({how})")
        elif record.instance_id is None and (record.expired() or record.state == "ending") and \
                not set(record.labels) & set(result.unresolved_labels):
            finish_hold(store, record, proven=True, message="its up never rented an instance")
            out.info(f"kept host {record.name}: the hold ended (its up never got an instance)")


def _forget_dead(registry: RunRegistry, runs: dict[str, LiveRun], result: ReapOutcome) -> None:
    """A dead run's registration goes once nothing of it is left unproven."""
    for run in runs.values():
        if run.liveness == "dead":
            registry.forget(run)


def _write_evidence(spec: RunSpec, run_id: str, result: ReapOutcome, out: Output) -> str | None:
    try:
        ev = RunEvidence(spec.evidence_dir / run_id)
        ev.write_json("absence-proof.json", {"interval_s": spec.proof_interval_s,
                                             "instances": [r.model_dump() for r in result.reports],
                                             "orphans": {str(k): v for k, v in result.orphan_why.items()},
                                             "husks": sorted(result.husks),
                                             "live": [li.model_dump() for li in result.live],
                                             "ledgers_read": result.ledgers_read,
                                             "not_proven": result.not_proven})
        ev.write_manifest()
        return str(ev.dir)
    except OSError as exc:  # evidence is best effort; the verdicts below still stand
        out.warn(f"could not write reap evidence under {spec.evidence_dir}: {exc}")
        return None


def _code(result: ReapOutcome) -> ExitCode:
    if result.not_proven or result.unproven_ids:
        return ExitCode.NOT_PROVEN_GONE  # something may still bill
    return ExitCode.INTERRUPTED if result.interrupted else ExitCode.PASSED
