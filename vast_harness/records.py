"""The typed records the layers hand upward: what happened, as data, with no behaviour that bills.

Each record is made by the layer that observes it and read by the layers above: the SSH layer makes
`SshEndpoint` and `ConnectAttempt`; the instance verbs make `CreateOutcome`, `DeleteAck`, `ProofRound`,
`AbsenceProof` and `InstanceTeardown`; the meter makes `PriceChange`; the live view's phase log makes
`PhaseRecord`; a remote command ends in a `StepOutcome`; and the run assembles them into its `RunRecord`
(harness-result.json, versioned by `RESULT_SCHEMA_VERSION`). Living here, below every behaviour module, lets
the evidence writer, the reports and the errors read them without importing the code that makes them.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class SshEndpoint(BaseModel):
    """Where an instance's sshd may be reached (ssh.endpoints_for reads it from the instance)."""

    host: str
    port: int
    kind: Literal["direct", "proxy"]

    def __str__(self) -> str:
        return f"{self.kind} {self.host}:{self.port}"


class ConnectAttempt(BaseModel):
    """One try at one endpoint: what happened and how long it took (ssh makes them, errors reports them)."""

    number: int
    endpoint: SshEndpoint
    ok: bool
    outcome: str
    seconds: float


class CreateOutcome(BaseModel):
    status: Literal["created", "created_with_error", "unavailable", "found_after_unknown", "not_created",
                    "unresolved"]
    instance_id: int | None = None
    detail: str = ""
    t_unix: float = Field(default_factory=time.time)


class DeleteAck(BaseModel):
    instance_id: int
    acknowledged: bool
    outcome: str  # deleted | already_gone | already_gone_after_unanswered (ours may have deleted it) | error text
    t_request_unix: float
    t_ack_unix: float | None = None
    t_ack_mono: float | None = None  # the same moment on the run's monotonic clock (for the meter)


# gone: parsed absence everywhere; going: only lingering destroyed rows; present: a live row; unknown: no answer
Verdict = Literal["gone", "going", "present", "unknown"]


class ProofRound(BaseModel):
    t_unix: float  # recorded for the reader
    t_mono: float = 0.0  # what the proof compares (this process's monotonic clock)
    per_id: dict[str, Any]
    list_by_id: dict[str, Any]
    list_by_label: dict[str, Any]
    verdict: Verdict
    in_lag_window: bool = False  # taken before the read-lag window closed: a "gone" here counts for nothing


class AbsenceProof(BaseModel):
    instance_id: int
    label: str
    interval_s: float
    not_before_unix: float = 0.0  # absence observed before this (create + read-lag window) proves nothing
    not_before_mono: float = 0.0  # the same instant on the monotonic clock: what the rounds are judged by
    seen_by_reads: bool = False  # a round showed the instance (live or lingering)
    rounds: list[ProofRound] = Field(default_factory=list)
    verdict: Verdict = "unknown"


class InstanceTeardown(BaseModel):
    instance_id: int
    seen: bool = True  # a read showed it or a DELETE deleted it (else its null reads proved nothing)
    deletes: list[DeleteAck] = Field(default_factory=list)
    proof: AbsenceProof | None = None

    @property
    def verdict(self) -> Verdict:
        return self.proof.verdict if self.proof else "unknown"


class PriceChange(BaseModel):
    instance_key: int
    searched_dph_usd: float
    billed_dph_usd: float | None
    t_unix: float = Field(default_factory=time.time)
    outcome: str  # tightened | unchanged | refused | late (learnt with no time left: the cap may be passed) | ignored
    source: str = "per-id read"  # which read showed it: a per-id read, a list by id, an absence-proof round's read
    reason: str | None = None  # why an `ignored` price was not a figure (the last good price kept)


class PhaseRecord(BaseModel):
    name: str
    t_start_unix: float
    t_end_unix: float | None = None
    usd_start: float = 0.0
    usd_end: float | None = None


class StepOutcome(BaseModel):
    """How a remote command ended. `rc` is None when it did not end by itself (timeout, lost link)."""

    rc: int | None
    seconds: float
    timed_out: bool = False
    connection_lost: bool = False
    detail: str = ""
    output_left_open: bool = False  # it exited, but a background process it started still held its output

    @property
    def ok(self) -> bool:
        return self.rc == 0


RESULT_SCHEMA_VERSION = 2


class StepRecord(BaseModel):
    name: str
    rc: int | None
    seconds: float
    timed_out: bool = False
    connection_lost: bool = False
    interrupted: bool = False  # a signal (Ctrl-C, SIGTERM, SIGHUP) ended it
    reconnect_ok: bool | None = None
    workload: bool = True
    detail: str = ""
    log_bytes: int = 0  # what the step printed (stdout + stderr)
    log_dropped_bytes: int = 0  # cut from the middle of its log by the size cap
    output_left_open: bool = False  # ended on its exit status while a background process held its output open


class RecordedInstance(BaseModel):
    """An instance as the record keeps it (harness-result.json `instances`)."""

    instance_id: int
    label: str
    offer_id: int
    machine_id: int | None
    dph_usd: float
    t_created_unix: float = Field(default_factory=time.time)
    status: str = "created"  # the create outcome (created, created_with_error, found_after_unknown, ...)
    detail: str = ""
    absence: str | None = None  # the teardown's verdict: gone, present or unknown
    seen: bool = False  # a read has shown it (or listed it): only then do null reads soon mean gone
    # The run key registered through POST /api/v0/instances/{id}/ssh/ (issue 33): True/False, None = not tried.
    key_attached: bool | None = None
    key_attach_detail: str = ""


class CreatedInstance(RecordedInstance):
    """An instance while the run owns it: plus the monotonic times the meter bills by (never recorded)."""

    t_created_mono: float
    t_deleted_mono: float | None = None
    # A row of it carrying the run's label was read (a per-id read, the list by id, the ownership read): it is
    # the run's, and no ownership read need come before its DELETE. Unlike `seen`, a list row sets it too.
    label_seen: bool = False

    def recorded(self) -> RecordedInstance:
        return RecordedInstance.model_validate(self.model_dump(exclude={"t_created_mono", "t_deleted_mono",
                                                                        "label_seen"}))


class OfferSummary(BaseModel):
    """The chosen offer as the plan, the quote file and the record show it."""

    id: int
    machine_id: int | None
    gpu_name: str
    num_gpus: int
    driver_version: str | None
    driver_qualified: bool
    cuda_max_good: float | None
    pcie_bw_gbps: float | None
    dph_total_usd: float | None
    dph_at_disk_usd: float
    reliability: float
    geolocation: str | None


class HostGpu(BaseModel):
    """One GPU as the host's nvidia-smi reported it after SSH (host/gpu_probe.py): text from a host we do not
    control, bounded and checked for shape before it gets here."""

    name: str
    memory_mib: int
    driver_version: str
    compute_cap: str | None = None


class HostGpus(BaseModel):
    """What the host that arrived has, and how it compares with its offer (host/gpu_match.py)."""

    instance_id: int
    offer_id: int
    gpus: list[HostGpu] = Field(default_factory=list)
    cuda_version: str | None = None  # the driver's CUDA, from nvidia-smi's header
    mismatches: list[str] = Field(default_factory=list)  # empty: the host is what the offer said
    simulated: bool = False  # answered by the simulator from its offer, not by a GPU

    def describe(self) -> str:
        """`2x NVIDIA H100 80GB HBM3 (79.6 GiB), driver 570.86.15, CUDA 12.8`, or what could not be read."""
        if not self.gpus:
            return "no GPU read"
        names = sorted({g.name for g in self.gpus})
        ram = ", ".join(sorted({f"{g.memory_mib / 1024:.1f} GiB" for g in self.gpus}))
        drivers = ", ".join(sorted({g.driver_version for g in self.gpus}))
        return (f"{len(self.gpus)}x {' + '.join(names)} ({ram}), driver {drivers}, "
                f"CUDA {self.cuda_version or 'unknown'}")

    def shown(self) -> str:
        """`describe()`, saying when the simulator, not a GPU, answered."""
        return self.describe() + (" (simulated: from the offer)" if self.simulated else "")


RECEIPT_SCHEMA_VERSION = 1
ReceiptVerdict = Literal["passed", "failed", "not_measured", "off"]
CheckVerdict = Literal["pass", "fail", "shown", "not_measured"]


class ReceiptCheck(BaseModel):
    """One comparison the receipt made (run/receipt.py): one measure of one GPU (or of the host) against a
    reference, the offer, the host's best GPU, or a rule. `expected` is the bound it had to meet (`fraction` of
    `basis`); a check with nothing to compare with is `shown` (its figure recorded beside whatever is known)."""

    measure: str
    gpu: int | None = None  # torch's index of the GPU; None: the host as a whole
    against: Literal["reference", "offer", "best_gpu", "rule"]
    measured: float | None = None
    expected: float | None = None
    basis: float | None = None
    fraction: float | None = None
    unit: str = ""
    source: str = ""  # where `basis` comes from: the reference's source, the offer's field, the rule
    action: Literal["gate", "record"] = "gate"
    verdict: CheckVerdict = "shown"
    at_most: bool = False  # `expected` is a ceiling (errors, a share of throttled samples), not a floor
    detail: str = ""

    def line(self) -> str:
        """`GPU 0 matmul 450.1 TFLOP/s, expected >= 620.5 TFLOP/s (90% of the reference 689.4)`: the measure, the
        measured and the expected value (the record's `source` says where the reference comes from)."""
        who = f"GPU {self.gpu} " if self.gpu is not None else ""
        measured = "not measured" if self.measured is None else f"{self.measured:.4g} {self.unit}".rstrip()
        whose = {"reference": "the reference", "best_gpu": "the best GPU's burn"}.get(self.against, self.source)
        if self.expected is None:
            said = f"{whose} {self.basis:.4g}: shown, not compared" if self.basis is not None else self.source
            return f"{who}{self.measure} {measured} ({self.detail or said})"
        why = (f"{self.fraction:.0%} of {whose} {self.basis:.4g}" if self.against != "rule" and self.basis is not None
               and self.fraction is not None else self.source)
        return (f"{who}{self.measure} {measured}, expected {'<=' if self.at_most else '>='} {self.expected:.4g} "
                f"{self.unit} ({why})" + (f"; {self.detail}" if self.detail else ""))


class Receipt(BaseModel):
    """What one host delivered before any work, judged (run/receipt.py): in the run's record (the host that ran,
    and each host refused on it), the console, report.html, the fleet report and the machines' history."""

    schema_version: int = RECEIPT_SCHEMA_VERSION
    instance_id: int
    offer_id: int
    machine_id: int | None = None
    gpu_name: str = ""
    num_gpus: int = 0
    verdict: ReceiptVerdict
    reason: str = ""  # not measured: why; failed: the failed checks, as lines
    checks: list[ReceiptCheck] = Field(default_factory=list)
    budget_s: float = 0.0  # the budget the host was given
    host_wall_s: float | None = None  # the receipt's own wall time on the host (its record's wall_s)
    wall_s: float = 0.0  # the whole phase here: the payload's upload, the run, the read back
    dph_usd: float = 0.0  # the host's price while it ran: every second of it is billed
    billed_usd: float = 0.0  # wall_s at dph_usd
    simulated: bool = False  # answered by the simulator from its offer and its faults, not by a GPU
    file: str | None = None  # the host's receipt as it answered, relative to the run's evidence directory
    notes: list[str] = Field(default_factory=list)
    # The sustained burn summed over the GPUs (TFLOP/s): what a fleet ranks by, per dollar
    burn_tflops_total: float | None = None

    @property
    def failed(self) -> list[ReceiptCheck]:
        return [c for c in self.checks if c.verdict == "fail"]

    def headline(self) -> str:
        """One line: the verdict and what decided it."""
        if self.verdict == "failed":
            return f"receipt FAILED: {'; '.join(c.line() for c in self.failed[:4]) or self.reason}"
        if self.verdict == "not_measured":
            return f"receipt not measured: {self.reason}"
        if self.verdict == "off":
            return "receipt off ([receipt] enabled = false)"
        gated = sum(c.action == "gate" and c.verdict == "pass" for c in self.checks)
        return f"receipt passed: {gated} gated check(s) met" + (
            f", {self.burn_tflops_total:.1f} TFLOP/s sustained" if self.burn_tflops_total else "")


class RecordCaps(BaseModel):
    max_usd: float
    max_minutes: float
    teardown_margin_s: float
    minimum_cap_s: float


class ByteCounts(BaseModel):
    uploaded: int
    downloaded: int


class HostKeyRecord(BaseModel):
    fingerprint: str
    type: str
    endpoint: str


class AbsenceSummary(BaseModel):
    verdict: str  # gone | unproven | nothing-created
    per_instance: dict[int, str]
    # creates whose outcome no read settled: an instance may exist that no teardown knows of (never "nothing")
    unresolved_labels: list[str] = Field(default_factory=list)
    # instances a create answer named that are not (proven) the run's, and why: never deleted, billed or listed
    # as the run's (`instances` holds none of them)
    not_ours: dict[int, str] = Field(default_factory=dict)


class PullRecord(BaseModel):
    """The host's evidence pull: what came back, what was left (budget, deadline), and why."""

    files: int = 0
    bytes: int = 0
    skipped: list[str] = Field(default_factory=list)  # over the size budget
    left: list[str] = Field(default_factory=list)  # a cut pull: the file being copied, then those not reached
    redacted: list[str] = Field(default_factory=list)  # files in which a secret's value was masked
    renamed: dict[str, str] = Field(default_factory=dict)  # host name with control characters -> local name
    symlink: str = ""  # the host's evidence folder (or one on the way) was a symlink: not followed, nothing pulled
    complete: bool = False
    detail: str = ""
    deadline_s: float | None = None
    max_bytes: float | None = None


class WorkdirLeftOut(BaseModel):
    """A workdir file or folder (`path` ends with `/`) left out of the upload by name: the API key file, the
    harness's own directories (never uploaded), or a well-known credential file (`includable`: `--include`)."""

    model_config = ConfigDict(frozen=True)

    path: str  # relative to the workdir
    why: str
    includable: bool


class WorkdirRecord(BaseModel):
    """`vast-e2e run`: the workdir as uploaded. `sha256` is the reproducible bundle of exactly these files."""

    path: str
    sha256: str
    files: int
    bytes: int  # the files' total, before compression
    excluded: int = 0  # files and folders left out by .gitignore, --exclude and .git/
    symlinks_skipped: list[str] = Field(default_factory=list)  # never followed, never uploaded
    left_out: list[WorkdirLeftOut] = Field(default_factory=list)  # keys, credentials, the harness's own: named
    included: list[str] = Field(default_factory=list)  # credential files --include took in


class ArtifactPull(BaseModel):
    """`--artifact` globs pulled from the host's workdir into <run>/artifacts/, smallest first, byte for byte:
    the user's own files, never masked, each witnessed by the sha256 the host computed."""

    globs: list[str]
    files: list[str] = Field(default_factory=list)
    bytes: int = 0
    unmatched: list[str] = Field(default_factory=list)  # globs that selected no file on the host
    skipped: list[str] = Field(default_factory=list)  # over the size budget
    left: list[str] = Field(default_factory=list)  # a cut pull: the file being copied, then those not reached
    sha256: dict[str, str] = Field(default_factory=dict)  # file -> sha256 of the file as kept here
    host_sha256: dict[str, str] = Field(default_factory=dict)  # file -> sha256 the host computed of its own
    mismatched: list[str] = Field(default_factory=list)  # kept bytes that are not the host's: not a pass
    unverified: list[str] = Field(default_factory=list)  # the host could not hash it (no sha256sum, gone)
    secrets_found: dict[str, list[str]] = Field(default_factory=dict)  # file -> names of the secrets it holds
    redacted: list[str] = Field(default_factory=list)  # files whose name held a secret (the name masked)
    renamed: dict[str, str] = Field(default_factory=dict)
    symlink: str = ""  # the host's workdir (or a folder on the way) was a symlink: not followed, nothing pulled
    complete: bool = False
    detail: str = ""


class Attempt(BaseModel):
    """One host of an interruptible run (docs/interruptible.md): where it ran, for how long, what it billed by the
    meter, and why it ended (`outbid during boot`, `outbid during step run`, `finished`, ...)."""

    instance_id: int
    machine_id: int | None = None
    dph_usd: float
    started_unix: float
    ended_unix: float | None = None
    accrued_usd: float = 0.0
    ended: str = ""
    salvaged_bytes: int = 0  # the checkpoint copied off it after its outbid
    restored_bytes: int = 0  # the checkpoint uploaded to it before its resume
    pauses: int = 0  # outbids it resumed from by itself while the run waited (--on-outbid wait:MINUTES)
    paused_s: float = 0.0  # the seconds those waits took (storage billing, the GPU not)


class RunRecord(BaseModel):
    """harness-result.json. Built by the run, serialised here; readers check `schema_version`."""

    schema_version: int = RESULT_SCHEMA_VERSION
    attempts: list[Attempt] = []  # an interruptible run's hosts, in order (empty for an on-demand run)
    run_id: str
    profile: str
    image: str
    api_url: str
    sim: bool
    offer: OfferSummary | None
    driver_qualified: bool | None
    any_driver: bool
    caps: RecordCaps
    worst_case_usd: float | None
    accrued_usd: float
    over_cap: str | None = None
    bytes: ByteCounts
    bundle_sha256: str | None
    host_key: HostKeyRecord | None
    remote_env: dict[str, str]  # settings as given; a secret's name with ***
    remote_secrets: list[str] = Field(default_factory=list)  # names only: a secret is never stored by value
    instances: list[RecordedInstance]
    price_changes: list[PriceChange] = Field(default_factory=list)
    steps: list[StepRecord]
    pull: PullRecord | None = None
    timings: dict[str, float]  # phase name -> seconds: an open set of names
    phases: list[PhaseRecord] = Field(default_factory=list)  # the run's timeline (console/live.py PhaseLog)
    absence: AbsenceSummary
    api_calls: dict[str, Any]  # client.ClientStats as a dict (the client's own counters)
    evidence_write_failures: list[str] = Field(default_factory=list)
    deadman: dict[str, Any] | None = None  # deadman.DeadmanStatus at the first SSH: armed, fires at, clock skew
    image_sent: str | None = None  # the image reference the create carried (repo@sha256:digest)
    image_expect_override: dict[str, str] | None = None  # --image-expect: what the host check expected instead
    workdir: WorkdirRecord | None = None  # `vast-e2e run`: the uploaded workdir and its sha256
    artifacts: ArtifactPull | None = None  # `vast-e2e run --artifact`: what came back
    host_gpus: HostGpus | None = None  # the GPUs of the host the work ran on, read after SSH (None: none arrived)
    gpu_refused: list[HostGpus] = Field(default_factory=list)  # hosts deleted as not the offer's, each with why
    receipt: Receipt | None = None  # what the host the work ran on delivered (None: none got that far)
    receipts_refused: list[Receipt] = Field(default_factory=list)  # hosts deleted on their receipt, each with why
    exit_code: int
    message: str
    finished_unix: float = Field(default_factory=time.time)
    harness: dict[str, str]
