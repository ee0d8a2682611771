"""The command line's shared options, each declared once as a typer `Annotated` alias, and what a command makes
of them.

A command lists the aliases it takes in its own signature (typer's documented way, as fastapi-cli does) and
hands its context to `Flags.of`, which gathers the values into one `RunOptions` (spec.resolve) and `--json`.
`Flags.spec()` resolves them to a `RunSpec` through `spec.resolve.resolve`, the one place where precedence and
bounds live, so a value is validated once, the same way for every command.

A parameter is named after its `RunOptions` field (`proof_interval_s` is `--proof-interval`), so the values
typer parsed go into the model by name. An option given before the subcommand (`vast-e2e --sim offers`) is
honoured when the subcommand takes it and refused with a usage error when it does not: never silently dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, cast

import typer
from pydantic import BaseModel, ConfigDict

from vast_harness.cli.completion import complete_profile
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.spec.values import path_flag

# A flag's metavar is "": the help shows `--sim`, not `--sim <bool>`.
Profile = Annotated[str | None, typer.Option(
    "--profile", metavar="NAME|PATH.toml", autocompletion=complete_profile,
    help="Harness profile: mfu, proofs, smoke, or your own profile file (validated like the shipped ones).")]
NumGpus = Annotated[int | None, typer.Option(
    "--num-gpus", metavar="N", help="GPUs per offer (overrides the profile).")]
MinPcieBw = Annotated[float | None, typer.Option(
    "--min-pcie-bw", metavar="GBPS", help="Minimum PCIe bandwidth, GB/s.")]
KeyFile = Annotated[str | None, typer.Option(
    "--key-file", metavar="PATH",
    help="File holding the API key (chmod 600). Else VAST_API_KEY, the config file's key_file, or the official "
         "CLI's ~/.config/vastai/vast_api_key.")]
MaxUsd = Annotated[float | None, typer.Option(
    "--max-usd", metavar="USD",
    help="Cost cap in dollars (worst case before renting, accrued while running).")]
MaxMinutes = Annotated[float | None, typer.Option(
    "--max-minutes", metavar="MIN", help="Time cap in minutes, create to teardown.")]
RemoteEnv = Annotated[list[str] | None, typer.Option(
    "--remote-env", metavar="KEY=VALUE",
    help="A setting for the host's steps (repeatable): shown and stored as given.")]
RemoteSecret = Annotated[list[str] | None, typer.Option(
    "--remote-secret", metavar="KEY[=VALUE]",
    help="A secret for the host's steps (repeatable; KEY alone takes this environment's value): masked "
         "everywhere the harness writes; stored by name only, never by value.")]
RemoteSecretFile = Annotated[str | None, typer.Option(
    "--remote-secret-file", metavar="PATH",
    help="File of KEY=VALUE secret lines (chmod 600), as --remote-secret.")]
DryRun = Annotated[bool, typer.Option(
    "--dry-run", metavar="", help="Quote and plan only: read-only calls, nothing created.")]
AnyDriver = Annotated[bool, typer.Option(
    "--any-driver", metavar="",
    help="Allow drivers outside the qualified list (the record says driver_qualified: false; exit 4 on "
         "success).")]
UnqualifiedOk = Annotated[bool, typer.Option(
    "--unqualified-ok", metavar="",
    help="With --any-driver: a pass on an unqualified driver exits 0, not 4 (for `set -e` scripts; the record "
         "still says driver_qualified: false).")]
EightGpuQualified = Annotated[bool, typer.Option(
    "--eight-gpu-qualified", metavar="", help="Rent 8 GPUs, qualified drivers only.")]
BootRetries = Annotated[int | None, typer.Option(
    "--boot-retries", metavar="N", help="Hosts to try after one fails to boot.")]
EvidenceDir = Annotated[str | None, typer.Option(
    "--evidence-dir", metavar="DIR",
    help="Where runs write evidence (default: the config file's evidence_dir, else the state dir: "
         "$VAST_HARNESS_HOME, else ~/.local/state/vast-harness on Linux). The ledger stays in the state dir.")]
ApiUrl = Annotated[str | None, typer.Option(
    "--api-url", metavar="URL", help="API base URL (default Vast; VAST_URL honoured).")]
Sim = Annotated[bool, typer.Option(
    "--sim", metavar="", help="Start the embedded simulator and run against it (no key).")]
JsonOutput = Annotated[bool, typer.Option(
    "--json", metavar="", help="One JSON object on stdout (progress on stderr).")]
ProofInterval = Annotated[float | None, typer.Option(
    "--proof-interval", metavar="S",
    help="Seconds between the two absence-proof rounds (default 10 against Vast, 0.5 with --sim).")]
PacingScale = Annotated[float | None, typer.Option(
    "--pacing-scale", metavar="F", hidden=True, help="Scale the client's rate-limit pacing (tests).")]
PollInterval = Annotated[float | None, typer.Option(
    "--poll-interval", metavar="S", hidden=True, help="Seconds between instance polls while booting (tests).")]
AllowUnarmedDeadman = Annotated[bool, typer.Option(
    "--allow-unarmed-deadman", metavar="",
    help="Run even when the dead-man switch cannot prove it can delete the host (recorded in the evidence).")]
ImageExpect = Annotated[str | None, typer.Option(
    "--image-expect", metavar="torch=V,cuda=V,cudnn=V",
    help="Override the host image check (any subset), e.g. torch=2.11.0,cuda=13.0: recorded as an override in "
         "the evidence and the report.")]
Notify = Annotated[list[str] | None, typer.Option(
    "--notify", metavar="URL",
    help="Post the run's events (rented, cap reached, interrupted, proven gone, ...) as JSON to this https URL "
         "(repeatable; http only to this machine). Never waited on; the URL is masked as a secret.")]
ImageExpectAck = Annotated[bool, typer.Option(
    "--image-expect-ack", metavar="", help="Allow --image-expect against a real (non-loopback) API.")]

# `vast-e2e run -- CMD` only (docs/run.md)
Workdir = Annotated[str | None, typer.Option(
    "--workdir", metavar="DIR",
    help="The folder to upload and run in (default .): .gitignore honoured; .git/, symlinks, the API key file, "
         "the harness's own directories and credential files (see --include) left out, each named.")]
Setup = Annotated[list[str] | None, typer.Option(
    "--setup", metavar="CMD",
    help="A shell command run in the workdir before CMD (repeatable, in order), e.g. 'pip install -r "
         "requirements.txt'.")]
Artifact = Annotated[list[str] | None, typer.Option(
    "--artifact", metavar="GLOB",
    help="Files to pull back into the run's evidence (repeatable; relative to the workdir, ** crosses folders, "
         "a folder takes all in it; smallest first). A glob that matches nothing after the run fails it (exit 1).")]
Exclude = Annotated[list[str] | None, typer.Option(
    "--exclude", metavar="GLOB",
    help="Leave these workdir files out of the upload (repeatable, .gitignore syntax); one that matches nothing "
         "is an error.")]
Include = Annotated[list[str] | None, typer.Option(
    "--include", metavar="PATH",
    help="Upload a credential file the upload leaves out by default (.env, id_rsa, .netrc, cloud and registry "
         "credentials, ...; repeatable, .gitignore syntax). The API key file and the harness's own directories "
         "are never uploaded.")]
WorkdirMaxMb = Annotated[float | None, typer.Option(
    "--workdir-max-mb", metavar="MB", help="The upload's size limit (default 100 MB).")]
Image = Annotated[str | None, typer.Option(
    "--image", metavar="REPO:TAG@sha256:DIGEST",
    help="The image, pinned by digest, its tag naming CUDA (default the smoke profile's pytorch/pytorch).")]
Gpu = Annotated[list[str] | None, typer.Option(
    "--gpu", metavar="NAME", help="A GPU model the offer may have, e.g. 'RTX 4090' (repeatable; default any).")]
MinGpuRamGb = Annotated[float | None, typer.Option(
    "--min-gpu-ram-gb", metavar="GB", help="Minimum memory per GPU, GB.")]
Command = Annotated[list[str] | None, typer.Argument(
    metavar="-- CMD [ARGS...]", show_default=False,
    help="The command, after --, run in the workdir as given (each word quoted; use sh -c '...' for shell syntax).")]

# --interruptible (docs/interruptible.md)
InterruptibleFlag = Annotated[bool, typer.Option(
    "--interruptible", metavar="",
    help="Rent an interruptible (bid) instance: cheaper, and it may be outbid; an outbid host is salvaged "
         "(--checkpoint), deleted, proven gone and replaced, within the caps.")]
Bid = Annotated[str | None, typer.Option(
    "--bid", metavar="auto|USD_PER_H",
    help="With --interruptible: the bid, $/h for the GPU (auto: the offer's min_bid plus 10%; default auto).")]
MaxInterruptions = Annotated[int | None, typer.Option(
    "--max-interruptions", metavar="K",
    help="With --interruptible: the outbids the worst case covers and the run survives (default 2).")]
Checkpoint = Annotated[str | None, typer.Option(
    "--checkpoint", metavar="DIR",
    help="With --interruptible: the workdir folder the command checkpoints into; copied off an outbid host "
         "(as `vastai copy` does) and uploaded to the next one.")]
Resume = Annotated[str | None, typer.Option(
    "--resume", metavar="CMD",
    help="With --checkpoint: the shell command that resumes from the restored folder (default: CMD again).")]
OnOutbid = Annotated[str | None, typer.Option(
    "--on-outbid", metavar="replace|wait:MINUTES",
    help="With --interruptible: rent another host at once (replace, the default), or wait up to MINUTES (within "
         "the caps) for the outbid one to resume by itself and go on there; one that does not is replaced.")]

# Kept hosts (`up`, `exec`, `keep`, `down`, `ssh`; docs/kept-host.md)
HeldName = Annotated[str, typer.Argument(
    metavar="NAME", show_default=False,
    help="The kept host's name: 1-32 lowercase letters, digits and dashes (`vast-e2e status` lists them).")]
IdleMinutes = Annotated[float | None, typer.Option(
    "--idle-minutes", metavar="MIN",
    help="The host's switch deletes it after this long without an exec or keep (default 10, at most the time "
         "cap); each exec and keep pushes it, never the cap's.")]
FullUpload = Annotated[bool, typer.Option(
    "--full-upload", metavar="", help="Send every workdir file again, not only what changed since the last upload.")]
RemoteCommand = Annotated[list[str] | None, typer.Argument(
    metavar="[-- CMD [ARGS...]]", show_default=False,
    help="One command instead of a shell, after -- (as ssh runs it).")]

# --max-usd as two commands word it: the fleet's is its total (and required), the canary's has its own default.
FleetMaxUsd = Annotated[float, typer.Option(
    "--max-usd", metavar="USD",
    help="Total cost cap of the whole fleet, dollars: the summed worst cases before renting, the summed accrual "
         "while running.")]
CanaryMaxUsd = Annotated[float | None, typer.Option(
    "--max-usd", metavar="USD", help="Cost cap of the canary rental, dollars (default 0.10).")]

JSON_OUTPUT = "json_output"  # the one shared option that is not a run option: how the command prints
SHARED = frozenset(RunOptions.model_fields) | {JSON_OUTPUT}


class OptionUsageError(typer.BadParameter):
    """A usage error (exit 2) in exactly these words. typer exports click's `BadParameter`, a usage error, but
    not its base; `BadParameter`'s own message would prefix "Invalid value:"."""

    def format_message(self) -> str:
        return self.message


def _given(ctx: typer.Context) -> frozenset[str]:
    """The shared options given on the command line (or by environment), not left at their default."""
    return frozenset(name for name in SHARED & ctx.params.keys()
                     if (source := ctx.get_parameter_source(name)) is not None
                     and source.name in ("COMMANDLINE", "ENVIRONMENT"))


def _flag_name(ctx: typer.Context, name: str) -> str:
    return next(str(p.opts[0]) for p in ctx.command.params if p.name == name)


def _merge_parent(ctx: typer.Context, values: dict[str, Any]) -> dict[str, Any]:
    """Options given before the subcommand: honoured when it takes them, refused (usage error) otherwise or
    when the subcommand's own value differs."""
    # typer hands every command its click context typed as `typer.Context`; the parent's is the same class
    parent = cast(typer.Context | None, ctx.parent)
    theirs = _given(parent) if parent is not None else frozenset()
    if parent is None or not theirs:
        return values
    command = ctx.info_name or "this command"
    refused = sorted(theirs - values.keys())
    if refused:
        names = ", ".join(_flag_name(parent, n) for n in refused)
        raise OptionUsageError(f"{names} does not apply to `{command}` (given before it); see vast-e2e {command} -h",
                               ctx=ctx)
    mine = _given(ctx)
    for name in sorted(theirs):
        if name in mine and values[name] != parent.params[name]:
            raise OptionUsageError(f"{_flag_name(parent, name)} given twice, before and after `{command}`, with "
                                   "different values", ctx=ctx)
    return values | {name: parent.params[name] for name in theirs}


class Flags(BaseModel):
    """What the command line gave one command: its run options (those given before it merged in) and --json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    options: RunOptions
    json_output: bool = False

    @classmethod
    def of(cls, ctx: typer.Context) -> Flags:
        """The shared options this command declares, as typer parsed them."""
        values = _merge_parent(ctx, {n: v for n, v in ctx.params.items() if n in SHARED})
        json_output = bool(values.pop(JSON_OUTPUT, False))
        return cls(options=RunOptions(**values), json_output=json_output)

    def spec(self, *, on_unwritable: Callable[[str], None] | None = None, no_key_hint: str | None = None,
             **changes: Any) -> RunSpec:
        """The validated run spec (spec.resolve: precedence, bounds, the key). `changes` replace options;
        `no_key_hint` ends a missing key's message for a command that takes no --sim."""
        paths = {"key_file": path_flag("--key-file", self.options.key_file), "evidence_dir": self.evidence_path}
        options = RunOptions.model_validate(self.options.model_dump() | paths | changes)
        return resolve(options, on_unwritable=on_unwritable, no_key_hint=no_key_hint)

    @property
    def evidence_path(self) -> Path | None:
        return path_flag("--evidence-dir", self.options.evidence_dir)
