"""Harness profiles (data in `profiles/harness/*.toml`) and the validated run spec built from them and the flags.

Precedence is decided in one place, `resolve`: flag > environment > profile. Everything that can be wrong with
the input is found here and raised as ConfigError naming the flag or field, before any network call.
"""

from __future__ import annotations

import os
import re
import stat
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from vast_harness.errors import ConfigError
from vast_harness.models import pack_driver_version
from vast_harness.resources import profiles_dir as _profiles_dir

PROFILES_DIR = _profiles_dir()  # the checkout's profiles/, or the wheel's packaged copy (resources.py)
DEFAULT_API_URL = "https://console.vast.ai"
PROFILE_NAMES = ("mfu", "proofs", "smoke")
LABEL_PREFIX = "vh-"

_DIGEST_RE = re.compile(r"^[a-z0-9][a-z0-9._/-]*(:[A-Za-z0-9._-]+)?@sha256:[0-9a-f]{64}$")
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Step(_Strict):
    """One command of the plan, run over SSH in the workload directory on the host."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    run: str
    timeout_s: float = Field(gt=0, default=600)
    workload: bool = True  # counts as the workload's own time (vs harness overhead) in the figures


class Filters(_Strict):
    num_gpus: int = Field(ge=1, le=16, default=1)
    gpu_names: list[str] = Field(default_factory=list)  # empty: any GPU
    min_pcie_bw_gbps: float = Field(ge=0, default=0)
    min_reliability: float = Field(ge=0, le=1, default=0.98)
    min_direct_ports: int = Field(ge=0, default=1)
    min_inet_down_mbps: float = Field(ge=0, default=100)
    min_gpu_ram_gb: float = Field(ge=0, default=0)
    verified: bool = True


class Caps(_Strict):
    max_usd: float = Field(gt=0)
    max_minutes: float = Field(gt=0)


class Transfer(_Strict):
    """Bytes the quote charges for: the bundle uploaded and the evidence expected back."""

    expected_evidence_mb: float = Field(ge=0, default=20)
    upload_extra_mb: float = Field(ge=0, default=0)  # e.g. wheels that travel with the bundle


class HarnessProfile(_Strict):
    name: str
    description: str = ""
    image: str
    image_tag: str = ""
    image_digest_verified: bool = False
    image_cuda: float = Field(gt=0)
    disk_gb: float = Field(ge=8, default=40)
    boot_retries: int = Field(ge=0, default=1)
    boot_timeout_s: float = Field(gt=0, default=900)
    caps: Caps
    filters: Filters = Filters()
    transfer: Transfer = Transfer()
    remote_env: dict[str, str] = Field(default_factory=dict)
    steps: list[Step]
    pytest_node_ids: list[str] = Field(default_factory=list)
    evidence_glob: str = "evidence/*"
    require_gpu: bool = True

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        if not _DIGEST_RE.match(value):
            raise ValueError(f"image {value!r} must be pinned by digest: repo@sha256:<64 hex>")
        return value

    @field_validator("steps")
    @classmethod
    def _unique_steps(cls, steps: list[Step]) -> list[Step]:
        names = [s.name for s in steps]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate step names: {sorted(dupes)}")
        if not steps:
            raise ValueError("a profile needs at least one step")
        return steps


class QualifiedDriver(_Strict):
    branch: int
    min_version: str
    note: str = ""


class DriverPolicy(BaseModel):
    """The qualified-drivers list: an offer's driver qualifies if its branch is listed at or above min."""

    drivers: list[QualifiedDriver]

    @cached_property
    def _min_by_branch(self) -> dict[int, int]:
        return {d.branch: pack_driver_version(d.min_version) for d in self.drivers}

    def qualifies(self, version: str | None) -> bool:
        if not version:
            return False
        try:
            packed = pack_driver_version(version)
        except ValueError:
            return False
        floor = self._min_by_branch.get(packed // 1_000_000)
        return floor is not None and packed >= floor


def _load_toml(path: Path) -> dict:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def _validation_message(source: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{source}: field {where}: {first['msg']}"


def load_profile(name: str, profiles_dir: Path = PROFILES_DIR) -> HarnessProfile:
    if name not in PROFILE_NAMES:
        raise ConfigError(f"--profile: unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}")
    path = profiles_dir / "harness" / f"{name}.toml"
    try:
        return HarnessProfile.model_validate(_load_toml(path))
    except ValidationError as exc:
        raise ConfigError(_validation_message(str(path), exc)) from None


def load_driver_policy(profiles_dir: Path = PROFILES_DIR) -> DriverPolicy:
    path = profiles_dir / "qualified-drivers.toml"
    try:
        return DriverPolicy(drivers=_load_toml(path).get("driver", []))
    except ValidationError as exc:
        raise ConfigError(_validation_message(str(path), exc)) from None


def parse_remote_env(items: list[str]) -> dict[str, str]:
    """`KEY=VALUE` pairs from repeated --remote-env flags. A malformed item is a ConfigError naming it."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY_RE.match(key):
            shown = key if _ENV_KEY_RE.match(key) else "<malformed>"
            raise ConfigError(
                f"--remote-env: expected KEY=VALUE with KEY like [A-Za-z_][A-Za-z0-9_]*, got {shown}=..."
            )
        env[key] = value
    return env


def mask_env(env: dict[str, str]) -> dict[str, str]:
    """Remote env values are masked everywhere they are shown or stored (invariant 3)."""
    return {k: "***" for k in env}


def read_api_key(key_file: Path | None, environ: dict[str, str] | None = None) -> SecretStr:
    """The key from --key-file (refused when group/world readable) or VAST_API_KEY."""
    environ = os.environ if environ is None else environ
    if key_file is not None:
        path = key_file.expanduser()
        try:
            mode = path.stat().st_mode
        except OSError as exc:
            raise ConfigError(f"--key-file {path}: cannot read ({exc.strerror})") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"--key-file {path} is readable by group or others (mode {stat.S_IMODE(mode):o}): "
                f"run chmod 600 {path}"
            )
        try:
            key = path.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"--key-file {path}: cannot read ({exc.strerror})") from None
        if not key:
            raise ConfigError(f"--key-file {path} is empty")
        return SecretStr(key)
    key = environ.get("VAST_API_KEY", "").strip()
    if not key:
        raise ConfigError("no API key: pass --key-file PATH (chmod 600) or set VAST_API_KEY (or use --sim)")
    return SecretStr(key)


def validate_api_url(url: str) -> str:
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise ConfigError(f"--api-url {url!r} is not an http(s) URL")
    if parsed.query or "api_key" in url:
        raise ConfigError("--api-url must not carry a query string (the key goes in a header only)")
    return url.rstrip("/")


class RunSpec(BaseModel):
    """Everything a run needs, validated. Built only by `resolve`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    profile: HarnessProfile
    filters: Filters
    caps: Caps
    remote_env: dict[str, str]
    api_url: str
    api_key: SecretStr | None  # None with --sim until the embedded simulator is up
    dry_run: bool = False
    any_driver: bool = False
    eight_gpu_qualified: bool = False
    boot_retries: int = 0
    evidence_dir: Path
    sim: bool = False
    json_output: bool = False
    proof_interval_s: float = 10.0
    teardown_margin_s: float = 120.0
    poll_s: float = 10.0  # instance polling while it boots (Vast's docs: every 10 s)
    deadman_grace_s: float = 600.0  # the host deletes itself this long after the time cap
    pacing_scale: float = 1.0

    @model_validator(mode="after")
    def _consistent(self) -> RunSpec:
        if self.any_driver and self.eight_gpu_qualified:
            raise ValueError("--any-driver and --eight-gpu-qualified contradict each other")
        return self

    @cached_property
    def masked_remote_env(self) -> dict[str, str]:
        return mask_env(self.remote_env)

    @property
    def max_seconds(self) -> float:
        return self.caps.max_minutes * 60.0


def resolve(
    *,
    profile: str,
    num_gpus: int | None = None,
    min_pcie_bw: float | None = None,
    key_file: Path | None = None,
    max_usd: float | None = None,
    max_minutes: float | None = None,
    remote_env: list[str] | None = None,
    dry_run: bool = False,
    any_driver: bool = False,
    eight_gpu_qualified: bool = False,
    boot_retries: int | None = None,
    evidence_dir: Path | None = None,
    api_url: str | None = None,
    sim: bool = False,
    json_output: bool = False,
    proof_interval_s: float | None = None,
    pacing_scale: float | None = None,
    poll_s: float | None = None,
    environ: dict[str, str] | None = None,
    profiles_dir: Path = PROFILES_DIR,
) -> RunSpec:
    """Flags > environment > profile, validated. Raises ConfigError naming the offending flag."""
    environ = os.environ if environ is None else environ
    prof = load_profile(profile, profiles_dir)
    for flag, value, floor in (("--max-usd", max_usd, 0.0), ("--max-minutes", max_minutes, 0.0)):
        if value is not None and not value > floor:  # `not >` also catches NaN
            raise ConfigError(f"{flag} must be positive, got {value}")
    if min_pcie_bw is not None and not min_pcie_bw >= 0:
        raise ConfigError(f"--min-pcie-bw must be >= 0, got {min_pcie_bw}")
    if num_gpus is not None and not 1 <= num_gpus <= 16:
        raise ConfigError(f"--num-gpus must be between 1 and 16, got {num_gpus}")
    if proof_interval_s is not None and not proof_interval_s >= 0:
        raise ConfigError(f"--proof-interval must be >= 0, got {proof_interval_s}")
    if poll_s is not None and not poll_s > 0:
        raise ConfigError(f"--poll-interval must be positive, got {poll_s}")
    if boot_retries is not None and boot_retries < 0:
        raise ConfigError(f"--boot-retries must be >= 0, got {boot_retries}")

    filters = prof.filters.model_copy(
        update={
            k: v
            for k, v in {
                "num_gpus": 8 if eight_gpu_qualified else num_gpus,
                "min_pcie_bw_gbps": min_pcie_bw,
            }.items()
            if v is not None
        }
    )
    caps = Caps(
        max_usd=max_usd if max_usd is not None else prof.caps.max_usd,
        max_minutes=max_minutes if max_minutes is not None else prof.caps.max_minutes,
    )
    env = dict(prof.remote_env)
    env.update(parse_remote_env(remote_env or []))

    url = api_url or environ.get("VAST_URL") or DEFAULT_API_URL
    url = validate_api_url(url)
    key = None if sim else read_api_key(key_file, environ)
    try:
        return RunSpec(
            profile=prof,
            filters=filters,
            caps=caps,
            remote_env=env,
            api_url=url,
            api_key=key,
            dry_run=dry_run,
            any_driver=any_driver,
            eight_gpu_qualified=eight_gpu_qualified,
            boot_retries=prof.boot_retries if boot_retries is None else boot_retries,
            evidence_dir=(evidence_dir or Path.cwd() / ".evidence" / "vast").expanduser(),  # never site-packages
            sim=sim,
            json_output=json_output,
            proof_interval_s=proof_interval_s if proof_interval_s is not None else (0.5 if sim else 10.0),
            teardown_margin_s=15.0 if sim else 120.0,
            poll_s=poll_s if poll_s is not None else (0.25 if sim else 10.0),
            deadman_grace_s=30.0 if sim else 600.0,
            pacing_scale=pacing_scale if pacing_scale is not None else 1.0,
        )
    except ValidationError as exc:
        raise ConfigError(_validation_message("run spec", exc)) from None
