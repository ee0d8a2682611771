"""An interruptible run's outbids (docs/interruptible.md): detect, salvage, delete the husk, replace, resume.

An outbid shows as a read of the instance paused (`Instance.paused`: every stopped, paused or scheduling shape the
sources name, since what Vast shows is UNCONFIRMED); the price watch sees it within one poll while anything runs
on the host, and a phase that fails on a host whose link dropped asks one read before it is called a failure.
Then, within the caps: the checkpoint folder is copied off the stopped husk the way `vastai copy` does it
(`PUT /commands/rsync/`, then rsync's daemon over SSH), the husk is deleted and proven gone (never two instances
of the run at once: a husk not proven gone stops the run, exit 3), its machine excluded, another host rented,
the folder uploaded into the workdir and the resume command run. Each host is an `Attempt` of the record.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from vast_harness.errors import BootFailed, HarnessError, Interrupted, TeardownUnproven, VastError
from vast_harness.host.bundle import WORKDIR_DIR
from vast_harness.records import Attempt, CreatedInstance
from vast_harness.run.host_work import REMOTE_DIR
from vast_harness.run.state import RunState
from vast_harness.run.teardown import teardown_one
from vast_harness.run.tools import RunTools
from vast_harness.spec.profile import Step
from vast_harness.vast.models import CopyEndpoint

OUTBID_READ_S = 5.0  # the one read that tells a dropped link from an outbid
SALVAGE_DIR = "salvaged"  # <evidence>/<run>/salvaged/<n>/: each husk's checkpoint folder as copied off it
COPY_POLL_S = 0.2
RSYNC_PARTIAL = 23  # rsync's "some files were not transferred": the folder itself missing is one such


class Outbid(HarnessError):
    """The run's host was outbid (paused) and the run recovers from it, or says why it could not."""


def open_attempt(t: RunTools, s: RunState, inst: CreatedInstance) -> None:
    if t.spec.interruptible is not None:
        s.attempts.append(Attempt(instance_id=inst.instance_id, machine_id=inst.machine_id, dph_usd=inst.dph_usd,
                                  started_unix=time.time()))


def close_attempt(t: RunTools, s: RunState, instance_id: int, why: str) -> None:
    for attempt in s.attempts:
        if attempt.instance_id == instance_id and attempt.ended_unix is None:
            attempt.ended_unix, attempt.ended = time.time(), why
            attempt.accrued_usd = round(t.meter.instance_accrued_usd(instance_id), 6)


def hosts_lines(t: RunTools, s: RunState) -> list[str]:
    """The console's account of an interruptible run's hosts: one line each (where, how long, what it accrued,
    why it ended), then the run's total against its cap and its worst case. Empty for any other run."""
    if not s.attempts:
        return []
    lines = []
    for a in s.attempts:
        seconds = max(0.0, (a.ended_unix or a.started_unix) - a.started_unix)
        paused = f", resumed from {a.pauses} pause(s) ({a.paused_s:.0f} s)" if a.pauses else ""
        lines.append(f"host {a.instance_id} (machine {a.machine_id if a.machine_id is not None else '?'}, "
                     f"${a.dph_usd:.4f}/h): {seconds:.0f} s, ${a.accrued_usd:.4f}{paused}; {a.ended or 'open'}")
    worst = s.hold_worst_case_usd if s.hold_worst_case_usd is not None \
        else s.plan.chosen.quote.worst_case_usd if s.plan is not None else None
    lines.append(f"{len(s.attempts)} host(s): ${t.meter.accrued_usd():.4f} of the cap ${t.spec.caps.max_usd:.4f}"
                 + (f" (worst case ${worst:.4f})" if worst is not None else ""))
    return lines


def outbid_of(t: RunTools, s: RunState, exc: BaseException) -> str | None:
    """Why `exc` (what stopped the work) is an outbid of the run's host, or None. The price watch may have seen
    it already; else, for an error of the link or the host (a step that lost its connection), one read decides.
    A signal or a cap is never an outbid."""
    if t.spec.interruptible is None or isinstance(exc, Interrupted):
        return None
    if s.outbid_reason is not None:
        return s.outbid_reason
    if s.cancelled.is_set():  # a cap, a fleet's total, someone else's delete: not ours to recover from
        return None
    inst = t.book.latest()
    if inst is None:
        return None
    try:
        read = t.client.get_instance(inst.instance_id, max_retry_s=0.0, within_s=OUTBID_READ_S)
    except VastError:
        return None
    if read is not None and read.paused is not None:
        return f"instance {inst.instance_id} {read.paused}"
    return None


def record_host_home(t: RunTools, s: RunState) -> None:
    """The host's $HOME, where the checkpoint folder will be copied from (the copy names absolute paths)."""
    if t.spec.interruptible is None or t.spec.interruptible.checkpoint is None or s.session is None:
        return
    lines: list[str] = []
    outcome = s.session.run('printf "%s\\n" "$HOME"', on_line=lambda _stream, line: lines.append(line),
                            timeout_s=max(0.5, min(15.0, t.meter.deadline() - t.clock())))
    if outcome.ok and lines and lines[0].startswith("/"):
        s.host_home = lines[0].strip()


def recover(t: RunTools, s: RunState, why: str, previous: Path | None = None, *, waited: bool = False) -> Path | None:
    """Salvage the husk's checkpoint, delete it and prove it gone, exclude its machine: what the next host needs
    (the folder salvaged off it, or `previous`, the one salvaged before, when the husk holds nothing newer).
    Raises Outbid (exit 1) past --max-interruptions or when the salvage fails, TeardownUnproven (exit 3) when the
    husk is not proven gone (nothing more is rented beside it)."""
    terms = t.spec.interruptible
    assert terms is not None
    inst = t.book.latest()
    assert inst is not None
    n = interruptions(s) + 1
    if not waited:  # a wait that ran out said both already
        t.out.warn(f"outbid ({n} of at most {terms.max_interruptions}): {why}")
        t.ledger.append(s.run_id, "outbid", inst.label, instance_id=inst.instance_id, detail=why[:300])
        t.notify.outbid(inst, why, stage=s.stage.value, interruption=n, next="stop" if n > terms.max_interruptions
                        else "salvage_and_replace" if terms.checkpoint is not None else "replace")
    salvaged: Path | None = None
    failure: str | None = None
    if terms.checkpoint is not None and previous is not None and not _restored(s, inst.instance_id):
        # Outbid before the folder it was given was restored: it ran nothing, so it holds nothing newer (and a
        # copy of a half-unpacked folder would be worse than the one already here).
        t.out.info(f"instance {inst.instance_id} was outbid before its checkpoint was restored: the one salvaged "
                   "before stands")
        salvaged = previous
    elif terms.checkpoint is not None:
        try:
            salvaged = salvage(t, s, inst, n) or previous
        except HarnessError as exc:
            failure = f"the checkpoint could not be copied off instance {inst.instance_id}: {exc}"
    if s.session is not None:  # the husk's session is dead: the next host's work starts afresh
        s.session.close()
    s.session, s.work, s.candidate, s.host_gpus, s.deadman = None, None, None, None, None
    close_attempt(t, s, inst.instance_id, f"outbid ({why})")
    report = teardown_one(t, s, inst)
    if report is None or report.verdict != "gone":
        raise TeardownUnproven(f"outbid instance {inst.instance_id} is not proven gone "
                               f"({'not ours' if report is None else report.verdict}): no other host is rented "
                               "while it may still bill")
    if s.registration is not None:
        s.registration.update(instance_ids=[i for i in s.registration.reg.instance_ids if i != inst.instance_id])
    if inst.machine_id is not None:
        t.book.excluded_machines.add(inst.machine_id)
    if failure is not None:
        raise Outbid(f"{failure}; the run stops rather than resume behind its last checkpoint")
    if n > terms.max_interruptions:
        raise Outbid(f"outbid {n} times, more than --max-interruptions {terms.max_interruptions}: the worst case "
                     "covered no more")
    return salvaged


def interruptions(s: RunState) -> int:
    """The outbids the run has met so far: hosts that ended outbid, and pauses a host resumed from."""
    return sum(a.ended.startswith("outbid") for a in s.attempts) + sum(a.pauses for a in s.attempts)


def wait_for_resume(t: RunTools, s: RunState, why: str) -> bool:
    """`--on-outbid wait:MINUTES`: wait for the outbid host to resume by itself (Vast resumes a paused bid
    instance when its bid regains priority), reading it every poll, for at most MINUTES and never past the
    caps' work deadline. True: it runs again (the caller reconnects and resumes the command on it, its disk and
    checkpoint folder as they were). False: no wait asked, past --max-interruptions, the wait ran out, or the
    instance went away; the caller salvages and replaces it. A cap or a signal meanwhile raises as anywhere."""
    terms = t.spec.interruptible
    inst = t.book.latest()
    if terms is None or terms.wait_minutes is None or inst is None:
        return False
    n = interruptions(s) + 1
    t.out.warn(f"outbid ({n} of at most {terms.max_interruptions}): {why}")
    t.ledger.append(s.run_id, "outbid", inst.label, instance_id=inst.instance_id, detail=f"waiting: {why}"[:300])
    t.notify.outbid(inst, why, stage=s.stage.value, interruption=n,
                    next="stop" if n > terms.max_interruptions else "wait")
    if n > terms.max_interruptions:
        return False
    if s.session is not None:  # the paused container's session is dead; a resume is a re-boot
        s.session.close()
    s.session, s.work, s.deadman = None, None, None
    s.recovered()  # from here a cap or a signal cancels as usual
    start = t.clock()
    until = min(start + terms.wait_minutes * 60.0, t.meter.work_deadline(start))
    t.phases.start("outbid wait")
    t.out.info(f"waiting up to {max(0.0, until - start):.0f} s for instance {inst.instance_id} to resume "
               "(--on-outbid wait)")
    resumed = False
    while t.clock() < until:
        s.check_cancelled()
        t.meter.check("waiting for the outbid host to resume")
        try:
            read = t.client.get_instance(inst.instance_id, max_retry_s=0.0, within_s=OUTBID_READ_S)
        except VastError:
            pass  # one failed read decides nothing: the next poll asks again
        else:
            if read is None:  # gone: nothing to wait for; the teardown proves it
                break
            if read.paused is None and read.actual_status == "running":
                resumed = True
                break
        time.sleep(min(t.spec.poll_s, max(0.0, until - t.clock())))
    waited_s = round(t.clock() - start, 3)
    s.timings[f"outbid_wait_{n}_s"] = waited_s
    if not resumed:
        t.out.warn(f"instance {inst.instance_id} did not resume within {waited_s:.0f} s: salvaging and replacing it")
        return False
    for attempt in s.attempts:
        if attempt.instance_id == inst.instance_id:
            attempt.pauses += 1
            attempt.paused_s = round(attempt.paused_s + waited_s, 3)
    t.out.info(f"instance {inst.instance_id} resumed after {waited_s:.1f} s: reconnecting")
    t.notify.resumed(inst, paused_s=waited_s, interruption=n)
    return True


def salvage(t: RunTools, s: RunState, inst: CreatedInstance, n: int) -> Path | None:
    """The checkpoint folder copied off the stopped husk into <evidence>/salvaged/<n>/ (`copy_off`). None: the
    command had written no checkpoint yet (the next host starts from scratch, which is behind nothing)."""
    terms = t.spec.interruptible
    assert terms is not None and terms.checkpoint is not None and s.key is not None
    if s.host_home is None:
        raise HarnessError("the host's home was never read: nothing to copy from")
    src = f"{s.host_home}/{REMOTE_DIR}/{WORKDIR_DIR}/{terms.checkpoint}/"
    dst = t.ev.dir / SALVAGE_DIR / str(n)
    t.phases.start("salvage")
    t.out.info(f"copying the checkpoint {terms.checkpoint}/ off instance {inst.instance_id} (stopped)")
    copied = copy_off(t, s, inst.instance_id, src, dst, max_bytes=terms.checkpoint_max_bytes)
    s.timings[f"salvage_{n}_s"] = copied.seconds
    got = copied.bytes
    if copied.cut:
        raise HarnessError(f"the copy was cut: {copied.cut} ({got} bytes copied)")
    if copied.rc == RSYNC_PARTIAL and "change_dir" in copied.said and "No such file" in copied.said and got == 0:
        t.out.info(f"instance {inst.instance_id} had no {terms.checkpoint}/ yet: the next host starts from scratch")
        return None
    if copied.rc != 0:
        raise HarnessError(f"rsync exited {copied.rc}: {t.spec.redactor.text(copied.said) or 'no message'}")
    for attempt in s.attempts:
        if attempt.instance_id == inst.instance_id:
            attempt.salvaged_bytes = got
    t.out.info(f"salvaged {got} bytes of {terms.checkpoint}/ off instance {inst.instance_id}")
    return dst


@dataclass
class Copied:
    """One copy off an instance: what came, how long it took, how rsync ended, and why it was cut (if it was)."""

    bytes: int
    seconds: float
    rc: int | None
    said: str  # the end of rsync's stderr
    cut: str = ""
    answer_s: float = 0.0  # the copy endpoint's answer time
    endpoint: CopyEndpoint | None = None


def copy_off(t: RunTools, s: RunState, instance_id: int, src: str, dst: Path, *, max_bytes: int) -> Copied:
    """`vastai copy C.<id>:SRC DST` as the official CLI runs it (cli/commands/storage.py::copy): the copy
    endpoint names where rsync's daemon for the instance's disk listens, then rsync over SSH as vastai_kaalia
    brings SRC (an absolute path on the host) into DST. Works on a stopped instance. Bounded by the meter's
    work deadline and `max_bytes`; the bytes are billed. HarnessError when the endpoint refuses or names no
    source."""
    assert s.key is not None
    if shutil.which("rsync") is None:
        raise HarnessError("rsync is not installed here")
    dst.mkdir(parents=True, exist_ok=True)
    deadline = t.meter.work_deadline(t.clock())
    start = t.clock()
    try:
        where = t.client.copy_to_local(instance_id, src, str(dst), within_s=max(1.0, deadline - t.clock()))
    except VastError as exc:
        raise HarnessError(f"the copy endpoint refused: {exc}") from exc
    answer_s = round(t.clock() - start, 3)
    if not where.success or not where.src_addr or not where.src_port:
        raise HarnessError(f"the copy endpoint answered no source to copy from ({where.msg or 'no message'})")
    ssh = shlex.join(["ssh", "-F", "/dev/null", "-i", str(s.key.path), "-p", str(where.src_port),
                      "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                      "-o", "IdentitiesOnly=yes", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=10"])
    argv = ["rsync", "-a", "-e", ssh, f"vastai_kaalia@{where.src_addr.strip()}::{instance_id}/{src}", f"{dst}/"]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                start_new_session=True)
        cut = ""
        while proc.poll() is None:
            if t.clock() >= deadline:
                cut = "the caps left no more time for it"
            elif _size(dst) > max_bytes:
                cut = f"it passed the checkpoint's {max_bytes}-byte budget"
            if cut:
                proc.kill()
                proc.wait()
                break
            time.sleep(COPY_POLL_S)
        errors.seek(0)
        said = errors.read()[-500:].decode(errors="replace").strip()
    got = _size(dst)
    t.meter.add_bytes(down=got)
    return Copied(bytes=got, seconds=round(t.clock() - start, 3), rc=proc.returncode, said=said, cut=cut,
                  answer_s=answer_s, endpoint=where)


def restore(t: RunTools, s: RunState, folder: Path) -> None:
    """Upload the salvaged folder into the new host's workdir, where the resume command finds it."""
    terms = t.spec.interruptible
    assert terms is not None and terms.checkpoint is not None and s.session is not None
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as fh:
        with tarfile.open(fileobj=fh, mode="w:gz") as tar:
            tar.add(folder, arcname=".")
        fh.flush()
        size = Path(fh.name).stat().st_size
        sent = s.session.put(Path(fh.name), "vh-checkpoint.tar.gz", deadline=t.meter.deadline())
    t.meter.add_bytes(up=sent)
    target = f"~/{REMOTE_DIR}/{WORKDIR_DIR}/{terms.checkpoint}"
    outcome = s.session.run(f"mkdir -p {target} && tar -xzf ~/vh-checkpoint.tar.gz -C {target}",
                            on_line=lambda _stream, _line: None,
                            timeout_s=max(0.5, min(120.0, t.meter.deadline() - t.clock())), stop=s.cancelled)
    if not outcome.ok:
        raise HarnessError(f"the checkpoint could not be unpacked on the new host: rc={outcome.rc} {outcome.detail}")
    inst = t.book.latest()
    for attempt in s.attempts:
        if inst is not None and attempt.instance_id == inst.instance_id:
            attempt.restored_bytes = size
    t.out.info(f"restored {terms.checkpoint}/ ({size} bytes) on instance {inst.instance_id if inst else '?'}")


def resume_steps(t: RunTools) -> list[Step]:
    """The steps a replacement host runs: the setup steps again, then the resume command (or the run's own)."""
    terms = t.spec.interruptible
    steps = list(t.spec.profile.steps)
    if terms is None or terms.resume is None or not steps:
        return steps
    last = steps[-1]
    return [*steps[:-1], last.model_copy(update={"run": terms.resume, "name": "resume"})]


def boot_outbid(t: RunTools, exc: BaseException) -> bool:
    """A boot that failed because the instance was paused (outbid before it ran)."""
    return t.spec.interruptible is not None and isinstance(exc, BootFailed) and "stopped" in str(exc)


def _restored(s: RunState, instance_id: int) -> bool:
    return any(a.instance_id == instance_id and a.restored_bytes > 0 for a in s.attempts)


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())
