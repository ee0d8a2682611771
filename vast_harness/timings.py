"""The run's paired timings: one table for Vast, one for the embedded simulator.

Every duration (and the rate-limit pacing) that differs between a run against Vast and a `--sim` run is a field
of `Timings`, with both values and why each is what it is. `spec.resolve` picks the table (`--sim` or not),
lays the user's flags over it (`--proof-interval`, `--poll-interval`, `--pacing-scale` win), and the resolved
`RunSpec` carries the result as `spec.timings`. No other module chooses between simulator and real timings.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field


class Timings(BaseModel):
    """Seconds (and one scale) a run is paced and bounded by. Build with `real()` or `sim()`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    proof_interval_s: float = Field(ge=0, description=(
        "Seconds between the absence proof's two gone rounds (instance/absence.prove_absent), and the pace of the final "
        "label sweep. Vast: 10 s, the interval the reference's synthesis asks between the two rounds (vast-api.md "
        "section 13, item 8: 'both repeated once more after >= 10 s'); config.REAL_PROOF_INTERVAL_FLOOR_S keeps "
        "a real API at or above it. Simulator: 0.5 s, its reads answer at once. --proof-interval wins."))
    teardown_margin_s: float = Field(ge=0, description=(
        "Room kept before a cap for the DELETE and the absence proof: the meter's work deadline is the hard "
        "deadline less this (meter.py), and its shares are `TeardownBudget`'s. Vast: "
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

    receipt_grace_s: float = Field(ge=0, description=(
        "Beyond its budget, how long the receipt's command may take on the host (host/receipt.py): unpacking its "
        "payload, the launcher's look for torch, the interpreter's exit, printing the record. The budget it is "
        "given is what the cap leaves less this. Vast: 20 s. Simulator: 2 s, its hosts answer the receipt from "
        "their offer at once."))
    receipt_min_s: float = Field(ge=0, description=(
        "The least budget a receipt is started with: less and the cap, not the host, would end it (exit 6, "
        "run/receipt.py). Vast: 30 s, what remote/receipt needs at its smallest (torch's import ~5 s, the short "
        "measures at a fifth of their length, its 8 s overhead and 6 s reserve, a 5 s burn). Simulator: 0.5 s."))

    @classmethod
    def real(cls) -> Timings:
        """Against Vast (or any API that is not the embedded simulator)."""
        return cls(proof_interval_s=10.0, teardown_margin_s=120.0, poll_s=10.0, deadman_grace_s=600.0,
                   read_lag_window_s=30.0, min_boot_s=60.0, pacing_scale=1.0, receipt_grace_s=20.0,
                   receipt_min_s=30.0)

    @classmethod
    def sim(cls) -> Timings:
        """Against the embedded simulator (`--sim`)."""
        return cls(proof_interval_s=0.5, teardown_margin_s=15.0, poll_s=0.25, deadman_grace_s=30.0,
                   read_lag_window_s=1.0, min_boot_s=1.0, pacing_scale=0.1, receipt_grace_s=2.0, receipt_min_s=0.5)

    @property
    def teardown_budget(self) -> TeardownBudget:
        """The shares of `teardown_margin_s`."""
        return TeardownBudget(margin_s=self.teardown_margin_s)


class TeardownBudget(BaseModel):
    """How the teardown margin is shared out: every share of it, computed here from `margin_s` and nowhere else.

    The margin is the room a run keeps before its cap for the DELETE and the absence proof (the meter's work
    deadline is the hard deadline less the margin). Counted back from the hard deadline, the shares nest:
    the prelude before the first DELETE ends `prelude_s` before it, the cap guard fires `guard_s` before it,
    and the teardown's evidence pull may run `pull_grace_s` past the work deadline. The minima at the end are
    fixed floors, not shares: they keep a bounded wait from shrinking to an attempt that can only time out.
    The module sits at the bottom layer so the client, the SSH session and the lifecycle can read it too.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    margin_s: float = Field(ge=0, description="Timings.teardown_margin_s: the room kept before the cap.")

    PRELUDE_SHARE: ClassVar[float] = 0.5
    GUARD_SHARE: ClassVar[float] = 0.25
    PULL_GRACE_SHARE: ClassVar[float] = 0.25
    SWITCH_SHARE: ClassVar[float] = 0.125
    PULL_GRACE_MAX_S: ClassVar[float] = 30.0
    SFTP_STALL_MIN_S: ClassVar[float] = 1.0
    SFTP_STALL_MAX_S: ClassVar[float] = 30.0
    SIGNAL_PULL_MAX_S: ClassVar[float] = 0.5
    """On a signal the evidence pull gets this long at most: the DELETE must leave within the first second (a
    CI cancel gives 7.5 s between SIGINT and SIGTERM, then 2.5 s to SIGKILL)."""
    SIGNAL_DELETE_WITHIN_S: ClassVar[float] = 1.0
    """After a signal the DELETE leaves within this long: the teardown's own, or else the cap guard's."""
    DELETE_ATTEMPT_MIN_S: ClassVar[float] = 0.25
    """The DELETE split: while two attempts fit before the cap, each gets half the time left, never less than
    this. Halving survives a stall or two; only the last half-second is split this fine, and an attempt cut
    there was still sent."""
    PROOF_READ_MIN_S: ClassVar[float] = 0.5
    """A proof read started at (or just before) the teardown's deadline still gets this long to answer: at most
    three of them (one round) overrun the deadline, by this each."""
    CONNECT_ATTEMPT_MIN_S: ClassVar[float] = 0.25
    """No SSH connect attempt starts with less than this left before its deadline: it could only time out, and
    its outcome would hide what the host said to the attempts before it. A retry wait ends this far from it."""

    @property
    def prelude_s(self) -> float:
        """What precedes the first DELETE (the last price read, the evidence pull, the switch's log) ends this
        long before the hard deadline: the first half of the margin may go to it, the DELETE and its retries
        keep the second half."""
        return self.PRELUDE_SHARE * self.margin_s

    @property
    def guard_s(self) -> float:
        """The cap guard fires when the hard deadline is this close: after the prelude's half (so a teardown on
        time never meets it) and early enough for a DELETE to land (sim 3.75 s, Vast 30 s)."""
        return self.GUARD_SHARE * self.margin_s

    @property
    def switch_s(self) -> float:
        """A kept host's dead-man switch deletes it this long before the hard deadline (the cap): after the cap
        guard's point, so a command's own teardown is never raced, and early enough for the switch's DELETE to
        land by the cap (sim 1.9 s, Vast 15 s; between commands nothing else acts at the cap)."""
        return self.SWITCH_SHARE * self.margin_s

    @property
    def pull_grace_s(self) -> float:
        """In teardown the evidence pull may run this long past the work deadline (never past the prelude): the
        rest of the margin belongs to DELETE and the absence proof, which a pull never delays."""
        return min(self.PULL_GRACE_MAX_S, self.PULL_GRACE_SHARE * self.margin_s)

    @property
    def sftp_stall_s(self) -> float:
        """An SFTP channel with no byte for this long (the pull's share of the margin, 1-30 s) is a stalled link:
        closed."""
        return min(self.SFTP_STALL_MAX_S, max(self.SFTP_STALL_MIN_S, self.PULL_GRACE_SHARE * self.margin_s))


__all__ = ["TeardownBudget", "Timings"]


# The longest run a user may ask for (--max-minutes): a week. A live-run label whose deadline lies further out
# than this is not one of ours (state/registry.py).
MAX_MINUTES_LIMIT = 7 * 24 * 60.0
