"""A run as a short Markdown page: what a CI job summary shows (GitHub's `$GITHUB_STEP_SUMMARY`, a merge
request's comment), built from the same evidence as `report.html` (`reports/run.py`'s tolerant reader).

In the order a reviewer asks: the verdict; cost against the cap and time against the time cap; the GPUs that
ran; the receipt when the record has one; the steps; the absence proof and any instance that was not the run's;
the artifacts; the notifications; the follow-up reap. Every value is text escaped for Markdown and HTML (a step name, a host's message or a label
cannot open a link, a table cell or a tag) and masked (masking.py); the page stays far below GitHub's 1 MiB per
step (long lists are cut and say so). A run that was refused (no evidence) or killed (no verdict) still gets a
page from what is known: the command's `--json` result, or only the directory it left.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vast_harness.console.money import usd
from vast_harness.errors import ExitCode
from vast_harness.masking import mask
from vast_harness.reports.run_facts import RunFacts, step_note

MAX_ROWS = 60  # steps, proof rows, artifacts, checks: a page a person reads
MAX_CELL_CHARS = 300
MAX_PAGE_CHARS = 200_000  # GitHub refuses a step summary over 1 MiB
# What can open something inside a line: code, emphasis, a link or an image, a table cell, strikethrough. What
# opens a block (#, -, >, 1.) only does so at a line's start, where no value is put.
_SPECIAL = re.compile(r"([\\`*_\[\]|~])")


@dataclass
class Hold:
    """A kept host's hold as the page shows it (views/summary.py reads it): `state` held, expired (held past its
    deadline: its switch deletes it), starting, outbid, ending, or ended; its dollars and seconds from the hold's
    start, now while it is held (`record_found`: from the hold's record), else the last command's figures."""

    state: str
    record_found: bool = False
    accrued_usd: float | None = None
    elapsed_s: float | None = None
    max_usd: float | None = None
    max_minutes: float | None = None
    name: str | None = None
    why_deadline: str | None = None
    left_s: float | None = None
    gpu: str | None = None

    @property
    def so_far(self) -> bool:
        return self.state != "ended"


def md(value: Any, limit: int = MAX_CELL_CHARS) -> str:
    """`value` as Markdown text that renders as itself: masked, one line, HTML's `<`, `>` and `&` as entities,
    the punctuation that could open code, emphasis, a link or a table cell escaped, cut."""
    text = "–" if value is None else mask(str(value))
    text = " ".join(text.split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _SPECIAL.sub(r"\\\1", text)


def code_span(value: Any, limit: int = MAX_CELL_CHARS) -> str:
    """`value` as a code span (a path, an id): masked, one line, cut, fenced by more backticks than it holds."""
    text = " ".join(mask(str(value)).split())
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _exit_name(code: Any) -> str:
    try:
        return ExitCode(int(code)).name
    except (TypeError, ValueError):
        return "unknown"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _table(headers: list[str], rows: list[list[str]], *, what: str) -> list[str]:
    """A GitHub-flavoured table of already escaped cells; past MAX_ROWS, a line says how many were left out."""
    if not rows:
        return []
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows[:MAX_ROWS]]
    if len(rows) > MAX_ROWS:
        lines.append(f"\n{len(rows) - MAX_ROWS} more {what} not shown: the evidence has them all.")
    return lines


def _share(part: float | None, whole: float | None) -> str:
    """` (12.5%)` of a cap (nothing Markdown reads in it); a share too small to print as such says so."""
    if part is None or not whole:
        return ""
    share = part / whole
    return " (under 0.1%)" if 0 <= share < 0.001 else f" ({share:.1%})"


def verdict_line(code: Any, message: Any) -> str:
    return f"**exit {md(code)} {_exit_name(code)}**: {md(message)}"  # the name: ExitCode's, no markup in it


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _overview(f: RunFacts | None, result: dict[str, Any], hold: Hold | None,
              estimated_usd: float | None = None) -> list[str]:
    """The run in a few lines: its id, the money against the cost cap, the time against the time cap, the GPUs,
    the offer, the absence verdict and the receipt; a kept host's hold: its state, its figures so far; a killed
    run's dollars: the ledger's estimate (`estimated_usd`) when its lines close the span, else not known."""
    r = f.result if f is not None else {}
    caps = _dict(r.get("caps")) or (_dict(f.quote.get("caps")) if f is not None else {})  # a killed run: its plan's
    accrued = _number(r.get("accrued_usd", result.get("accrued_usd")))
    estimated = accrued is None and hold is None and estimated_usd is not None
    if estimated:
        accrued = estimated_usd
    max_usd, max_min = _number(caps.get("max_usd")), _number(caps.get("max_minutes"))
    total_s = _number(_dict(r.get("timings")).get("total_s"))
    if hold is not None:
        accrued, total_s = hold.accrued_usd, hold.elapsed_s
        max_usd = hold.max_usd if hold.max_usd is not None else max_usd
        max_min = hold.max_minutes if hold.max_minutes is not None else max_min
    rows: list[tuple[str, str]] = [("run", code_span(r.get("run_id") or result.get("run_id")
                                                 or (f.dir.name if f is not None else "not known")))]
    if hold is not None:
        rows.append(("kept host", md(_hold_words(hold))))
    if r.get("sim"):
        rows.append(("API", "the simulator: no money moved"))
    cost = md(usd(accrued)) if accrued is not None else "not known"
    if max_usd is not None:
        cost += f" of the {md(usd(max_usd))} cap{_share(accrued, max_usd)}"
    if estimated:
        cost += (", estimated from the ledger (create to the last DELETE or proof of absence, at the highest price "
                 "recorded: as `vast-e2e costs` counts it; bytes moved not counted)")
    elif accrued is None and f is not None and "harness-result.json" in f.missing:
        cost += ("; killed before its record: its host bills until the follow-up reap or its dead-man switch "
                 "deletes it (the ledger then says how long)")
    worst = _number(r.get("worst_case_usd"))
    if worst is None and f is not None:  # a killed run: its plan's quote
        worst = _number(_dict(f.quote.get("quote")).get("worst_case_usd"))
    if worst is not None:
        cost += f"; worst case quoted before renting {md(usd(worst))}"
    if r.get("over_cap"):
        cost += f"; **over the cap**: {md(r.get('over_cap'))}"
    if hold is not None and hold.so_far and accrued is not None:
        cost += " so far"
    rows.append(("cost", cost))
    if total_s is not None or max_min is not None:
        took = f"{total_s:.1f} s" if total_s is not None else "not known"
        if max_min is not None:
            took += f" of the {max_min:g} min cap{_share(total_s, max_min * 60)}"
        if hold is not None and hold.so_far and total_s is not None:
            took += " so far"
        rows.append(("time", md(took)))
    rows.append(("GPUs that ran", md(_gpus(r, result, hold, f.offer if f is not None else {},
                                           f.receipts if f is not None else {}))))
    offer = f.offer if f is not None else {}
    if offer:
        dph = _number(offer.get("dph_at_disk_usd"))
        rows.append(("offer", md(f"{offer.get('id')}: {offer.get('num_gpus')}x {offer.get('gpu_name')}, "
                                 f"{usd(dph) + '/h' if dph is not None else 'price unknown'}, driver "
                                 f"{offer.get('driver_version')}, {offer.get('geolocation') or 'location unknown'}")))
    rows.append(("absence", _absence_words(_dict(r.get("absence")).get("verdict"), result, f is not None)))
    receipt = r.get("receipt")
    if isinstance(receipt, dict):
        rows.append(("receipt", md(_receipt_headline(receipt))))
    return [f"- **{name}**: {text}" for name, text in rows]


def _hold_words(hold: Hold) -> str:
    name = f"{hold.name}: " if hold.name else ""
    if hold.state == "ended":
        return "ended: its host deleted (the absence below); the figures are the whole hold's"
    if hold.state == "expired":
        return (f"{name}held past its {hold.why_deadline or ''} deadline: its dead-man switch deletes it, "
                "vast-e2e reap proves it gone")
    if not hold.record_found:
        return ("held when its last command ended; no hold record on this machine (another machine's, or it "
                "ended since): the figures are that command's")
    left = f", ends by its {hold.why_deadline} deadline in {hold.left_s:.0f} s" if hold.left_s is not None else ""
    return f"{name}{hold.state}{left} (vast-e2e down deletes it)"


def _gpus(r: dict[str, Any], result: dict[str, Any], hold: Hold | None = None,
          offer: dict[str, Any] | None = None, receipts: dict[str, dict[str, Any]] | None = None) -> str:
    gpus = r.get("host_gpus")
    if isinstance(gpus, dict) and isinstance(gpus.get("gpus"), list) and gpus["gpus"]:
        first = gpus["gpus"][0] if isinstance(gpus["gpus"][0], dict) else {}
        mib = _number(first.get("memory_mib"))
        text = (f"{len(gpus['gpus'])}x {first.get('name')}" + (f" ({mib / 1024:.1f} GiB)" if mib else "")
                + f", driver {first.get('driver_version')}" + (f", CUDA {gpus['cuda_version']}"
                                                               if gpus.get("cuda_version") else ""))
        return text + (" (simulated: from the offer)" if gpus.get("simulated") else "")
    receipt = _dict(r.get("receipt"))
    if hold is not None and receipt.get("gpu_name"):  # a kept host's later command: the `up`'s receipt says
        return f"{receipt.get('num_gpus')}x {receipt.get('gpu_name')} (the up's receipt)"
    if hold is not None and hold.gpu:
        return f"{hold.gpu} (the up's offer)"
    offer = offer or {}
    if hold is not None and offer.get("gpu_name"):
        return f"{offer.get('num_gpus')}x {offer.get('gpu_name')} (the up's offer)"
    said = [f"{_receipt_gpus(doc)} on instance {instance}" for instance, doc in (receipts or {}).items()]
    if said:  # a run killed before its record: each host's receipt, as the host measured it
        return "; ".join(said) + " (the hosts' receipts in receipts/)"
    return str(result.get("gpu") or "none ran")


def _receipt_gpus(doc: dict[str, Any]) -> str:
    gpus = [g for g in doc.get("gpus") or [] if isinstance(g, dict)]
    if not gpus:
        return "no GPU measured"
    first = gpus[0]
    gib = _number(first.get("memory_gib"))
    return (f"{len(gpus)}x {first.get('name')}" + (f" ({gib:.1f} GiB)" if gib else "")
            + (f", driver {doc['driver']}" if doc.get("driver") else "")
            + (f", CUDA {doc['cuda_runtime']}" if doc.get("cuda_runtime") else "")
            + (" (simulated)" if doc.get("torch") == "simulated" else ""))  # the simulator's host says so


def _absence_words(verdict: Any, result: dict[str, Any], have_dir: bool = True) -> str:
    if verdict == "held":
        return "held: not deleted yet (a kept host: `vast-e2e down` deletes it and proves it gone)"
    if verdict == "gone":
        return "**gone**: every instance deleted and proven absent"
    if verdict == "nothing-created":
        return "nothing was created"
    if verdict == "unproven":
        return "**NOT proven**: an instance may still bill; the reap below says what became of it"
    code = result.get("exit_code")
    if code in (ExitCode.BAD_INPUT, ExitCode.NO_OFFER):
        return "nothing rented"
    if not have_dir:
        return "not known (no evidence of this run was found); the reap below proves what is left"
    return "not known from this run's files (its record is missing); the reap below proves what is left"


def _receipt_headline(receipt: dict[str, Any]) -> str:
    verdict = receipt.get("verdict")
    checks = [c for c in receipt.get("checks") or [] if isinstance(c, dict)]
    if verdict == "failed":
        failed = [_check_line(c) for c in checks if c.get("verdict") == "fail"]
        return "FAILED: " + ("; ".join(failed[:3]) or str(receipt.get("reason") or ""))
    if verdict == "not_measured":
        return f"not measured: {receipt.get('reason') or ''}"
    if verdict == "off":
        return "off ([receipt] enabled = false)"
    gated = sum(1 for c in checks if c.get("action") == "gate" and c.get("verdict") == "pass")
    burn = _number(receipt.get("burn_tflops_total"))
    return f"passed: {gated} gated check(s) met" + (f", {burn:.1f} TFLOP/s sustained" if burn else "")


def _check_line(c: dict[str, Any]) -> str:
    who = f"GPU {c['gpu']} " if c.get("gpu") is not None else ""
    unit = str(c.get("unit") or "")
    measured = _number(c.get("measured"))
    expected = _number(c.get("expected"))
    shown = "not measured" if measured is None else f"{measured:.4g} {unit}".rstrip()
    bound = "" if expected is None else f", expected {'<=' if c.get('at_most') else '>='} {expected:.4g} {unit}".rstrip()
    return f"{who}{c.get('measure')} {shown}{bound}"


def _receipt_section(r: dict[str, Any]) -> list[str]:
    """The checks the receipt compared (gated or recorded, passed or failed) of the host that ran and of every host
    refused on its receipt; the figures only shown (nothing to compare with) are counted, the record has them."""
    ran = r.get("receipt")
    refused = [x for x in r.get("receipts_refused") or [] if isinstance(x, dict)]
    receipts = [x for x in [ran, *refused] if isinstance(x, dict)]
    if not receipts:
        return []
    lines = ["", "#### Receipt", ""]
    for rec in refused:
        lines.append(f"- instance {md(rec.get('instance_id'))} ({md(rec.get('gpu_name'))}) refused, deleted and "
                     f"proven gone: {md(_receipt_headline(rec))}")
    rows, shown = [], 0
    for rec in receipts:
        for c in rec.get("checks") or []:
            if not isinstance(c, dict):
                continue
            if c.get("verdict") not in ("pass", "fail"):
                shown += 1
                continue
            verdict = md(c.get("verdict")) if c.get("verdict") == "pass" else f"**{md(c.get('verdict'))}**"
            rows.append([md(rec.get("instance_id")), md(_check_line(c)), md(c.get("action")), verdict,
                         md(c.get("source"))])
    if refused:
        lines.append("")
    lines += _table(["instance", "check", "action", "verdict", "against"], rows, what="checks")
    if shown:
        lines += ["", f"{shown} more figure(s) recorded with nothing to compare them with: `harness-result.json` "
                      "has them."]
    return lines


def _steps_section(f: RunFacts) -> list[str]:
    rows = []
    for s in f.steps:
        note = step_note(s)
        seconds = _number(s.get("seconds"))
        rc = s.get("rc")
        ok = rc in (0, "0") and not note
        shown = "–" if s.get("cut_off") else md("NA" if rc is None else rc)  # no exit code: none is made up
        rows.append([md(s.get("name")), ("" if ok else "**") + shown + ("" if ok else "**"),
                     md(f"{seconds:.1f}" if seconds is not None else None), md(note or s.get("detail") or "")])
    if not rows:
        return ["", "#### Steps", "", "No step ran."]
    return ["", "#### Steps", "", *_table(["step", "rc", "seconds", "note"], rows, what="steps")]


def _absence_section(f: RunFacts) -> list[str]:
    rows = []
    for td in f.absence.get("instances") or []:
        if not isinstance(td, dict):
            continue
        deletes = [d for d in td.get("deletes") or [] if isinstance(d, dict)]
        proof = _dict(td.get("proof"))
        rounds = [rd for rd in proof.get("rounds") or [] if isinstance(rd, dict)]
        verdict = td.get("verdict") or proof.get("verdict")
        shown = md(verdict) if verdict == "gone" else f"**{md(verdict)}**"
        rows.append([md(td.get("instance_id")), md("; ".join(str(d.get("outcome")) for d in deletes) or "none sent"),
                     md(len(rounds)), md(" → ".join(str(rd.get("verdict")) for rd in rounds) or "–"), shown])
    if not rows:
        return []
    interval = _number(f.absence.get("interval_s"))
    said = f" (rounds {interval:g} s apart)" if interval is not None else ""
    return ["", "#### Absence proof", "", f"Each instance was deleted, then read until it was proven absent{said}:",
            "", *_table(["instance", "DELETE", "proof rounds", "round verdicts", "verdict"], rows, what="instances")]


def _not_ours_section(f: RunFacts) -> list[str]:
    found = f.not_ours()
    if not found:
        return []
    rows = [[md(i), md(why)] for i, why in found.items()]
    return ["", "#### Not the run's", "",
            "A create answer named these instances, but a read showed them as another's: the run neither deleted nor "
            "billed them, and its proof of absence does not cover them. Whose they are is for the account's owner "
            "to say:", "", *_table(["instance", "why"], rows, what="instances")]


def _artifacts_section(r: dict[str, Any]) -> list[str]:
    a = r.get("artifacts")
    if not isinstance(a, dict):
        return []
    files = [x for x in a.get("files") or [] if isinstance(x, str)]
    size = _number(a.get("bytes")) or 0
    lines = ["", "#### Artifacts", "", f"{len(files)} file(s), {size:,.0f} bytes, byte for byte in `artifacts/`."]
    for what, key in (("matched nothing", "unmatched"), ("skipped (over the budget)", "skipped"),
                      ("differ from the host's copy", "mismatched"), ("not verified by the host", "unverified")):
        named = [x for x in a.get(key) or [] if isinstance(x, str)]
        if named:
            lines.append(f"- **{what}**: {md(', '.join(named[:10]))}")
    secrets = a.get("secrets_found")
    if isinstance(secrets, dict):
        for name, which in list(secrets.items())[:10]:
            lines.append(f"- **warning**: {md(name)} holds {md(', '.join(map(str, which)))}: kept byte for byte; "
                         "do not share it as it is")
    return lines


def _notifications_section(notes: dict[str, Any] | None) -> list[str]:
    if not notes:
        return []
    deliveries = [d for d in notes.get("deliveries") or [] if isinstance(d, dict)]
    ok = sum(1 for d in deliveries if d.get("outcome") == "delivered")
    lines = ["", "#### Notifications", "",
             f"{md(notes.get('events'))} event(s) to {len(notes.get('targets') or [])} receiver(s): {ok} of "
             f"{len(deliveries)} deliveries answered 2xx."]
    for d in [d for d in deliveries if d.get("outcome") != "delivered"][:MAX_ROWS]:
        lines.append(f"- {md(d.get('event'))} to {md(d.get('target'))}: {md(d.get('outcome'))} "
                     f"({md(d.get('error') or d.get('status'))})")
    return lines


def _reap_section(reap: dict[str, Any] | None) -> list[str]:
    """The follow-up reap's `--json` object: what it deleted and proved, what it left alone, what it could not."""
    if reap is None:
        return []
    lines = ["", "#### Follow-up reap", ""]
    code = reap.get("exit_code")
    if "error" in reap:
        return [*lines, f"**exit {md(code)}**: {md(reap.get('error'))}"]
    reaped = reap.get("reaped") if isinstance(reap.get("reaped"), dict) else {}
    live = [li for li in reap.get("live") or [] if isinstance(li, dict)]
    if code == 0:
        lines.append("exit 0: " + ("every orphan deleted and proven absent." if reaped else
                                   "nothing was left to reap (no orphan in the ledgers or among the account's "
                                   "vh- instances)."))
    else:
        lines.append(f"**exit {md(code)}: NOT all proven absent.**")
    lines += [f"- {md(line)}" for line in (reap.get("not_proven") or [])[:MAX_ROWS] if isinstance(line, str)]
    if reaped:
        lines += ["", *_table(["instance", "verdict"], [[md(i), md(v)] for i, v in reaped.items()],
                              what="instances")]
    if live:
        lines += ["", f"Left alone, live (another run's, not this job's): "
                      f"{md(', '.join(str(li.get('instance_id')) for li in live[:20]))}."]
    return lines


def job_summary(f: RunFacts | None, *, result: dict[str, Any] | None = None, reap: dict[str, Any] | None = None,
                notifications: dict[str, Any] | None = None, artifact_name: str | None = None,
                no_verdict: str = "", hold: Hold | None = None, estimated_usd: float | None = None) -> str:
    """The page (the module's docstring). `f`: the run's evidence, None when it left none; `result`: its `--json`
    object (the verdict when the record is missing); `reap`: the follow-up reap's `--json` object; `no_verdict`:
    why the result says nothing (empty, unreadable), `hold`: a kept host's hold when `f` is one's;
    `estimated_usd`: the ledger's figure for a run no record or result gives one of (killed)."""
    result = result or {}
    r = f.result if f is not None else {}
    code = r.get("exit_code", result.get("exit_code"))
    message = r.get("message", result.get("message", result.get("error")))
    lines = ["### vast-harness", ""]
    if code is None:
        why = (md(no_verdict) if no_verdict else "the run was stopped before it could write one (killed, or its "
               "runner went away)")
        files = ("What its files say is below" if f is not None else
                 "No evidence of this run was found (none of an earlier run is shown in its place)")
        lines.append(f"**no verdict**: {why}. {files}; the follow-up reap deletes what it left, and the host's "
                     "dead-man switch deletes it at the cap if nothing else does.")
    else:
        lines.append(verdict_line(code, message))
    if f is None and code in (ExitCode.BAD_INPUT, ExitCode.NO_OFFER):
        lines += ["", "Nothing was rented: the run was refused before any create."]
    lines += ["", *_overview(f, result, hold, estimated_usd)]
    if f is not None:
        lines += _receipt_section(r)
        lines += _steps_section(f)
        lines += _absence_section(f)
        lines += _not_ours_section(f)
        lines += _artifacts_section(r)
    lines += _notifications_section(notifications)
    lines += _reap_section(reap)
    if f is not None:
        report = ("open `report.html` in it for the timeline and every file" if (f.dir / "report.html").is_file()
                  else "`vast-e2e report` builds its `report.html` from it")
        lines += ["", f"Evidence: {code_span(f.dir)}" + (f", uploaded as the artifact **{md(artifact_name)}**"
                                                   if artifact_name else "") + f" ({report})."]
    page = "\n".join(lines) + "\n"
    if len(page) > MAX_PAGE_CHARS:
        page = page[:MAX_PAGE_CHARS] + "\n\n(cut here: the evidence has the rest)\n"
    return page


def outputs(f: RunFacts | None, result: dict[str, Any] | None, *, hold: Hold | None = None,
            run_id: str | None = None, estimated_usd: float | None = None) -> dict[str, str]:
    """The figures a CI step hands on (GitHub's step outputs): each a single line. A value not known (an exit
    code, dollars, an absence, the run id and evidence dir of a run killed before renting) is `unknown`, never
    empty: GitHub's expressions read '' as 0 or false (`exit-code == 0` would hold, `accrued-usd < 1` too). A
    killed run's dollars: the ledger's estimate (`estimated_usd`) when there is one."""
    result = result or {}
    r = f.result if f is not None else {}
    code = r.get("exit_code", result.get("exit_code"))
    accrued = _number(r.get("accrued_usd", result.get("accrued_usd")))
    if hold is not None:
        accrued = hold.accrued_usd
    elif accrued is None:
        accrued = estimated_usd
    absence = _dict(r.get("absence")).get("verdict")
    values = {"exit-code": "unknown" if code is None else str(code),
              "accrued-usd": "unknown" if accrued is None else f"{accrued:.6f}",
              "run-id": str(r.get("run_id") or result.get("run_id") or (f.dir.name if f is not None else "")
                            or run_id or "unknown"),
              "evidence-dir": str(f.dir) if f is not None else "unknown",
              "absence": str(absence or ("nothing-created" if code in (ExitCode.BAD_INPUT, ExitCode.NO_OFFER)
                                         else "unknown"))}
    return {k: " ".join(mask(v).split()) or "unknown" for k, v in values.items()}  # a blank one is empty too
