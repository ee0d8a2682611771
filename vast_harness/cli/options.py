"""The command line's options, declared once, and the one object they become.

Every option is declared here, once (`OPTIONS`); a command names the ones it takes with `@takes(...)`, which
adds them to its signature for typer and hands the command one `Flags` object instead of 20 parameters.
`Flags.spec()` resolves it to a `RunSpec` through `config.resolve`, the one place where precedence and bounds
live, so a value is validated once, the same way for every command (the fleet's own `--max-usd` check once let
`inf` through). An option given before the subcommand (`vast-e2e --sim offers`) is honoured when the
subcommand takes it and refused with a message when it does not; it is never silently dropped.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from copy import copy
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict
from typer._click.core import ParameterSource  # typer vendors click
from typer._click.exceptions import UsageError

from vast_harness.spec.resolve import RunSpec, resolve
from vast_harness.spec.values import path_flag


def _opt(*names: str, text: str, metavar: str | None = None, hidden: bool = False) -> Any:
    # metavar "" for flags: the help shows `--sim`, not `--sim <bool>`
    return typer.Option(*names, help=text, metavar=metavar, hidden=hidden)


# name -> (annotation with its typer.Option, default). The one declaration of every shared option.
OPTIONS: dict[str, tuple[Any, Any]] = {
    "profile": (Annotated[str | None, _opt("--profile", metavar="NAME|PATH.toml", text=(
        "Harness profile: mfu, proofs, smoke, or your own profile file (validated like the shipped ones)."))], None),
    "num_gpus": (Annotated[int | None, _opt("--num-gpus", metavar="N", text="GPUs per offer (overrides the "
                                                                             "profile).")], None),
    "min_pcie_bw": (Annotated[float | None, _opt("--min-pcie-bw", metavar="GBPS", text="Minimum PCIe bandwidth, "
                                                                                        "GB/s.")], None),
    "key_file": (Annotated[str | None, _opt("--key-file", metavar="PATH", text=(
        "File holding the API key (chmod 600). Else VAST_API_KEY, the config file's key_file, or the official "
        "CLI's ~/.config/vastai/vast_api_key."))], None),
    "max_usd": (Annotated[float | None, _opt("--max-usd", metavar="USD", text="Cost cap in dollars (worst case "
                                                                               "before renting, accrued while "
                                                                               "running).")], None),
    "max_minutes": (Annotated[float | None, _opt("--max-minutes", metavar="MIN", text="Time cap in minutes, create "
                                                                                      "to teardown.")], None),
    "remote_env": (Annotated[list[str] | None, _opt("--remote-env", metavar="KEY=VALUE", text=(
        "A setting for the host's steps (repeatable): shown and stored as given."))], None),
    "remote_secret": (Annotated[list[str] | None, _opt("--remote-secret", metavar="KEY[=VALUE]", text=(
        "A secret for the host's steps (repeatable; KEY alone takes this environment's value): masked everywhere "
        "the harness writes, never stored."))], None),
    "remote_secret_file": (Annotated[str | None, _opt("--remote-secret-file", metavar="PATH", text=(
        "File of KEY=VALUE secret lines (chmod 600), as --remote-secret."))], None),
    "dry_run": (Annotated[bool, _opt("--dry-run", metavar="", text="Quote and plan only: read-only calls, nothing "
                                                                   "created.")], False),
    "any_driver": (Annotated[bool, _opt("--any-driver", metavar="", text=(
        "Allow drivers outside the qualified list (the record says driver_qualified: false; exit 4 on "
        "success)."))], False),
    "unqualified_ok": (Annotated[bool, _opt("--unqualified-ok", metavar="", text=(
        "With --any-driver: a pass on an unqualified driver exits 0, not 4 (for `set -e` scripts; the record "
        "still says driver_qualified: false)."))], False),
    "eight_gpu_qualified": (Annotated[bool, _opt("--eight-gpu-qualified", metavar="", text="Rent 8 GPUs, qualified "
                                                                                           "drivers only.")], False),
    "boot_retries": (Annotated[int | None, _opt("--boot-retries", metavar="N", text="Hosts to try after one fails "
                                                                                    "to boot.")], None),
    "evidence_dir": (Annotated[str | None, _opt("--evidence-dir", metavar="DIR", text=(
        "Where runs write evidence (default: the config file's evidence_dir, else the state dir: "
        "$VAST_HARNESS_HOME, else ~/.local/state/vast-harness). The ledger stays in the state dir."))], None),
    "api_url": (Annotated[str | None, _opt("--api-url", metavar="URL", text="API base URL (default Vast; VAST_URL "
                                                                            "honoured).")], None),
    "sim": (Annotated[bool, _opt("--sim", metavar="", text="Start the embedded simulator and run against it (no "
                                                           "key).")], False),
    "json_output": (Annotated[bool, _opt("--json", metavar="", text="One JSON object on stdout (progress on "
                                                                    "stderr).")], False),
    "proof_interval": (Annotated[float | None, _opt("--proof-interval", metavar="S", text=(
        "Seconds between the two absence-proof rounds (default 10 against Vast, 0.5 with --sim)."))], None),
    "pacing_scale": (Annotated[float | None, _opt("--pacing-scale", metavar="F", hidden=True,
                                                  text="Scale the client's rate-limit pacing (tests).")], None),
    "poll_interval": (Annotated[float | None, _opt("--poll-interval", metavar="S", hidden=True,
                                                   text="Seconds between instance polls while booting (tests).")],
                      None),
    "allow_unarmed_deadman": (Annotated[bool, _opt("--allow-unarmed-deadman", metavar="", text=(
        "Run even when the dead-man switch cannot prove it can delete the host (recorded in the evidence)."))],
                              False),
    "image_expect": (Annotated[str | None, _opt("--image-expect", metavar="torch=V,cuda=V,cudnn=V", text=(
        "Override the host image check (any subset), e.g. torch=2.11.0,cuda=13.0: recorded as an override in "
        "the evidence and the report."))], None),
    "image_expect_ack": (Annotated[bool, _opt("--image-expect-ack", metavar="", text=(
        "Allow --image-expect against a real (non-loopback) API."))], False),
}

RUN = tuple(OPTIONS)  # the main run takes every option
OFFERS = ("profile", "num_gpus", "min_pcie_bw", "key_file", "max_usd", "max_minutes", "any_driver",
          "eight_gpu_qualified", "api_url", "sim", "json_output", "pacing_scale", "evidence_dir")
FLEET = tuple(n for n in RUN if n != "eight_gpu_qualified")
CHECK = ("profile", "key_file", "api_url", "sim", "json_output", "pacing_scale")
CANARY = ("max_usd", "max_minutes", "profile", "key_file", "evidence_dir", "api_url", "sim", "json_output",
          "proof_interval", "pacing_scale", "poll_interval")
STATUS = ("key_file", "api_url", "json_output", "pacing_scale")
REAP = ("key_file", "evidence_dir", "api_url", "json_output", "proof_interval", "pacing_scale")
EVIDENCE = ("evidence_dir", "json_output")  # report, logs, costs: read the evidence, call nothing


class Flags(BaseModel):
    """Every option's value as given (None/False when not), and which were given on the command line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = None
    num_gpus: int | None = None
    min_pcie_bw: float | None = None
    key_file: str | None = None
    max_usd: float | None = None
    max_minutes: float | None = None
    remote_env: list[str] | None = None
    remote_secret: list[str] | None = None
    remote_secret_file: str | None = None
    dry_run: bool = False
    any_driver: bool = False
    unqualified_ok: bool = False
    eight_gpu_qualified: bool = False
    boot_retries: int | None = None
    evidence_dir: str | None = None
    api_url: str | None = None
    sim: bool = False
    json_output: bool = False
    proof_interval: float | None = None
    pacing_scale: float | None = None
    poll_interval: float | None = None
    allow_unarmed_deadman: bool = False
    image_expect: str | None = None
    image_expect_ack: bool = False
    given: frozenset[str] = frozenset()

    def spec(self, *, profile: str | None = None, **overrides: Any) -> RunSpec:
        """The validated run spec (config.resolve: precedence, bounds, the key). `overrides` replace flags."""
        values: dict[str, Any] = {
            "profile": self.profile if profile is None else profile, "num_gpus": self.num_gpus, "min_pcie_bw": self.min_pcie_bw,
            "key_file": path_flag("--key-file", self.key_file), "max_usd": self.max_usd,
            "max_minutes": self.max_minutes, "remote_env": self.remote_env, "remote_secret": self.remote_secret,
            "remote_secret_file": self.remote_secret_file, "dry_run": self.dry_run, "any_driver": self.any_driver,
            "unqualified_ok": self.unqualified_ok, "eight_gpu_qualified": self.eight_gpu_qualified,
            "boot_retries": self.boot_retries, "evidence_dir": path_flag("--evidence-dir", self.evidence_dir),
            "api_url": self.api_url, "sim": self.sim, "proof_interval_s": self.proof_interval,
            "pacing_scale": self.pacing_scale, "poll_s": self.poll_interval,
            "allow_unarmed_deadman": self.allow_unarmed_deadman, "image_expect": self.image_expect,
            "image_expect_ack": self.image_expect_ack,
        }
        return resolve(**(values | overrides))

    @property
    def evidence_path(self) -> Path | None:
        return path_flag("--evidence-dir", self.evidence_dir)


def _flag_name(name: str) -> str:
    info = OPTIONS[name][0].__metadata__[0]
    return str(info.param_decls[0]) if info.param_decls else f"--{name.replace('_', '-')}"


def _given(ctx: typer.Context, names: tuple[str, ...]) -> frozenset[str]:
    return frozenset(n for n in names if ctx.get_parameter_source(n) in (ParameterSource.COMMANDLINE,
                                                                          ParameterSource.ENVIRONMENT))


def merge_parent(ctx: typer.Context, flags: Flags, accepted: tuple[str, ...]) -> Flags:
    """Options given before the subcommand: honoured when it takes them, refused (usage error) otherwise or
    when the subcommand's own value differs."""
    parent = ctx.find_object(Flags)
    if parent is None or not parent.given:
        return flags
    command = ctx.info_name or "this command"
    refused = sorted(n for n in parent.given if n not in accepted)
    if refused:
        names = ", ".join(_flag_name(n) for n in refused)
        raise UsageError(f"{names} does not apply to `{command}` (given before it); see vast-e2e {command} -h",
                         ctx=ctx)
    update: dict[str, Any] = {}
    for name in sorted(parent.given):
        mine, theirs = getattr(flags, name), getattr(parent, name)
        if name in flags.given and mine != theirs:
            raise UsageError(f"{_flag_name(name)} given twice, before and after `{command}`, with different "
                             "values", ctx=ctx)
        update[name] = theirs
    return flags.model_copy(update=update | {"given": flags.given | parent.given})


def takes(*names: str, help_overrides: dict[str, str] | None = None,
          required: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the named shared options to a command's signature; the command receives them as `flags: Flags`.
    `help_overrides` rewords an option for this command; `required` makes it required here."""
    overrides = help_overrides or {}

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name not in ("flags", "ctx")]
        extra = []
        for name in names:
            annotation, default = OPTIONS[name]
            base, info = annotation.__origin__, copy(annotation.__metadata__[0])
            if name in overrides:
                info.help = overrides[name]
            if name in required:
                default = ...
            extra.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                           annotation=Annotated[base, info]))
        ctx_param = inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context)

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            ctx: typer.Context = kwargs.pop("ctx")
            values = {n: kwargs.pop(n) for n in names}
            flags = Flags(**values, given=_given(ctx, names))
            return fn(ctx=ctx, flags=merge_parent(ctx, flags, names), **kwargs)

        params = [ctx_param, *[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own], *extra]
        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return decorate
