"""Harness profiles (data in `profiles/harness/*.toml`) and the validated run spec built from them and the flags.

Precedence is decided in one place, `resolve`: flag > environment > profile. Everything that can be wrong with
the input is found here and raised as ConfigError naming the flag or field, before any network call.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import tempfile
import tomllib
from collections.abc import Callable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator

from vast_harness.errors import ConfigError, UnwritableDirError
from vast_harness.resources import profiles_dir as _profiles_dir
from vast_harness.spec.redact import Redactor
from vast_harness.state.dirs import SIM_SUBDIR, STATE_ENV
from vast_harness.state.dirs import state_dir as user_state_dir
from vast_harness.timings import Timings
from vast_harness.vast.models import pack_driver_version
from vast_harness.vast.url import DEFAULT_API_URL, is_loopback_url, shown, validate_api_url

PROFILES_DIR = _profiles_dir()  # the checkout's profiles/, or the wheel's packaged copy (resources.py)
PROFILE_NAMES = ("mfu", "proofs", "smoke")
LABEL_PREFIX = "vh-"

# repo:tag@sha256:digest — the tag says what the image is, the digest pins which bytes it is.
_IMAGE_RE = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/-]*):(?P<tag>[A-Za-z0-9._-]+)@sha256:(?P<digest>[0-9a-f]{64})$")
_TAG_CUDA_RE = re.compile(r"(?:^|-)cuda(\d+\.\d+)(?:-|$)")
_TAG_TORCH_RE = re.compile(r"^(\d+\.\d+\.\d+)-")
_TAG_CUDNN_RE = re.compile(r"(?:^|-)cudnn(\d+)(?:-|$)")
IMAGE_EXPECT_PLACEHOLDER = "{image_expect}"
NUM_GPUS_PLACEHOLDER = "{num_gpus}"  # in a profile's remote_env value: the GPUs per offer this run rents
_ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_REMOTE_ENV_VALUE_CHARS = 4096

# Flag bounds: anything outside is a typo or an attack on the caps, refused before any network call.
MAX_USD_LIMIT = 10_000.0
MAX_MINUTES_LIMIT = 7 * 24 * 60.0
MAX_PCIE_GBPS = 1_000.0
MAX_BOOT_RETRIES = 20
MAX_INTERVAL_S = 600.0
MAX_PACING_SCALE = 100.0
# Against a real API the absence proof's two rounds must be this far apart, and pacing may not go below
# Vast's own rate limits: lower values are for the simulator (loopback or --sim) only.
REAL_PROOF_INTERVAL_FLOOR_S = 10.0
REAL_PACING_SCALE_FLOOR = 1.0


class _Strict(BaseModel):
    # A profile or config number that is not finite (`disk_gb = inf`) is refused here, naming the field; it
    # once reached the search request as JSON that cannot be sent (a traceback, exit 1).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


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


class ImageRef(_Strict):
    repo: str
    tag: str
    digest: str  # "sha256:<64 hex>"

    @classmethod
    def parse(cls, image: str) -> ImageRef:
        found = _IMAGE_RE.match(image)
        if not found:
            raise ValueError(f"image {image!r} must be pinned by digest with its tag: repo:tag@sha256:<64 hex>")
        return cls(repo=found["repo"], tag=found["tag"], digest=f"sha256:{found['digest']}")

    @property
    def create_form(self) -> str:
        """What the create sends: `repo@sha256:<digest>`, the digest-pinned form. No source shows Vast taking
        `repo:tag@sha256:…` (its templates split image and tag themselves); the tag stays in the profile for
        people, the dry run and the host check."""
        return f"{self.repo}@{self.digest}"

    @property
    def cuda(self) -> str | None:
        found = _TAG_CUDA_RE.search(self.tag)
        return found.group(1) if found else None


_VERSION_PREFIX = r"^\d+(\.\d+)*$"


class ImageExpect(_Strict):
    """What the env-probe step checks on the host before any workload minute is billed: the image's torch,
    CUDA runtime (torch.version.cuda) and cuDNN, each a dotted prefix ("9" accepts 9.10.2.21)."""

    torch: Annotated[str, Field(pattern=_VERSION_PREFIX)]
    cuda: Annotated[str, Field(pattern=_VERSION_PREFIX)]
    cudnn: Annotated[str, Field(pattern=_VERSION_PREFIX)]

    def flags(self) -> str:
        return f"--expect-torch {self.torch} --expect-cuda {self.cuda} --expect-cudnn {self.cudnn}"


def parse_image_expect(raw: str, base: ImageExpect | None) -> ImageExpect:
    """`--image-expect torch=X,cuda=Y,cudnn=Z` (any subset; the rest keep the profile's values)."""
    if base is None:
        raise ConfigError("--image-expect: this profile checks no image on the host; there is nothing to override")
    values = base.model_dump()
    given: set[str] = set()
    for item in (part.strip() for part in raw.split(",")):
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in values:
            raise ConfigError(f"--image-expect: expected torch=VERSION,cuda=VERSION,cudnn=VERSION, got {item!r}")
        if key.strip() in given:
            raise ConfigError(f"--image-expect: {key.strip()} is given twice ({raw!r}); give each once")
        given.add(key.strip())
        values[key.strip()] = value.strip()
    try:
        return ImageExpect.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(f"--image-expect: {'.'.join(str(p) for p in first['loc'])}: a dotted version "
                          f"like 12.8 is expected") from None


def with_image_expect(profile: HarnessProfile, expect: ImageExpect) -> HarnessProfile:
    """The profile whose host check expects `expect` (its steps' expanded flags replaced)."""
    assert profile.image_expect is not None
    old, new = profile.image_expect.flags(), expect.flags()
    steps = [s.model_copy(update={"run": s.run.replace(old, new)}) for s in profile.steps]
    return profile.model_copy(update={"image_expect": expect, "image_expect_overridden": True, "steps": steps})


class HarnessProfile(_Strict):
    name: str
    description: str = ""
    image: str
    image_digest_verified: bool = False
    image_cuda: float = Field(gt=0)
    # None: no image check on the host (the smoke profile, whose tiny CPU round runs on any torch)
    image_expect: ImageExpect | None = None
    image_expect_overridden: bool = False  # --image-expect replaced it: no longer checked against the tag
    disk_gb: float = Field(ge=8, default=40)
    boot_retries: int = Field(ge=0, default=1)
    boot_timeout_s: float = Field(gt=0, default=900)
    caps: Caps
    filters: Filters = Filters()
    transfer: Transfer = Transfer()
    remote_env: dict[str, str] = Field(default_factory=dict)
    steps: list[Step]
    pytest_node_ids: list[str] = Field(default_factory=list)
    # False: the steps run on any host (the smoke profile's CPU round). `fleet --sim` swaps a GPU profile's
    # steps for the smoke profile's, since simulated hosts have no GPU.
    require_gpu: bool = True

    @field_validator("remote_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        # refused when the profile is read (exit 2), as --remote-env refuses them, never after renting
        for key, value in env.items():
            if not _ENV_KEY_RE.match(key):
                raise ValueError(f"remote_env name {key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
            _env_value("remote_env", key, value)
        return env

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str) -> str:
        ImageRef.parse(value)
        return value

    @model_validator(mode="before")
    @classmethod
    def _expand_image_expect(cls, data: object) -> object:
        """`{image_expect}` in a step's command becomes the expectation's flags (nothing when none is
        declared), so the dry run shows the very command the host runs. A declared expectation that no
        step checks is refused: it would be a check that never runs."""
        if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
            return data
        expect = data.get("image_expect")
        try:
            flags = ImageExpect.model_validate(expect).flags() if expect is not None else ""
        except ValidationError:
            return data  # the field's own validation names what is wrong
        steps = [dict(s) if isinstance(s, dict) else s for s in data["steps"]]
        used = False
        for step in steps:
            if isinstance(step, dict) and isinstance(step.get("run"), str) and IMAGE_EXPECT_PLACEHOLDER in step["run"]:
                step["run"] = step["run"].replace(IMAGE_EXPECT_PLACEHOLDER, flags).rstrip()
                used = True
        if expect is not None and not used:
            raise ValueError(f"image_expect is declared but no step runs the check: put {IMAGE_EXPECT_PLACEHOLDER} "
                             "in the env-probe step's command")
        return {**data, "steps": steps}

    @model_validator(mode="after")
    def _image_consistent(self) -> HarnessProfile:
        ref = self.image_ref
        if ref.cuda is None:
            raise ValueError(f"image tag {ref.tag!r} names no CUDA version (cudaX.Y): image_cuda cannot be checked")
        if float(ref.cuda) != self.image_cuda:
            raise ValueError(f"image_cuda {self.image_cuda:g} contradicts the image tag {ref.tag!r} (CUDA {ref.cuda})")
        exp = self.image_expect
        if exp is not None and not self.image_expect_overridden:
            torch_tag, cudnn_tag = _TAG_TORCH_RE.search(ref.tag), _TAG_CUDNN_RE.search(ref.tag)
            if exp.cuda != ref.cuda:
                raise ValueError(f"image_expect.cuda {exp.cuda} contradicts the image tag {ref.tag!r}")
            if torch_tag and exp.torch != torch_tag.group(1):
                raise ValueError(f"image_expect.torch {exp.torch} contradicts the image tag {ref.tag!r}")
            if cudnn_tag and exp.cudnn.split(".")[0] != cudnn_tag.group(1):
                raise ValueError(f"image_expect.cudnn {exp.cudnn} contradicts the image tag {ref.tag!r}")
        return self

    @property
    def image_ref(self) -> ImageRef:
        return ImageRef.parse(self.image)

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


def _load_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nesting level: a 5000-deep array is bad input, not a crash
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None


def _validation_message(source: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{source}: field {where}: {first['msg']}"


def is_profile_path(name: str) -> bool:
    return name.endswith(".toml") or "/" in name


def load_profile(name: str, profiles_dir: Path = PROFILES_DIR) -> HarnessProfile:
    """A shipped profile by name, or a user's own profile file (`--profile PATH.toml`), validated alike."""
    if is_profile_path(name):
        path = path_flag("--profile", name) or Path(name)
        if not path.expanduser().is_file():
            raise ConfigError(f"--profile {shown(path)}: no such profile file")
        path = path.expanduser()
    elif name not in PROFILE_NAMES:
        raise ConfigError(f"--profile: unknown profile {name!r}; choose one of {', '.join(PROFILE_NAMES)} "
                          "or give a profile file (PATH.toml)")
    else:
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


def _env_value(flag: str, key: str, value: str) -> str:
    if "\x00" in value or len(value) > MAX_REMOTE_ENV_VALUE_CHARS:
        raise ConfigError(f"{flag} {key}: the value must be under {MAX_REMOTE_ENV_VALUE_CHARS} "
                          "characters and contain no NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {key}: the value is not valid UTF-8") from None
    return value


def parse_remote_env(items: list[str], flag: str = "--remote-env",
                     environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`KEY=VALUE` pairs from a repeated flag. With `environ` (--remote-secret) a bare `KEY` takes the local
    environment's value, as SkyPilot's `--secret KEY` does. A malformed item is a ConfigError naming it; a
    secret's value never appears in a message."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not _ENV_KEY_RE.match(key) or (not sep and environ is None):
            shown = key if _ENV_KEY_RE.match(key) else "<malformed>"
            raise ConfigError(f"{flag}: expected KEY=VALUE with KEY like [A-Za-z_][A-Za-z0-9_]*, got {shown}=...")
        if not sep:
            assert environ is not None
            if key not in environ:
                raise ConfigError(f"{flag} {key}: no value given and {key} is not set in this environment")
            value = environ[key]
        env[key] = _env_value(flag, key, value)
    return env


def read_secret_file(path: Path) -> dict[str, str]:
    """`--remote-secret-file`: KEY=VALUE lines (blank lines and `#` comments skipped), under the key file's
    rule: a regular file readable by its owner only. Values are never echoed in a message."""
    where = f"--remote-secret-file {shown(path)}"
    _check_private_file(path.expanduser(), where)
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read ({type(exc).__name__})") from None
    items = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for n, item in enumerate(items, 1):
        if "=" not in item:
            raise ConfigError(f"{where}: entry {n} is not KEY=VALUE")
    return parse_remote_env(items, flag=where)


def mask_env(env: Mapping[str, object]) -> dict[str, str]:
    """Secrets are shown and stored as their names with `***` (invariant 3)."""
    return {k: "***" for k in env}


MAX_KEY_FILE_BYTES = 4096  # a Vast key is 64 hex characters; anything this large is not a key file


def _checked_key(key: str, source: str) -> SecretStr:
    if not key:
        raise ConfigError(f"{source} is empty")
    if len(key) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{source}: the key is {len(key)} characters long; a Vast API key is 64")
    if not key.isascii() or any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ConfigError(f"{source}: the key must be printable ASCII without spaces (is this the right file?)")
    return SecretStr(key)


def _check_private_file(path: Path, where: str, st: os.stat_result | None = None) -> None:
    """A file holding a secret: a regular file (a FIFO would block the run for ever) that only its owner can
    read (`chmod 600`), as ssh requires of a private key."""
    if st is None:
        try:
            st = path.stat()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: not a usable path ({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{where} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}): run chmod 600 on it"
        )


CONFIG_FILE = Path("vast-harness") / "config.toml"  # under the XDG config directory
OFFICIAL_CLI_KEY_FILE = Path("vastai") / "vast_api_key"  # where `vastai set api-key` writes it


def config_home(environ: Mapping[str, str]) -> Path | None:
    """$XDG_CONFIG_HOME, else $HOME/.config, from the given environment only (tests pass their own)."""
    if environ.get("XDG_CONFIG_HOME"):
        return Path(environ["XDG_CONFIG_HOME"])
    return Path(environ["HOME"]) / ".config" if environ.get("HOME") else None


class UserConfig(_Strict):
    """`$XDG_CONFIG_HOME/vast-harness/config.toml`: a user's defaults, below flags and the environment and
    above the profile. Every key optional; an unknown key is refused (exit 2 naming it)."""

    key_file: str | None = None
    evidence_dir: str | None = None
    max_usd: float | None = Field(default=None, gt=0, le=MAX_USD_LIMIT)
    max_minutes: float | None = Field(default=None, gt=0, le=MAX_MINUTES_LIMIT)

    @classmethod
    def load(cls, environ: Mapping[str, str]) -> tuple[UserConfig, Path | None]:
        home = config_home(environ)
        path = home / CONFIG_FILE if home is not None else None
        if path is None or not path.is_file():
            return cls(), None
        try:
            return cls.model_validate(_load_toml(path)), path
        except ValidationError as exc:
            raise ConfigError(_validation_message(str(path), exc)) from None


def read_api_key(key_file: Path | None, environ: Mapping[str, str] | None = None,
                 config_key_file: Path | None = None) -> SecretStr:
    """The key from --key-file, VAST_API_KEY, the config file's key_file, or the official CLI's key file
    (in that order); every file is refused when group/world readable."""
    environ = os.environ if environ is None else environ
    if key_file is None and not environ.get("VAST_API_KEY", "").strip():
        home = config_home(environ)
        official = home / OFFICIAL_CLI_KEY_FILE if home is not None else None
        if config_key_file is not None:
            return _read_key_file(config_key_file.expanduser(), f"key_file {shown(config_key_file)} (config file)")
        if official is not None and official.exists():
            return _read_key_file(official, f"the official CLI's key file {shown(official)}")
    if key_file is not None:
        return _read_key_file(key_file.expanduser(), f"--key-file {shown(key_file.expanduser())}")
    key = environ.get("VAST_API_KEY", "").strip()
    if not key:
        raise ConfigError("no API key: pass --key-file PATH (chmod 600), set VAST_API_KEY, or run `vastai set "
                          "api-key` (read from ~/.config/vastai/vast_api_key) (or use --sim)")
    return _checked_key(key, "VAST_API_KEY")


def _read_key_file(path: Path, where: str) -> SecretStr:
    """A key file: regular, owner-only (`chmod 600`), small, one printable ASCII key."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    except ValueError as exc:  # an embedded NUL
        raise ConfigError(f"{where}: not a usable path ({exc})") from None
    _check_private_file(path, where, st)
    if st.st_size > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{where} is {st.st_size} bytes; a Vast API key file is under {MAX_KEY_FILE_BYTES}")
    try:
        raw = path.read_bytes()[: MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not ASCII text: a Vast API key is 64 hex characters") from None
    return _checked_key(text.strip(), where)


def path_flag(flag: str, raw: str | Path | None) -> Path | None:
    """A path given on the command line: never empty (which would silently mean the current directory)."""
    if raw is None:
        return None
    text = str(raw)
    if not text.strip():
        raise ConfigError(f"{flag} is empty: give a path")
    if "\x00" in text:
        raise ConfigError(f"{flag} {shown(text)} contains a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {shown(text)} is not valid UTF-8") from None
    return Path(text)


_SYSTEM_DIRS = ("/proc", "/sys", "/dev")
_NO_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, None}


def check_evidence_dir(path: Path, flag: str = "--evidence-dir", consequence: str = "nothing was rented") -> None:
    """The evidence dir must be a writable directory with room, checked before anything is rented."""
    where = f"{flag} {shown(path)}"
    try:
        resolved = str(path.resolve())
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot resolve ({exc})") from None
    if any(resolved == d or resolved.startswith(d + "/") for d in _SYSTEM_DIRS):
        raise ConfigError(f"{where} is under a system directory ({resolved}); choose a normal directory")
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{where} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".vh-write-probe-", dir=path)
        try:
            data = b"\0" * 4096  # room for the ledger's first lines
            if os.write(fd, data) != len(data):
                raise OSError(28, "short write (disk full?)")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        # No room or no permission: the directory is right but takes no writes. Anything else (a name too long,
        # a file on the path) is a wrong path, whoever asked.
        if exc.errno in _NO_WRITES:
            raise UnwritableDirError(f"{where} is not writable ({exc.strerror or exc}); {consequence}") from None
        raise ConfigError(f"{where} cannot be used ({exc.strerror or exc}); choose another directory") from None


def check_number(flag: str, value: float | None, *, low: float, high: float, low_inclusive: bool = True,
                  what: str = "") -> None:
    """A finite number within [low, high] (or (low, high]); `not ... <=` also catches NaN."""
    if value is None:
        return
    lower = "positive" if low == 0 and not low_inclusive else f"at least {low:g}"
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag} must be {lower} and finite, got {value}")
    if not (low <= value if low_inclusive else low < value):
        raise ConfigError(f"{flag} must be {lower}{what}, got {value}")
    if not value <= high:
        raise ConfigError(f"{flag} must be at most {high:g}{what}, got {value}")


class RunSpec(BaseModel):
    """Everything a run needs, validated. Built only by `resolve`."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)

    profile: HarnessProfile
    filters: Filters
    caps: Caps
    remote_env: dict[str, str]  # settings: shown and stored as given
    remote_secrets: dict[str, SecretStr] = Field(default_factory=dict)  # masked everywhere, never stored
    api_url: str
    api_key: SecretStr | None  # None with --sim until the embedded simulator is up
    dry_run: bool = False
    any_driver: bool = False
    eight_gpu_qualified: bool = False
    unqualified_ok: bool = False  # exit 0 instead of 4 for a pass on an unqualified driver (--any-driver runs)
    boot_retries: int = 0
    evidence_dir: Path
    state_dir: Path  # the user's ledger and live-run registrations (statedir.py); evidence by default
    sim: bool = False
    timings: Timings  # the table for this target (timings.py), the user's flags laid over it
    allow_unarmed_deadman: bool = False  # run even when the dead-man switch cannot prove it can act (recorded)
    image_expect_override: ImageExpect | None = None  # --image-expect: recorded in the evidence and the report

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

    @cached_property
    def redactor(self) -> Redactor:
        return Redactor(v.get_secret_value() for v in self.remote_secrets.values())

    @property
    def max_seconds(self) -> float:
        return self.caps.max_minutes * 60.0


def resolve(
    *,
    profile: str,
    num_gpus: int | None = None,
    min_pcie_bw: float | None = None,
    key_file: Path | str | None = None,
    max_usd: float | None = None,
    max_minutes: float | None = None,
    remote_env: list[str] | None = None,
    remote_secret: list[str] | None = None,
    remote_secret_file: Path | str | None = None,
    dry_run: bool = False,
    any_driver: bool = False,
    eight_gpu_qualified: bool = False,
    unqualified_ok: bool = False,
    boot_retries: int | None = None,
    evidence_dir: Path | str | None = None,
    api_url: str | None = None,
    sim: bool = False,
    proof_interval_s: float | None = None,
    pacing_scale: float | None = None,
    poll_s: float | None = None,
    allow_unarmed_deadman: bool = False,
    image_expect: str | None = None,
    image_expect_ack: bool = False,
    state_dir: Path | None = None,
    environ: Mapping[str, str] | None = None,
    profiles_dir: Path = PROFILES_DIR,
    on_unwritable: Callable[[str], None] | None = None,
) -> RunSpec:
    """Flags > environment (VAST_API_KEY, VAST_URL) > the user's config file > profile, validated. Raises
    ConfigError naming the offending flag or field. An evidence or state dir that takes no writes is refused,
    unless `on_unwritable` is given: then it is told (a reap warns and goes on deleting)."""
    environ = os.environ if environ is None else environ
    user, _ = UserConfig.load(environ)
    prof = load_profile(profile, profiles_dir)
    if unqualified_ok and not any_driver:
        raise ConfigError("--unqualified-ok only applies with --any-driver (without it no run passes on an "
                          "unqualified driver)")
    max_usd = max_usd if max_usd is not None else user.max_usd
    max_minutes = max_minutes if max_minutes is not None else user.max_minutes
    ev_source = "--evidence-dir" if evidence_dir is not None else "evidence_dir (config file)"
    evidence_dir = evidence_dir if evidence_dir is not None else user.evidence_dir
    check_number("--max-usd", max_usd, low=0, high=MAX_USD_LIMIT, low_inclusive=False)
    check_number("--max-minutes", max_minutes, low=0, high=MAX_MINUTES_LIMIT, low_inclusive=False)
    check_number("--min-pcie-bw", min_pcie_bw, low=0, high=MAX_PCIE_GBPS)
    check_number("--num-gpus", num_gpus, low=1, high=16)
    check_number("--boot-retries", boot_retries, low=0, high=MAX_BOOT_RETRIES)
    check_number("--proof-interval", proof_interval_s, low=0, high=MAX_INTERVAL_S)
    check_number("--poll-interval", poll_s, low=0, high=MAX_INTERVAL_S, low_inclusive=False)
    check_number("--pacing-scale", pacing_scale, low=0, high=MAX_PACING_SCALE)
    evidence_dir = path_flag("--evidence-dir", evidence_dir)
    key_file = path_flag("--key-file", key_file)

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
    given_env = parse_remote_env(remote_env or [])
    secret_file = path_flag("--remote-secret-file", remote_secret_file)
    secrets = read_secret_file(secret_file) if secret_file is not None else {}
    secrets.update(parse_remote_env(remote_secret or [], flag="--remote-secret", environ=environ))
    # `{num_gpus}` follows --num-gpus / --eight-gpu-qualified (the mfu sweep's world sizes); --remote-env wins;
    # a secret named like one of the profile's settings replaces it (a flag given twice is refused below)
    profile_env = {k: v.replace(NUM_GPUS_PLACEHOLDER, str(filters.num_gpus)) for k, v in prof.remote_env.items()}
    env = {k: v for k, v in profile_env.items() if k not in secrets} | given_env

    if api_url is not None:  # given, even empty: never silently replaced by VAST_URL or the real console
        url = validate_api_url(api_url)
    elif environ.get("VAST_URL") is not None:
        url = validate_api_url(environ["VAST_URL"], "VAST_URL")
    else:
        url = DEFAULT_API_URL
    if not (sim or is_loopback_url(url)):  # the safety floors hold against any real API
        if proof_interval_s is not None and proof_interval_s < REAL_PROOF_INTERVAL_FLOOR_S:
            raise ConfigError(f"--proof-interval {proof_interval_s:g} is below the {REAL_PROOF_INTERVAL_FLOOR_S:g} s "
                              f"floor against {url}; lower values are for the simulator (loopback or --sim)")
        if pacing_scale is not None and pacing_scale < REAL_PACING_SCALE_FLOOR:
            raise ConfigError(f"--pacing-scale {pacing_scale:g} is below {REAL_PACING_SCALE_FLOOR:g} against {url}: "
                              "Vast's rate limits cannot be scaled down; lower values are for the simulator")
    override = None
    if image_expect is not None:
        override = parse_image_expect(image_expect, prof.image_expect)
        if not (sim or is_loopback_url(url) or image_expect_ack):
            raise ConfigError(f"--image-expect overrides the profile's image check against {url}: a real rental "
                              "could run on an image the profile was not measured with. Add --image-expect-ack "
                              "to do it anyway (the override is recorded in the evidence and the report)")
        prof = with_image_expect(prof, override)
    elif image_expect_ack:
        raise ConfigError("--image-expect-ack acknowledges an --image-expect override; none was given")
    key = None if sim else read_api_key(key_file, environ, path_flag("key_file (config file)", user.key_file))
    # --sim runs keep their own state: the embedded simulator's account dies with the process, so its ledger
    # lines must never make a reap of the real account exit 3.
    state = (state_dir or (user_state_dir(environ) / SIM_SUBDIR if sim else user_state_dir(environ))).expanduser()
    ev_dir = (evidence_dir or state).expanduser()  # never site-packages, never the current directory
    if not dry_run:  # a run writes its ledger and evidence here: find out now, not after renting
        state_name = f"the state directory (${STATE_ENV})" if environ.get(STATE_ENV) else "the state directory"
        checks = [(ev_dir, ev_source if evidence_dir is not None else state_name)]
        checks += [(state, state_name)] if state != ev_dir else []
        for path, name in checks:
            try:
                check_evidence_dir(path, name, **({"consequence": "reaping anyway; what cannot be written is "
                                                  "skipped"} if on_unwritable else {}))
            except UnwritableDirError as exc:
                if on_unwritable is None:
                    raise
                on_unwritable(str(exc))
    # The one place a run's timings are chosen: the simulator's table with --sim, else Vast's; flags win.
    timing_flags = {"proof_interval_s": proof_interval_s, "poll_s": poll_s, "pacing_scale": pacing_scale}
    table = Timings.sim() if sim else Timings.real()
    try:
        timings = Timings.model_validate(table.model_dump() | {k: v for k, v in timing_flags.items() if v is not None})
        return RunSpec(
            profile=prof,
            filters=filters,
            caps=caps,
            remote_env=env,
            remote_secrets={k: SecretStr(v) for k, v in secrets.items()},
            api_url=url,
            api_key=key,
            dry_run=dry_run,
            any_driver=any_driver,
            eight_gpu_qualified=eight_gpu_qualified,
            unqualified_ok=unqualified_ok,
            boot_retries=prof.boot_retries if boot_retries is None else boot_retries,
            evidence_dir=ev_dir,
            state_dir=state,
            sim=sim,
            timings=timings,
            allow_unarmed_deadman=allow_unarmed_deadman,
            image_expect_override=override,
        )
    except ValidationError as exc:
        raise ConfigError(_validation_message("run spec", exc)) from None
