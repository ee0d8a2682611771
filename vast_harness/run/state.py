"""What one guarded run is made of: its stages in order and the state it learns as it goes (declared once, in
`RunState`). The stages are functions of (tools, state), in `run/rent.py` and `run/teardown.py`, the tools
built once in `run/tools.py`; `GuardedRun.execute` calls them in `Stage` order."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass, field

from vast_harness.caps.meter import teardown_budget_s
from vast_harness.errors import ExitCode, RunCancelled
from vast_harness.host.deadman import DeadmanStatus
from vast_harness.host.ssh import HostSession, RunKey
from vast_harness.market.offers import Candidate
from vast_harness.market.plan import RunPlan
from vast_harness.records import Attempt, HostGpus, Receipt, StepRecord, WorkdirRecord
from vast_harness.run.host_work import HostWork
from vast_harness.spec.resolve import RunSpec
from vast_harness.state.registry import HeldRegistration


class Stage(enum.Enum):
    """The run's stages, in the order `GuardedRun.execute` runs them. Whatever ends the work (an error, a cap,
    a signal), TEARDOWN and VERDICT run."""

    PREFLIGHT = "preflight"  # caps, evidence dir, registration, the plan and its quote, the run's key
    RENT = "rent"  # create -> boot -> SSH connect -> arrival; the next offer after a host that does not come up
    DEADMAN = "deadman"  # the dead-man switch proven able to act before any workload minute
    RECEIPT = "receipt"  # what the host delivers, measured and judged; the next offer after a host that fails
    UPLOAD = "upload"  # the bundle, unpacked on the host
    STEPS = "steps"  # the profile's steps, in order
    PULL = "pull"  # the host's evidence, back under the meter's deadline
    TEARDOWN = "teardown"  # last reads and pull, then DELETE + absence proof per instance, then the label sweep
    VERDICT = "verdict"  # the exit code, the record, the report


@dataclass
class RunState:
    """Everything the run learns as it goes: the stages write it, the verdict and the record read it."""

    run_id: str
    teardown_budget_s: float  # one instance's delete + absence proof before it is declared unproven (exit 3)
    read_lag_window_s: float  # reads may not see an instance this long after its create
    # The meter's t0 on the wall clock (set as the meter starts): where the time cap starts for a judge outside
    # the process (the chaos suite, tests). Recorded, never compared here: deadlines are on the monotonic clock.
    t0_unix: float = 0.0
    stage: Stage = Stage.PREFLIGHT
    timings: dict[str, float] = field(default_factory=dict)
    registration: HeldRegistration | None = None  # held (locked) from before the first create to the end
    plan: RunPlan | None = None
    candidate: Candidate | None = None  # the offer whose host came up
    key: RunKey | None = None
    session: HostSession | None = None
    work: HostWork | None = None  # the host's phases, once SSH is up
    deadman: DeadmanStatus | None = None  # the switch as the first SSH found it
    workdir: WorkdirRecord | None = None  # a `run`'s uploaded workdir (its sha256), from the bundle
    host_gpus: HostGpus | None = None  # the GPUs of the host that came up, read and matched after SSH
    gpu_refused: list[HostGpus] = field(default_factory=list)  # hosts deleted as not what was offered
    receipt: Receipt | None = None  # what the host the work runs on delivered, judged (run/receipt.py)
    receipts_refused: list[Receipt] = field(default_factory=list)  # hosts deleted on their receipt
    # Set by `cancel` from another thread; checked wherever the cap deadline is, and by a running step.
    cancelled: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""
    cancel_exit_code: ExitCode = ExitCode.CAP_REACHED
    # --interruptible (run/interrupt.py): an outbid stops the work like a cancel, but one the run recovers from
    outbid_reason: str | None = None
    attempts: list[Attempt] = field(default_factory=list)
    host_home: str | None = None  # the host's $HOME, where the checkpoint folder is copied from
    # A kept host's worst case: the whole hold's (the `up`'s quote), not the offer this command rented after an outbid
    hold_worst_case_usd: float | None = None
    steps_before: list[StepRecord] = field(default_factory=list)  # earlier hosts' steps
    _cancel_lock: threading.Lock = field(default_factory=threading.Lock)

    def cancel(self, reason: str, exit_code: ExitCode = ExitCode.CAP_REACHED) -> None:
        """Thread-safe: stop at the next stage boundary; the first reason stands, except over an outbid's (a cap
        or a signal then replaces it: the run does not recover from those)."""
        with self._cancel_lock:
            if not self.cancelled.is_set() or self.outbid_reason is not None:
                self.outbid_reason = None
                self.cancel_reason, self.cancel_exit_code = reason, exit_code
                self.cancelled.set()

    def outbid(self, reason: str) -> None:
        """Thread-safe: the host was outbid; the work stops at the next boundary (a running step at once)."""
        with self._cancel_lock:
            if not self.cancelled.is_set():
                self.outbid_reason = reason
                self.cancel_reason, self.cancel_exit_code = f"outbid: {reason}", ExitCode.FAILED
                self.cancelled.set()

    def recovered(self) -> None:
        """The outbid was handled (salvaged, deleted, replaced): the work may go on, unless a real cancel came."""
        with self._cancel_lock:
            if self.outbid_reason is not None:
                self.outbid_reason, self.cancel_reason = None, ""
                self.cancelled.clear()

    def check_cancelled(self, *_: object) -> None:
        if self.cancelled.is_set():
            raise RunCancelled(f"cancelled: {self.cancel_reason}", self.cancel_exit_code)


def new_state(spec: RunSpec, run_id: str) -> RunState:
    return RunState(run_id=run_id, teardown_budget_s=teardown_budget_s(spec.proof_interval_s),
                    read_lag_window_s=spec.timings.read_lag_window_s)
