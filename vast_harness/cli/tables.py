"""The offer and plan tables: what `vast-e2e offers` and `--dry-run` print, as rich tables or one JSON object.

They render the market's records (`OfferChoice`, `RunPlan`) through the console's sink; the console itself
knows nothing of offers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.table import Table

from vast_harness.console.money import usd
from vast_harness.console.output import Output
from vast_harness.console.terminal import line as _line
from vast_harness.console.terminal import safe_text as _t
from vast_harness.spec.workdir import left_out_lines

if TYPE_CHECKING:  # annotations only: `vast-e2e --version` and `-h` start without the API client (httpx)
    from vast_harness.market.offers import OfferChoice
    from vast_harness.market.plan import RunPlan
    from vast_harness.market.requires import DroppedFamily
    from vast_harness.spec.fit import GpuFit, Option, WorkloadFit

OPTION_SHORT = {"none": "as asked", "ckpt": "act-ckpt", "compile+ckpt": "compile+act-ckpt"}


def show_dropped(out: Output, requires: dict[str, object], dropped: list[DroppedFamily]) -> None:
    """What the profile's [requires] asks and the GPU families it dropped, one line each with the reasons."""
    if not requires:
        return
    out.out.print(_line(("requires", "bold"), ": " + ", ".join(f"{k}={v}" for k, v in requires.items())),
                  soft_wrap=True)
    for family in dropped:
        out.out.print(_t(f"  dropped {family.line()}", "yellow"), soft_wrap=True)


def show_fit(out: Output, fit: GpuFit, gpu: str) -> None:
    """The dry run's memory fit: each 1B run on the chosen GPU, how it runs and what it needs (docs/profiles.md)."""
    t = Table(title=_t(f"Memory fit on {gpu} ({fit.gpu_gib:.1f} GiB per GPU)"), header_style="bold")
    for col in ("run", "step", "world", "micro-batch", "runs as", "needs GiB", "each option needs"):
        t.add_column(col)
    for p in fit.placements:
        options = ", ".join(f"{OPTION_SHORT[o]} {g:.1f}" for o, g in p.run.needs().items())
        runs_as = _t(p.runs_as()) if p.option is not None else _t("dropped: does not fit", "yellow")
        t.add_row(_t(p.run.tag), _t(p.run.step), _t(p.run.world), _t(p.run.micro_batch), runs_as,
                  _t(f"{p.need_gib:.1f}"), _t(options))
    out.out.print(t)


def show_fit_by_gpu(out: Output, fit: WorkloadFit, gpus: dict[str, float]) -> None:
    """`offers`: which GPU families hold which of the profile's runs, and the largest micro-batch each holds."""
    t = Table(title="Memory fit per GPU (the profile's runs from their settings; docs/profiles.md#the-memory-fit)",
              header_style="bold")
    t.add_column("GPU")
    t.add_column("GiB")
    for run in fit.runs:
        t.add_column(run.tag)
    t.add_column("largest micro-batch")
    for name, mib in sorted(gpus.items(), key=lambda kv: (kv[1], kv[0])):
        on = fit.on(mib)
        cells = [_t(f"{OPTION_SHORT[p.option]} {p.need_gib:.1f}") if p.option is not None
                 else _t(f"no ({p.need_gib:.1f})", "yellow") for p in on.placements]
        largest = "; ".join(f"{group}: " + ", ".join(f"{OPTION_SHORT[o]} {mb if mb else '-'}" for o, mb in sizes.items())
                            for group, sizes in fit.largest(mib).items())
        t.add_row(_t(name), _t(f"{on.gpu_gib:.1f}"), *cells, _t(largest or "-"))
    out.out.print(t)


def fit_by_gpu_rows(fit: WorkloadFit, gpus: dict[str, float]) -> list[dict[str, object]]:
    """`offers --json`: the same as `show_fit_by_gpu`."""
    rows: list[dict[str, object]] = []
    for name, mib in sorted(gpus.items(), key=lambda kv: (kv[1], kv[0])):
        on = fit.on(mib)
        largest: dict[str, dict[Option, int | None]] = fit.largest(mib)
        rows.append({"gpu": name, "gpu_gib": round(on.gpu_gib, 2), "runs": [p.row() for p in on.placements],
                     "fits": not on.reasons(), "largest_micro_batch": largest})
    return rows


def show_plan(out: Output, plan: RunPlan) -> None:
    """The dry run: the chosen offer, the steps, the caps and the worst case (or its JSON with --json)."""
    if out.json_mode:
        out.emit_json({"dry_run": True} | plan.summary())
        return
    o, q = plan.chosen.offer, plan.chosen.quote
    out.out.print(_line(("Dry run", "bold"), " — profile ", (str(plan.profile), "cyan")))
    repo_tag, _, digest = plan.image.partition("@")  # repo:tag@sha256:... (config refuses any other form)
    out.out.print(_line(("image", "bold"), f" {repo_tag}  ", ("digest", "bold"),
                         f" {digest}{'' if plan.image_digest_verified else ' (unverified)'}"), soft_wrap=True)
    out.out.print(_line(("create sends", "bold"), f" {repo_tag.rsplit(':', 1)[0]}@{digest}"), soft_wrap=True)
    t = Table(title="Chosen offer", show_header=True, header_style="bold")
    for col in ("id", "GPU", "count", "driver", "qualified", "CUDA", "PCIe GB/s", "$/h", "reliability",
                "location"):
        t.add_column(col)
    t.add_row(
        _t(o.id), _t(o.gpu_name), _t(o.num_gpus), _t(o.driver_version or "?"),
        _t("yes") if plan.chosen.driver_qualified else _t("no", "yellow"), _t(o.cuda_max_good),
        _t(o.pcie_bw_gbps), _t(f"{q.dph_at_disk_usd:.4f}"), _t(f"{o.reliability_score:.3f}"),
        _t(o.geolocation or "?"),
    )
    out.out.print(t)
    steps = Table(title="Steps", show_header=True, header_style="bold")
    steps.add_column("#")
    steps.add_column("name")
    steps.add_column("timeout")
    steps.add_column("command", overflow="fold")
    for i, s in enumerate(plan.steps, 1):
        steps.add_row(_t(i), _t(s.name), _t(f"{s.timeout_s:g} s"), _t(s.run))
    out.out.print(steps)
    if plan.pytest_node_ids:
        out.out.print(_line(("pytest node ids", "bold"), " (a skip fails the run):"))
        for node in plan.pytest_node_ids:
            out.out.print(_t(f"  {node}"))
    out.out.print(_line(("Caps", "bold"), f": {usd(plan.caps.max_usd)}, {plan.caps.max_minutes:g} min   ",
                         ("Credit", "bold"), f": {usd(plan.credit_usd)}"))
    out.out.print(_line(("Worst case", "bold"), f": {q.arithmetic}"))
    if plan.fit is not None:
        show_fit(out, plan.fit, f"{o.num_gpus}x {o.gpu_name}")
    if plan.receipt is not None:  # within the worst case: the time cap covers every host's boot and receipt
        out.out.print(_line(("Receipt", "bold"), f": {plan.receipt.line()}"), soft_wrap=True)
    if plan.skipped_machines:
        out.out.print(_t(f"{plan.skipped_machines} machine(s) skipped: they failed a receipt before "
                         "(`vast-e2e machines`)", "yellow"), soft_wrap=True)
    show_dropped(out, plan.requires, plan.dropped)
    env = " ".join(f"{k}={v}" for k, v in plan.remote_env_shown.items()) or "(none)"
    out.out.print(_line(("remote_env", "bold"), f": {env}"))
    if plan.workdir is not None:  # `vast-e2e run`: what is uploaded and what comes back
        wd = plan.workdir
        skipped = f", {len(wd.symlinks_skipped)} symlink(s) skipped" if wd.symlinks_skipped else ""
        out.out.print(_line(("workdir", "bold"), f": {wd.path} ({wd.files} files, {wd.bytes} bytes; "
                             f"{wd.excluded} left out by .gitignore and --exclude{skipped})"))
        for shown in left_out_lines(wd.left_out):  # by name: keys, credentials, the harness's own
            out.out.print(_t(f"  left out: {shown}", "yellow"), soft_wrap=True)
        for rel in wd.included:
            out.out.print(_t(f"  included (--include): {rel}", "yellow"), soft_wrap=True)
        out.out.print(_line(("artifacts", "bold"), f": {', '.join(plan.artifacts) or '(none)'}"))
    out.out.print(_t(f"bundle sha256 {plan.bundle_sha256[:16]}… ({plan.bundle_bytes} bytes); {plan.offers_seen} "
                      f"offers seen in {plan.pages} page(s); nothing was created.", "dim"))
    for w in plan.warnings:
        out.warn(w)

def gpu_memories(choice: OfferChoice) -> dict[str, float]:
    """Each GPU name seen (ranked, rejected or dropped) and the largest memory its offers state, in MiB."""
    seen: dict[str, float] = {}
    offers = [c.offer for c in choice.ranked] + [r.offer for r in choice.rejected]
    pairs = [(o.gpu_name, o.gpu_ram_mb) for o in offers] + [(f.gpu, f.gpu_ram_mib) for f in choice.dropped]
    for name, mib in pairs:
        if name and mib is not None and mib == mib and mib > seen.get(name, 0.0):  # `mib == mib`: not NaN
            seen[name] = mib
    return seen


def show_offers(out: Output, choice: OfferChoice, *, show_rejected: int = 20,
                requires: dict[str, object] | None = None, fit: WorkloadFit | None = None) -> None:
    """`vast-e2e offers`: the ranked offers and the closest rejected ones, as tables or one JSON object; with a
    memory fit, which GPU families hold which runs."""
    if out.json_mode:
        out.emit_json(
            {
                "ranked": [c.row() for c in choice.ranked],
                "rejected": [r.row() for r in choice.closest_rejections(show_rejected)],
                "offers_seen": choice.offers_seen,
                "pages": choice.pages,
                "requires": requires or {},
                "dropped_by_requires": [f.model_dump() for f in choice.dropped],
                "fit_by_gpu": fit_by_gpu_rows(fit, gpu_memories(choice)) if fit is not None else None,
            }
        )
        return
    t = Table(title=_t(f"Ranked offers ({len(choice.ranked)} of {choice.offers_seen} seen)"), header_style="bold")
    for col in ("rank", "id", "GPU", "n", "driver", "qual", "CUDA", "PCIe", "$/h", "worst $", "rel", "location"):
        t.add_column(col)
    for i, c in enumerate(choice.ranked, 1):
        r = c.row()
        t.add_row(_t(i), *(_t(r[k]) for k in ("id", "gpu", "n", "driver", "qualified", "cuda", "pcie_bw",
                                              "dph", "worst_case_usd", "reliability", "location")))
    out.out.print(t)
    show_dropped(out, requires or {}, choice.dropped)
    if fit is not None:
        show_fit_by_gpu(out, fit, gpu_memories(choice))
    out.rejections([r.row() for r in choice.closest_rejections(show_rejected)], title="Closest rejected offers")
