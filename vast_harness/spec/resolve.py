"""The validated run spec, and the one place that builds it: `resolve` takes the flags as given (`RunOptions`)
and lays flag > environment > user config > profile, in that order, over the target's timings.

Everything that can be wrong with the input is found here (or by the parsers in `values`, `profile` and `user`)
and raised as ConfigError naming the flag or field, before any network call. Before any of it, every key and
secret the inputs hold is told to the process's masker (`known_secrets`), so no message can quote one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

from vast_harness.console.notify import notify_urls
from vast_harness.errors import ConfigError, UnwritableDirError
from vast_harness.masking import ACCOUNT_KEY, MASKER, Masker
from vast_harness.spec.command import MAX_GPU_RAM_GB, CommandRun, command_profile, with_cap_timeouts
from vast_harness.spec.fit import FIT_SETTINGS, HOST_VAR, WorkloadFit, workload_fit
from vast_harness.spec.interruptible import RSYNC_MISSING, Interruptible, parse_interruptible
from vast_harness.spec.known_secrets import teach_inputs
from vast_harness.spec.profile import (
    NUM_GPUS_PLACEHOLDER,
    PROFILES_DIR,
    Caps,
    Filters,
    HarnessProfile,
    ImageExpect,
    load_profile,
    parse_image_expect,
    validation_message,
    with_image_expect,
)
from vast_harness.spec.receipt import check_receipt_budget
from vast_harness.spec.references import check_gates, load_references
from vast_harness.spec.requires import MAX_GPU_RAM_GIB, MIB_PER_GIB
from vast_harness.spec.user import CONFIG_FILE, OFFICIAL_CLI_KEY_FILE, UserConfig, config_home, read_api_key
from vast_harness.spec.values import (
    MAX_BOOT_RETRIES,
    MAX_INTERVAL_S,
    MAX_PACING_SCALE,
    MAX_PCIE_GBPS,
    MAX_USD_LIMIT,
    check_evidence_dir,
    check_number,
    check_own_dir,
    mask_env,
    parse_remote_env,
    path_flag,
    read_secret_file,
    secret_like_settings,
)
from vast_harness.spec.workdir import NeverUpload, select_workdir
from vast_harness.state.dirs import SIM_SUBDIR, STATE_ENV
from vast_harness.state.dirs import state_dir as user_state_dir
from vast_harness.timings import MAX_MINUTES_LIMIT, Timings
from vast_harness.vast.url import DEFAULT_API_URL, is_loopback_url, validate_api_url

# Against a real API the absence proof's two rounds must be this far apart, and pacing may not go below
# Vast's own rate limits: lower values are for the simulator (loopback or --sim) only.
REAL_PROOF_INTERVAL_FLOOR_S = 10.0
REAL_PACING_SCALE_FLOOR = 1.0


class RunSpec(BaseModel):
    """Everything a run needs, validated. Built only by `resolve`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    profile: HarnessProfile
    filters: Filters
    caps: Caps
    # Where caps.max_usd came from, as a message names it: "--max-usd", "max_usd (config file)", "profile smoke"
    max_usd_source: str = "--max-usd"
    remote_env: dict[str, str]  # settings: shown and stored as given
    remote_secrets: dict[str, SecretStr] = Field(default_factory=dict)  # masked everywhere; stored by name only
    api_url: str
    api_key: SecretStr | None  # None with --sim until the embedded simulator is up
    dry_run: bool = False
    any_driver: bool = False
    eight_gpu_qualified: bool = False
    unqualified_ok: bool = False  # exit 0 instead of 4 for a pass on an unqualified driver (--any-driver runs)
    boot_retries: int = 0
    evidence_dir: Path
    state_dir: Path  # the user's ledger and live-run registrations (state/dirs.py); evidence by default
    sim: bool = False
    timings: Timings  # the table for this target (timings.py), the user's flags laid over it
    allow_unarmed_deadman: bool = False  # run even when the dead-man switch cannot prove it can act (recorded)
    image_expect_override: ImageExpect | None = None  # --image-expect: recorded in the evidence and the report
    notify: list[str] = Field(default_factory=list)  # --notify URLs, checked (console/notify.py); masked as secrets
    # Never uploaded from a workdir, whatever the flags: the key files, the harness's config and state
    never_upload: tuple[NeverUpload, ...] = ()
    hints: tuple[str, ...] = ()  # said before the run or in the dry run: a setting that looks like a secret
    interruptible: Interruptible | None = None  # --interruptible: bid instances, outbids salvaged and replaced

    @property
    def harness_dirs(self) -> tuple[Path, ...]:
        """The harness's own state and evidence, never uploaded from a workdir: a --sim run's state is a part
        of the user's state dir (`<state>/sim`), whose real ledger and runs are left out as well."""
        own = [self.state_dir, self.evidence_dir]
        if self.sim and self.state_dir.name == SIM_SUBDIR:
            own.append(self.state_dir.parent)
        return tuple(own)

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        if self.any_driver and self.eight_gpu_qualified:
            raise ValueError("--any-driver and --eight-gpu-qualified contradict each other")
        both = sorted(set(self.remote_env) & set(self.remote_secrets))
        if both:
            raise ValueError(f"{', '.join(both)} given both as --remote-env and as a secret: give it once")
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        # pydantic's `update` skips validation: a key that is not a field (`poll_s`, read from `timings`)
        # would be dropped without a word. Refused instead.
        unknown = sorted(set(update or {}) - set(type(self).model_fields))
        if unknown:
            raise TypeError(f"RunSpec has no field {', '.join(unknown)} (timings change with with_timings)")
        return super().model_copy(update=update, deep=deep)

    def with_timings(self, **changes: float) -> RunSpec:
        """This spec with some timings replaced, validated (tests and chaos scale the clocks down)."""
        return self.model_copy(update={"timings": Timings.model_validate(self.timings.model_dump() | changes)})

    # Shorthands for the `timings` the phases read; not fields of their own (with_timings changes them).
    @property
    def proof_interval_s(self) -> float:
        return self.timings.proof_interval_s

    @property
    def teardown_margin_s(self) -> float:
        return self.timings.teardown_margin_s

    @property
    def poll_s(self) -> float:
        return self.timings.poll_s

    @property
    def deadman_grace_s(self) -> float:
        return self.timings.deadman_grace_s

    @property
    def deadman_allowance_s(self) -> int:
        """How long after its host boots the dead-man switch deletes the instance: the time cap plus its grace."""
        return int(self.max_seconds + self.timings.deadman_grace_s)

    @property
    def pacing_scale(self) -> float:
        return self.timings.pacing_scale

    @property
    def shown_remote_env(self) -> dict[str, str]:
        """What the dry run, the record and the reports show: settings as given, secrets as `***`."""
        return dict(self.remote_env) | mask_env(self.remote_secrets)

    @property
    def host_env(self) -> dict[str, str]:
        """The steps' environment on the host: settings and secrets, by value."""
        return dict(self.remote_env) | {k: v.get_secret_value() for k, v in self.remote_secrets.items()}

    def teach_masker(self) -> Masker:
        """The process's masker, told this spec's key and secrets (resolve told it already; a spec copied with
        another key, the simulator's, is told here)."""
        if self.api_key is not None:
            MASKER.add(self.api_key.get_secret_value(), ACCOUNT_KEY)
        for name, value in self.remote_secrets.items():
            MASKER.add(value.get_secret_value(), name)
        return MASKER

    @property
    def account_keys(self) -> tuple[str, ...]:
        """The account keys a workdir file must not hold (the one this run uses, and every one read)."""
        return known_account_keys(self.api_key.get_secret_value() if self.api_key else None)

    @property
    def redactor(self) -> Masker:
        """What masks this run's key and secrets (with every other this process knows) in what it writes."""
        return self.teach_masker()

    @property
    def max_seconds(self) -> float:
        return self.caps.max_minutes * 60.0

    @property
    def fit(self) -> WorkloadFit | None:
        """The memory fit of the profile's 1B runs under this run's settings (spec/fit.py); None: no step makes
        one. Computed from the profile each time, so a spec whose steps are swapped (fleet --sim) has its own."""
        return profile_fit(self.profile, self.remote_env, self.filters.num_gpus)


class RunOptions(BaseModel):
    """What a run is asked to be: every flag's value as given (None or False when not), before precedence,
    defaults and bounds are applied. `resolve` turns it into a `RunSpec`; nothing here is checked yet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | None = None  # a shipped name or a profile file; required by `resolve`
    num_gpus: int | None = None
    min_pcie_bw: float | None = None
    key_file: Path | str | None = None
    max_usd: float | None = None
    max_minutes: float | None = None
    remote_env: list[str] | None = None
    remote_secret: list[str] | None = None
    remote_secret_file: Path | str | None = None
    dry_run: bool = False
    any_driver: bool = False
    eight_gpu_qualified: bool = False
    unqualified_ok: bool = False
    boot_retries: int | None = None
    evidence_dir: Path | str | None = None
    api_url: str | None = None
    sim: bool = False
    proof_interval_s: float | None = None
    pacing_scale: float | None = None
    poll_s: float | None = None
    allow_unarmed_deadman: bool = False
    image_expect: str | None = None
    image_expect_ack: bool = False
    notify: list[str] | None = None  # receivers of the run's events (docs/notifications.md)
    state_dir: Path | None = None  # the ledger's home (default: the user's state dir, by the environment)
    # `vast-e2e run -- CMD` (spec/command.py): the command replaces the profile
    command: list[str] | None = None
    workdir: str | None = None
    setup: list[str] | None = None
    artifact: list[str] | None = None
    exclude: list[str] | None = None
    include: list[str] | None = None
    workdir_max_mb: float | None = None
    image: str | None = None
    gpu: list[str] | None = None
    min_gpu_ram_gb: float | None = None
    # --interruptible (spec/interruptible.py)
    interruptible: bool = False
    bid: str | None = None
    max_interruptions: int | None = None
    checkpoint: str | None = None
    resume: str | None = None
    on_outbid: str | None = None



def known_account_keys(key: str | None) -> tuple[str, ...]:
    """`key` and every account key the masker was told (with --sim: the key file or VAST_API_KEY given, read to
    mask them); a workdir file that holds one stays home, whatever its name."""
    return tuple(dict.fromkeys([*([key] if key else []), *MASKER.values(ACCOUNT_KEY)]))


def never_upload(*, key_file: Path | None, config_key_file: str | None, environ: Mapping[str, str],
                 dirs: list[tuple[Path, str]]) -> tuple[NeverUpload, ...]:
    """What no workdir upload takes: the key file given (read or not: with --sim it is not), the config file's,
    the official CLI's (where `vastai set api-key` writes it, and its older place in $HOME), the harness's config
    directory, and `dirs` (the state and evidence directories)."""
    home = config_home(environ)
    found = [(key_file, "the API key file (--key-file)"),
             (Path(config_key_file) if config_key_file else None, "the API key file (the config file's key_file)"),
             (home / OFFICIAL_CLI_KEY_FILE if home else None, "the official CLI's API key file"),
             # without the `xdg` package the official CLI reads ~/.config whatever XDG_CONFIG_HOME says
             (Path(environ["HOME"]) / ".config" / OFFICIAL_CLI_KEY_FILE if environ.get("HOME") else None,
              "the official CLI's API key file"),
             (Path(environ["HOME"]) / ".vast_api_key" if environ.get("HOME") else None,
              "the official CLI's API key file"),
             (home / CONFIG_FILE.parent if home else None, "the harness's config directory"),
             *dirs]
    return tuple(NeverUpload(path=path.expanduser(), why=why) for path, why in found if path is not None)


def profile_fit(prof: HarnessProfile, env: Mapping[str, str], num_gpus: int) -> WorkloadFit | None:
    return workload_fit(((s.name, s.fit) for s in prof.steps), env, num_gpus)


def with_fit(prof: HarnessProfile, env: dict[str, str], num_gpus: int, secrets: Mapping[str, str]) -> HarnessProfile:
    """The fit's settings checked (exit 2 naming the bad one), its decisions exported to the host (HT_FIT, into
    `env`), and the least memory it needs made the profile's memory floor: it narrows the search and the host
    that arrives is held to it (`[requires]`, docs/profiles.md#the-memory-fit)."""
    if HOST_VAR in env or HOST_VAR in secrets:
        raise ConfigError(f"{HOST_VAR} is written by the harness from the run's settings (docs/profiles.md#the-memory-"
                          "fit); set HT_MFU_MB, HT_ACT_CKPT and the like instead")
    fit = profile_fit(prof, env, num_gpus)
    if fit is None:
        return prof
    hidden = sorted(set(FIT_SETTINGS) & set(secrets))
    if hidden:  # the host would run what the fit never saw
        raise ConfigError(f"{', '.join(hidden)}: the memory fit reads it to choose the offer; give it as a setting "
                          "(--remote-env), not a secret")
    env[HOST_VAR] = fit.host_value()
    floor = min(round(fit.floor_gib, 2), MAX_GPU_RAM_GIB)
    if floor <= prof.requires.min_gpu_ram_gib:
        return prof
    return prof.model_copy(update={"requires": prof.requires.model_copy(update={"min_gpu_ram_gib": floor})})


def with_flag_requires(prof: HarnessProfile, gpus: list[str], min_gpu_ram_gb: float | None) -> HarnessProfile:
    """`--gpu` and `--min-gpu-ram-gb` are requirements (they narrow the search, a dropped offer family is named
    with its reason, and the host that arrives is held to them). They only narrow what a profile requires: its
    own GPU list stays the outer bound, its memory floor wins when larger. The flag's GB is the search's
    1000 MB, in the MiB Vast's `gpu_ram` is written in."""
    req = prof.requires
    update: dict[str, object] = {}
    if gpus:
        allowed = [g for g in gpus if not req.gpu_names or g in req.gpu_names]
        if not allowed:
            raise ConfigError(f"--gpu {', '.join(gpus)}: profile {prof.name} runs only on "
                              f"{', '.join(req.gpu_names)} ([requires] gpu_names)")
        update["gpu_names"] = allowed
    if min_gpu_ram_gb:
        update["min_gpu_ram_gib"] = max(req.min_gpu_ram_gib, round(min_gpu_ram_gb * 1000 / MIB_PER_GIB, 2))
    return prof.model_copy(update={"requires": req.model_copy(update=update)}) if update else prof


def resolve(
    options: RunOptions,
    *,
    environ: Mapping[str, str] | None = None,
    profiles_dir: Path = PROFILES_DIR,
    on_unwritable: Callable[[str], None] | None = None,
    unwritable_goes_on: str = "reaping anyway; what cannot be written is skipped",
    no_key_hint: str | None = None,
) -> RunSpec:
    """Flags > environment (VAST_API_KEY, VAST_URL) > the user's config file > profile, validated. Raises
    ConfigError naming the offending flag or field. `environ` and `profiles_dir` say where to read (default:
    this process's environment, the shipped profiles). An evidence or state dir that takes no writes is refused,
    unless `on_unwritable` is given: then it is told, with `unwritable_goes_on` (a reap, or a kept host's `down`,
    warns and goes on deleting)."""
    o = options
    environ = os.environ if environ is None else environ
    teach_inputs(environ=environ, key_file=o.key_file, secret_items=o.remote_secret or [],
                 secret_file=o.remote_secret_file, notify_urls=o.notify or [])
    if o.command is not None and o.profile is not None:
        raise ConfigError("run takes a command or a profile, not both: put the steps in the profile file, or drop "
                          "--profile")
    if o.profile is None and o.command is None:
        raise ConfigError("a profile is required (mfu, proofs, smoke or a profile file)")
    user, _ = UserConfig.load(environ)
    if o.command is not None:
        prof = command_profile(CommandRun(command=o.command, workdir="." if o.workdir is None else o.workdir,
                                          setup=o.setup or [], artifacts=o.artifact or [], exclude=o.exclude or [],
                                          include=o.include or [], workdir_max_mb=o.workdir_max_mb, image=o.image),
                               profiles_dir=profiles_dir)
    else:
        run_only = [f for f in ("workdir", "setup", "artifact", "exclude", "include", "workdir_max_mb", "image")
                    if getattr(o, f) is not None]
        if run_only:
            raise ConfigError(f"--{run_only[0].replace('_', '-')} applies to `vast-e2e run -- CMD` only; a profile "
                              "says it in its file ([workdir], artifacts, image)")
        prof = load_profile(o.profile or "", profiles_dir)
    if o.unqualified_ok and not o.any_driver:
        raise ConfigError("--unqualified-ok only applies with --any-driver (without it no run passes on an "
                          "unqualified driver)")
    max_usd = o.max_usd if o.max_usd is not None else user.max_usd
    max_usd_source = ("--max-usd" if o.max_usd is not None else "max_usd (config file)" if user.max_usd is not None
                      else "vast-e2e run's default" if o.command is not None else f"profile {prof.name}")
    if o.eight_gpu_qualified and o.num_gpus is not None and o.num_gpus != 8:
        raise ConfigError(f"--eight-gpu-qualified rents 8 GPUs; --num-gpus {o.num_gpus} contradicts it: give one of "
                          "them")
    max_minutes = o.max_minutes if o.max_minutes is not None else user.max_minutes
    notify = (notify_urls(o.notify, "--notify") if o.notify
              else notify_urls(user.notify or [], "notify (config file)"))
    ev_source = "--evidence-dir" if o.evidence_dir is not None else "evidence_dir (config file)"
    evidence_given = o.evidence_dir if o.evidence_dir is not None else user.evidence_dir
    check_number("--max-usd", max_usd, low=0, high=MAX_USD_LIMIT, low_inclusive=False)
    check_number("--max-minutes", max_minutes, low=0, high=MAX_MINUTES_LIMIT, low_inclusive=False)
    check_number("--min-pcie-bw", o.min_pcie_bw, low=0, high=MAX_PCIE_GBPS)
    check_number("--num-gpus", o.num_gpus, low=1, high=16)
    check_number("--boot-retries", o.boot_retries, low=0, high=MAX_BOOT_RETRIES)
    check_number("--min-gpu-ram-gb", o.min_gpu_ram_gb, low=0, high=MAX_GPU_RAM_GB)
    for name in o.gpu or []:
        if not name.strip():
            raise ConfigError("--gpu: an empty GPU name; give one such as 'RTX 4090' (repeat --gpu for several)")
    check_number("--proof-interval", o.proof_interval_s, low=0, high=MAX_INTERVAL_S)
    check_number("--poll-interval", o.poll_s, low=0, high=MAX_INTERVAL_S, low_inclusive=False)
    check_number("--pacing-scale", o.pacing_scale, low=0, high=MAX_PACING_SCALE)
    evidence_dir = path_flag("--evidence-dir", evidence_given)
    key_file = path_flag("--key-file", o.key_file)
    bid_terms = parse_interruptible(interruptible=o.interruptible, bid=o.bid, max_interruptions=o.max_interruptions,
                                    checkpoint=o.checkpoint, resume=o.resume, on_outbid=o.on_outbid,
                                    workdir=(o.workdir or ".") if o.command is not None else None)
    if bid_terms is not None and bid_terms.checkpoint is not None and shutil.which("rsync") is None:
        raise ConfigError(RSYNC_MISSING)

    prof = with_flag_requires(prof, [n.strip() for n in o.gpu or []], o.min_gpu_ram_gb)
    filters = prof.filters.model_copy(
        update={
            k: v
            for k, v in {
                "num_gpus": 8 if o.eight_gpu_qualified else o.num_gpus,
                "min_pcie_bw_gbps": o.min_pcie_bw,
            }.items()
            if v is not None
        }
    )
    caps = Caps(
        max_usd=max_usd if max_usd is not None else prof.caps.max_usd,
        max_minutes=max_minutes if max_minutes is not None else prof.caps.max_minutes,
    )
    if o.command is not None:
        prof = with_cap_timeouts(prof, caps.max_minutes * 60.0)
    given_env = parse_remote_env(o.remote_env or [])
    secret_file = path_flag("--remote-secret-file", o.remote_secret_file)
    secrets = read_secret_file(secret_file) if secret_file is not None else {}
    secrets.update(parse_remote_env(o.remote_secret or [], flag="--remote-secret", environ=environ, secret=True))
    # `{num_gpus}` follows --num-gpus / --eight-gpu-qualified (the mfu sweep's world sizes); --remote-env wins;
    # a secret named like one of the profile's settings replaces it (a flag given twice is refused below)
    profile_env = {k: v.replace(NUM_GPUS_PLACEHOLDER, str(filters.num_gpus)) for k, v in prof.remote_env.items()}
    env = {k: v for k, v in profile_env.items() if k not in secrets} | given_env
    prof = with_fit(prof, env, filters.num_gpus, secrets)

    if o.api_url is not None:  # given, even empty: never silently replaced by VAST_URL or the real console
        url = validate_api_url(o.api_url, environ=environ)
    elif environ.get("VAST_URL") is not None:
        url = validate_api_url(environ["VAST_URL"], "VAST_URL", environ)
    else:
        url = DEFAULT_API_URL
    if not (o.sim or is_loopback_url(url)):  # the safety floors hold against any real API
        if o.proof_interval_s is not None and o.proof_interval_s < REAL_PROOF_INTERVAL_FLOOR_S:
            raise ConfigError(f"--proof-interval {o.proof_interval_s:g} is below the {REAL_PROOF_INTERVAL_FLOOR_S:g} s "
                              f"floor against {url}; lower values are for the simulator (loopback or --sim)")
        if o.pacing_scale is not None and o.pacing_scale < REAL_PACING_SCALE_FLOOR:
            raise ConfigError(f"--pacing-scale {o.pacing_scale:g} is below {REAL_PACING_SCALE_FLOOR:g} against {url}: "
                              "Vast's rate limits cannot be scaled down; lower values are for the simulator")
    override = None
    if o.image_expect is not None:
        override = parse_image_expect(o.image_expect, prof.image_expect)
        if not (o.sim or is_loopback_url(url) or o.image_expect_ack):
            raise ConfigError(f"--image-expect overrides the profile's image check against {url}: a real rental "
                              "could run on an image the profile was not measured with. Add --image-expect-ack "
                              "to do it anyway (the override is recorded in the evidence and the report)")
        prof = with_image_expect(prof, override)
    elif o.image_expect_ack:
        raise ConfigError("--image-expect-ack acknowledges an --image-expect override; none was given")
    if prof.receipt.declared_gates:  # a gate the GPUs to be rented cannot report: exit 2 now, not after renting
        check_gates(prof.receipt, num_gpus=filters.num_gpus, gpu_names=filters.gpu_names or prof.requires.gpu_names,
                    refs=load_references(profiles_dir))
    key = None if o.sim else read_api_key(key_file, environ, path_flag("key_file (config file)", user.key_file),
                                          **({"hint": no_key_hint} if no_key_hint else {}))
    # --sim runs keep their own state: the embedded simulator's account dies with the process, so its ledger
    # lines must never make a reap of the real account exit 3.
    state = (o.state_dir or (user_state_dir(environ) / SIM_SUBDIR if o.sim else user_state_dir(environ))).expanduser()
    ev_dir = (evidence_dir or state).expanduser()  # never site-packages, never the current directory
    state_name = f"the state directory (${STATE_ENV})" if environ.get(STATE_ENV) else "the state directory"
    for own in dict.fromkeys([state, state.parent] if o.state_dir is None and o.sim else [state]):  # --sim: <home>/sim
        check_own_dir(own, state_name)
    check_own_dir(ev_dir, ev_source if evidence_dir is not None else state_name)
    if not o.dry_run:  # a run writes its ledger and evidence here: find out now, not after renting
        checks = [(ev_dir, ev_source if evidence_dir is not None else state_name)]
        checks += [(state, state_name)] if state != ev_dir else []
        for path, name in checks:
            try:
                check_evidence_dir(path, name, **({"consequence": unwritable_goes_on} if on_unwritable else {}))
            except UnwritableDirError as exc:
                if on_unwritable is None:
                    raise
                on_unwritable(str(exc))
    never = never_upload(key_file=key_file, config_key_file=user.key_file, environ=environ,
                         dirs=[(state, "the harness's state directory"),
                               (user_state_dir(environ).expanduser(), "the harness's state directory"),
                               (ev_dir, "the harness's evidence directory")])
    if prof.workdir is not None:  # missing, over the size limit, an --exclude that matches nothing: exit 2 now
        select_workdir(Path(prof.workdir.path), exclude=prof.workdir.exclude, include=prof.workdir.include,
                       max_mb=prof.workdir.max_mb, never_upload=never,
                       account_keys=known_account_keys(key.get_secret_value() if key else None))
    # The one place a run's timings are chosen: the simulator's table with --sim, else Vast's; flags win.
    timing_flags = {"proof_interval_s": o.proof_interval_s, "poll_s": o.poll_s, "pacing_scale": o.pacing_scale}
    table = Timings.sim() if o.sim else Timings.real()
    try:
        timings = Timings.model_validate(table.model_dump() | {k: v for k, v in timing_flags.items() if v is not None})
        check_receipt_budget(prof.receipt, timings)
        return RunSpec(
            profile=prof,
            filters=filters,
            caps=caps,
            max_usd_source=max_usd_source,
            remote_env=env,
            remote_secrets={k: SecretStr(v) for k, v in secrets.items()},
            api_url=url,
            api_key=key,
            dry_run=o.dry_run,
            any_driver=o.any_driver,
            eight_gpu_qualified=o.eight_gpu_qualified,
            unqualified_ok=o.unqualified_ok,
            boot_retries=prof.boot_retries if o.boot_retries is None else o.boot_retries,
            evidence_dir=ev_dir,
            state_dir=state,
            sim=o.sim,
            timings=timings,
            allow_unarmed_deadman=o.allow_unarmed_deadman,
            image_expect_override=override,
            notify=notify,
            never_upload=never,
            hints=tuple(secret_like_settings(list(given_env))),
            interruptible=bid_terms,
        )
    except ValidationError as exc:
        raise ConfigError(validation_message("run spec", exc)) from None
