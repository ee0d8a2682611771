"""The run's paired timings: one table for Vast, one for the embedded simulator.

Every duration (and the rate-limit pacing) that differs between a run against Vast and a `--sim` run is a field
of `Timings`, with both values and why each is what it is. `config.resolve` picks the table (`--sim` or not),
lays the user's flags over it (`--proof-interval`, `--poll-interval`, `--pacing-scale` win), and the resolved
`RunSpec` carries the result as `spec.timings`. No other module chooses between simulator and real timings.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Timings(BaseModel):
    """Seconds (and one scale) a run is paced and bounded by. Build with `real()` or `sim()`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    proof_interval_s: float = Field(ge=0, description=(
        "Seconds between the absence proof's two gone rounds (lifecycle.prove_absent), and the pace of the final "
        "label sweep. Vast: 10 s, the interval the reference's synthesis asks between the two rounds (vast-api.md "
        "section 13, item 8: 'both repeated once more after >= 10 s'); config.REAL_PROOF_INTERVAL_FLOOR_S keeps "
        "a real API at or above it. Simulator: 0.5 s, its reads answer at once. --proof-interval wins."))
    teardown_margin_s: float = Field(ge=0, description=(
        "Room kept before a cap for the DELETE and the absence proof: the meter's work deadline is the hard "
        "deadline less this (meter.py), and the teardown pull's grace is a share of it (hostwork.py). Vast: "
        "120 s, what it must cover there: a DELETE retried under the client's per-call bound (120 s, "
        "client.py max_retry_s) and two proof rounds 10 s apart. Simulator: 15 s, its calls answer in "
        "milliseconds."))
    poll_s: float = Field(gt=0, description=(
        "Seconds between instance reads while it boots and while the steps run (the price re-read), and the "
        "wait between label look-ups after an unknown create. Vast: 10 s, as its docs say ('Poll every 10 "
        "seconds', hello-world.mdx; vast-api.md section 6). Simulator: 0.25 s. --poll-interval wins."))
    deadman_grace_s: float = Field(ge=0, description=(
        "The host's dead-man switch deletes the instance this long after the time cap, counted on the host's "
        "clock (onstart.py): a grace for the harness's own teardown to finish first. Vast: 600 s. Simulator: "
        "30 s, scaled down with its other clocks."))
    read_lag_window_s: float = Field(ge=0, description=(
        "How long after a create reads may still not see the instance: a 'not found' or an absence proof "
        "inside this window counts for nothing (lifecycle.create, teardown_instance; the final sweep waits it "
        "out). Vast: 30 s, our bound: Vast documents no figure (its SDK and SkyPilot retry the read). "
        "Simulator: 1 s; a simulated lag longer than that is outside the model."))
    min_boot_s: float = Field(ge=0, description=(
        "The least a booted host needs before teardown could start: the time cap must cover it plus the "
        "teardown margin (meter.minimum_cap_s), or the run is refused with exit 2. Vast: 60 s (boot is "
        "'typically 1-5 minutes', vast-api.md section 6). Simulator: 1 s, the embedded simulator's boot "
        "time (cli.py starts it with this)."))
    pacing_scale: float = Field(ge=0, description=(
        "The client's rate-limit pacing as a multiple of Vast's documented per-endpoint intervals (pacing.py). "
        "Vast: 1.0, its limits cannot be scaled down (config.REAL_PACING_SCALE_FLOOR). Simulator: 0.1, the "
        "embedded simulator enforces Vast's limits at a tenth of the real intervals (cli.py starts it with "
        "this). --pacing-scale wins."))

    @classmethod
    def real(cls) -> Timings:
        """Against Vast (or any API that is not the embedded simulator)."""
        return cls(proof_interval_s=10.0, teardown_margin_s=120.0, poll_s=10.0, deadman_grace_s=600.0,
                   read_lag_window_s=30.0, min_boot_s=60.0, pacing_scale=1.0)

    @classmethod
    def sim(cls) -> Timings:
        """Against the embedded simulator (`--sim`)."""
        return cls(proof_interval_s=0.5, teardown_margin_s=15.0, poll_s=0.25, deadman_grace_s=30.0,
                   read_lag_window_s=1.0, min_boot_s=1.0, pacing_scale=0.1)


__all__ = ["Timings"]


# The longest run a user may ask for (--max-minutes): a week. A live-run label whose deadline lies further out
# than this is not one of ours (state/registry.py).
MAX_MINUTES_LIMIT = 7 * 24 * 60.0
