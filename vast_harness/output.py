"""The one sink for what the CLI shows: rich tables for people, one JSON object for `--json`.

Human output goes to stdout; progress, warnings and errors to stderr, so `--json` stdout stays parseable.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from vast_harness.offers import Candidate, OfferChoice, Rejection
from vast_harness.plan import RunPlan


class Output:
    def __init__(self, *, json_mode: bool = False, quiet: bool = False) -> None:
        self.json_mode = json_mode
        self.out = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=160)
        self.err = Console(file=sys.stderr, highlight=False, soft_wrap=False, width=160)
        self.quiet = quiet
        self.emitted = False  # --json promises exactly one object on stdout
        self.rejected_rows: list[dict] = []  # with --json, rejections ride along in that one object

    # -- generic -------------------------------------------------------------------------------
    def info(self, message: str) -> None:
        if not self.quiet:
            self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {message}")

    def failure(self, message: str, exit_code: int) -> None:
        """An error that ends the command: one line on stderr, and with --json the one stdout object."""
        self.error(message)
        if self.json_mode and not self.emitted:
            self.emit_json({"error": message, "exit_code": exit_code})

    def error(self, message: str, hint: str | None = None) -> None:
        self.err.print(f"[bold red]error:[/] {message}", markup=True)
        if hint:
            self.err.print(f"[dim]{hint}[/]")

    def emit_json(self, payload: dict[str, Any]) -> None:
        if self.rejected_rows and "rejected" not in payload:
            payload = payload | {"rejected": self.rejected_rows}
        self.emitted = True
        sys.stdout.write(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
        sys.stdout.flush()

    # -- a run -----------------------------------------------------------------------------------
    def step_line(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, line: str) -> None:
        """One line of a step's output, live: the step, its elapsed time and the dollars accrued so far."""
        if self.quiet:
            return
        console = self.err if self.json_mode else self.out
        prefix = f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]"
        style = "red" if stream == "stderr" else "dim"
        console.print(f"[{style}]{escape(prefix)}[/] {escape(line)}")

    def result(self, run_id: str, code: int, message: str, evidence_dir, steps, teardowns, accrued_usd: float) -> None:
        if self.json_mode:
            self.emit_json({"run_id": run_id, "exit_code": code, "message": message,
                            "evidence_dir": str(evidence_dir), "accrued_usd": round(accrued_usd, 6),
                            "steps": [s.model_dump() for s in steps],
                            "absence": {t.instance_id: t.verdict for t in teardowns}})
            return
        t = Table(title=f"Run {run_id}", header_style="bold")
        for col in ("step", "rc", "seconds", "note"):
            t.add_column(col)
        for s in steps:
            note = "timed out" if s.timed_out else ("connection lost" if s.connection_lost else "")
            t.add_row(s.name, "NA" if s.rc is None else str(s.rc), f"{s.seconds:.1f}", note)
        self.out.print(t)
        for td in teardowns:
            color = "green" if td.verdict == "gone" else "bold red"
            self.out.print(f"instance {td.instance_id}: [{color}]{td.verdict}[/] "
                           f"({len(td.proof.rounds) if td.proof else 0} proof rounds)")
        color = "green" if code in (0, 4) else "red"
        self.out.print(f"[{color}]exit {code}[/]: {escape(message)}  accrued ${accrued_usd:.4f}  evidence {evidence_dir}")

    # -- plans and offers ----------------------------------------------------------------------
    def plan(self, plan: RunPlan) -> None:
        if self.json_mode:
            self.emit_json({"dry_run": True} | plan.summary())
            return
        o, q = plan.chosen.offer, plan.chosen.quote
        self.out.print(f"[bold]Dry run[/] — profile [cyan]{plan.profile}[/]")
        repo_tag, _, digest = plan.image.partition("@")  # repo:tag@sha256:... (config refuses any other form)
        self.out.print(f"[bold]image[/] {escape(repo_tag)}  [bold]digest[/] {escape(digest)}"
                       f"{'' if plan.image_digest_verified else ' (unverified)'}", soft_wrap=True)
        t = Table(title="Chosen offer", show_header=True, header_style="bold")
        for col in ("id", "GPU", "count", "driver", "qualified", "CUDA", "PCIe GB/s", "$/h", "reliability",
                    "location"):
            t.add_column(col)
        t.add_row(
            str(o.id), o.gpu_name, str(o.num_gpus), o.driver_version or "?",
            "yes" if plan.chosen.driver_qualified else "[yellow]no[/]", f"{o.cuda_max_good}",
            f"{o.pcie_bw_gbps}", f"{q.dph_at_disk_usd:.4f}", f"{o.reliability_score:.3f}", o.geolocation or "?",
        )
        self.out.print(t)
        steps = Table(title="Steps", show_header=True, header_style="bold")
        steps.add_column("#")
        steps.add_column("name")
        steps.add_column("timeout")
        steps.add_column("command", overflow="fold")
        for i, s in enumerate(plan.steps, 1):
            steps.add_row(str(i), s["name"], f"{s['timeout_s']:g} s", s["run"])
        self.out.print(steps)
        if plan.pytest_node_ids:
            self.out.print("[bold]pytest node ids[/] (a skip fails the run):")
            for node in plan.pytest_node_ids:
                self.out.print(f"  {node}")
        self.out.print(
            f"[bold]Caps[/]: ${plan.caps['max_usd']:.2f}, {plan.caps['max_minutes']:g} min   "
            f"[bold]Credit[/]: ${plan.credit_usd:.2f}"
        )
        self.out.print(f"[bold]Worst case[/]: {q.arithmetic}")
        env = " ".join(f"{k}={v}" for k, v in plan.remote_env_masked.items()) or "(none)"
        self.out.print(f"[bold]remote_env[/]: {env}")
        self.out.print(
            f"[dim]bundle sha256 {plan.bundle_sha256[:16]}… ({plan.bundle_bytes} bytes); {plan.offers_seen} "
            f"offers seen in {plan.pages} page(s); nothing was created.[/]"
        )
        for w in plan.warnings:
            self.warn(w)

    def offers(self, choice: OfferChoice, *, show_rejected: int = 20) -> None:
        if self.json_mode:
            self.emit_json(
                {
                    "ranked": [_candidate_row(c) for c in choice.ranked],
                    "rejected": [_rejection_row(r) for r in choice.closest_rejections(show_rejected)],
                    "offers_seen": choice.offers_seen,
                    "pages": choice.pages,
                }
            )
            return
        t = Table(title=f"Ranked offers ({len(choice.ranked)} of {choice.offers_seen} seen)", header_style="bold")
        for col in ("rank", "id", "GPU", "n", "driver", "qual", "CUDA", "PCIe", "$/h", "worst $", "rel", "location"):
            t.add_column(col)
        for i, c in enumerate(choice.ranked, 1):
            r = _candidate_row(c)
            t.add_row(str(i), *(str(r[k]) for k in ("id", "gpu", "n", "driver", "qualified", "cuda", "pcie_bw",
                                                   "dph", "worst_case_usd", "reliability", "location")))
        self.out.print(t)
        self.rejections(choice.closest_rejections(show_rejected), title="Closest rejected offers")

    def rejections(self, rejected: list[Rejection], *, title: str) -> None:
        if self.json_mode:
            self.rejected_rows = [_rejection_row(r) for r in rejected]
            return
        t = Table(title=title, header_style="bold")
        for col in ("id", "GPU", "n", "driver", "worst $", "why rejected"):
            t.add_column(col, overflow="fold")
        for r in rejected:
            row = _rejection_row(r)
            t.add_row(str(row["id"]), row["gpu"], str(row["n"]), str(row["driver"]), str(row["worst_case_usd"]),
                      "; ".join(row["reasons"]))
        (self.err if self.json_mode else self.out).print(t)


def _candidate_row(c: Candidate) -> dict:
    o = c.offer
    return {
        "id": o.id, "gpu": o.gpu_name, "n": o.num_gpus, "driver": o.driver_version, "qualified": c.driver_qualified,
        "cuda": o.cuda_max_good, "pcie_bw": o.pcie_bw_gbps, "dph": round(c.quote.dph_at_disk_usd, 4),
        "worst_case_usd": round(c.quote.worst_case_usd, 4), "reliability": round(o.reliability_score, 3),
        "location": o.geolocation,
    }


def _rejection_row(r: Rejection) -> dict:
    o = r.offer
    return {
        "id": o.id, "gpu": o.gpu_name, "n": o.num_gpus, "driver": o.driver_version,
        "worst_case_usd": round(r.worst_case_usd, 4) if r.worst_case_usd is not None else None,
        "reasons": r.reasons,
    }
