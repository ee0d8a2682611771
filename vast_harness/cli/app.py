"""`vast-e2e` / `python scripts/vast_e2e.py`: declarations only; the work happens in the library.

Each command declares its options in its signature, the shared ones through the `Annotated` aliases of
`options.py`; its body is one call into a private function, handed the shared values as one `Flags` (read by
name from the parsed parameters, so the body does not repeat them). Typed errors become exit codes here, in
one place (`_guard`, through `errors.exit_code_for`); `main` adds the two that come from outside a command: a
usage error (2) and an interrupt (130). Per docs/invariants.md: 0 passed on a qualified driver · 1 a step
failed · 2 bad input · 3 teardown not proven · 4 passed on an unqualified driver · 5 no offer fits · 6 a cap
was reached · 130 interrupted. Before the command line is parsed, `main` tells the process's masker every key
and secret argv and the environment hold, and masks stdout and stderr as a last resort (masking.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from vast_harness.api import api_target
from vast_harness.cli.completion import RANK_BY_VALUES, complete_rank_by, complete_run
from vast_harness.cli.options import (
    AllowUnarmedDeadman,
    AnyDriver,
    ApiUrl,
    Artifact,
    Bid,
    BootRetries,
    CanaryMaxUsd,
    Checkpoint,
    Command,
    DryRun,
    EightGpuQualified,
    EvidenceDir,
    Exclude,
    Flags,
    FleetMaxUsd,
    FullUpload,
    Gpu,
    HeldName,
    IdleMinutes,
    Image,
    ImageExpect,
    ImageExpectAck,
    Include,
    InterruptibleFlag,
    JsonOutput,
    KeyFile,
    MaxInterruptions,
    MaxMinutes,
    MaxUsd,
    MinGpuRamGb,
    MinPcieBw,
    Notify,
    NumGpus,
    OnOutbid,
    PacingScale,
    PollInterval,
    Profile,
    ProofInterval,
    RemoteCommand,
    RemoteEnv,
    RemoteSecret,
    RemoteSecretFile,
    Resume,
    Setup,
    Sim,
    UnqualifiedOk,
    Workdir,
    WorkdirMaxMb,
)
from vast_harness.cli.tables import show_offers, show_plan
from vast_harness.console.output import Output
from vast_harness.errors import (
    ConfigError,
    ExitCode,
    HarnessError,
    Interrupted,
    NoOfferError,
    describe,
    exit_code_for,
)
from vast_harness.masking import MASKER, MaskingStream, mask
from vast_harness.spec.known_secrets import teach_inputs
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec
from vast_harness.spec.values import MAX_USD_LIMIT, check_number, path_flag

if TYPE_CHECKING:  # the client (httpx, tenacity) is imported when a command needs it, not at startup
    from vast_harness.vast.client import VastClient

app = typer.Typer(
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,  # tracebacks could show locals; keys stay out of them
    rich_markup_mode=None,  # plain help: flags as `--sim`, values as `--max-usd USD`
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Rent a Vast.ai GPU host under cost and time caps, run a pinned workload, always delete it with proof.",
)

MAX_PARALLEL = 64
CANARY_MAX_USD = 0.10  # a canary rents minutes of the cheapest offer


def _version() -> str:
    try:
        return metadata.version("vast-harness")
    except metadata.PackageNotFoundError:  # a checkout run without an install
        return "unknown (not installed)"


def _show_version(value: bool) -> None:
    if value:
        Output().out.print(f"vast-e2e {_version()}")
        raise typer.Exit(0)


_api_target = api_target  # the embedded simulator with --sim (vast_harness/api.py, shared with run_workload)


REFUSED_ATTEMPTS = 2  # the interactive commands: a refused connection is tried once more, then said
REAP_NO_SIM = ("reap takes no --sim: a --sim run's instances live and die in its own simulator; against the "
               "simulator on its own (`python -m vast_harness.sim`), pass --api-url URL and any key")


def _client(spec: RunSpec, out: Output | None = None) -> VastClient:
    """With `out` (the interactive commands: status, offers, reap), each retry is said as a warning line, a 429
    once, and a refused connection ends the command after one more try (nothing listens: waiting two minutes
    changes nothing)."""
    from vast_harness.vast.client import VastClient

    assert spec.api_key is not None
    return VastClient(spec.api_key.get_secret_value(), base_url=spec.api_url, pacing_scale=spec.pacing_scale,
                      on_retry=out.warn if out is not None else None,
                      refused_attempts=REFUSED_ATTEMPTS if out is not None else None)


_reported: list[int] = []  # exit codes whose message was already shown (by `_guard`)


def _guard(out: Output, body: Callable[[], int], *, interrupted: str = "interrupted before anything was rented") -> None:
    """Run `body`, turning typed errors into one clear line and their exit code (errors.exit_code_for)."""
    try:
        code = ExitCode(body())
    except (HarnessError, KeyboardInterrupt, Interrupted) as exc:
        if isinstance(exc, NoOfferError) and exc.rejected:
            out.rejections([r.row() for r in exc.rejected], title="Closest offers and why each was rejected")
        code = exit_code_for(exc)
        out.failure(interrupted if isinstance(exc, (KeyboardInterrupt, Interrupted)) else describe(exc), code)
    _reported.append(code)
    raise typer.Exit(code)


@app.callback(invoke_without_command=True)
def main_command(
    ctx: typer.Context,
    *,
    version: Annotated[bool, typer.Option("--version", metavar="", is_eager=True, callback=_show_version,
                                          help="Print the version and exit.")] = False,
    profile: Profile = None,
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcieBw = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMinutes = None,
    remote_env: RemoteEnv = None,
    remote_secret: RemoteSecret = None,
    remote_secret_file: RemoteSecretFile = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    unqualified_ok: UnqualifiedOk = False,
    eight_gpu_qualified: EightGpuQualified = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
    allow_unarmed_deadman: AllowUnarmedDeadman = False,
    image_expect: ImageExpect = None,
    image_expect_ack: ImageExpectAck = False,
    notify: Notify = None,
) -> None:
    """Run a profile end to end (or --dry-run to see the offer, the plan and the worst-case cost).

    Commands below take their own options after their name (`vast-e2e offers --sim`); an option given before
    the command is honoured when the command takes it."""
    if ctx.invoked_subcommand is None:  # else the subcommand takes these up (Flags.of reads its parent)
        _run_profile(Flags.of(ctx))


def _run_profile(flags: Flags) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        if flags.options.profile is None:
            raise ConfigError("--profile is required for a run, being what you rent for (mfu, proofs, smoke or a "
                              "profile file); offers, check and fleet default to mfu, canary to smoke; vast-e2e -h "
                              "lists every option")
        return _plan_or_run(out, flags.spec())

    _guard(out, body)


def _plan_or_run(out: Output, spec: RunSpec) -> int:
    """The dry run's plan, or the guarded run: a profile's and `run`'s alike."""
    drivers = load_driver_policy()
    with _api_target(spec) as target, _client(target) as client:
        if target.dry_run:
            from vast_harness.caps.meter import check_minimum_cap
            from vast_harness.host.bundle import bundle_for
            from vast_harness.market.plan import plan_run

            check_minimum_cap(target.caps.max_minutes, target.timings, target.profile.receipt)  # the run would refuse it: so does the preview

            show_plan(out, plan_run(target, client, drivers, bundle_for(target), explain_requires=True))
            return 0
        from vast_harness.run.runner import run_guarded

        return run_guarded(target, client, drivers, out).exit_code


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    ctx: typer.Context,
    *,
    command: Command = None,
    workdir: Workdir = None,
    setup: Setup = None,
    artifact: Artifact = None,
    exclude: Exclude = None,
    include: Include = None,
    workdir_max_mb: WorkdirMaxMb = None,
    image: Image = None,
    gpu: Gpu = None,
    num_gpus: NumGpus = None,
    min_gpu_ram_gb: MinGpuRamGb = None,
    min_pcie_bw: MinPcieBw = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMinutes = None,
    remote_env: RemoteEnv = None,
    remote_secret: RemoteSecret = None,
    remote_secret_file: RemoteSecretFile = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    unqualified_ok: UnqualifiedOk = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
    allow_unarmed_deadman: AllowUnarmedDeadman = False,
    interruptible: InterruptibleFlag = False,
    bid: Bid = None,
    max_interruptions: MaxInterruptions = None,
    checkpoint: Checkpoint = None,
    resume: Resume = None,
    on_outbid: OnOutbid = None,
    notify: Notify = None,
) -> None:
    """Run your own command on a rented host: upload the workdir, run --setup then CMD there, pull the
    --artifact files, delete the instance and prove it gone, under the same caps and guarantees as a profile.

    vast-e2e run [OPTIONS] -- CMD [ARGS...]   (default caps: $1 and 30 minutes; see docs/run.md)"""
    _run_command(Flags.of(ctx))


def _run_command(flags: Flags) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        if not flags.options.command:
            raise ConfigError("run: no command given; put it after --: vast-e2e run [OPTIONS] -- CMD [ARGS...]")
        return _plan_or_run(out, flags.spec())

    _guard(out, body)


@app.command()
def up(
    ctx: typer.Context,
    name: HeldName,
    *,
    idle_minutes: IdleMinutes = None,
    workdir: Workdir = None,
    setup: Setup = None,
    exclude: Exclude = None,
    include: Include = None,
    workdir_max_mb: WorkdirMaxMb = None,
    image: Image = None,
    gpu: Gpu = None,
    num_gpus: NumGpus = None,
    min_gpu_ram_gb: MinGpuRamGb = None,
    min_pcie_bw: MinPcieBw = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMinutes = None,
    remote_env: RemoteEnv = None,
    remote_secret: RemoteSecret = None,
    remote_secret_file: RemoteSecretFile = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    unqualified_ok: UnqualifiedOk = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
    allow_unarmed_deadman: AllowUnarmedDeadman = False,
    interruptible: InterruptibleFlag = False,
    bid: Bid = None,
    max_interruptions: MaxInterruptions = None,
    checkpoint: Checkpoint = None,
    resume: Resume = None,
    on_outbid: OnOutbid = None,
) -> None:
    """Rent a host and keep it: upload the workdir, run --setup once, and leave it held for `exec` (the caps
    cover the whole hold; its switch deletes it after --idle-minutes without an exec, or at the cap)."""
    _up(Flags.of(ctx), name, idle_minutes)


UP_RESUME = ("--resume has no meaning for up: up runs no command of yours (each exec brings its own), so an exec "
             "cut by an outbid runs its own command again on the replacement, after --setup and the checkpoint's "
             "restore; give --checkpoint DIR alone")


def _up(flags: Flags, name: str, idle_minutes: float | None) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.kept.up import idle_minutes_for, up_host, up_spec
        from vast_harness.state.held import check_name

        check_name(name)
        if flags.options.resume is not None:  # before anything is rented
            raise ConfigError(UP_RESUME)
        spec = up_spec(flags.spec(command=["true"]), name)
        idle = idle_minutes_for(spec, idle_minutes)
        if spec.dry_run:
            code = _plan_or_run(out, spec)
            terms = spec.interruptible
            bid = ("" if terms is None else
                   f"; an interruptible hold's covers {terms.max_interruptions} outbid(s) of its host over the whole "
                   "hold (each a replacement rented at most at the ceiling above, the workdir and the checkpoint "
                   "sent again)")
            out.info(f"kept host {name}: the worst case above covers the whole hold (its caps: ${spec.caps.max_usd:g}, "
                     f"{spec.caps.max_minutes:g} min){bid}; each exec's upload is metered against the same cap; its "
                     f"switch deletes it after {idle:g} min without an exec")
            return code
        return up_host(spec, name, idle_minutes=idle, out=out, options=flags.options)

    _guard(out, body)


@app.command("exec")
def exec_command(
    ctx: typer.Context,
    name: HeldName,
    command: Command = None,
    *,
    workdir: Workdir = None,
    artifact: Artifact = None,
    exclude: Exclude = None,
    include: Include = None,
    workdir_max_mb: WorkdirMaxMb = None,
    full_upload: FullUpload = False,
    remote_env: RemoteEnv = None,
    remote_secret: RemoteSecret = None,
    remote_secret_file: RemoteSecretFile = None,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
) -> None:
    """Run a command on a kept host: upload what changed in the workdir (by content; deletions too), run CMD,
    pull the --artifact files; the host stays held (exit codes as a run's step).

    vast-e2e exec NAME [OPTIONS] -- CMD [ARGS...]"""
    _exec(Flags.of(ctx), name, full_upload)


def _exec(flags: Flags, name: str, full_upload: bool) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.kept.execute import exec_on

        if not flags.options.command:
            raise ConfigError(f"exec: no command given; put it after --: vast-e2e exec {name} -- CMD [ARGS...]")
        return exec_on(name, _held_options(flags), full_upload=full_upload, out=out)

    _guard(out, body, interrupted="interrupted before the command started; the kept host stays held")


def _held_options(flags: Flags) -> RunOptions:
    """A kept host command's options, the key file checked as every command's is."""
    return flags.options.model_copy(update={"key_file": path_flag("--key-file", flags.options.key_file)})


@app.command()
def keep(
    ctx: typer.Context,
    name: HeldName,
    *,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    json_output: JsonOutput = False,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
) -> None:
    """Push a kept host's idle deadline from now (never its cap's)."""
    flags = Flags.of(ctx)
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.kept.keep import keep_host

        return keep_host(name, _held_options(flags), out=out)

    _guard(out, body, interrupted="interrupted; the kept host stays held")


@app.command()
def down(
    ctx: typer.Context,
    name: HeldName,
    *,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
) -> None:
    """Delete a kept host and prove it absent; the hold ends."""
    flags = Flags.of(ctx)
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.kept.keep import down_host

        return down_host(name, _held_options(flags), out=out)

    _guard(out, body, interrupted="interrupted; run `vast-e2e down` again (or `reap` after the hold's deadline)")


@app.command()
def ssh(
    ctx: typer.Context,
    name: HeldName,
    command: RemoteCommand = None,
    *,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
) -> None:
    """Open a shell on a kept host (OpenSSH's ssh, the hold's key), or run one command there; under the same
    caps, the idle deadline pushed while it is open.

    vast-e2e ssh NAME [-- CMD [ARGS...]]"""
    flags = Flags.of(ctx)
    out = Output(progress=False)  # the shell owns the terminal: no live view over it

    def body() -> int:
        from vast_harness.kept.shell import ssh_host

        return ssh_host(name, list(command or []), _held_options(flags), out=out)

    _guard(out, body, interrupted="interrupted; the kept host stays held")


@app.command()
def offers(
    ctx: typer.Context,
    *,
    rank_by: Annotated[str, typer.Option("--rank-by", metavar="dph|usd-per-mtok", autocompletion=complete_rank_by,
                                         help=(
        "dph (worst case, then reliability) or usd-per-mtok (measured tokens/s from committed evidence and "
        "your fleet results; $/h for GPUs with none)."))] = "dph",
    profile: Profile = None,
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcieBw = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMinutes = None,
    remote_env: RemoteEnv = None,
    any_driver: AnyDriver = False,
    eight_gpu_qualified: EightGpuQualified = False,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    pacing_scale: PacingScale = None,
    evidence_dir: EvidenceDir = None,
) -> None:
    """Search and rank offers for a profile (default mfu); show why each rejected offer failed and, for a profile
    with 1B runs, which GPUs hold which micro-batches (--remote-env sets them, as for a run)."""
    _offers(Flags.of(ctx), rank_by)


def _offers(flags: Flags, rank_by: str) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        if rank_by not in RANK_BY_VALUES:
            raise ConfigError(f"--rank-by must be dph or usd-per-mtok, got {rank_by!r}")
        given = flags.options.profile
        spec = flags.spec(profile="mfu" if given is None else given, dry_run=True)
        from vast_harness.host.bundle import bundle_for
        from vast_harness.market.plan import account_credit_usd, choose_offers

        with _api_target(spec) as target, _client(target, out) as client:
            credit = account_credit_usd(client)
            choice = choose_offers(target, client, load_driver_policy(), bundle_for(target), credit_usd=credit,
                                   explain_requires=True)
        if rank_by == "usd-per-mtok":
            from vast_harness.market.token_rate import load_measurements, print_ranked, rank_by_usd_per_mtok

            measurements = load_measurements(spec.evidence_dir)
            print_ranked(out, rank_by_usd_per_mtok(choice, measurements), measurements)
            return ExitCode.PASSED if choice.ranked else NoOfferError.exit_code
        show_offers(out, choice, requires=spec.profile.requires.model_dump(exclude_defaults=True), fit=spec.fit)
        return ExitCode.PASSED if choice.ranked else NoOfferError.exit_code

    _guard(out, body)


@app.command()
def fleet(
    ctx: typer.Context,
    *,
    gpus: Annotated[str, typer.Option("--gpus", metavar="NAMES", help=(
        'GPU types, comma separated: "RTX 5090,RTX 4090,H100 SXM".'))],
    per_run_usd: Annotated[float | None, typer.Option("--per-run-usd", metavar="USD", help=(
        "Cost cap of each run (default: --max-usd / number of GPU types)."))] = None,
    parallel: Annotated[int, typer.Option("--parallel", metavar="K", help="Runs at once.")] = 3,
    allow_overcommit: Annotated[bool, typer.Option("--allow-overcommit", metavar="", help=(
        "Start even when the summed worst cases exceed --max-usd: the live monitor alone holds the total (runs "
        "are cancelled when it is reached)."))] = False,
    profile: Profile = None,
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcieBw = None,
    key_file: KeyFile = None,
    max_usd: FleetMaxUsd,
    max_minutes: MaxMinutes = None,
    remote_env: RemoteEnv = None,
    remote_secret: RemoteSecret = None,
    remote_secret_file: RemoteSecretFile = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    unqualified_ok: UnqualifiedOk = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
    allow_unarmed_deadman: AllowUnarmedDeadman = False,
    image_expect: ImageExpect = None,
    image_expect_ack: ImageExpectAck = False,
    interruptible: InterruptibleFlag = False,
    bid: Bid = None,
    max_interruptions: MaxInterruptions = None,
    on_outbid: OnOutbid = None,
    notify: Notify = None,
) -> None:
    """One guarded run per GPU type, K at once, under one total cap; ranked by $ per million training tokens."""
    _fleet(Flags.of(ctx), gpus=gpus, per_run_usd=per_run_usd, parallel=parallel, allow_overcommit=allow_overcommit)


def _fleet(flags: Flags, *, gpus: str, per_run_usd: float | None, parallel: int, allow_overcommit: bool) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.fleet.plan import parse_gpus
        from vast_harness.fleet.run import run_fleet

        names = parse_gpus(gpus)
        total = flags.options.max_usd
        check_number("--max-usd", total, low=0, high=MAX_USD_LIMIT, low_inclusive=False)  # finite: inf is refused
        assert total is not None  # required by the declaration
        per_run = per_run_usd if per_run_usd is not None else total / len(names)
        check_number("--per-run-usd", per_run, low=0, high=MAX_USD_LIMIT, low_inclusive=False)
        check_number("--parallel", parallel, low=1, high=MAX_PARALLEL)
        given = flags.options.profile
        spec = flags.spec(profile="mfu" if given is None else given, max_usd=per_run)
        with _api_target(spec) as target, _client(target) as client:
            return run_fleet(target, names, client, load_driver_policy(), out, total_usd=total,
                             per_run_usd=per_run, parallel=parallel, allow_overcommit=allow_overcommit)

    _guard(out, body)


@app.command()
def check(
    ctx: typer.Context,
    *,
    profile: Profile = None,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    pacing_scale: PacingScale = None,
) -> None:
    """Read-only: the key, credit and balance, each endpoint the harness uses and the image reference form."""
    _check(Flags.of(ctx))


def _check(flags: Flags) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        spec = flags.spec(profile=flags.options.profile or "mfu", dry_run=True)
        from vast_harness.views.check import print_report, run_checks

        with _api_target(spec) as target, _client(target) as client:
            report = run_checks(target, client)
        print_report(out, report)
        return report.exit_code

    _guard(out, body)


@app.command()
def canary(
    ctx: typer.Context,
    *,
    out_file: Annotated[str, typer.Option("--out", metavar="PATH",
                                          help="Where canary.json goes (also in the run's evidence).")]
    = "canary.json",
    max_usd: CanaryMaxUsd = None,
    max_minutes: MaxMinutes = None,
    profile: Profile = None,
    key_file: KeyFile = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_s: PollInterval = None,
    interruptible: InterruptibleFlag = False,
    bid: Bid = None,
) -> None:
    """Rent the cheapest qualified offer under the usual guards and measure read lag, boot, the image reference,
    the dead-man switch, SSH environment, linger and a repeat DELETE; writes canary.json. With --interruptible: a
    bid instance, stopped after its steps to see what a paused one shows, and a file copied off it."""
    _canary(Flags.of(ctx), out_file)


def _canary(flags: Flags, out_file: str) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        out_path = path_flag("--out", out_file)
        given = flags.options
        spec = flags.spec(profile=given.profile or "smoke",
                          max_usd=given.max_usd if given.max_usd is not None else CANARY_MAX_USD)
        from vast_harness.actions.canary import print_canary, run_canary

        with _api_target(spec) as target, _client(target) as client:
            rep, _ = run_canary(target, client, load_driver_policy(), out, out_path)
        print_canary(out, rep, out_path)
        return rep.exit_code

    _guard(out, body)


@app.command()
def reap(
    ctx: typer.Context,
    *,
    include_live: Annotated[bool, typer.Option("--include-live", metavar="", help="Also delete live runs' "
                                               "instances (after a confirmation prompt).")] = False,
    yes: Annotated[bool, typer.Option("--yes", metavar="", help="Confirm --include-live without a prompt "
                                      "(scripts).")] = False,
    key_file: KeyFile = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    json_output: JsonOutput = False,
    proof_interval_s: ProofInterval = None,
    pacing_scale: PacingScale = None,
) -> None:
    """Delete and prove absent every orphan (instances of dead runs, or past their own cap deadline); list
    live runs' instances and leave them alone. Also removes what killed simulators left on this machine."""
    _reap(Flags.of(ctx), include_live=include_live, yes=yes)


def _reap(flags: Flags, *, include_live: bool, yes: bool) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        # What killed simulators (`--sim` runs, `python -m vast_harness.sim`) left on this machine: local, so
        # before the key is needed
        from vast_harness.sim.sandbox import reap_dead_simulators

        if left := reap_dead_simulators().line():
            out.info(left)
        # A full disk must not keep the orphans billing: reap warns and deletes; what it cannot write (ledger
        # lines, evidence) is said as it happens, and the verdicts stand on the API's answers alone.
        spec = flags.spec(profile="smoke", on_unwritable=out.warn, no_key_hint=REAP_NO_SIM)
        from vast_harness.actions.reap import reap_all
        from vast_harness.views.status import confirm_live

        if include_live and not yes and not sys.stdin.isatty():
            raise ConfigError("--include-live deletes live runs' instances: confirm with --yes where there is no "
                              "terminal to ask")
        with _client(spec, out) as client:
            return reap_all(spec, client, out, include_live=include_live,
                            confirm=(lambda live: True) if yes else confirm_live)

    _guard(out, body, interrupted="reap interrupted before it deleted anything; run `vast-e2e reap` again")


def _evidence_dir(flags: Flags) -> Path:
    from vast_harness.spec.user import UserConfig
    from vast_harness.state.runs import default_evidence_dir

    given = flags.evidence_path
    if given is None:
        user, _ = UserConfig.load(os.environ)
        given = Path(user.evidence_dir) if user.evidence_dir else default_evidence_dir()
    return given.expanduser()


@app.command()
def report(
    ctx: typer.Context,
    *,
    run: Annotated[str | None, typer.Argument(metavar="RUN", autocompletion=complete_run, show_default=False, help=(
        "A run id, part of one, or its directory (default: the latest run); or a fleet id (fleet-...), "
        "part of one, or its directory."))] = None,
    evidence_dir: EvidenceDir = None,
    json_output: JsonOutput = False,
) -> None:
    """Rebuild a run's report.html, or a fleet's fleet-report.html, from the evidence; print where it is."""
    _report(Flags.of(ctx), run)


def _report(flags: Flags, run: str | None) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.state.runs import find_fleet, find_run, latest_run
        from vast_harness.views.logs import rebuild_report

        where = _evidence_dir(flags)
        fleet = None if run is None else find_fleet(where, run)
        if fleet is not None:
            from vast_harness.views.fleet_report import rebuild_fleet

            return rebuild_fleet(out, fleet)
        return rebuild_report(out, latest_run(where) if run is None else find_run(where, run))

    _guard(out, body, interrupted="interrupted")


@app.command()
def summary(
    ctx: typer.Context,
    *,
    run: Annotated[str | None, typer.Argument(metavar="RUN", autocompletion=complete_run, show_default=False, help=(
        "A run id, part of one, or its directory (default: the run --result names, else the latest run)."))]
    = None,
    result: Annotated[str | None, typer.Option("--result", metavar="FILE", help=(
        "The run command's --json output: its verdict (a refused run has no other); the page is that run's only "
        "(empty or unreadable: no verdict, never an earlier run's)."))] = None,
    reap_result: Annotated[str | None, typer.Option("--reap-result", metavar="FILE", help=(
        "A follow-up `reap --json` output, shown under the run."))] = None,
    outputs: Annotated[str | None, typer.Option("--outputs", metavar="FILE", help=(
        "Append exit-code, accrued-usd, run-id, evidence-dir and absence as name=value lines (GitHub's "
        "$GITHUB_OUTPUT)."))] = None,
    artifact_name: Annotated[str | None, typer.Option("--artifact-name", metavar="NAME", help=(
        "The name the evidence is uploaded under, said on the page."))] = None,
    evidence_dir: EvidenceDir = None,
) -> None:
    """A run as the Markdown a CI job summary shows ($GITHUB_STEP_SUMMARY): verdict, cost against the caps, the
    GPUs, the steps, the absence proof; from the evidence only."""
    _summary(Flags.of(ctx), run, result=result, reap_result=reap_result, outputs=outputs,
             artifact_name=artifact_name)


def _summary(flags: Flags, run: str | None, *, result: str | None, reap_result: str | None, outputs: str | None,
             artifact_name: str | None) -> None:
    out = Output()

    def body() -> int:
        from vast_harness.views.summary import show_summary

        return show_summary(out, _evidence_dir(flags), run, result_file=path_flag("--result", result),
                            reap_file=path_flag("--reap-result", reap_result),
                            outputs_file=path_flag("--outputs", outputs), artifact_name=artifact_name)

    _guard(out, body, interrupted="interrupted")


@app.command()
def logs(
    ctx: typer.Context,
    *,
    run: Annotated[str | None, typer.Argument(metavar="RUN", autocompletion=complete_run, show_default=False, help=(
        "A run id, part of one, or its directory (default: the latest run)."))] = None,
    step: Annotated[str | None, typer.Argument(metavar="STEP", help="The one step whose log to print; without "
                                               "it, every step's log in order, each under a header.",
                                               show_default=False)] = None,
    list_only: Annotated[bool, typer.Option("--list", metavar="", help="A table of the run's step logs (step, "
                                            "bytes, path) instead of their text.")] = False,
    follow: Annotated[bool, typer.Option("--follow", "-f", metavar="", help="Follow a run that is still going "
                                         "(from another terminal): print its steps' lines as they land, until "
                                         "the run ends (its record), or its process is gone (killed).")] = False,
    raw: Annotated[bool, typer.Option("--raw", metavar="", help="The bytes as the host sent them (escape codes "
                                      "and carriage returns included); else control characters are shown "
                                      "escaped and each line as a terminal leaves it.")] = False,
    evidence_dir: EvidenceDir = None,
    json_output: JsonOutput = False,
) -> None:
    """Print a run's step logs (every step in order, or one), list them (--list), or follow a live run (-f)."""
    _logs(Flags.of(ctx), run, step, raw=raw, list_only=list_only, follow=follow)


def _logs(flags: Flags, run: str | None, step: str | None, *, raw: bool, list_only: bool, follow: bool) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.state.runs import find_run, latest_run
        from vast_harness.views.logs import show_logs

        if follow and (step is not None or list_only):
            raise ConfigError("logs --follow prints every step of a run as it goes: it takes no STEP and no --list")
        where = _evidence_dir(flags)
        run_dir = latest_run(where) if run is None else find_run(where, run)
        if follow:
            from vast_harness.state.dirs import SIM_SUBDIR, state_dir
            from vast_harness.views.follow import follow_logs

            return follow_logs(out, run_dir, [state_dir(), state_dir() / SIM_SUBDIR], raw=raw)
        return show_logs(out, run_dir, step, raw=raw, list_only=list_only)

    _guard(out, body, interrupted="interrupted")


@app.command()
def costs(ctx: typer.Context, *, evidence_dir: EvidenceDir = None, json_output: JsonOutput = False) -> None:
    """What every run cost, from the ledger and the evidence: per run, per day, per profile, and totals."""
    _costs(Flags.of(ctx))


def _costs(flags: Flags) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.views.costs import show_costs

        return show_costs(out, _evidence_dir(flags))

    _guard(out, body, interrupted="interrupted")


@app.command()
def status(
    ctx: typer.Context,
    *,
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    sim: Annotated[bool, typer.Option("--sim", metavar="", help=(
        "The live --sim runs of this user (their registrations: each --sim run's instances live in its own "
        "simulator, which no other process can reach); no key, no API call."))] = False,
    json_output: JsonOutput = False,
    pacing_scale: PacingScale = None,
) -> None:
    """Read-only: every live run of this user and every `vh-` instance of the account, with accrued dollars."""
    _status(Flags.of(ctx))


def _status(flags: Flags) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        spec = flags.spec(profile="smoke", dry_run=True)
        from vast_harness.views.status import show_status

        if spec.sim:
            return show_status(spec, None, out)
        with _client(spec, out) as client:
            return show_status(spec, client, out)

    _guard(out, body)


@app.command()
def machines(
    ctx: typer.Context,
    *,
    forget: Annotated[list[int] | None, typer.Option("--forget", metavar="ID", help=(
        "Try this machine again: its failed receipt no longer skips it (the history keeps it). Repeatable."))] = None,
    forget_all: Annotated[bool, typer.Option("--forget-all", metavar="", help=(
        "Try every machine of this API (or of --sim) again."))] = False,
    api_url: ApiUrl = None,
    sim: Annotated[bool, typer.Option("--sim", metavar="", help=(
        "The embedded simulator's machines (--sim runs keep their own history); no key, no API call."))] = False,
    json_output: JsonOutput = False,
) -> None:
    """Every machine you rented, with the dates and measures of its receipts; a machine whose last receipt failed
    is skipped by later runs until --forget."""
    _machines(Flags.of(ctx), forget=forget or [], forget_all=forget_all)


def _machines(flags: Flags, *, forget: list[int], forget_all: bool) -> None:
    out = Output(json_mode=flags.json_output)

    def body() -> int:
        from vast_harness.state.dirs import SIM_SUBDIR, state_dir
        from vast_harness.state.machines import MachineHistory, market_of
        from vast_harness.vast.url import DEFAULT_API_URL, validate_api_url
        from vast_harness.views.machines import show_machines

        o = flags.options
        if o.api_url is not None:
            url = validate_api_url(o.api_url, environ=os.environ)
        elif os.environ.get("VAST_URL") is not None:
            url = validate_api_url(os.environ["VAST_URL"], "VAST_URL", os.environ)
        else:
            url = DEFAULT_API_URL
        market = market_of(url, sim=o.sim)
        history = MachineHistory(state_dir(os.environ) / SIM_SUBDIR if o.sim else state_dir(os.environ))
        if forget_all and forget:
            raise ConfigError("--forget-all forgets every machine; give it or --forget ID, not both")
        known = history.machines(market)
        for mid in forget:
            if mid not in known:
                raise ConfigError(f"--forget {mid}: no machine {mid} in the history of {market} ({history.path})")
        targets: list[int | None] = [None] if forget_all else list(forget)
        for target in targets:
            history.forget(market, target)
            out.info("every machine tried again" if target is None else f"machine {target} tried again by later runs")
        return show_machines(out, history, market)

    _guard(out, body, interrupted="interrupted")


# The options whose values hold a key or a secret (a webhook's URL is its token), read from argv before typer
# parses it (a usage error quotes)
_SECRET_OPTIONS = ("--key-file", "--remote-secret", "--remote-secret-file", "--notify")


def _teach_masker(argv: Sequence[str]) -> None:
    """Every key and secret this command line and the environment hold, told to the masker before parsing."""
    given: dict[str, list[str]] = {name: [] for name in _SECRET_OPTIONS}
    words = list(argv[: argv.index("--")] if "--" in argv else argv)  # after `--`: run's command
    for i, word in enumerate(words):
        name, sep, value = word.partition("=")
        if name in given:
            if sep:
                given[name].append(value)
            elif i + 1 < len(words):
                given[name].append(words[i + 1])
    teach_inputs(environ=os.environ, secret_items=given["--remote-secret"], notify_urls=given["--notify"])
    for key_file in given["--key-file"]:
        teach_inputs(environ=os.environ, key_file=key_file)
    for secret_file in given["--remote-secret-file"]:
        teach_inputs(environ=os.environ, secret_file=secret_file)


@contextlib.contextmanager
def _masked_streams() -> Iterator[None]:
    """stdout and stderr masked while the command runs: what reaches them past `Output` (a traceback, a thread's
    error, a warning, a library's print) too."""
    saved = sys.stdout, sys.stderr
    # A stream the process started without (its fd closed: Python makes it None) stays None: nothing to mask
    sys.stdout, sys.stderr = (saved[0] and MaskingStream(saved[0])), (saved[1] and MaskingStream(saved[1]))
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError, AttributeError):
                if stream is not None:
                    stream.flush()
        sys.stdout, sys.stderr = saved


def main() -> None:
    """The program: every way out is an exit code and at most one clear line on stderr, never a traceback but
    for a bug (an exception the harness did not expect: its traceback, masked, and exit 1)."""
    # The quiet exit used while importing gives way to KeyboardInterrupt, for SIGTERM and SIGHUP too: a command
    # stopped before a run's own signal guard takes over (or a reap, a status) ends as an interrupt, exit 130.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.default_int_handler)
    _reported.clear()
    if len(sys.argv) == 1:  # bare `vast-e2e`: what it can do, not an error about a missing --profile
        sys.argv.append("--help")
    with MASKER.scoped(), _masked_streams():
        _teach_masker(sys.argv[1:])
        code = _command()
    sys.exit(code)


def _command() -> int:
    try:
        code = app(standalone_mode=False, prog_name="vast-e2e")
    except typer.TyperException as exc:  # usage errors (click's, which typer vendors, subclass this): exit 2
        Output().failure(exc.format_message(), exc.exit_code)
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = ExitCode.INTERRUPTED
    except Exception:  # noqa: BLE001 - a bug: its traceback is what a report of it needs, masked like the rest
        sys.stderr.write(mask(traceback.format_exc()))
        return ExitCode.FAILED
    if code == ExitCode.INTERRUPTED and ExitCode.INTERRUPTED not in _reported:
        Output().failure("interrupted before anything was rented", ExitCode.INTERRUPTED)
    return code if isinstance(code, int) else 0
