"""A kept host's commands as a guarded run's stages (docs/kept-host.md).

`vast-e2e up NAME` is a run that keeps its instance: it rents, boots, checks the arrival and the dead-man switch,
uploads the workdir and runs `--setup`, as a run does, and then hands the instance over to the hold's record
(`state/held.py`) instead of deleting it. `exec`, `keep`, `ssh` and `down` are runs that adopt the held
instance instead of renting one: the run's tools are rebuilt from the record (`tools.Adopted`: the book holds
the instance, the meter goes on from the hold's start at the price it bills, with the bytes moved so far), so
the cap guard, the signals, the price watch, the teardown and the verdict are the run's own. Each is a
`GuardedRun` whose `RunStages` are one of the classes here.

The host's dead-man switch is the autostop: its cap is the hold's time cap (no grace), and its idle deadline,
a second file on the host, is pushed by each command (`deadman.push_deadlines`), and by a heartbeat while one
runs, so a long command is never idle; once no command runs, the switch deletes the host `--idle-minutes`
after the last push, or at the cap. Nothing here moves the cap's deadline later. What ends the hold while a
command runs (the cap, the switch found dead, the instance gone) goes through the run's teardown, and the hold
ends with it (`HoldStages.ended`).

The evidence of a hold is one run's directory, `<evidence>/<hold_id>/`: every command's step logs (steps
named `setup-N`, `exec-N`), `steps.tsv` in order, the artifacts the latest `exec` pulled, and
`harness-result.json`, the record of the latest command with the hold's totals (`costs` counts the hold as one
run).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from vast_harness.caps.meter import usd_up
from vast_harness.errors import ConfigError, ExitCode, HarnessError, VastError
from vast_harness.evidence.run import RunEvidence, write_whole
from vast_harness.host.bundle import (
    Bundle,
    WorkdirDelta,
    build_workdir_delta,
    bundle_for,
    bundle_manifest,
    workdir_selection,
)
from vast_harness.host.deadman import DeadmanUnarmed, SwitchStatus, push_deadlines
from vast_harness.host.ssh import HostSession, RunKey, endpoints_for, load_run_key
from vast_harness.instance.absence import is_lingering
from vast_harness.market.plan import RunPlan, plan_run
from vast_harness.records import AbsenceSummary, CreatedInstance, RunRecord
from vast_harness.run.host_work import REMOTE_DIR, HostWork
from vast_harness.run.interrupt import close_attempt, interruptions, recover, restore, salvage, wait_for_resume
from vast_harness.run.receipt import RECEIPT_ENV
from vast_harness.run.rent import preflight, rent_and_connect, timed, warn_left_out
from vast_harness.run.runner import RunStages, work_at
from vast_harness.run.state import RunState, Stage
from vast_harness.run.teardown import pull_evidence
from vast_harness.run.tools import Adopted, HoldTerms, RunTools
from vast_harness.run.verdict import Outcome, work_outcome
from vast_harness.spec.profile import Step
from vast_harness.state.held import HeldHost, HeldLock, HeldStore, Instant
from vast_harness.state.process import ProcessId, this_host
from vast_harness.timings import TeardownBudget

IDLE_PUSH_MAX_S = 30.0  # while a command runs, its host's idle deadline is pushed at least this often
# The shortest --idle-minutes the switch can honour: between two pushes (a heartbeat's interval, idle / 4) the
# idle deadline must outlast one push (an SSH command of a few seconds: PUSH_ROOM_S) and the host's whole-second
# truncation, twice; shorter, the switch deletes the host between two pushes while a command still works on it.
PUSH_ROOM_S = 5.0
IDLE_MIN_S = 10.0
CONNECT_S = 60.0  # a later command's SSH connect to its held host
PUSH_S = 15.0  # one push of the deadlines (a host command)
READ_S = 10.0  # a later command's first read of its held instance
KILL_S = 5.0  # stopping an interrupted exec's command on the host
# After its deadline the switch's DELETE goes within one curl bound (20 s), its verifying read 30 s later: a host
# its switch deleted is billed to the deadline and this (an upper bound, unless a read showed it still there).
SWITCH_DELETE_MARGIN_S = 60.0
EXEC_PGID = f"{REMOTE_DIR}/.exec.pgid"  # the process group of the exec's command on the host (under $HOME)
DELTA_NAME = "vh-delta.tar.gz"
SETUP_TIMEOUT_S = 24 * 60 * 60.0  # a replacement's --setup step, as a run's: bounded by the caps, not a timeout
HOST_CLOCK_STEP_S = 1.0  # the host's deadlines are whole seconds (`date +%s`): up to this much earlier than ours


def adopted(record: HeldHost) -> Adopted:
    """The record's instance and meter as a later command's tools take them over."""
    inst = None
    if record.state != "outbid" and record.instance_id is not None and record.label is not None \
            and record.created is not None:
        inst = CreatedInstance(instance_id=record.instance_id, label=record.label, offer_id=record.offer_id or -1,
                               machine_id=record.machine_id, dph_usd=record.dph_usd or 0.0,
                               t_created_unix=record.created.unix, status="held", seen=True, label_seen=True,
                               t_created_mono=record.created.to_mono())
    t0 = record.t0.to_mono()
    return Adopted(instance=inst, labels={label: t0 for label in record.labels}, t0_mono=t0, t0_unix=record.t0.unix,
                   dph_usd=record.dph_usd or 0.0, usd_per_gb=record.usd_per_byte * 1e9,
                   bytes_up=record.bytes_up, bytes_down=record.bytes_down, settled_usd=record.settled_usd)


def hold_terms(record: HeldHost, budget: TeardownBudget, *, idle_first_s: int | None = None,
               adopt: bool = True) -> HoldTerms:
    """A command's terms for the kept host of `record`: an `up` (not `adopt`) rents with the idle deadline's
    first allowance and lets a signal delete what it rented; a later command adopts and keeps the host on a
    signal. The switch deletes `budget.switch_s` before the cap, and re-reads its idle deadline a quarter of
    it apart (30 s at most)."""
    return HoldTerms(switch_allowance_s=int(record.max_seconds - budget.switch_s),
                     switch_recheck_s=max(1, int(min(IDLE_PUSH_MAX_S, record.idle_s / 4))), idle_first_s=idle_first_s,
                     adopt=adopted(record) if adopt else None, signal_deletes=not adopt)


class Heartbeat:
    """While a command works on its kept host, `push` runs every `interval_s` (the idle deadline moved on), so a
    command longer than `--idle-minutes` is not idle. It stops with the command: a killed command's host is
    deleted `--idle-minutes` after its last push."""

    def __init__(self, push: Callable[[], None], interval_s: float) -> None:
        self._push, self._interval_s = push, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="vh-hold-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=PUSH_S + 1.0)

    def _beat(self) -> None:
        while not self._stop.wait(self._interval_s):
            with contextlib.suppress(Exception):  # a push that fails (the link down) is tried again next beat
                self._push()


class HeldHostWork(HostWork):
    """The host's phases on a held host: its upload sends only what changed (`build_workdir_delta`), unpacked over
    what is there (a run's upload replaces `~/vh` whole); a killed or interrupted exec's command is stopped by its
    process group, which each exec's command writes on the host."""

    def upload(self, bundle: Bundle) -> None:
        if bundle.size_bytes == 0:
            self.out.info("upload: nothing changed since the last upload")
            return
        self.send(bundle, DELTA_NAME)
        self.unpack(f"cd ~/{REMOTE_DIR} && tar -xzf ~/{DELTA_NAME} -C ~/{REMOTE_DIR} && "
                    "if [ -f .vh-delete.lst ]; then (cd work && xargs -0 rm -f -- < ../.vh-delete.lst) && "
                    f"rm -f .vh-delete.lst; fi && rm -f ~/{DELTA_NAME}")

    def stop_command(self, timeout_s: float = KILL_S) -> bool:
        """Stop an exec's command still running on the host (its process group: TERM, then KILL a second
        later); True when one was there."""
        script = (f"p=$(cat ~/{EXEC_PGID} 2>/dev/null); case \"$p\" in ''|*[!0-9]*) exit 0;; esac; "
                  f"if kill -TERM -- -$p 2>/dev/null; then echo VHSTOPPED; sleep 1; kill -KILL -- -$p 2>/dev/null; fi; "
                  f"rm -f ~/{EXEC_PGID}")
        lines: list[str] = []
        try:
            self.session.run(script, on_line=lambda _s, line: lines.append(line), timeout_s=timeout_s)
        except Exception:  # noqa: BLE001 - best effort: the idle deadline ends the host anyway
            return False
        return "VHSTOPPED" in lines


def exec_line(command_line: str) -> str:
    """An exec's command as its step runs it: its process group written first (a later command stops it if it
    is left running), removed when it ends, its exit status kept."""
    return f"echo $$ > ~/{EXEC_PGID} && {{ {command_line} ; }} ; r=$? ; rm -f ~/{EXEC_PGID} ; exit $r"


class HoldStages(RunStages):
    """What every command of a kept host shares: the record, the deadline pushes and their heartbeat, the hand
    over, and the end of the hold (`ended`: the instance deleted, whoever's command that was)."""

    command = "command"

    def __init__(self, store: HeldStore, record: HeldHost) -> None:
        self.store, self.record = store, record
        self.claimed = True  # the record is this hold's (an `up` claims it first: one that lost the race ends nothing)
        self.yielded = False  # another command is ending the hold (`down`): this one leaves the end to it
        self.lock: HeldLock | None = None  # the `up`'s, held until it hands over or ends
        self.end_reason: str | None = None  # the hold must end now, whatever the command's own outcome
        self.switch: SwitchStatus | None = None
        self.heartbeat: Heartbeat | None = None
        self._push_lock = threading.Lock()
        self.idle_first_s: int | None = None  # a create's first idle allowance (the `up`'s, or a replacement's)
        self.replaced = False  # this command rented a replacement after an outbid: the record moves to it
        self.salvaged: Path | None = None  # the checkpoint folder the replacement restores

    @property
    def name(self) -> str:
        return self.record.name

    # ------------------------------------------------------------------------------------ the record
    def save(self, t: RunTools, s: RunState, **changes: object) -> None:
        """The record, with what the meter knows now (price, bytes, accrued, the caps' deadline) and `changes`;
        never brings back a hold that ended meanwhile (`down` from another terminal)."""
        inst = t.book.latest()
        meter = t.meter

        if inst is not None and gone(t, inst):
            inst = None  # an outbid host deleted and proven gone: the record already moved off it

        def change(r: HeldHost) -> None:
            if inst is not None:
                if r.instance_id != inst.instance_id:  # a replacement: its own start and price
                    r.created, r.dph_usd = Instant.at_mono(inst.t_created_mono), inst.dph_usd
                r.instance_id, r.label, r.dph_usd = inst.instance_id, inst.label, max(inst.dph_usd, r.dph_usd or 0.0)
                r.offer_id, r.machine_id = inst.offer_id, inst.machine_id
                if r.created is None:
                    r.created = Instant.at_mono(inst.t_created_mono)
            if r.bid is not None:  # the hold's hosts so far, as this command knows them
                r.attempts = [a.model_copy() for a in s.attempts] or r.attempts
                r.excluded_machines = sorted(set(r.excluded_machines) | t.book.excluded_machines)
                r.host_home = s.host_home or r.host_home
            r.labels = sorted(set(r.labels) | t.book.labels())
            # Never lower than the record says: an `ssh` beside an `exec` must not undo the exec's bytes.
            r.usd_per_byte = max(r.usd_per_byte, meter.usd_per_byte_up, meter.usd_per_byte_down)
            r.bytes_up, r.bytes_down = max(r.bytes_up, meter.bytes_up), max(r.bytes_down, meter.bytes_down)
            r.accrued_usd, r.seen_unix = max(r.accrued_usd, usd_up(meter.accrued_usd())), time.time()
            r.hard_deadline = Instant.at_mono(meter.hard_deadline()) if inst is not None else None
            for key, value in changes.items():
                setattr(r, key, value)

        saved = self.store.update(self.name, change)
        if saved is not None:
            self.record = saved

    # ------------------------------------------------------------------------------------ the deadlines
    def push(self, t: RunTools, s: RunState, *, idle: bool = True) -> SwitchStatus | None:
        """The host's cap tightened to what the meter leaves, its idle deadline pushed to now + idle (when
        `idle`), the switch checked; the record follows. None when there is no session to push through."""
        if s.session is None or not s.session.is_active():
            return None
        with self._push_lock:
            # Taken before the host's, less the second its `date +%s` truncates: this machine's is never later.
            idle_at = Instant.now(self.record.idle_s - HOST_CLOCK_STEP_S)
            cap_left_s = t.meter.hard_deadline() - t.budget.switch_s - t.clock()
            status = push_deadlines(s.session, cap_left_s=cap_left_s, idle_s=self.record.idle_s if idle else None,
                                    timeout_s=PUSH_S)
            self.switch = status
            if status.problem is None or status.idle_epoch is not None:
                self.save(t, s, **({"idle_deadline": idle_at} if idle and status.idle_epoch is not None else {}),
                          host_cap_epoch=status.cap_epoch, host_idle_epoch=status.idle_epoch)
        return status

    def start_heartbeat(self, t: RunTools, s: RunState) -> None:
        interval_s = max(1.0, min(IDLE_PUSH_MAX_S, self.record.idle_s / 4))
        self.heartbeat = Heartbeat(lambda: self._beat(t, s), interval_s).start()

    def _beat(self, t: RunTools, s: RunState) -> None:
        status = self.push(t, s)
        if status is not None and status.cap_epoch is not None and not status.alive and status.host_now is not None:
            self._switch_dead(t, s, status)

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.stop()
            self.heartbeat = None

    def _switch_dead(self, t: RunTools, s: RunState, status: SwitchStatus) -> None:
        """Without its switch nothing deletes the host once no command runs: the hold ends now (fail closed)."""
        if self.end_reason is None:
            self.end_reason = (f"the dead-man switch of kept host {self.name!r} cannot act ({status.problem}): "
                               "without it nothing would delete the host once no command runs, so the hold ends "
                               "here (deleted, proven absent)")
            t.out.warn(self.end_reason)
            s.cancel(self.end_reason, ExitCode.FAILED)

    # ------------------------------------------------------------------------------------ adopting
    def adopt(self, t: RunTools, s: RunState) -> None:
        """Stage.RENT for a later command: the held instance read (still there, running, its price) and SSH up
        with the hold's key, to the host whose key the first connection saw."""
        s.stage = Stage.RENT
        t.phases.start("connect")
        self.load_bid(t, s)
        inst = t.book.latest()
        if inst is None and self.record.state == "outbid":  # the husk went between commands: rent the next host
            t.out.warn(f"kept host {self.name}: {self.record.message or 'its host was outbid'}; renting another")
            self.replace(t, s, Path(self.record.salvaged) if self.record.salvaged else None)
            return
        if inst is None:
            raise HoldNotUsable(f"kept host {self.name!r} has no instance: its `up` never got one (killed?)")
        try:
            read = t.client.get_instance(inst.instance_id, max_retry_s=READ_S, within_s=READ_S)
        except VastError as exc:
            raise HarnessError(f"could not read instance {inst.instance_id} of kept host {self.name!r}: {exc}; it "
                               "is left as it was (its switch still deletes it)") from exc
        if read is None or is_lingering(read):
            t.reads.vanished(inst, "a read no longer shows it" if read is None else "a read shows it destroyed")
            self.end_reason = t.book.vanished.get(inst.instance_id, "the instance is gone")
            raise HarnessError(f"kept host {self.name!r}: instance {inst.instance_id} is gone")
        t.instances.check_boot_read(inst, read)  # a row with another label is not the hold's (exit 3: unknown)
        t.reads.on_read(inst, read)
        if read.paused is not None and self.record.bid is not None:  # outbid while no command ran
            if self.outbid_between(t, s, f"instance {inst.instance_id} {read.paused}"):
                return
            read = t.client.get_instance(inst.instance_id, max_retry_s=READ_S, within_s=READ_S) or read
        if read.actual_status != "running":
            raise HarnessError(f"kept host {self.name!r}: instance {inst.instance_id} is {read.actual_status!r}, "
                               "not running; it is left as it was (`down` deletes it, else its switch)")
        key_problem = self.store.key_usable(self.record)
        if key_problem is not None:
            raise HoldNotUsable(f"kept host {self.name!r}: its SSH key cannot be used: {key_problem}")
        key = RunKey(Path(self.record.key_path or ""), "")
        deadline = min(t.meter.deadline(), t.clock() + CONNECT_S)
        t.out.info(f"kept host {self.name}: instance {inst.instance_id} running; connecting over SSH")
        session = HostSession.connect(endpoints_for(read) or self.record.endpoints, key, deadline_monotonic=deadline,
                                      clock=t.clock, retry_wait_s=min(2.0, max(t.spec.poll_s, 0.2)))
        if self.record.host_key_fingerprint and session.host_key_fingerprint != self.record.host_key_fingerprint:
            session.close()
            raise HarnessError(f"kept host {self.name!r} answers with host key {session.host_key_fingerprint}, not "
                               f"the {self.record.host_key_fingerprint} its first connection saw: nothing is sent "
                               "to it. `vast-e2e down` deletes it")
        s.session = session
        s.session.stall_timeout_s = t.budget.sftp_stall_s
        s.work = t.host_work(session, spec=t.spec, meter=t.meter, ev=t.ev, out=t.out, run_id=s.run_id,
                             cancelled=s.cancelled, check_cancelled=s.check_cancelled,
                             hurry=lambda: t.signals.hurry, timings=s.timings, on_phase=t.phases.start)
        s.receipt = self.record.receipt  # the `up`'s: the host is the one it measured
        if self.record.receipt_path:
            s.work.step_env[RECEIPT_ENV] = self.record.receipt_path
        self.save(t, s, endpoints=endpoints_for(read) or self.record.endpoints)

    def check_switch(self, t: RunTools, s: RunState) -> None:
        """Stage.DEADMAN for a later command: the deadlines pushed, the switch found running (else the hold ends:
        fail closed), the heartbeat started."""
        if self.replaced:  # a replacement rented by this command: the record moves to it first
            self.save_host(t, s)
        s.stage = Stage.DEADMAN
        status = timed(t, s, "deadman_check", lambda: self.push(t, s))
        if status is None or (status.problem is not None and status.cap_epoch is None):
            raise HarnessError(f"kept host {self.name!r}: its deadlines could not be pushed"
                               f"{f' ({status.problem})' if status else ''}; the switch keeps the last ones")
        if not status.alive:
            self._switch_dead(t, s, status)
            raise DeadmanUnarmed(self.end_reason or "the dead-man switch no longer runs")
        t.out.info(self.deadlines_line())
        self.start_heartbeat(t, s)

    def deadlines_line(self) -> str:
        r = self.record
        idle = (f"after {r.idle_minutes:g} min without a command (by {_utc(r.idle_deadline)})"
                if r.idle_deadline else "")
        return (f"dead-man: armed; deletes kept host {self.name} {idle}{' or ' if idle else ''}at the cap "
                f"({_utc(r.cap_end())})")

    # ------------------------------------------------------------------------------------ outbids
    def load_bid(self, t: RunTools, s: RunState) -> None:
        """An interruptible hold's hosts so far, as the run's outbid code counts them (`--max-interruptions`
        over the whole hold), the machines an outbid hit, and where the host keeps the checkpoint."""
        r = self.record
        if r.bid is None:
            return
        s.attempts = [a.model_copy() for a in r.attempts]
        s.host_home = r.host_home
        s.hold_worst_case_usd = r.bid.worst_case_usd
        t.book.excluded_machines.update(r.excluded_machines)
        if s.key is None and r.key_path and self.store.key_usable(r) is None:
            s.key = load_run_key(Path(r.key_path))  # the salvage's rsync, and a replacement's onstart

    def outbid_between(self, t: RunTools, s: RunState, why: str) -> bool:
        """The held host reads paused (outbid) as a command starts: per `--on-outbid`, wait for it to resume
        (False: it did; the command goes on there), or salvage it, delete it, prove it gone and rent the next
        host (True: replaced). Past --max-interruptions, `recover` ends the hold (exit 1)."""
        s.outbid(why)
        if wait_for_resume(t, s, why):  # its container re-booted: the command connects to it as usual
            return False
        bid = self.record.bid
        assert bid is not None
        previous = Path(self.record.salvaged) if self.record.salvaged else None
        salvaged = recover(t, s, why, previous, waited=bid.wait_minutes is not None)
        s.recovered()
        self.replace(t, s, salvaged)
        return True

    def replace_host(self, t: RunTools, s: RunState, salvaged: Path | None) -> None:
        self.replace(t, s, salvaged)

    def replace(self, t: RunTools, s: RunState, salvaged: Path | None) -> None:
        """After the husk was deleted and proven gone: the record moved off it (what it accrued settled, the
        checkpoint salvaged off it kept), then the next host rented as the `up` rented (its offer within the
        hold's ceiling, the machine excluded), booted, checked and measured; `arm` moves the record to it."""
        self.replaced, self.salvaged = True, salvaged
        self.moved_off(t, s, salvaged)
        s.stage = Stage.RENT
        if s.plan is None:  # a later command: the `up`'s offer search again, within the hold's ceiling
            s.plan = replacement_plan(t, self.record)
        rent_and_connect(t, s)

    def moved_off(self, t: RunTools, s: RunState, salvaged: Path | None) -> None:
        """The husk is deleted and proven gone: the record leaves it (state `outbid`: nothing billed, the next
        command rents), what it accrued settled, the checkpoint salvaged off it kept for the next host."""
        meter = t.meter
        compute_usd = meter.accrued_usd() - meter.bytes_up * meter.usd_per_byte_up \
            - meter.bytes_down * meter.usd_per_byte_down  # every host so far, the husk to its DELETE

        def change(r: HeldHost) -> None:
            r.state = "outbid" if r.state == "held" else r.state
            r.instance_id, r.created, r.dph_usd, r.hard_deadline = None, None, None, None
            r.settled_usd = round(max(r.settled_usd, compute_usd), 9)
            r.salvaged = str(salvaged) if salvaged is not None else r.salvaged
            r.attempts = [a.model_copy() for a in s.attempts] or r.attempts
            r.excluded_machines = sorted(set(r.excluded_machines) | t.book.excluded_machines)

        saved = self.store.update(self.name, change)
        if saved is not None:
            self.record = saved

    def save_host(self, t: RunTools, s: RunState) -> None:
        """The record learns the host this command connected to: its receipt, SSH endpoints and host key."""
        assert s.session is not None
        self.save(t, s, receipt=s.receipt, receipt_path=s.work.step_env.get(RECEIPT_ENV) if s.work else None,
                  endpoints=[s.session.endpoint], host_key_fingerprint=s.session.host_key_fingerprint,
                  host_key_type=s.session.host_key_type, host_key_base64=s.session.host_key_base64,
                  gpu=f"{s.candidate.offer.num_gpus}x {s.candidate.offer.gpu_name}" if s.candidate else None,
                  **({"state": "held"} if self.record.state == "outbid" else {}))

    def on_created(self, inst: CreatedInstance) -> None:
        """A create named the instance: the record knows it (a `kill -9` from here leaves it to the switch,
        which fires `idle_first_s` after the host first runs its onstart, or at the cap)."""
        def change(r: HeldHost) -> None:
            r.instance_id, r.label, r.offer_id, r.machine_id = inst.instance_id, inst.label, inst.offer_id, \
                inst.machine_id
            r.labels = sorted({*r.labels, inst.label})
            r.created, r.dph_usd = Instant.at_mono(inst.t_created_mono), inst.dph_usd
            if self.idle_first_s is not None:
                r.idle_deadline = r.created.plus(self.idle_first_s - HOST_CLOCK_STEP_S)

        saved = self.store.update(self.name, change)
        if saved is not None:
            self.record = saved

    def again_steps(self, t: RunTools, s: RunState, n: int) -> list[Step]:
        """What a replacement (or a host resumed in place) runs after the setup: an exec's command again."""
        return []

    def work_on_host(self, t: RunTools, s: RunState, bundle: Bundle | None, salvaged: Path | None, *,
                     in_place: bool) -> None:
        """The command's work; on a host rented after an outbid: the workdir whole, the `up`'s --setup again,
        the checkpoint restored, then the command's own again (`again_steps`); on a host resumed in place, its
        disk as it was: the setup and the command again."""
        if not (self.replaced or in_place or salvaged is not None or s.steps_before):
            self.work(t, s, bundle)
            return
        salvaged = salvaged if salvaged is not None else self.salvaged
        n = interruptions(s)
        work = work_at(s, Stage.UPLOAD)
        if not in_place and self.record.workdir is not None:
            full = bundle_for(t.spec)  # the host has nothing of ours: all of it, as the `up` sent it
            t.out.info(f"kept host {self.name}: uploading the workdir ({full.files} files) to the new host")
            self.save(t, s, manifest_state="applying")
            timed(t, s, "upload", lambda: HostWork.upload(work, full))
            self.save(t, s, manifest=bundle_manifest(full), manifest_state="clean")
        setup = [Step(name=f"setup-{i}.r{n}", run=line, timeout_s=SETUP_TIMEOUT_S, workload=False)
                 for i, line in enumerate(self.record.setup, 1)]
        if setup:
            work.steps_to_run = setup
            work_at(s, Stage.STEPS).run_steps()
        if not in_place and salvaged is not None:
            restore(t, s, salvaged)
        again = self.again_steps(t, s, n)
        if again:
            work.steps_to_run = again
            work_at(s, Stage.STEPS).run_steps()
        pull_evidence(t, s, in_teardown=False)
        self.replaced = False

    def finished(self, t: RunTools, s: RunState) -> None:
        """The host stays held: its attempt stays open (`down`, or the next outbid, ends it)."""

    # ------------------------------------------------------------------------------------ keeping
    # The outcomes after which the host stays held: a command that failed or was interrupted keeps it
    kept_codes: tuple[ExitCode, ...] = (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER, ExitCode.FAILED,
                                        ExitCode.INTERRUPTED)

    def keeps(self, t: RunTools, s: RunState, code: ExitCode) -> bool:
        """Kept after an outcome it keeps, unless the hold must end: its deadline passed while the command ran (a
        stopped process: the switch may have deleted it), or, with the link gone, a read says it is gone. Then the
        teardown proves it absent and the hold ends."""
        inst = t.book.latest()
        fresh = self.store.load(self.name)
        if fresh is None or fresh.state == "ending":
            # A `down` (or a reap) is ending the hold, or has: its teardown and its proof are that command's; a
            # second prover beside it only draws the account's 429s. Nothing of ours is written back.
            self.yielded = True
            return True
        if self.end_reason is not None or inst is None or inst.instance_id in t.book.vanished \
                or code not in self.kept_codes or gone(t, inst):
            return False
        if fresh.expired():
            self.end_reason = f"its {fresh.why_deadline()} deadline passed while the command ran"
            return False
        if s.session is None or not s.session.is_active():  # the link went: is the host still there?
            try:
                read = t.client.get_instance(inst.instance_id, max_retry_s=READ_S, within_s=READ_S)
            except VastError:
                return True  # unknown: it stays held, and its switch still deletes it
            if read is None or is_lingering(read):
                t.reads.vanished(inst, "a read after the link went no longer shows it")
                return False
            return True
        return not self.switch_dead_at_end(t, s)

    def switch_dead_at_end(self, t: RunTools, s: RunState) -> bool:
        """The switch checked once more as the command ends (its command may have stopped or killed it): True,
        the hold must end here. A push that could not run (the link) says nothing: the host stays held."""
        self.stop_heartbeat()  # no beat beside this push: the end's own
        status = self.push(t, s)
        if status is None or status.cap_epoch is None or status.host_now is None or status.alive:
            return False
        if self.end_reason is None:
            self.end_reason = (f"the dead-man switch of kept host {self.name!r} cannot act as this command ends "
                               f"({status.problem}): without it nothing would delete the host, so the hold ends "
                               "here (deleted, proven absent)")
            t.out.warn(self.end_reason)
        return True

    def not_kept(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        """The hold ends with this command (`keeps` said no): never a pass, whatever the command did; the
        message says why the hold ended."""
        why = self.end_reason
        if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER):
            return ExitCode.FAILED, f"{why or 'the hold ended'} (the command itself: {message})"
        return code, message if why is None or why in message else f"{message}; {why}"

    def hand_over(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        """The command is done and the host stays: the heartbeat stopped, the idle deadline pushed from now, the
        record saved (state held); the link closed."""
        self.stop_heartbeat()
        if self.yielded:
            if s.session is not None:
                s.session.close()
            self.release()
            return code, f"{message}; kept host {self.name} was taken down meanwhile (`down`): its end is that command's"
        self.push(t, s)
        self.save(t, s, state="held", message=message[:500])
        if s.session is not None:
            s.session.close()
        self.release()
        return code, message

    def records_result(self, t: RunTools, s: RunState) -> bool:
        return not self.yielded  # the `down` that ended the hold meanwhile wrote the hold's record: it stands

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------------------------------ the end
    def ended(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> None:
        """The teardown ran (the cap, the switch found dead, the instance gone, `down`): proven gone, the hold's
        record and key go (and its detached simulator, when no other hold uses it); not proven, the record stays
        as `ending`, for `reap` (the ledger names the instance too)."""
        self.stop_heartbeat()
        self.release()
        if self.claimed:
            finish_hold(self.store, self.record, proven=not t.book.unproven() and not t.book.unresolved,
                        message=message)


def replacement_plan(t: RunTools, record: HeldHost) -> RunPlan:
    """The offers a later command may rent after an outbid: the `up`'s search again (the hold's spec), every host
    within the ceiling the `up`'s worst case priced (not a fresh one from today's cheapest offer)."""
    plan = plan_run(t.spec, t.client, t.drivers, bundle_for(t.spec))
    ceiling = record.bid.ceiling_dph_usd if record.bid is not None else None
    if ceiling is None:
        return plan
    quote = plan.chosen.quote.model_copy(update={"ceiling_dph_usd": ceiling})
    return plan.model_copy(update={"chosen": plan.chosen.model_copy(update={"quote": quote})})


def gone(t: RunTools, inst: CreatedInstance) -> bool:
    """The instance was deleted and proven gone by this command (an outbid husk)."""
    return any(r.instance_id == inst.instance_id and r.verdict == "gone" for r in t.book.teardowns)


class HoldNotUsable(ConfigError):
    """The kept host cannot be worked on (no instance yet, its key unusable): exit 2, nothing done to it."""


def finish_hold(store: HeldStore, record: HeldHost, *, proven: bool, message: str) -> None:
    """The hold is over. Proven gone: its record and key removed, its detached simulator stopped when no other
    hold uses it. Not proven: the record stays, `ending`, with why (`reap` proves it, then removes it)."""
    if proven:
        busy = store.busy(record.name)  # asked before the lock files go with the record
        store.remove(record.name)
        stop_watcher(record)
        if busy is None or busy.pid == os.getpid():
            stop_detached_sim(store, record)
        return

    def change(r: HeldHost) -> None:
        r.state, r.message = "ending", f"not proven gone: {message}"[:500]

    store.update(record.name, change, ending_ok=True)


def close_hold_record(record: HeldHost, *, ended_unix: float, how: str) -> None:
    """The hold's record (its last command's `harness-result.json`) brought to the hold's end by someone else
    than a command of it (a `reap`, a command that found the hold over): billed from its last sight to
    `ended_unix` at its price (an upper bound), its instance gone, the message saying how. Best effort."""
    path = Path(record.evidence_dir) / "harness-result.json"
    try:
        doc = RunRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return
    tail_usd = 0.0
    if record.dph_usd is not None and record.seen_unix is not None:
        tail_usd = max(0.0, ended_unix - record.seen_unix) * record.dph_usd / 3600.0
    gone = {i.instance_id: "gone" for i in doc.instances}
    doc = doc.model_copy(update={
        "accrued_usd": usd_up(max(doc.accrued_usd, record.accrued_usd) + tail_usd),
        "instances": [i.model_copy(update={"absence": "gone"}) for i in doc.instances],
        "absence": AbsenceSummary(verdict="gone", per_instance=gone), "message": f"{doc.message}; then {how}"[:2000]})
    with contextlib.suppress(OSError):
        write_whole(path, json.dumps(doc.model_dump(mode="json"), indent=2) + "\n")
        RunEvidence(path.parent).write_manifest()


def switch_ended_unix(record: HeldHost) -> float:
    """When the hold's switch deleted its host, at the latest (wall clock): its deadline, and the time its DELETE
    may take (`SWITCH_DELETE_MARGIN_S`); never later than now."""
    deadline_unix = time.time() + record.deadline().left_s()
    return min(time.time(), deadline_unix + SWITCH_DELETE_MARGIN_S)


def stop_detached_sim(store: HeldStore, record: HeldHost) -> None:
    """A --sim hold's simulator (started by its `up`), stopped when no other hold on this machine uses it and no
    other command of this hold is still at work on it (an exec a `down` ended proves its host gone through it;
    the simulator stops itself a minute after its last call)."""
    if record.sim_pid is None:
        return
    if any(other.sim_pid == record.sim_pid and other.name != record.name for other in store.all()):
        return
    proc = ProcessId(host=this_host(), pid=record.sim_pid, start=record.sim_pid_start)
    if proc.running():
        with contextlib.suppress(OSError):
            os.kill(record.sim_pid, signal.SIGTERM)


def stop_watcher(record: HeldHost) -> None:
    """An interruptible hold's watcher (`kept/watch.py`), stopped with the hold (never this process itself)."""
    if record.watcher_pid is None or record.watcher_pid == os.getpid():
        return
    proc = ProcessId(host=this_host(), pid=record.watcher_pid, start=record.watcher_pid_start)
    if proc.running():
        with contextlib.suppress(OSError):
            os.kill(record.watcher_pid, signal.SIGTERM)


class WatchStages(HoldStages):
    """The watcher's look at a held host that read paused while no command ran (`kept/watch.py`): per
    `--on-outbid`, waited for (resumed: it stays held as it was), or salvaged, deleted and proven gone, the hold
    marked `outbid` for the next command to rent (nothing billed meanwhile); past --max-interruptions the hold
    ends. No SSH."""

    command = "watch"

    def __init__(self, store: HeldStore, record: HeldHost, *, why: str) -> None:
        super().__init__(store, record)
        self.why = why
        self.moved = False

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        t.cap_guard.start()
        return None

    def connect(self, t: RunTools, s: RunState) -> None:
        s.stage = Stage.RENT
        self.load_bid(t, s)
        bid = self.record.bid
        assert bid is not None
        s.outbid(self.why)
        if wait_for_resume(t, s, self.why):
            return
        previous = Path(self.record.salvaged) if self.record.salvaged else None
        salvaged = recover(t, s, self.why, previous, waited=bid.wait_minutes is not None)
        s.recovered()
        self.moved_off(t, s, salvaged)
        self.moved = True
        s.key = None  # the hold's key, not this run's: the teardown that follows must not destroy it

    def arm(self, t: RunTools, s: RunState) -> None:
        pass

    def work_on_host(self, t: RunTools, s: RunState, bundle: Bundle | None, salvaged: Path | None, *,
                     in_place: bool) -> None:
        pass

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        if self.moved:
            return ExitCode.PASSED, (f"kept host {self.name}: its host was outbid while no command ran ({self.why}): "
                                     "salvaged, deleted and proven gone; the next exec rents another")
        return ExitCode.PASSED, f"kept host {self.name}: its host resumed after an outbid ({self.why})"

    def not_kept(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        return code, message  # its outcome says what became of the husk

    def ended(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> None:
        if self.moved and code == ExitCode.PASSED:  # the hold goes on, outbid: only its husk ended
            self.stop_heartbeat()
            self.release()
            return
        super().ended(t, s, code, message)


def _utc(at: Instant | None) -> str:
    if at is None:
        return "?"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + at.left_s()))


# ------------------------------------------------------------------------------------------- the commands
class UpStages(HoldStages):
    """`vast-e2e up NAME`: a run (rent, boot, arrival, switch, upload, `--setup`) whose host is kept when all of
    it passed; anything else tears it down, as a run does."""

    command = "up"
    kept_codes = (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER)

    def __init__(self, store: HeldStore, record: HeldHost, *, idle_first_s: int) -> None:
        super().__init__(store, record)
        self.idle_first_s = idle_first_s
        self.claimed = False

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        self.store.claim(self.record)  # before anything is rented: `status` and `reap` know the hold from here on
        self.claimed = True
        self.lock = self.store.lock(self.name, "up")  # an exec meanwhile is refused: "up is setting it up"
        bundle = preflight(t, s, self.store.make_key_dir(self.name))
        assert s.key is not None
        bid = self.record.bid
        if bid is not None and s.plan is not None:  # every later host of the hold within the worst case's ceiling
            quote = s.plan.chosen.quote
            bid = bid.model_copy(update={"ceiling_dph_usd": quote.ceiling_dph_usd,
                                         "worst_case_usd": quote.worst_case_usd})
            s.hold_worst_case_usd = quote.worst_case_usd
        self.save(t, s, key_path=str(s.key.path), bid=bid)
        return bundle

    def connect(self, t: RunTools, s: RunState) -> None:
        rent_and_connect(t, s)

    def arm(self, t: RunTools, s: RunState) -> None:
        """The switch was proven armed and the receipt taken in `connect` (as a run's): the idle deadline is
        pushed from now and the record learns the host."""
        self.save_host(t, s)
        status = self.push(t, s)
        if status is None or status.problem is not None:
            raise DeadmanUnarmed(f"kept host {self.name!r}: the idle deadline could not be set on the host "
                                 f"({status.problem if status else 'no link'}); nothing would delete it once idle")
        self.start_heartbeat(t, s)

    def work(self, t: RunTools, s: RunState, bundle: Bundle | None) -> None:
        super().work(t, s, bundle)
        if bundle is not None and bundle.workdir is not None:  # what the host has: the bytes that were sent
            self.save(t, s, manifest=bundle_manifest(bundle), manifest_state="clean")

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        code, _ = work_outcome(s.candidate.driver_qualified if s.candidate else False)
        return code, "held"

    def hand_over(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        code, message = super().hand_over(t, s, code, message)
        if self.yielded:  # a `down` took it meanwhile: nothing is held, so no 0
            return ExitCode.FAILED, message
        inst = t.book.latest()
        assert inst is not None
        r = self.record
        gpu = f" ({r.gpu})" if r.gpu else ""
        return code, (f"kept host {self.name} is held: instance {inst.instance_id}{gpu} at ${inst.dph_usd:.4f}/h. "
                      f"`vast-e2e exec {self.name} -- CMD` runs in it, `vast-e2e down {self.name}` deletes it; its "
                      f"switch deletes it after {r.idle_minutes:g} min without one (by {_utc(r.idle_deadline)}) or "
                      f"at the cap ({_utc(r.cap_end())})")


class ExecStages(HoldStages):
    """`vast-e2e exec NAME -- CMD`: the held host adopted, what changed uploaded, the command run as a step,
    the artifacts pulled; the host kept, whatever the command's exit, unless the hold must end (the cap, the
    switch found dead, the instance gone)."""

    command = "exec"

    def __init__(self, store: HeldStore, record: HeldHost, *, full_upload: bool = False) -> None:
        super().__init__(store, record)
        self.full_upload = full_upload
        self.delta: WorkdirDelta | None = None

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        """What changed in the workdir since the last upload, by content; after a cut upload (or
        `--full-upload`), every file again, and every name ever sent that the workdir lost, removed."""
        s.stage = Stage.PREFLIGHT
        t.phases.start("plan")
        selection = workdir_selection(t.spec)  # a run's rules: never a key, a credential only by --include
        assert selection is not None
        known = self.record.manifest_state == "clean" and not self.full_upload
        self.delta = build_workdir_delta(selection, self.record.manifest if known else {},
                                         sent_before=self.record.manifest, account_keys=t.spec.account_keys)
        s.workdir = self.delta.workdir
        warn_left_out(t, self.delta.workdir)
        t.cap_guard.start()
        return self.delta.bundle or Bundle(data=b"", sha256="", files=0, workdir=self.delta.workdir)

    def connect(self, t: RunTools, s: RunState) -> None:
        self.adopt(t, s)

    def arm(self, t: RunTools, s: RunState) -> None:
        self.check_switch(t, s)
        work = s.work
        if self.record.exec_unfinished and isinstance(work, HeldHostWork) and work.stop_command():
            t.out.warn(f"kept host {self.name}: the last exec did not end (killed?) and its command was still running "
                       "on the host: stopped")
        self.save(t, s, exec_unfinished=True, execs=self.record.execs + 1, last_exec_unix=time.time())

    def work(self, t: RunTools, s: RunState, bundle: Bundle | None) -> None:
        assert self.delta is not None and bundle is not None
        if bundle.size_bytes:
            d = self.delta
            t.out.info(f"upload: {len(d.changed)} changed file(s), {bundle.size_bytes} bytes; {len(d.deleted)} "
                       "removed")
            self.save(t, s, manifest_state="applying")
        super().work(t, s, bundle)
        self.save(t, s, manifest=self.delta.manifest, manifest_state="clean")

    def again_steps(self, t: RunTools, s: RunState, n: int) -> list[Step]:
        """The exec's command again on the host that replaced (or resumed) the outbid one, as `exec-N.rK`."""
        steps = [step.model_copy(update={"name": f"{step.name}.r{n}"}) for step in t.spec.profile.steps]
        for step, again in zip(t.spec.profile.steps, steps, strict=True):
            t.out.warn(f"kept host {self.name}: {step.name} was cut by the outbid; run again as {again.name}")
        return steps

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        return ExitCode.PASSED, f"exec {self.record.execs} passed"

    def hand_over(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        if self.yielded:
            return super().hand_over(t, s, code, message)
        work = s.work
        step = work.steps[-1] if work and work.steps else None
        left_running = step is not None and step.rc is None  # interrupted, cut, or its link lost
        if left_running and isinstance(work, HeldHostWork) and work.session.is_active() and work.stop_command():
            t.out.info(f"kept host {self.name}: the command was stopped on the host")
            left_running = False
        # Still running there (the link was lost): the next exec stops it first.
        self.save(t, s, exec_unfinished=left_running, last_exec_rc=step.rc if step else None)
        code, message = super().hand_over(t, s, code, message)
        return code, f"{message}; kept host {self.name} stays held (idle deadline {_utc(self.record.idle_deadline)})"


class KeepStages(HoldStages):
    """`vast-e2e keep NAME`: the idle deadline pushed from now; nothing else."""

    command = "keep"

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        t.cap_guard.start()
        return None

    def connect(self, t: RunTools, s: RunState) -> None:
        self.adopt(t, s)

    def arm(self, t: RunTools, s: RunState) -> None:
        self.check_switch(t, s)

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        return ExitCode.PASSED, f"kept host {self.name}: idle deadline pushed to {_utc(self.record.idle_deadline)}"


class DownStages(HoldStages):
    """`vast-e2e down NAME`: the held instance adopted (no SSH) and torn down as a run's: DELETE, proof of
    absence, the label sweep; the hold ends."""

    command = "down"
    past_cap = False  # the hold was past its cap when the `down` began

    def prepare(self, t: RunTools, s: RunState, key_dir: Path) -> Bundle | None:
        self.expect_gone(t)

        def change(r: HeldHost) -> None:
            r.state, r.message = "ending", "down"

        self.store.update(self.name, change, ending_ok=True)  # an exec's hand-over no longer keeps it
        self.past_cap = self.record.cap_end().left_s() <= 0
        if not self.past_cap:  # past it, the switch has deleted the host (or this teardown does, now): the guard
            t.cap_guard.start()  # would fire at once and claim that deletion as its own
        return None

    def expect_gone(self, t: RunTools) -> None:
        """The held instance found gone is proven gone, not someone else's delete, when the hold had ended
        already: an earlier `down` (killed?) or teardown sent its DELETE (the record says `ending`, or the ledger
        has a DELETE of the hold's for it), or its deadline passed (its switch deletes it by then)."""
        r, inst = self.record, t.book.latest()
        if inst is None:
            return
        ours = any(e.event == "delete_ack" and e.run_id == r.hold_id and e.instance_id == inst.instance_id
                   for e in t.ledger.entries())
        if r.state == "ending" or ours:
            t.reads.expected_gone[inst.instance_id] = "an earlier command of this hold (a `down`) sent its DELETE"
        elif r.expired():
            t.reads.expected_gone[inst.instance_id] = (f"its dead-man switch deleted it at the hold's "
                                                       f"{r.why_deadline()} deadline")
            # Its bill ended there: the switch fires at that deadline, `switch_lead_s` before the cap at the latest
            # (the meter would bill until this read, and see a cap overrun that never was)
            t.reads.gone_by[inst.instance_id] = r.deadline().to_mono() + r.switch_lead_s

    def connect(self, t: RunTools, s: RunState) -> None:
        """No SSH. An interruptible hold's host that reads paused (outbid) has its checkpoint salvaged into the
        hold's evidence first (the teardown then deletes it and proves it gone)."""
        s.stage = Stage.RENT
        self.load_bid(t, s)
        inst = t.book.latest()
        bid = self.record.bid
        if bid is None or inst is None:
            return
        try:
            read = t.client.get_instance(inst.instance_id, max_retry_s=READ_S, within_s=READ_S)
        except VastError:
            return  # the teardown reads it again
        if read is None or read.paused is None:
            return
        why = f"instance {inst.instance_id} {read.paused}"
        t.out.warn(f"kept host {self.name}: outbid ({why}); deleting it")
        t.ledger.append(s.run_id, "outbid", inst.label, instance_id=inst.instance_id, detail=why[:300])
        if bid.checkpoint is not None:
            try:
                salvage(t, s, inst, interruptions(s) + 1)
            except HarnessError as exc:  # the host goes anyway: `down` never keeps it for its data
                t.out.warn(f"the checkpoint could not be copied off instance {inst.instance_id}: {exc}")
        close_attempt(t, s, inst.instance_id, f"outbid ({why}); then down")

    def arm(self, t: RunTools, s: RunState) -> None:
        pass

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        inst = t.book.latest()
        what = f"instance {inst.instance_id}" if inst else "no instance (its up never got one)"
        return ExitCode.PASSED, f"kept host {self.name} is down: {what} deleted"

    def keeps(self, t: RunTools, s: RunState, code: ExitCode) -> bool:
        return False

    def not_kept(self, t: RunTools, s: RunState, code: ExitCode, message: str) -> Outcome:
        return code, message  # ending the hold is what `down` is for
