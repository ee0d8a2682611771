"""`vast-e2e canary`: one cheap guarded run that measures what the harness otherwise assumes about Vast.

It is a `GuardedRun` (the same caps, quote, write-ahead ledger, signal handling, teardown and absence proof;
`--max-usd` 0.10 by default) on the cheapest qualified offer, with one step that looks at the SSH session's
environment, and a few read-only observations added where the run already is:

* create -> the first per-id read and the first v1 list row that show the instance (read lag), at the
  client's pacing (2 s per-id, 1 s list against Vast: that is the resolution);
* create -> running (boot time), and whether the image reference was accepted (running, not "manifest ...");
* the container key's read of its own instance (the dead-man switch armed, from `deadman.py`);
* which of Vast's variables an SSH session sees (docs: none, unless in /etc/environment);
* DELETE -> null per-id read and list absence, and the shape in between (a lingering destroyed row, or null
  at once), from the absence proof's own rounds (resolution: the proof interval);
* the answer to a repeat DELETE, sent only after the absence is proven;
* the shape the per-id read came in (an object or a one-element list) and whether it carried `ports`;
* whether the run's key was attached through `POST /instances/{id}/ssh/`;
* the bandwidth figures to compare with the account's invoice: the bytes each way, the offer's two rates, what
  each reading of "up" would bill, and the credit before and after (whose "up" `inet_up_cost` names is unsourced).

It writes `canary.json` (the run's evidence directory and `--out`) and prints a table;
`python -m vast_harness.sim --calibrate canary.json` sets the simulator's read lag, linger and boot time from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from rich.table import Table
from rich.text import Text

from vast_harness.caps.meter import BYTES_PER_GB, usd_up
from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.errors import BootFailed, HarnessError, VastError
from vast_harness.instance.absence import is_lingering
from vast_harness.masking import MASKER
from vast_harness.records import CreatedInstance
from vast_harness.run.interrupt import copy_off
from vast_harness.run.runner import GuardedRun, HarnessResult, RunStages
from vast_harness.run.state import RunState
from vast_harness.run.tools import RunTools
from vast_harness.run.verdict import Outcome
from vast_harness.spec.profile import DriverPolicy, Step
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.resolve import RunSpec
from vast_harness.vast.client import VastClient
from vast_harness.vast.endpoints import ENDPOINT_PATHS
from vast_harness.vast.models import UnreadableShape, per_id_row

CANARY_SCHEMA_VERSION = 1  # issue 33 added fields only: calibrate reads version 1 files of either age
_VARS = ("CONTAINER_ID", "CONTAINER_API_KEY", "VAST_CONTAINERLABEL", "PUBLIC_IPADDR")
# The one step: which of Vast's variables an SSH session sees, and whether /etc/environment carries them
# (names only: a value never leaves the host).
ENV_STEP = Step(name="ssh-env", workload=False, timeout_s=60, run="; ".join(
    [*(f'echo "VHCANARY ssh {v} ${{{v}:+set}}"' for v in _VARS),
     *(f'echo "VHCANARY etc {v} $(grep -sc "^{v}=" /etc/environment)"' for v in _VARS)]))


# canary --interruptible: a file of known bytes the probe copies off the stopped instance, and how long it watches
# the stopped instance's reads for the shape the detector calls paused
PROBE_DIR = "vh-canary-probe"
PROBE_BYTES = 1_000_000
PAUSE_WATCH_S = 120.0
PROBE_STEP = Step(name="probe-file", workload=False, timeout_s=60, run=(
    f"mkdir -p ~/{PROBE_DIR} && head -c {PROBE_BYTES} /dev/urandom > ~/{PROBE_DIR}/probe.bin"
    f' && echo "VHCANARY probe $(sha256sum ~/{PROBE_DIR}/probe.bin | cut -c1-64)" && echo "VHCANARY home $HOME"'))


class Visibility(BaseModel):
    """When reads first showed the instance, seconds after the create's answer (None: not within the boot)."""

    per_id_s: float | None = None
    list_s: float | None = None
    polls: int = 0


class Bandwidth(BaseModel):
    """Bytes each way and what each reading of Vast's names would bill: a user compares these with the invoice's
    bandwidth line, which tells whose "up" `inet_up_cost` is (the harness prices both at the higher rate)."""

    bytes_to_host: int
    bytes_from_host: int
    inet_up_cost_usd_per_gb: float | None
    inet_down_cost_usd_per_gb: float | None
    host_names_usd: float  # to the host at inet_down_cost, from it at inet_up_cost (the host's "up")
    renter_names_usd: float  # to the host at inet_up_cost, from it at inet_down_cost (the renter's "up")
    harness_usd: float  # both at the higher rate: what the meter counted
    credit_before_usd: float | None = None
    credit_after_usd: float | None = None


class PausedRead(BaseModel):
    """One shape a stopped bid instance's per-id read showed, and when (seconds after the stop was answered)."""

    t_s: float
    actual_status: str | None = None
    intended_status: str | None = None
    cur_state: str | None = None
    next_state: str | None = None
    status_msg: str | None = None


class InterruptibleProbe(BaseModel):
    """`canary --interruptible`: a bid instance, stopped by the canary itself (`PUT /instances/{id}/` state
    stopped, manage_instance.yaml) as the nearest thing to an outbid it can cause; what its reads show while
    paused, whether the harness's outbid detector calls it paused, and the copy off it (`vastai copy`'s way)
    of a known file: the endpoint's answer, time, bytes and rate. An outbid by another renter is not caused:
    that its states are the same as a stop's stays UNCONFIRMED (docs/limits.md)."""

    bid_usd_per_h: float | None = None
    min_bid_usd_per_h: float | None = None
    is_bid: bool | None = None  # the running instance's own row
    stop: str = "not sent"  # "answered", or why not
    reads: list[PausedRead] = Field(default_factory=list)  # each distinct shape, in order
    paused_after_s: float | None = None  # stop answered -> the first read the detector calls paused
    detector: str | None = None  # what `Instance.paused` says of it
    outbid_during_run: str | None = None  # a real outbid the run met (then the probe is of the replacement)
    copy_answer_keys: list[str] = Field(default_factory=list)
    copy_answer_s: float | None = None
    copy_s: float | None = None
    copy_bytes: int | None = None
    copy_rc: int | None = None
    copy_bytes_per_s: float | None = None
    copy_matches: bool | None = None  # the copied file's sha256 is the one the host computed
    copy_detail: str = ""


class CanaryReport(BaseModel):
    """canary.json."""

    schema_version: int = CANARY_SCHEMA_VERSION
    api_url: str
    sim: bool
    run_id: str
    exit_code: int
    message: str
    accrued_usd: float
    offer_id: int | None = None
    instance_id: int | None = None
    create_answer_s: float | None = None  # PUT sent -> answered
    read_lag: Visibility = Field(default_factory=Visibility)
    boot_s: float | None = None  # create answered -> running with SSH
    image_sent: str
    image_accepted: bool | None = None
    deadman_armed: bool | None = None
    deadman_probe_status: int | None = None
    host_clock_skew_s: float | None = None
    ssh_env: dict[str, bool] = Field(default_factory=dict)  # variable -> visible in an SSH session
    etc_environment: dict[str, bool] = Field(default_factory=dict)  # variable -> listed in /etc/environment
    delete_to_null_s: float | None = None  # DELETE acknowledged -> per-id read null
    delete_to_list_absent_s: float | None = None  # ... -> v1 list without it
    linger_shape: str | None = None  # "null at once" or "destroyed row, then null"
    linger_s: float | None = None  # how long a destroyed row was seen (0 when none)
    proof_interval_s: float
    absence: str | None = None
    repeat_delete: dict[str, Any] | None = None  # status and body of a DELETE after the absence was proven
    per_id_shapes: dict[str, int] = Field(default_factory=dict)  # per-id reads by shape: object, list, null, ...
    per_id_ports: bool | None = None  # whether the per-id read of the running instance carried `ports`
    key_attached: bool | None = None  # the run key attached through POST /api/v0/instances/{id}/ssh/
    key_attach_detail: str = ""
    bandwidth: Bandwidth | None = None
    interruptible: InterruptibleProbe | None = None  # `canary --interruptible`
    measured_unix: float = Field(default_factory=time.time)


class _ProbeStages(RunStages):
    """A run's stages, and `canary --interruptible`'s probe once the work succeeded: after the price watch has
    ended (the stop the probe makes must not read as an outbid of the run), before the teardown."""

    def __init__(self, probe: Callable[[], None]) -> None:
        self._probe = probe

    def outcome(self, t: RunTools, s: RunState) -> Outcome:
        self._probe()
        return super().outcome(t, s)


class CanaryRun(GuardedRun):
    """The guarded run, with the observations above. Nothing here rents, deletes or waits on its own, except
    that `--interruptible` stops its own bid instance after the steps to see it paused and copy off it."""

    def __init__(self, spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output) -> None:
        super().__init__(spec, client, drivers, out, around_boot=self._observe_boot,
                         stages=_ProbeStages(self._pause_probe) if spec.interruptible is not None else None)
        self.visibility = Visibility()
        self.boot_s: float | None = None
        self.image_accepted: bool | None = None
        self.per_id_ports: bool | None = None
        self.probe: InterruptibleProbe | None = None

    def _pause_probe(self) -> None:
        t, s = self.tools, self.state
        inst = self.book.latest()
        cand = s.candidate
        probe = self.probe = InterruptibleProbe(
            bid_usd_per_h=cand.offer.bid_usd_per_h if cand else None,
            min_bid_usd_per_h=cand.offer.min_bid_usd_per_h if cand else None,
            outbid_during_run=next((a.ended for a in s.attempts if a.ended.startswith("outbid")), None))
        if inst is None:
            return
        with contextlib.suppress(VastError):
            row = t.client.get_instance(inst.instance_id, max_retry_s=5.0)
            probe.is_bid = row.is_bid if row is not None else None
        sha, home = self._probe_file()
        try:
            t.client.set_instance_state(inst.instance_id, "stopped", within_s=30.0)
        except VastError as exc:
            probe.stop = f"refused: {exc}"[:300]
            return
        probe.stop = "answered"
        if s.session is not None:  # the container stops: its session with it
            s.session.close()
            s.session = None
        stopped = now_s()
        until = min(stopped + PAUSE_WATCH_S, self.meter.work_deadline())
        seen: set[tuple[str | None, ...]] = set()
        while now_s() < until:
            s.check_cancelled()
            with contextlib.suppress(VastError):
                row = t.client.get_instance(inst.instance_id, max_retry_s=0.0)
                if row is not None:
                    shape = (row.actual_status, row.intended_status, row.cur_state, row.next_state, row.status_msg)
                    if shape not in seen:
                        seen.add(shape)
                        probe.reads.append(PausedRead(t_s=round(now_s() - stopped, 3), **dict(zip(
                            ("actual_status", "intended_status", "cur_state", "next_state", "status_msg"), shape,
                            strict=True))))
                    if row.paused is not None:
                        probe.paused_after_s = round(now_s() - stopped, 3)
                        probe.detector = row.paused
                        break
            time.sleep(min(self.spec.poll_s, 2.0))
        if probe.paused_after_s is None:
            probe.copy_detail = "the instance never read as paused: no copy tried"
            return
        if home is None or shutil.which("rsync") is None:
            probe.copy_detail = "no copy: " + ("rsync is not installed here" if home else "the host's home unread")
            return
        dst = self.ev.dir / "canary-copy"
        try:
            copied = copy_off(t, s, inst.instance_id, f"{home}/{PROBE_DIR}/", dst, max_bytes=4 * PROBE_BYTES)
        except HarnessError as exc:
            probe.copy_detail = str(exc)[:300]
            return
        probe.copy_answer_keys = sorted((copied.endpoint.model_extra or {}).keys()
                                        | copied.endpoint.model_fields_set) if copied.endpoint else []
        probe.copy_answer_s, probe.copy_s, probe.copy_bytes = copied.answer_s, copied.seconds, copied.bytes
        probe.copy_rc = copied.rc
        transfer_s = max(1e-3, copied.seconds - copied.answer_s)
        probe.copy_bytes_per_s = round(copied.bytes / transfer_s, 1) if copied.bytes else None
        got = dst / "probe.bin"
        probe.copy_matches = (hashlib.sha256(got.read_bytes()).hexdigest() == sha) if got.is_file() and sha else None
        probe.copy_detail = (copied.cut or (t.spec.redactor.text(copied.said) if copied.rc else ""))[:300]

    def _probe_file(self) -> tuple[str | None, str | None]:
        """The probe file's sha256 and the host's $HOME, as the probe step printed them."""
        sha = home = None
        try:
            lines = (self.ev.dir / "steps" / f"{PROBE_STEP.name}.log").read_text(errors="replace").splitlines()
        except OSError:
            return None, None
        for line in lines:
            parts = line.split()
            if len(parts) == 3 and parts[:2] == ["VHCANARY", "probe"]:
                sha = parts[2]
            elif len(parts) == 3 and parts[:2] == ["VHCANARY", "home"] and parts[2].startswith("/"):
                home = parts[2]
        return sha, home

    def _observe_boot(self, inst: CreatedInstance, boot: Callable[[], None]) -> None:
        """Around each boot: reads until they show the instance, then the boot; its time and the image's fate."""
        self._watch_visibility(inst)
        try:
            boot()
        except BootFailed as exc:
            if "manifest" in str(exc).lower():
                self.image_accepted = False
            raise
        self.boot_s = round(time.time() - inst.t_created_unix, 3)
        self.image_accepted = True
        running = _shown(self.tools.client.read_instance_raw(inst.instance_id), inst.instance_id)
        self.per_id_ports = None if running is None else bool(running.get("ports"))

    def _watch_visibility(self, inst: CreatedInstance) -> None:
        """Per-id read and v1 list by id, each until it first shows the instance (bounded by the boot's time)."""
        deadline = self.meter.deadline(self.spec.profile.boot_timeout_s)
        vis = self.visibility = Visibility()
        client = self.tools.client
        while now_s() < deadline and (vis.per_id_s is None or vis.list_s is None):
            self.state.check_cancelled()
            vis.polls += 1
            if vis.per_id_s is None:
                x = client.read_instance_raw(inst.instance_id)
                if _shown(x, inst.instance_id) is not None:
                    vis.per_id_s = round(x.t_end_unix - inst.t_created_unix, 3)
            if vis.list_s is None:
                x = client.list_instances_raw(instance_id=inst.instance_id)
                rows = x.json.get("instances") if x.status == 200 and isinstance(x.json, dict) else None
                if isinstance(rows, list) and any(isinstance(r, dict) and r.get("id") == inst.instance_id
                                                  for r in rows):
                    vis.list_s = round(x.t_end_unix - inst.t_created_unix, 3)
            if vis.per_id_s is None or vis.list_s is None:
                time.sleep(min(self.spec.poll_s, 1.0))

    def report(self, result: HarnessResult) -> CanaryReport:
        inst = self.created[-1] if self.created else None
        sent, deadman = self.book.attempts, self.state.deadman
        rep = CanaryReport(
            api_url=self.spec.api_url, sim=self.spec.sim, run_id=self.run_id, exit_code=int(result.exit_code),
            message=result.message, accrued_usd=usd_up(self.accrued_usd()),
            offer_id=inst.offer_id if inst else None, instance_id=inst.instance_id if inst else None,
            create_answer_s=_answer_s(inst.t_created_unix, sent[inst.label]) if inst and inst.label in sent else None,
            read_lag=self.visibility, boot_s=self.boot_s, image_sent=self.spec.profile.image_ref.create_form,
            image_accepted=self.image_accepted, proof_interval_s=self.spec.proof_interval_s,
            deadman_armed=deadman.armed if deadman else None,
            deadman_probe_status=deadman.probe_status if deadman else None,
            host_clock_skew_s=deadman.host_clock_skew_s if deadman else None,
        )
        rep.per_id_shapes = {str(k): v for k, v in self.tools.client.read_shapes.items()}
        rep.per_id_ports = self.per_id_ports
        if inst is not None:
            rep.key_attached, rep.key_attach_detail = inst.key_attached, inst.key_attach_detail
        cand = self.state.candidate
        if cand is not None:
            rep.bandwidth = bandwidth_figures(self.meter.bytes_up, self.meter.bytes_down,
                                              up_usd_per_gb=cand.offer.inet_up_cost_usd_per_gb,
                                              down_usd_per_gb=cand.offer.inet_down_cost_usd_per_gb)
        rep.interruptible = self.probe
        self._read_env(rep)
        teardown = next((t for t in self.teardowns if inst and t.instance_id == inst.instance_id), None)
        if teardown is not None:
            rep.absence = teardown.verdict
            self._read_linger(rep, teardown)
        return rep

    def _read_env(self, rep: CanaryReport) -> None:
        log = self.ev.dir / "steps" / f"{ENV_STEP.name}.log"
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            return
        for line in lines:
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "VHCANARY":
                value = parts[3] if len(parts) > 3 else ""
                if parts[1] == "ssh":
                    rep.ssh_env[parts[2]] = value == "set"
                elif parts[1] == "etc":
                    rep.etc_environment[parts[2]] = value not in ("", "0")

    def _read_linger(self, rep: CanaryReport, teardown: Any) -> None:
        acks = [d.t_ack_unix for d in teardown.deletes if d.acknowledged and d.t_ack_unix]
        if not acks or teardown.proof is None:
            return
        t_ack = acks[0]
        first_row_t = last_row_t = None
        for rnd in teardown.proof.rounds:
            shown: Any = "odd"
            if rnd.per_id.get("status") == 200 and rep.instance_id is not None:
                with contextlib.suppress(UnreadableShape):  # either shape: an object or a one-element list
                    shown = per_id_row(rnd.per_id.get("json"), rep.instance_id)[1]
            rows = rnd.list_by_id.get("json", {}).get("instances") if rnd.list_by_id.get("status") == 200 \
                and isinstance(rnd.list_by_id.get("json"), dict) else None
            if isinstance(shown, dict) and is_lingering(shown):
                first_row_t = first_row_t or rnd.t_unix
                last_row_t = rnd.t_unix
            if shown is None and rep.delete_to_null_s is None:
                rep.delete_to_null_s = round(rnd.t_unix - t_ack, 3)
            if rows == [] and rep.delete_to_list_absent_s is None:
                rep.delete_to_list_absent_s = round(rnd.t_unix - t_ack, 3)
        if first_row_t is None:
            rep.linger_shape, rep.linger_s = "null at once", 0.0
        else:
            rep.linger_shape = "destroyed row, then null"
            rep.linger_s = round((last_row_t or first_row_t) - t_ack, 3)

    def repeat_delete(self, rep: CanaryReport) -> None:
        """One DELETE after the absence was proven: what Vast answers for an instance already gone."""
        if rep.instance_id is None or rep.absence != "gone":
            return
        x = self.tools.client.exchange("DELETE", ENDPOINT_PATHS["destroy_instance"].format(id=rep.instance_id), json={})
        rep.repeat_delete = {"status": x.status, "body": x.text[:300], "error": x.error}


def _shown(x: Any, instance_id: int) -> dict[str, Any] | None:
    """The row a raw per-id read shows for `instance_id`, in either shape; None otherwise."""
    if x.status != 200:
        return None
    try:
        _shape, row = per_id_row(x.json, instance_id)
    except UnreadableShape:
        return None
    return row if row is not None and row.get("id") == instance_id else None


def bandwidth_figures(to_host: int, from_host: int, *, up_usd_per_gb: float | None,
                      down_usd_per_gb: float | None) -> Bandwidth:
    up, down = up_usd_per_gb or 0.0, down_usd_per_gb or 0.0
    return Bandwidth(bytes_to_host=to_host, bytes_from_host=from_host, inet_up_cost_usd_per_gb=up_usd_per_gb,
                     inet_down_cost_usd_per_gb=down_usd_per_gb,
                     host_names_usd=round((to_host * down + from_host * up) / BYTES_PER_GB, 6),
                     renter_names_usd=round((to_host * up + from_host * down) / BYTES_PER_GB, 6),
                     harness_usd=round((to_host + from_host) * max(up, down) / BYTES_PER_GB, 6))


def _credit(client: VastClient) -> float | None:
    try:
        return client.current_user(max_retry_s=5.0).available_usd
    except VastError:
        return None


def canary_spec(spec: RunSpec) -> RunSpec:
    """The profile's image, caps and filters, one step (the SSH environment; with --interruptible a second that
    writes the probe file), no boot retries, no receipt (it measures Vast, not the GPU: a receipt would bill its
    seconds for nothing the canary reports)."""
    steps = [ENV_STEP, PROBE_STEP] if spec.interruptible is not None else [ENV_STEP]
    profile = spec.profile.model_copy(update={"steps": steps, "image_expect": None,
                                              "receipt": ReceiptPolicy(enabled=False)})
    return spec.model_copy(update={"profile": profile, "boot_retries": 0})


def run_canary(spec: RunSpec, client: VastClient, drivers: DriverPolicy, out: Output,
               out_path: Path | None) -> tuple[CanaryReport, CanaryRun]:
    run_out = out
    if out.json_mode:  # stdout carries canary.json alone: the run's own lines go to stderr
        run_out = Output()
        run_out.out = out.err
    run = CanaryRun(canary_spec(spec), client, drivers, run_out)
    credit_before = _credit(client)
    result = run.execute()
    rep = run.report(result)
    if rep.bandwidth is not None:  # Vast may settle bandwidth later: the invoice is the witness, this a hint
        rep.bandwidth.credit_before_usd, rep.bandwidth.credit_after_usd = credit_before, _credit(client)
    run.repeat_delete(rep)
    payload = rep.model_dump()
    run.ev.write_json("canary.json", payload)
    if out_path is not None:
        out_path.write_text(json.dumps(MASKER.json_value(payload), indent=2) + "\n", encoding="utf-8")
    return rep, run


def print_canary(out: Output, rep: CanaryReport, out_path: Path | None) -> None:
    if out.json_mode:
        out.emit_json(rep.model_dump())
        return
    vis = rep.read_lag
    rows = [
        ("exit code", f"{rep.exit_code}: {rep.message[:120]}"), ("accrued $", f"{rep.accrued_usd:.4f}"),
        ("create answered after", _s(rep.create_answer_s)),
        ("read lag: per-id / v1 list", f"{_s(vis.per_id_s)} / {_s(vis.list_s)} ({vis.polls} polls)"),
        ("boot (answer -> running)", _s(rep.boot_s)),
        ("image reference accepted", f"{_show(rep.image_accepted)} ({rep.image_sent})"),
        ("dead-man armed (container key read)", f"{_show(rep.deadman_armed)} (HTTP {rep.deadman_probe_status})"),
        ("host clock skew", _s(rep.host_clock_skew_s)),
        ("SSH session sees", ", ".join(k for k, v in rep.ssh_env.items() if v) or "none of Vast's variables"),
        ("/etc/environment lists", ", ".join(k for k, v in rep.etc_environment.items() if v) or "none"),
        ("DELETE -> per-id null / list absent", f"{_s(rep.delete_to_null_s)} / {_s(rep.delete_to_list_absent_s)} "
                                                f"(resolution {rep.proof_interval_s:g} s)"),
        ("linger", f"{rep.linger_shape} ({_s(rep.linger_s)})"), ("absence", str(rep.absence)),
        ("repeat DELETE", f"HTTP {rep.repeat_delete['status']} {rep.repeat_delete['body'][:80]}"
         if rep.repeat_delete else "not sent"),
        ("per-id read shape", ", ".join(f"{k} x{v}" for k, v in rep.per_id_shapes.items()) or "-"),
        ("per-id read carries ports", _show(rep.per_id_ports)),
        ("run key attached (POST .../ssh/)", f"{_show(rep.key_attached)} {rep.key_attach_detail[:80]}".strip()),
        ("bandwidth (host's 'up' / renter's 'up' / harness)", _bandwidth(rep.bandwidth)),
        *_probe_rows(rep.interruptible),
    ]
    table = Table(title=Text(f"vast-e2e canary: {rep.api_url}"))
    table.add_column("measured")
    table.add_column("value")
    for name, value in rows:
        table.add_row(Text(name), Text(value))
    out.out.print(table)
    if out_path is not None:
        out.info(f"wrote {out_path}; `python -m vast_harness.sim --calibrate {out_path}` runs the simulator on these "
                 "figures")


def _probe_rows(p: InterruptibleProbe | None) -> list[tuple[str, str]]:
    if p is None:
        return []
    shapes = "; ".join(f"+{r.t_s:g} s: actual {r.actual_status}, intended {r.intended_status}, cur {r.cur_state}, "
                       f"next {r.next_state}, msg {r.status_msg!r}" for r in p.reads) or "-"
    return [
        ("bid placed / min_bid ($/h)", f"{p.bid_usd_per_h} / {p.min_bid_usd_per_h}; the row says is_bid "
                                       f"{_show(p.is_bid)}"),
        ("stop (PUT state stopped)", p.stop),
        ("reads while stopped", shapes),
        ("detector calls it paused after", f"{_s(p.paused_after_s)} ({p.detector or 'never'})"),
        ("copy endpoint answer (keys, time)", f"{', '.join(p.copy_answer_keys) or '-'} ({_s(p.copy_answer_s)})"),
        ("copy off the stopped instance", f"{p.copy_bytes} B in {_s(p.copy_s)}, rsync rc {p.copy_rc}, "
                                          f"{p.copy_bytes_per_s or '-'} B/s, sha256 same {_show(p.copy_matches)} "
                                          f"{p.copy_detail}".strip()),
        ("a real outbid met", p.outbid_during_run or "none"),
    ]


def _bandwidth(bw: Bandwidth | None) -> str:
    if bw is None:
        return "-"
    return (f"${bw.host_names_usd:.6f} / ${bw.renter_names_usd:.6f} / ${bw.harness_usd:.6f} "
            f"({bw.bytes_to_host} B in, {bw.bytes_from_host} B out; compare with the invoice)")


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def _show(value: bool | None) -> str:
    return "unknown" if value is None else "yes" if value else "NO"


def _answer_s(answered_unix: float, sent_mono: float) -> float:
    """PUT sent (this process's monotonic clock, as the run records it) -> answered (wall clock, recorded)."""
    sent_unix = time.time() - (now_s() - sent_mono)
    return round(max(0.0, answered_unix - sent_unix), 3)
