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


def show_dropped(out: Output, requires: dict[str, object], dropped: list[DroppedFamily]) -> None:
    """What the profile's [requires] asks and the GPU families it dropped, one line each with the reasons."""
    if not requires:
        return
    out.out.print(_line(("requires", "bold"), ": " + ", ".join(f"{k}={v}" for k, v in requires.items())),
                  soft_wrap=True)
    for family in dropped:
        out.out.print(_t(f"  dropped {family.line()}", "yellow"), soft_wrap=True)


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

def show_offers(out: Output, choice: OfferChoice, *, show_rejected: int = 20,
                requires: dict[str, object] | None = None) -> None:
    """`vast-e2e offers`: the ranked offers and the closest rejected ones, as tables or one JSON object."""
    if out.json_mode:
        out.emit_json(
            {
                "ranked": [c.row() for c in choice.ranked],
                "rejected": [r.row() for r in choice.closest_rejections(show_rejected)],
                "offers_seen": choice.offers_seen,
                "pages": choice.pages,
                "requires": requires or {},
                "dropped_by_requires": [f.model_dump() for f in choice.dropped],
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
    out.rejections([r.row() for r in choice.closest_rejections(show_rejected)], title="Closest rejected offers")
