"""The judge: what counts as a broken promise, decided from the simulator's own record, never the harness's word.

Every scenario kind (in-process, network, kill -9) ends in the same checks, on the same facts:

* leak           an instance still live at the end (after `reap` where the scenario kills or the run exits 3)
* false_absence  'gone' claimed (ledger `absence gone`, harness-result.json) while the simulator had it live
* over_cap_usd   dollars billed by the simulator above `max_usd`
* over_cap_time  an instance destroyed later than run start + the time cap
* exit_mismatch  an exit code that does not fit what happened (0 only for a run that really passed under cap)
* reap_failed    `reap` (faults cleared) did not exit 0 with nothing live
* hang           a scenario over its wall budget (caps + a teardown allowance); the run is killed
* crash          an exception out of the in-process run
* traceback      "Traceback" in a subprocess run's output
* not_ours       an instance that is not the run's (a decoy of the account) deleted, or waited on as the run's
* under_reported a run reporting less accrued than the simulator billed for its instances (every in-process
                 run, and a suspend)
* sim_bug        an exception the simulator's HTTP server caught (`/_sim/state` `server_errors`): the scenario
                 did not test what it meant to
* gpu_liar_used  a host whose nvidia-smi named another GPU (fault gpu_mismatch) got more than the GPU read
                 (a second command or an upload), or a run whose every host lied exited 0
* receipt_failed_used  the user's work ran on a host whose receipt failed: a command started on it after its
                 receipt (the receipt it answered, `/_sim/state`, judged by the profile's [receipt] with the
                 harness's pure judge), or a run whose every host's receipt failed exited 0
* healthy_refused  a host with no receipt fault (only the ±3% noise) refused on its receipt
* secret_on_host the bytes of the account's key file or of a credential file in the workdir found in the
                 simulated host's sandbox (the uploaded tarball decompressed)
* not_named      a key or credential file left out of the upload but not named in the record or on the console
* step_held      a step whose command exited at once, held past its exit status (by a background process)
* secret_leak    a secret's value (or the account key) in any output of the run but the artifact that holds it:
                 the console, the step logs, the record, the report, the ledger; or that artifact readable by
                 others than its owner
* artifact_altered  an artifact that is not byte for byte what the command wrote, or whose recorded sha256 is
                 not the host's
* secret_unwarned   an artifact holding a secret that the console, the record or the report does not name
"""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from vast_harness.host.receipt_judge import OfferFigures, judge
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.references import shipped_references
from vast_harness.state.ledger import LEDGER_FILE, Ledger

VIOLATION_KINDS = ("leak", "false_absence", "over_cap_usd", "over_cap_time", "exit_mismatch", "reap_failed",
                   "hang", "crash", "traceback", "sim_bug", "gpu_liar_used", "receipt_failed_used", "healthy_refused",
                   "not_ours", "under_reported", "secret_on_host", "not_named", "step_held", "secret_leak",
                   "artifact_altered", "secret_unwarned")


class Violation(BaseModel):
    kind: str
    detail: str
    known: str | None = None  # the KNOWN_ISSUES entry it matches: reported, not counted


# Harness bugs this suite found and that are not fixed yet: name -> (violation kind, pattern on its detail).
# A matching violation is reported as known and not counted. Each entry should have a strict xfail test in
# tests/harness/test_chaos.py; when the fix lands that test passes, strict mode fails it, and the entry goes.
KNOWN_ISSUES: dict[str, tuple[str, re.Pattern[str]]] = {}


def classify(violation: Violation) -> Violation:
    for name, (kind, pattern) in KNOWN_ISSUES.items():
        if violation.kind == kind and pattern.search(violation.detail):
            return violation.model_copy(update={"known": name})
    return violation


def false_absences(instances: list[dict[str, Any]], evidence_dir: Path, *, wall_offset_s: float = 0.0) -> list[Violation]:
    """'gone' claimed (ledger `absence gone`, harness-result.json) while the simulator still had it live.
    `wall_offset_s`: how far the writer's wall clock was stepped when it claimed (account clock scenarios)."""
    by_id = {i["id"]: i for i in instances}
    claims: list[tuple[int, float, str]] = []
    try:
        claims += [(e.instance_id, e.t_unix, "ledger") for e in Ledger(evidence_dir / LEDGER_FILE).entries()
                   if e.event == "absence" and e.verdict == "gone" and e.instance_id is not None]
    except (OSError, ValueError):
        pass  # an unreadable ledger claims nothing (the leak check still sees what is live)
    for path in evidence_dir.glob("*/harness-result.json"):
        try:
            result = json.loads(path.read_text())
            claims += [(int(i), result["finished_unix"], path.parent.name)
                       for i, verdict in result["absence"]["per_instance"].items() if verdict == "gone"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # a torn result file (full disk) claims nothing
    found = []
    claims = [(i, t - wall_offset_s, src) for i, t, src in claims]
    for instance_id, t_unix, source in claims:
        if instance_id not in by_id:
            continue  # never created: nothing to be wrong about
        destroyed = by_id[instance_id]["destroyed_at"]
        if destroyed is None or destroyed > t_unix:
            found.append(Violation(kind="false_absence", detail=f"{source} says {instance_id} gone at {t_unix:.3f}; "
                                   f"the simulator destroyed it at {destroyed}"))
    return found


def cap_violations(instances: list[dict[str, Any]], now_unix: float, start_unix: float, max_usd: float,
                   max_seconds: float, evidence_dir: Path | None = None) -> list[Violation]:
    """Dollars billed over `max_usd`; an instance alive past run start + the time cap (still live: `now_unix`).
    With the run's `evidence_dir`, a late instance's violation also says when the harness sent its DELETE and
    what the run was doing (its phases): enough to tell a late decision from a slow answer."""
    found = []
    billed_usd = sum(i["billed_usd"] for i in instances)
    if billed_usd > max_usd:
        found.append(Violation(kind="over_cap_usd", detail=f"billed ${billed_usd:.6f} > cap ${max_usd:.6f}"))
    for inst in instances:
        late_s = (inst["destroyed_at"] or now_unix) - start_unix - max_seconds
        if late_s > 0:
            when = _teardown_timeline(evidence_dir, inst["id"], start_unix) if evidence_dir else ""
            found.append(Violation(kind="over_cap_time", detail=f"instance {inst['id']} lived {late_s:.2f} s "
                                   f"past the {max_seconds:.1f} s cap{when}"))
    return found


def _teardown_timeline(evidence_dir: Path, instance_id: int, start_unix: float) -> str:
    """'; DELETE sent +19.62 s, acknowledged +21.30 s; phases: boot +0.2..+0.4, ...' from the run's record."""
    parts = []
    for path in evidence_dir.glob("*/absence-proof.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            for rec in json.loads(path.read_text())["instances"]:
                if rec["instance_id"] == instance_id and rec["deletes"]:
                    d = rec["deletes"][0]
                    ack = f", acknowledged +{d['t_ack_unix'] - start_unix:.2f} s" if d.get("t_ack_unix") else ""
                    parts.append(f"DELETE sent +{d['t_request_unix'] - start_unix:.2f} s{ack}")
    for path in evidence_dir.glob("*/harness-result.json"):
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            phases = json.loads(path.read_text())["phases"]
            parts.append("phases: " + ", ".join(f"{p['name']} +{p['t_start_unix'] - start_unix:.2f}.."
                                                f"+{p['t_end_unix'] - start_unix:.2f}" for p in phases))
    return ("; " + "; ".join(parts)) if parts else ""


def gpu_liar_violations(instances: list[dict[str, Any]], exit_code: int | None) -> list[Violation]:
    """A lying host (`gpu_lie` in `/_sim/state`) must be refused after its one GPU read, before any upload or
    step; a run whose every host lied cannot pass (its deletion is judged by `leak` like any other)."""
    found = [Violation(kind="gpu_liar_used", detail=f"instance {i['id']} reported another GPU yet ran "
                       f"{i.get('execs')} command(s) and received {i.get('bytes_to_host')} bytes")
             for i in instances if i.get("gpu_lie") and (i.get("execs", 0) > 1 or i.get("bytes_to_host", 0) > 0)]
    if instances and all(i.get("gpu_lie") for i in instances) and exit_code in (0, 4):
        found.append(Violation(kind="gpu_liar_used", detail=f"exit {exit_code} though every host lied"))
    return found


def receipt_violations(instances: list[dict[str, Any]], exit_code: int | None, policy: ReceiptPolicy,
                       evidence_dir: Path | None) -> list[Violation]:
    """The user's work never runs on a host whose receipt failed, and no healthy host is refused on it. "Failed"
    is decided here from the receipt the host answered (`/_sim/state`) and its offer, not from the run's word;
    "refused" from the run's record (`receipts_refused`)."""
    found, failed = [], []
    for inst in instances:
        doc = inst.get("receipt")
        if not isinstance(doc, dict) or not isinstance(inst.get("offer_figures"), dict):
            continue
        fig = inst["offer_figures"]
        offer = OfferFigures(gpu_name=str(fig.get("gpu_name") or ""), num_gpus=int(fig.get("num_gpus") or 1),
                             pcie_bw_gbps=fig.get("pcie_bw"), pci_gen=fig.get("pci_gen"),
                             gpu_mem_bw_gbps=fig.get("gpu_mem_bw"), total_flops=fig.get("total_flops"),
                             bw_nvlink_gbps=fig.get("bw_nvlink"))
        judged = judge(doc, offer, policy, shipped_references())
        if judged.verdict != "failed":
            continue
        failed.append(inst["id"])
        started = doc.get("started_unix")
        later = [t for t in inst.get("exec_times", []) if isinstance(started, float | int) and t > started]
        if later:
            found.append(Violation(kind="receipt_failed_used", detail=f"instance {inst['id']} failed its receipt "
                                   f"({judged.reason[:200]}) yet ran {len(later)} command(s) after it"))
    answered = [i for i in instances if isinstance(i.get("receipt"), dict)]
    if answered and len(failed) == len(answered) and exit_code in (0, 4):
        found.append(Violation(kind="receipt_failed_used", detail=f"exit {exit_code} though every host's receipt "
                               "failed"))
    healthy = {i["id"] for i in instances if not i.get("receipt_faults")}
    for path in evidence_dir.glob("harness-result.json") if evidence_dir else []:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            for rec in json.loads(path.read_text()).get("receipts_refused") or []:
                if rec["instance_id"] in healthy and rec.get("verdict") == "failed":
                    found.append(Violation(kind="healthy_refused", detail=f"instance {rec['instance_id']} had no "
                                           f"receipt fault yet was refused: {str(rec.get('reason'))[:300]}"))
    return found


def sim_bugs(state: dict[str, Any]) -> list[Violation]:
    """Exceptions the simulator's server caught while the scenario ran (a state without the field has none)."""
    return [Violation(kind="sim_bug", detail=text[:3000]) for text in state.get("server_errors", [])]


def traceback_violations(text: str, where: str) -> list[Violation]:
    at = text.find("Traceback (most recent call last)")
    if at < 0:
        return []
    tail = text[at:].splitlines()
    # The exception is the first unindented line after the frames: name it first, then the frames.
    last = next((line for line in tail[1:] if line and not line.startswith(" ")), tail[-1] if tail else "")
    return [Violation(kind="traceback", detail=f"{where}: {last[:300]}\n{text[at:at + 3000]}")]


def secret_leaks(root: Path, value: str, *, kept: Path | None = None, what: str = "the secret") -> list[Violation]:
    """Every file under `root` that holds `value`'s bytes, but `kept` (the artifact that is the user's own and
    may hold it), and `kept` itself when others than its owner may read it."""
    needle = value.encode()
    found = [Violation(kind="secret_leak", detail=f"{what} in clear in {p.relative_to(root)}")
             for p in sorted(root.rglob("*"))
             if p.is_file() and not p.is_symlink() and p != kept and needle in p.read_bytes()]
    if kept is not None and kept.is_file() and kept.stat().st_mode & 0o077:
        found.append(Violation(kind="secret_leak", detail=f"{kept.name} holds {what} and has mode "
                               f"{kept.stat().st_mode & 0o777:o}: not private"))
    return found
