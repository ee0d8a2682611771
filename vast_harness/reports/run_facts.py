"""What one run's evidence says, read once: the facts the run report, its timeline and the fleet report draw.

A leaf below `reports/run.py` and `reports/timeline.py` (both read it; neither imports the other's types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vast_harness.evidence.host_data import WorkloadFigures, number


@dataclass
class Workload:
    """The headline workload figures of a run: the best-MFU measurement and the replay verdict."""

    mfu: float | None = None
    tokens_per_s: float | None = None
    tokens_per_s_per_gpu: float | None = None
    world_size: int | None = None
    replay_match: bool | None = None
    source: str = ""


@dataclass
class RunFacts:
    dir: Path
    result: dict[str, Any] = field(default_factory=dict)
    quote: dict[str, Any] = field(default_factory=dict)
    absence: dict[str, Any] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    workloads: list[WorkloadFigures] = field(default_factory=list)  # remote/*.json, every figure checked
    unreadable: list[str] = field(default_factory=list)  # remote/*.json that did not parse, and why
    # harness-result.json / absence-proof.json not there (a full disk at the end): nothing may be inferred
    # from their absence, least of all "nothing was rented"
    missing: list[str] = field(default_factory=list)
    # receipts/<instance>.json: each host's receipt as it answered, by instance id (a killed run's only word on
    # the GPUs it ran on)
    receipts: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def offer(self) -> dict[str, Any]:
        offer = self.result.get("offer") or self.quote.get("offer") or {}
        return offer if isinstance(offer, dict) else {}

    @property
    def dph_usd(self) -> float | None:
        for key in ("dph_at_disk_usd", "dph_total_usd"):
            n = number(self.offer.get(key), low=0.0, high=1e6)
            if n.value is not None:
                return n.value
        return None

    def not_ours(self) -> dict[str, str]:
        """Instances a create answer named that were not (proven) the run's, and why (absence-proof.json, else the
        record): never deleted, billed or proven as the run's, so whose they are is for the account's owner to
        say. Both pages show them (report.html, the job summary)."""
        found = _dict(self.absence.get("not_ours")) or _dict(_dict(self.result.get("absence")).get("not_ours"))
        return {str(i): str(why) for i, why in found.items()}

    def workload(self) -> Workload:
        best: Workload = Workload()
        replays = [w.replay_match for w in self.workloads if w.replay_match is not None]
        for w in self.workloads:
            if w.mfu is not None and (best.mfu is None or w.mfu > best.mfu):
                best = Workload(mfu=w.mfu, tokens_per_s=w.tokens_per_s, tokens_per_s_per_gpu=w.tokens_per_s_per_gpu,
                                world_size=w.world_size, source=w.name)
        best.replay_match = all(replays) if replays else None
        return best


def step_note(step: dict[str, Any]) -> str:
    """How a step ended when not by itself: both pages' note for it ('' for one that ended with its exit code)."""
    if step.get("cut_off"):
        return "cut off: it started (its log is in steps/), no outcome was recorded"
    return ("interrupted" if step.get("interrupted") else "timed out" if step.get("timed_out") else
            "connection lost" if step.get("connection_lost") else "")


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}
