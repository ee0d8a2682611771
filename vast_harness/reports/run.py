"""`report.html` of one run, built only from the files the run wrote (so it can be rebuilt at any time).

Reads harness-result.json, offer-quote.json, steps.tsv, absence-proof.json, remote/*.json and receipts/*.json
(and, for a run killed before its record, which steps have a log in steps/ but no outcome); writes one
self-contained HTML file (inline CSS, charts as embedded SVG data URIs, no script, no network). Missing or
odd files shrink the report, never break it: the report runs after teardown and must never fail a run.
The same sections make up each run's part of the fleet report (`fleet_report.py`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from vast_harness.evidence.host_data import WorkloadFigures, load_workloads, number, read_json, usd_per_mtok
from vast_harness.evidence.run import RECEIPTS_DIR
from vast_harness.records import HostGpus, Receipt
from vast_harness.reports import svg as svgplot
from vast_harness.reports import timeline
from vast_harness.reports.html import Cell, Link, exit_cell, page, show, table, usd
from vast_harness.reports.run_facts import RunFacts, step_note

__all__ = ["REPORT_NAME", "Cell", "RunFacts", "exit_cell", "load_run", "page", "run_sections", "table",
           "usd_per_mtok", "write_run_report", "write_run_report_safely"]

REPORT_NAME = "report.html"

def _read_json(path: Path) -> Any:
    return read_json(path)[0]


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def load_run(directory: Path) -> RunFacts:
    facts = RunFacts(dir=directory)
    facts.result = _dict(_read_json(directory / "harness-result.json"))
    facts.quote = _dict(_read_json(directory / "offer-quote.json"))
    facts.absence = _dict(_read_json(directory / "absence-proof.json"))
    steps = facts.result.get("steps")
    facts.steps = [s for s in steps if isinstance(s, dict)] if isinstance(steps, list) else []
    # A kept host's record is its latest command's (its own steps only, none for a `down`): every command's
    # steps are in steps.tsv, each overlaid by the record's row of it where it has one
    if (not facts.steps or facts.result.get("profile") == "kept") and (directory / "steps.tsv").is_file():
        recorded = {s.get("name"): s for s in facts.steps}
        facts.steps = [recorded.get(row["name"], row) for row in _tsv_steps(directory / "steps.tsv")]
    facts.workloads, facts.unreadable = load_workloads(directory / "remote")
    facts.missing = [n for n in ("harness-result.json", "absence-proof.json") if not (directory / n).is_file()]
    if "harness-result.json" in facts.missing:
        facts.steps += _cut_off_steps(directory, facts)
    for path in sorted((directory / RECEIPTS_DIR).glob("*.json")) if (directory / RECEIPTS_DIR).is_dir() else []:
        receipt = _read_json(path)
        if isinstance(receipt, dict):
            facts.receipts[path.stem] = receipt
    return facts


def _cut_off_steps(directory: Path, facts: RunFacts) -> list[dict[str, Any]]:
    """A run with no record (killed): each step with a log but no row, as started with no outcome, in its plan's
    order (offer-quote.json), then by when its log was last written."""
    ended = {s.get("name") for s in facts.steps}
    logs = {p.stem: p for p in (directory / "steps").glob("*.log") if p.is_file() and p.stem not in ended} \
        if (directory / "steps").is_dir() else {}
    planned = [s.get("name") for s in facts.quote.get("steps") or [] if isinstance(s, dict)]
    order = {name: n for n, name in enumerate(planned)}
    names = sorted(logs, key=lambda name: (order.get(name, len(order)), logs[name].stat().st_mtime))
    return [{"name": name, "rc": None, "seconds": None, "cut_off": True} for name in names]


def _tsv_steps(path: Path) -> list[dict[str, Any]]:
    """steps.tsv's rows as a record's steps: name, rc, seconds, and how a step ended when not by itself."""
    rows: list[dict[str, Any]] = []
    for line in path.read_text(errors="replace").splitlines():
        name, rc, secs, end = (line.split("\t") + ["", "", "", ""])[:4]
        seconds = number(_float_or_none(secs), low=0.0, high=1e9, low_inclusive=True).value
        row: dict[str, Any] = {"name": name, "rc": None if rc == "NA" else rc, "seconds": seconds or 0.0}
        if end in ("interrupted", "timed_out", "connection_lost"):
            row[end] = True
        rows.append(row)
    return rows


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def summary_section(f: RunFacts) -> str:
    r, o = f.result, f.offer
    caps = _dict(r.get("caps"))
    rows = [
        ["run id", r.get("run_id", f.dir.name)], ["exit code", exit_cell(r.get("exit_code"))],
        ["message", r.get("message")],
        ["offer", f"{o.get('id')} · {o.get('num_gpus')}× {o.get('gpu_name')} · {o.get('geolocation')}" if o else None],
        ["host GPUs", host_gpus_cell(r)],
        ["receipt", receipt_cell(r)],
        ["$/h (at disk)", usd(f.dph_usd)], ["driver", f"{o.get('driver_version')} (qualified: "
                                                      f"{show(r.get('driver_qualified'))})" if o else None],
        ["caps", f"{usd(caps.get('max_usd'), 2)} · {caps.get('max_minutes')} min" if caps else None],
        ["worst case", usd(r.get("worst_case_usd"))], ["accrued", _accrued_cell(r.get("accrued_usd"))],
        ["absence", (r.get("absence") or {}).get("verdict")], ["simulated", r.get("sim")],
        ["dead-man", deadman_line(r.get("deadman"))], ["image sent", r.get("image_sent")],
    ]
    found = f.not_ours()
    if found:
        rows.insert(next(n for n, row in enumerate(rows) if row[0] == "absence") + 1,
                    ["not the run's", Cell("; ".join(f"instance {i}: {why}" for i, why in found.items())
                                           + " (named by a create answer, never deleted or billed as the run's)",
                                           "bad")])
    if "harness-result.json" in f.missing:
        rows.insert(0, ["record", Cell("harness-result.json is missing (the run could not write it): its outcome "
                                       "is not known from this directory; the ledger says what it rented", "bad")])
    override = r.get("image_expect_override")
    if override:
        rows.append(["image check", Cell("OVERRIDDEN by --image-expect: " + ", ".join(
            f"{k}={v}" for k, v in override.items()), "bad")])
    return table([], [[k, v] for k, v in rows], cls="summary")


def attempts_section(f: RunFacts) -> str:
    """An interruptible run's hosts, one after another (docs/interruptible.md): where each ran, how long, what the
    meter accrued for it, the checkpoint moved, why it ended; and the run's total against its caps. Nothing for a
    run with no attempts (on demand)."""
    rows: list[list[Any]] = []
    spent = 0.0
    for a in f.result.get("attempts") or []:
        if not isinstance(a, dict):
            continue
        start = number(a.get("started_unix"), low=0, high=1e11).value
        end = number(a.get("ended_unix"), low=0, high=1e11).value
        accrued = number(a.get("accrued_usd"), low=0, high=1e9, low_inclusive=True).value
        spent += accrued or 0.0
        ended = str(a.get("ended") or "open")
        rows.append([a.get("instance_id"), a.get("machine_id"), usd(a.get("dph_usd")),
                     time.strftime("%H:%M:%SZ", time.gmtime(start)) if start else None,
                     round(end - start, 1) if start and end else None, usd(accrued), a.get("salvaged_bytes"),
                     a.get("restored_bytes"), Cell(ended, "bad" if ended.startswith("outbid") else "")])
    if not rows:
        return ""
    caps = _dict(f.result.get("caps"))
    total = (f"{len(rows)} host(s); the hosts accrued {usd(spent)}, the run {usd(f.result.get('accrued_usd'))} in all "
             f"(bytes moved included), of the cap {usd(caps.get('max_usd'), 2)} and the worst case "
             f"{usd(f.result.get('worst_case_usd'))}")
    return ("<h3>Hosts (interruptible)</h3>"
            + table(["instance", "machine", "$/h", "started", "seconds", "accrued", "salvaged B", "restored B",
                     "ended"], rows, cls="attempts")
            + f'<p class="attempts-total">{escape(total)}</p>')


def _accrued_cell(accrued: Any) -> str:
    """The meter's figure is an upper bound: it bills from the create's answer, Vast bills the GPU from
    `running` (storage only while loading), so a real invoice is at most this."""
    shown = usd(accrued)
    return shown if shown == "–" else f"{shown} (an upper bound: billed from the create, Vast from running)"


def host_gpus_cell(r: dict[str, Any]) -> str | Cell | None:
    """The GPUs the host reported after SSH (the record's `host_gpus`), and any host refused as not the offer's."""
    if "host_gpus" not in r:  # a record from before the arrival check
        return None
    try:
        gpus = HostGpus.model_validate(r["host_gpus"]) if r.get("host_gpus") else None
        refused = [HostGpus.model_validate(g) for g in r.get("gpu_refused") or []]
    except ValidationError:
        return Cell("unreadable in harness-result.json", "bad")
    text = gpus.shown() if gpus else "none ran"
    if refused:
        return Cell(f"{text} · refused as not what was offered: " + " | ".join(
            f"instance {g.instance_id} (offer {g.offer_id}): {g.describe()}: {'; '.join(g.mismatches[:3])}"
            for g in refused), "bad")
    return text


def _receipts(r: dict[str, Any]) -> tuple[Receipt | None, list[Receipt]] | None:
    """The record's receipt (the host the work ran on) and those refused; None when unreadable."""
    try:
        ran = Receipt.model_validate(r["receipt"]) if r.get("receipt") else None
        refused = [Receipt.model_validate(x) for x in r.get("receipts_refused") or []]
    except (ValidationError, TypeError):
        return None
    return ran, refused


def receipt_cell(r: dict[str, Any]) -> str | Cell | None:
    """One line: what the host that ran delivered, and how many were refused on their receipt."""
    if "receipt" not in r:  # a record from before the receipt
        return None
    found = _receipts(r)
    if found is None:
        return Cell("unreadable in harness-result.json", "bad")
    ran, refused = found
    text = ran.headline() if ran else "none passed" if refused else "none taken"
    if ran is not None and ran.verdict not in ("off",):
        text += f" ({ran.wall_s:.1f} s, {usd(ran.billed_usd)} billed at the host's price)"
    if refused:
        return Cell(f"{text} · refused on their receipt: " + " | ".join(
            f"instance {x.instance_id} (machine {x.machine_id}): {x.reason[:300]}" for x in refused), "bad")
    return Cell(text, "bad") if ran is not None and ran.verdict == "failed" else text


def receipt_section(f: RunFacts) -> str:
    """Every receipt the run took, check by check: the measure, what it was compared with, the bound, the
    verdict; the host's own record linked."""
    found = _receipts(f.result)
    if not found or (found[0] is None and not found[1]):
        return ""
    ran, refused = found
    parts = ["<h3>Receipt</h3><p>What each host's GPUs delivered, measured on the host before any work and "
             "judged against the reference table (profiles/receipt-references.toml), the offer and the profile's "
             "[receipt]. Every second of it is billed at the host's price and counted against both caps.</p>"]
    for rec in [*refused, *([ran] if ran else [])]:
        link: Any = Link(rec.file, quote(rec.file)) if rec.file and (f.dir / rec.file).is_file() else "–"
        head: list[list[Any]] = [["instance", f"{rec.instance_id} (offer {rec.offer_id}, machine {rec.machine_id}, {rec.num_gpus}x "
                             f"{rec.gpu_name})"],
                ["verdict", Cell(rec.headline(), "ok" if rec.verdict == "passed" else "bad"
                                 if rec.verdict == "failed" else "")],
                ["time", f"{rec.wall_s:.1f} s here, {rec.host_wall_s if rec.host_wall_s is not None else '–'} s on "
                         f"the host, budget {rec.budget_s:g} s"],
                ["billed", f"{usd(rec.billed_usd)} (all of it, at {usd(rec.dph_usd)}/h)"],
                ["simulated", rec.simulated], ["the host's record", link]]
        rows = [[c.gpu if c.gpu is not None else "host", c.measure, c.against, show(c.measured), c.unit,
                 f"{'<=' if c.at_most else '>='} {c.expected:.4g}" if c.expected is not None else "–",
                 show(c.basis), c.source,
                 Cell(c.verdict + (f": {c.detail}" if c.detail else ""),
                      "ok" if c.verdict == "pass" else "bad" if c.verdict == "fail" else "")] for c in rec.checks]
        parts.append(table([], head, cls="receipt") + table(
            ["GPU", "measure", "against", "measured", "unit", "bound", "compared with", "source", "verdict"], rows,
            cls="receipt-checks"))
    return "".join(parts)


def deadman_line(d: dict[str, Any] | None) -> str | None:
    """ "armed, fires at <UTC>" (with the host clock's skew), or why it was not armed."""
    if not d:
        return None
    skew = d.get("host_clock_skew_s")
    skew_text = f" (host clock {skew:+.0f} s)" if isinstance(skew, int | float) else ""
    if d.get("armed"):
        return f"armed, fires at {d.get('fires_at_utc')}{skew_text}"
    allowed = "; run allowed by --allow-unarmed-deadman" if d.get("allowed_unarmed") else ""
    return f"NOT ARMED: {d.get('problem')}{allowed}{skew_text}"


def profile_section(f: RunFacts) -> str:
    """The profile that actually ran: its name, image, settings and each step's command (offer-quote.json
    holds the plan as the run resolved it; under `fleet --sim` a GPU profile runs the smoke steps)."""
    r = f.result
    env = _dict(r.get("remote_env"))
    rows: list[list[Any]] = [["profile", r.get("profile")], ["image", r.get("image")],
            ["remote env", " ".join(f"{k}={v}" for k, v in env.items()) or "(none)"],
            ["secrets (names)", ", ".join(str(n) for n in r.get("remote_secrets") or []) or "(none)"]]
    steps = f.quote.get("steps")
    plan: list[list[Any]] = [[s.get("name"), s.get("timeout_s"), s.get("run")]
                             for s in (steps if isinstance(steps, list) else []) if isinstance(s, dict)]
    return ("<h3>Profile that ran</h3>" + table([], rows, cls="profile")
            + table(["step", "timeout s", "command"], plan, cls="plan"))


def workdir_section(f: RunFacts) -> str:
    """`vast-e2e run`: the workdir that was uploaded (its sha256) and the artifacts that came back, each linked;
    the globs that matched nothing and the files left on the host are named. Nothing for a profile's bundle."""
    wd, arts = _dict(f.result.get("workdir")), _dict(f.result.get("artifacts"))
    if not wd and not arts:
        return ""
    rows: list[list[Any]] = [["workdir", wd.get("path")], ["sha256", wd.get("sha256")], ["files", wd.get("files")],
                             ["bytes", wd.get("bytes")], ["left out", wd.get("excluded")],
                             ["symlinks skipped", ", ".join(str(s) for s in wd.get("symlinks_skipped") or []) or "–"]]
    html = "<h3>Workdir</h3>" + table(["", ""], rows, cls="workdir")
    if arts:
        files = [str(n) for n in arts.get("files") or []]
        ours, theirs = _dict(arts.get("sha256")), _dict(arts.get("host_sha256"))
        found = _dict(arts.get("secrets_found"))
        # linked, never rendered: an artifact is the user's file, kept byte for byte (a secret in it included)
        links: list[list[Any]] = [
            [Link(n, "artifacts/" + quote(n)) if (f.dir / "artifacts" / n).is_file() else n, ours.get(n),
             _witness_cell(ours.get(n), theirs.get(n)),
             Cell(", ".join(str(s) for s in found[n]), "bad") if found.get(n) else "–"] for n in files]
        problems: list[list[Any]] = [["globs", ", ".join(str(g) for g in arts.get("globs") or [])],
                    ["matched nothing", ", ".join(str(g) for g in arts.get("unmatched") or []) or "–"],
                    ["skipped (budget)", ", ".join(str(g) for g in arts.get("skipped") or []) or "–"],
                    ["left on the host", ", ".join(str(g) for g in arts.get("left") or []) or "–"],
                    ["not the host's bytes", ", ".join(str(g) for g in arts.get("mismatched") or []) or "–"],
                    ["complete", arts.get("complete")]]
        if found:
            problems.append([Cell("secrets inside", "bad"), Cell("; ".join(
                f"{name}: {', '.join(str(s) for s in secrets)}" for name, secrets in found.items()
                if isinstance(secrets, list)) + " (kept byte for byte and private: do not share as is)", "bad")])
        html += ("<h3>Artifacts</h3>" + table(["", ""], problems, cls="artifacts")
                 + table(["file", "sha256", "the host's sha256", "holds"], links, cls="artifact-files"))
    return html


def _witness_cell(ours: Any, theirs: Any) -> Cell | str:
    """Whether the kept file is the host's: its sha256 against the one the host computed."""
    if not theirs:
        return "not checked"
    return Cell("same", "ok") if theirs == ours else Cell(f"DIFFERENT: {theirs}", "bad")


def steps_section(f: RunFacts) -> str:
    rows = []
    for s in f.steps:
        name = str(s.get("name"))
        log = f.dir / "steps" / f"{name}.log"
        note = step_note(s)
        rows.append([name, "–" if s.get("cut_off") else s.get("rc"), s.get("seconds"), note, s.get("detail") or "",
                     Link(f"steps/{name}.log", f"steps/{name}.log") if log.is_file() else "–"])
    timings = _dict(f.result.get("timings"))
    return ("<h3>Steps</h3>" + table(["step", "rc", "seconds", "note", "detail", "log"], rows, cls="steps")
            + "<h3>Timings</h3>" + table(["phase", "seconds"], [[k, v] for k, v in timings.items()], cls="timings"))


def _not_ours_notice(f: RunFacts) -> str:
    found = f.not_ours()
    if not found:
        return ""
    return ('<p class="bad not-ours">Not the run\'s: a create answer named these instances, but no read showed them '
            "carrying the run's label. They were left alone: never deleted, billed or proven gone as the run's "
            "(and <code>vast-e2e reap</code> leaves them alone too). Check in the account whose they are.</p>"
            + table(["instance", "why it is not the run's"], [[i, why] for i, why in found.items()],
                    cls="not-ours"))


def absence_section(f: RunFacts) -> str:
    rows = []
    for td in f.absence.get("instances") or []:
        deletes = td.get("deletes") or []
        outcome = "; ".join(f"{d.get('outcome')}" for d in deletes) or "–"
        proof = td.get("proof") or {}
        for i, rd in enumerate(proof.get("rounds") or [], 1):
            rows.append([td.get("instance_id"), outcome, i, time.strftime("%H:%M:%S", time.gmtime(rd.get("t_unix", 0))),
                         _exchange(rd.get("per_id")), _exchange(rd.get("list_by_id")),
                         _exchange(rd.get("list_by_label")), Cell(str(rd.get("verdict")),
                                                                  "ok" if rd.get("verdict") == "gone" else "bad")])
        if not proof.get("rounds"):
            rows.append([td.get("instance_id"), outcome, "–", "–", "–", "–", "–",
                         Cell(str(td.get("verdict")), "bad")])
    verdict = f.absence.get("verdict") or (f.result.get("absence") or {}).get("verdict") or (
        "not known (absence-proof.json is missing)" if "absence-proof.json" in f.missing else "nothing-created")
    return (f"<h3>Absence proof</h3><p>verdict: <b class={'ok' if verdict in ('gone', 'nothing-created') else 'bad'}>"
            f"{escape(str(verdict))}</b> (interval {escape(str(f.absence.get('interval_s')))} s)</p>"
            + _not_ours_notice(f)
            + table(["instance", "DELETE", "round", "time (UTC)", "GET by id", "list by id", "list by label",
                     "verdict"], rows, cls="absence"))


def _exchange(ex: dict[str, Any] | None) -> str:
    if not ex:
        return "–"
    body = ex.get("json")
    if isinstance(body, dict) and "instances" in body:
        inst = body["instances"]
        shown = "null" if inst is None else f"{len(inst) if isinstance(inst, list) else 1} row(s)"
    else:
        shown = (ex.get("error") or "")[:40]
    return f"{ex.get('status')} {shown}".strip()


def sweep_series(workloads: list[WorkloadFigures]) -> list[tuple[str, list[tuple[float, float]]]]:
    """MFU % against micro-batch, one series per world size (and compile mode when both ran): the sweep's
    shape. Empty unless some series has two micro-batches or more (a single point is not a sweep)."""
    groups: dict[tuple[int, bool | None], dict[int, float]] = {}
    for w in workloads:
        if w.mfu is None or w.micro_batch is None or w.world_size is None:
            continue
        points = groups.setdefault((w.world_size, w.compiled), {})
        points[w.micro_batch] = max(points.get(w.micro_batch, 0.0), 100 * w.mfu)
    if not any(len(p) > 1 for p in groups.values()):
        return []
    modes = {compiled for _, compiled in groups}
    series = []
    for (world, compiled), points in sorted(groups.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        mode = "" if len(modes) == 1 else (" compiled" if compiled else " eager")
        series.append((f"world {world}{mode}", sorted((float(mb), mfu) for mb, mfu in points.items())))
    return series


def workload_section(f: RunFacts) -> str:
    if not f.workloads and not f.unreadable:
        return ""
    rows = [[w.name, w.world_size, w.micro_batch, w.reduction, None if w.mfu is None else round(100 * w.mfu, 2),
             w.tokens_per_s, w.tokens_per_s_per_gpu, w.peak_tflops, w.replay_match, w.attention_backend,
             Cell("; ".join(w.invalid), "bad") if w.invalid else ""] for w in f.workloads]
    parts = ["<h3>Workload (MFU)</h3>",
             table(["file", "world", "micro-batch", "reduction", "MFU %", "tokens/s", "tokens/s per GPU",
                    "peak TFLOP/s", "replay match", "attention", "invalid figures"], rows, cls="mfu")]
    if f.unreadable:
        parts.append("<p class=bad>Not read: " + escape("; ".join(f.unreadable)) + "</p>")
    series = sweep_series(f.workloads)
    if series:
        svg = svgplot.lines(series, title="MFU sweep: MFU vs micro-batch per world size", xlabel="micro-batch",
                            ylabel="MFU %", point_marks=True)
        parts.append(svgplot.img_tag(svg, "MFU vs micro-batch per world size", cls="plot sweep"))
    elif sum(w.mfu is not None for w in f.workloads) > 1:  # one bar is the table's one figure again
        svg = svgplot.bars([(w.name.removesuffix(".json"), 100 * (w.mfu or 0.0)) for w in f.workloads],
                           title="MFU per measurement", ylabel="MFU %")
        parts.append(svgplot.img_tag(svg, "MFU per measurement"))
    return "".join(parts)


# The run's files a reader opens next, in the order they are asked for.
EVIDENCE_FILES = (
    ("harness-result.json", "the run's record: outcome, caps, phases, steps, timings, absence"),
    ("absence-proof.json", "every DELETE and every absence-proof read, as answered"),
    ("offer-quote.json", "the offer as chosen and the plan as resolved"),
    ("deadman.log", "the host's dead-man switch, as it logged"),
    ("steps.tsv", "each step's name, exit status and seconds"),
    ("manifest.sha256", "a digest of every file here"),
)
REMOTE_FILES_LISTED = 100
# Vast's console has an instances page; a page per instance is not a documented address (UNCONFIRMED), so the
# link is to the list, named by the instance id (a destroyed instance is gone from it: the record is here).
VAST_CONSOLE_INSTANCES = "https://cloud.vast.ai/instances/"


def files_section(f: RunFacts) -> str:
    """Links to the evidence files beside the report, what the host left in remote/, and (a real run) the
    instances in Vast's console."""
    rows: list[list[Any]] = [[Link(name, name), what] for name, what in EVIDENCE_FILES if (f.dir / name).is_file()]
    remote_dir = f.dir / "remote"
    remote = sorted(p for p in remote_dir.rglob("*") if p.is_file()) if remote_dir.is_dir() else []
    for p in remote[:REMOTE_FILES_LISTED]:
        rel = p.relative_to(f.dir).as_posix()
        rows.append([Link(rel, rel), "pulled from the host"])
    if len(remote) > REMOTE_FILES_LISTED:
        rows.append([f"remote/ ({len(remote) - REMOTE_FILES_LISTED} more)", "pulled from the host"])
    instances = f.result.get("instances")
    if f.result.get("sim") is False:  # a simulated instance is in no console
        for inst in instances if isinstance(instances, list) else []:
            iid = inst.get("instance_id") if isinstance(inst, dict) else None
            if isinstance(iid, int) and not isinstance(iid, bool):
                rows.append([Link(f"instance {iid}", VAST_CONSOLE_INSTANCES),
                             "Vast's console (its instances page; a destroyed instance is no longer listed)"])
    return "<h3>Files</h3>" + table(["file", "what it holds"], rows, cls="files")


_RELATIVE_HREF = re.compile(r'href="(?![a-z][a-z0-9+.-]*:|#|/)')


def run_sections(f: RunFacts, *, link_prefix: str = "") -> str:
    """A run's sections; `link_prefix` makes its links relative to another page (the fleet report)."""
    html = (summary_section(f) + attempts_section(f) + timeline.timeline_section(f) + timeline.cost_section(f) + steps_section(f)
            + receipt_section(f) + profile_section(f) + workdir_section(f) + absence_section(f) + workload_section(f)
            + files_section(f))
    return _RELATIVE_HREF.sub(f'href="{escape(link_prefix)}', html) if link_prefix else html


def write_run_report(directory: Path) -> Path:
    """Build `report.html` in a run's evidence directory from its files; returns its path."""
    f = load_run(directory)
    run_id = f.result.get("run_id", directory.name)
    html = page(f"Run {run_id}", f"<h1>Run {escape(str(run_id))}</h1>" + run_sections(f))
    from vast_harness.evidence.run import write_whole

    path = directory / REPORT_NAME
    write_whole(path, html)
    return path


def write_run_report_safely(directory: Path, warn: Callable[[str], None]) -> Path | None:
    """The run's last act, after teardown and the result: the report, then the manifest again so that it
    covers the report. A report that cannot be written is a warning, never a failure."""
    from vast_harness.evidence.run import RunEvidence

    rebuild = f"`vast-e2e report {directory.name}` rebuilds it from the evidence files once there is room"
    try:
        path = write_run_report(directory)
    except Exception as exc:  # noqa: BLE001 - the evidence files stay; the report can be rebuilt from them
        warn(f"could not write {REPORT_NAME} ({type(exc).__name__}: {exc}); {rebuild}")
        return None
    ev = RunEvidence(directory)
    ev.write_manifest()  # the report is evidence too: the manifest covers it
    if ev.write_failures:  # a report the manifest does not list would fail a check of the directory
        path.unlink(missing_ok=True)
        warn(f"could not add {REPORT_NAME} to the manifest ({'; '.join(ev.write_failures)}): removed it; {rebuild}")
        return None
    return path
