"""`vast-e2e` / `python scripts/vast_e2e.py`: declarations only; the work happens in the library.

Typed errors become exit codes here, in one place (`_run_guarded_cli`), per docs/invariants.md:
0 passed on a qualified driver · 1 a step failed · 2 bad input · 3 teardown not proven · 4 passed on an
unqualified driver · 5 no offer fits · 6 a cap was reached · 130 interrupted.
"""

from __future__ import annotations

import secrets
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer
from pydantic import SecretStr
from typer._click.exceptions import ClickException  # typer vendors click; usage errors subclass this

from vast_harness.config import RunSpec, load_driver_policy, path_flag, resolve
from vast_harness.errors import ConfigError, ExitCode, HarnessError, NoOfferError, describe, exit_code_for
from vast_harness.output import Output

if TYPE_CHECKING:  # the client (httpx, tenacity) is imported when a command needs it, not at startup
    from vast_harness.client import VastClient

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,  # tracebacks could show locals; keys stay out of them
    help="Rent a Vast.ai GPU host under cost and time caps, run a pinned workload, always delete it with proof.",
)

SIM_OFFERS = 1000  # a market large enough that every profile finds offers
SIM_PACING_SCALE = 0.1  # the embedded simulator enforces Vast's rate limits at a tenth of the real intervals

Profile = Annotated[str | None, typer.Option("--profile", help="Harness profile: mfu, proofs or smoke.")]
NumGpus = Annotated[int | None, typer.Option("--num-gpus", help="GPUs per offer (overrides the profile).")]
MinPcie = Annotated[float | None, typer.Option("--min-pcie-bw", help="Minimum PCIe bandwidth, GB/s.")]
KeyFile = Annotated[str | None, typer.Option("--key-file", help="File holding the API key (chmod 600). "
                                              "Else VAST_API_KEY.")]
MaxUsd = Annotated[float | None, typer.Option("--max-usd", help="Cost cap in dollars (worst case and accrued).")]
MaxMin = Annotated[float | None, typer.Option("--max-minutes", help="Time cap in minutes, boot to teardown.")]
RemoteEnv = Annotated[list[str] | None, typer.Option("--remote-env", help="KEY=VALUE for the host (repeatable; "
                                                     "values are masked everywhere).")]
AnyDriver = Annotated[bool, typer.Option("--any-driver", help="Allow drivers outside the qualified list "
                                         "(result records driver_qualified: false; exit 4 on success).")]
Eight = Annotated[bool, typer.Option("--eight-gpu-qualified", help="Rent 8 GPUs, qualified drivers only.")]
BootRetries = Annotated[int | None, typer.Option("--boot-retries", help="Hosts to try after one fails to boot.")]
EvidenceDir = Annotated[str | None, typer.Option("--evidence-dir", help="Where runs write evidence (default the "
                                                  "state dir: $VAST_HARNESS_HOME, else ~/.local/state/vast-harness)."
                                                  " The ledger stays in the state dir.")]
ApiUrl = Annotated[str | None, typer.Option("--api-url", help="API base URL (default Vast; VAST_URL honoured).")]
Sim = Annotated[bool, typer.Option("--sim", help="Start the embedded simulator and run against it (no key).")]
Json = Annotated[bool, typer.Option("--json", help="Machine-readable result on stdout.")]
ProofInterval = Annotated[float | None, typer.Option("--proof-interval", help="Seconds between the two absence "
                                                     "proof rounds (default 10 against Vast, 0.5 with --sim).")]
PacingScale = Annotated[float | None, typer.Option("--pacing-scale", hidden=True,
                                                   help="Scale the client's rate-limit pacing (tests).")]
PollInterval = Annotated[float | None, typer.Option("--poll-interval", hidden=True,
                                                    help="Seconds between instance polls while booting (tests).")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Quote and plan only: read-only calls, nothing created.")]


@contextmanager
def _api_target(spec: RunSpec) -> Iterator[tuple[RunSpec, float]]:
    """The spec pointed at the API it should use: the embedded simulator with --sim, else as given."""
    if not spec.sim:
        yield spec, spec.pacing_scale
        return
    from vast_harness.sim import SimServer  # imported only when asked for

    with SimServer(seed=0, boot_seconds=1.0, rate_scale=SIM_PACING_SCALE, num_offers=SIM_OFFERS) as sim:
        key = SecretStr("sim-" + secrets.token_hex(16))
        yield spec.model_copy(update={"api_url": sim.url, "api_key": key}), SIM_PACING_SCALE


def _client(spec: RunSpec, pacing_scale: float) -> VastClient:
    from vast_harness.client import VastClient

    assert spec.api_key is not None
    return VastClient(spec.api_key.get_secret_value(), base_url=spec.api_url, pacing_scale=pacing_scale)


_reported: list[int] = []  # exit codes whose message was already shown (by `_guard`)


def _guard(out: Output, body: Callable[[], int], *, interrupted: str = "interrupted before anything was rented") -> None:
    """Run `body`, turning typed errors into one clear line and their exit code (errors.exit_code_for)."""
    try:
        code = ExitCode(body())
    except (HarnessError, KeyboardInterrupt) as exc:
        if isinstance(exc, NoOfferError) and exc.rejected:
            out.rejections(exc.rejected, title="Closest offers and why each was rejected")
        code = exit_code_for(exc)
        out.failure(interrupted if isinstance(exc, KeyboardInterrupt) else describe(exc), code)
    _reported.append(code)
    raise typer.Exit(code)


@app.callback(invoke_without_command=True)
def main_command(
    ctx: typer.Context,
    profile: Profile = None,
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcie = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMin = None,
    remote_env: RemoteEnv = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    eight_gpu_qualified: Eight = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: Json = False,
    proof_interval: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_interval: PollInterval = None,
) -> None:
    """Run a profile end to end (or --dry-run to see the offer, the plan and the worst-case cost)."""
    if ctx.invoked_subcommand:
        return
    out = Output(json_mode=json_output)

    def body() -> int:
        if profile is None:
            raise ConfigError("--profile is required (mfu, proofs or smoke)")
        spec = resolve(
            profile=profile, num_gpus=num_gpus, min_pcie_bw=min_pcie_bw, key_file=path_flag("--key-file", key_file),
            max_usd=max_usd,
            max_minutes=max_minutes, remote_env=remote_env, dry_run=dry_run, any_driver=any_driver,
            eight_gpu_qualified=eight_gpu_qualified, boot_retries=boot_retries,
            evidence_dir=path_flag("--evidence-dir", evidence_dir),
            api_url=api_url, sim=sim, proof_interval_s=proof_interval,
            pacing_scale=pacing_scale, poll_s=poll_interval,
        )
        drivers = load_driver_policy()
        with _api_target(spec) as (target, scale), _client(target, scale) as client:
            if target.dry_run:
                from vast_harness.bundle import build_bundle
                from vast_harness.plan import plan_run

                out.plan(plan_run(target, client, drivers, build_bundle()))
                return 0
            from vast_harness.runner import run_guarded

            return run_guarded(target, client, drivers, out).exit_code

    _guard(out, body)


@app.command()
def offers(
    profile: Profile = "mfu",
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcie = None,
    key_file: KeyFile = None,
    max_usd: MaxUsd = None,
    max_minutes: MaxMin = None,
    any_driver: AnyDriver = False,
    eight_gpu_qualified: Eight = False,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: Json = False,
    pacing_scale: PacingScale = None,
    rank_by: Annotated[str, typer.Option("--rank-by", help="dph (worst case, then reliability) or usd-per-mtok "
                                         "(measured tokens/s from committed evidence and your fleet results; "
                                         "$/h for GPUs with none).")] = "dph",
    evidence_dir: EvidenceDir = None,
) -> None:
    """Search and rank offers for a profile; show why each rejected offer failed."""
    out = Output(json_mode=json_output)

    def body() -> int:
        if rank_by not in ("dph", "usd-per-mtok"):
            raise ConfigError(f"--rank-by must be dph or usd-per-mtok, got {rank_by!r}")
        spec = resolve(
            profile="mfu" if profile is None else profile, num_gpus=num_gpus, min_pcie_bw=min_pcie_bw,
            key_file=path_flag("--key-file", key_file),
            max_usd=max_usd, max_minutes=max_minutes, any_driver=any_driver,
            eight_gpu_qualified=eight_gpu_qualified, api_url=api_url, sim=sim,
            dry_run=True, pacing_scale=pacing_scale, evidence_dir=evidence_dir,
        )
        from vast_harness.bundle import build_bundle
        from vast_harness.plan import account_credit_usd, choose_offers

        with _api_target(spec) as (target, scale), _client(target, scale) as client:
            credit = account_credit_usd(client)
            choice = choose_offers(target, client, load_driver_policy(), build_bundle(), credit_usd=credit)
        if rank_by == "usd-per-mtok":
            from vast_harness.tokrate import load_measurements, print_ranked, rank_by_usd_per_mtok

            measurements = load_measurements(spec.evidence_dir)
            print_ranked(out, rank_by_usd_per_mtok(choice, measurements), measurements)
            return ExitCode.PASSED if choice.ranked else NoOfferError.exit_code
        out.offers(choice)
        return ExitCode.PASSED if choice.ranked else NoOfferError.exit_code

    _guard(out, body)


@app.command()
def fleet(
    gpus: Annotated[str, typer.Option("--gpus", help='GPU types, comma separated: "RTX 5090,RTX 4090,H100 SXM".')],
    max_usd: Annotated[float, typer.Option("--max-usd", help="Total cost cap of the whole fleet, dollars: the "
                                           "summed worst cases before renting, the summed accrual while running.")],
    profile: Profile = "mfu",
    per_run_usd: Annotated[float | None, typer.Option("--per-run-usd", help="Cost cap of each run (default: "
                                                      "--max-usd / number of GPU types).")] = None,
    parallel: Annotated[int, typer.Option("--parallel", help="Runs at once.")] = 3,
    allow_overcommit: Annotated[bool, typer.Option("--allow-overcommit", help="Start even when the summed worst "
                                                   "cases exceed --max-usd: the live monitor alone holds the "
                                                   "total (runs are cancelled when it is reached).")] = False,
    num_gpus: NumGpus = None,
    min_pcie_bw: MinPcie = None,
    key_file: KeyFile = None,
    max_minutes: MaxMin = None,
    remote_env: RemoteEnv = None,
    dry_run: DryRun = False,
    any_driver: AnyDriver = False,
    boot_retries: BootRetries = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    sim: Sim = False,
    json_output: Json = False,
    proof_interval: ProofInterval = None,
    pacing_scale: PacingScale = None,
    poll_interval: PollInterval = None,
) -> None:
    """One guarded run per GPU type, K at once, under one total cap; ranked by $ per million training tokens."""
    out = Output(json_mode=json_output)

    def body() -> int:
        from vast_harness.fleet import parse_gpus, run_fleet

        names = parse_gpus(gpus)
        if not max_usd > 0:
            raise ConfigError(f"--max-usd must be positive, got {max_usd}")
        per_run = per_run_usd if per_run_usd is not None else max_usd / len(names)
        if not per_run > 0:
            raise ConfigError(f"--per-run-usd must be positive, got {per_run_usd}")
        if parallel < 1:
            raise ConfigError(f"--parallel must be at least 1, got {parallel}")
        spec = resolve(
            profile=profile or "mfu", num_gpus=num_gpus, min_pcie_bw=min_pcie_bw, key_file=key_file,
            max_usd=per_run, max_minutes=max_minutes, remote_env=remote_env, dry_run=dry_run,
            any_driver=any_driver, boot_retries=boot_retries, evidence_dir=evidence_dir, api_url=api_url, sim=sim,
            proof_interval_s=proof_interval, pacing_scale=pacing_scale, poll_s=poll_interval,
        )
        with _api_target(spec) as (target, scale), _client(target, scale) as client:
            return run_fleet(target, names, client, load_driver_policy(), out, total_usd=max_usd,
                             per_run_usd=per_run, parallel=parallel, allow_overcommit=allow_overcommit)

    _guard(out, body)


@app.command()
def reap(
    key_file: KeyFile = None,
    evidence_dir: EvidenceDir = None,
    api_url: ApiUrl = None,
    json_output: Json = False,
    proof_interval: ProofInterval = None,
    pacing_scale: PacingScale = None,
    include_live: Annotated[bool, typer.Option("--include-live", help="Also delete live runs' instances "
                                               "(after a confirmation prompt).")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Confirm --include-live without a prompt (scripts).")] = False,
) -> None:
    """Delete and prove absent every orphan (instances of dead runs, or past their own cap deadline); list
    live runs' instances and leave them alone."""
    out = Output(json_mode=json_output)

    def body() -> int:
        spec = resolve(profile="smoke", key_file=path_flag("--key-file", key_file),
                       evidence_dir=path_flag("--evidence-dir", evidence_dir), api_url=api_url,
                       proof_interval_s=proof_interval, pacing_scale=pacing_scale)
        from vast_harness.reap import reap_all
        from vast_harness.status import confirm_live

        if include_live and not yes and not sys.stdin.isatty():
            raise ConfigError("--include-live deletes live runs' instances: confirm with --yes where there is no "
                              "terminal to ask")
        with _client(spec, spec.pacing_scale) as client:
            return reap_all(spec, client, out, include_live=include_live,
                            confirm=(lambda live: True) if yes else confirm_live)

    _guard(out, body, interrupted="reap interrupted before it deleted anything; run `vast-e2e reap` again")


@app.command()
def status(
    key_file: KeyFile = None,
    api_url: ApiUrl = None,
    json_output: Json = False,
    pacing_scale: PacingScale = None,
) -> None:
    """Read-only: every live run of this user and every `vh-` instance of the account, with accrued dollars."""
    out = Output(json_mode=json_output)

    def body() -> int:
        spec = resolve(profile="smoke", key_file=path_flag("--key-file", key_file), api_url=api_url,
                       pacing_scale=pacing_scale, dry_run=True)
        from vast_harness.status import show_status

        with _client(spec, spec.pacing_scale) as client:
            return show_status(spec, client, out)

    _guard(out, body)


def main() -> None:
    """The program: every way out is an exit code and at most one clear line on stderr, never a traceback."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # replaces the quiet exit used while importing
    _reported.clear()
    try:
        code = app(standalone_mode=False)
    except ClickException as exc:  # usage errors: the flag and why, exit 2
        Output().failure(exc.format_message(), exc.exit_code)
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort):
        code = ExitCode.INTERRUPTED
    if code == ExitCode.INTERRUPTED and ExitCode.INTERRUPTED not in _reported:
        Output().failure("interrupted before anything was rented", ExitCode.INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
