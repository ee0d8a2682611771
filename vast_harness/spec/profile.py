"""Harness profiles (`profiles/harness/*.toml`) and the qualified-driver policy: the models, their loaders, and
the image reference a profile pins.

A profile is data; `load_profile` validates it and raises ConfigError naming the file and the field.
"""

from __future__ import annotations

import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from vast_harness.errors import ConfigError
from vast_harness.files import UnusableFile, read_regular_file
from vast_harness.resources import profiles_dir as _profiles_dir
from vast_harness.spec.fit import FitKind
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.spec.requires import Requires
from vast_harness.spec.values import ENV_KEY_RE, env_value, path_flag
from vast_harness.spec.workdir import DEFAULT_WORKDIR_MAX_MB, MAX_WORKDIR_MAX_MB, check_glob
from vast_harness.vast.models import pack_driver_version
from vast_harness.vast.url import shown

PROFILES_DIR = _profiles_dir()  # the checkout's profiles/, or the wheel's packaged copy (resources.py)
PROFILE_NAMES = ("mfu", "proofs", "smoke")


# repo:tag@sha256:digest — the tag says what the image is, the digest pins which bytes it is.
_IMAGE_RE = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/-]*):(?P<tag>[A-Za-z0-9._-]+)@sha256:(?P<digest>[0-9a-f]{64})$")


_TAG_CUDA_RE = re.compile(r"(?:^|-)cuda(\d+\.\d+)(?:-|$)")


_TAG_TORCH_RE = re.compile(r"^(\d+\.\d+\.\d+)-")


_TAG_CUDNN_RE = re.compile(r"(?:^|-)cudnn(\d+)(?:-|$)")


IMAGE_EXPECT_PLACEHOLDER = "{image_expect}"


NUM_GPUS_PLACEHOLDER = "{num_gpus}"  # in a profile's remote_env value: the GPUs per offer this run rents


class StrictModel(BaseModel):
    # A profile or config number that is not finite (`disk_gb = inf`) is refused here, naming the field; it
    # once reached the search request as JSON that cannot be sent (a traceback, exit 1).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class Step(StrictModel):
    """One command of the plan, run over SSH in the workload directory on the host."""

    name: Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")]
    run: str
    timeout_s: float = Field(gt=0, default=600)
    workload: bool = True  # counts as the workload's own time (vs harness overhead) in the figures
    # the 1B runs it makes, as the memory fit reads them from the run's settings (spec/fit.py); None: none
    fit: FitKind | None = None


class Filters(StrictModel):
    num_gpus: int = Field(ge=1, le=16, default=1)
    gpu_names: list[str] = Field(default_factory=list)  # empty: any GPU
    min_pcie_bw_gbps: float = Field(ge=0, default=0)
    min_reliability: float = Field(ge=0, le=1, default=0.98)
    min_direct_ports: int = Field(ge=0, default=1)
    min_inet_down_mbps: float = Field(ge=0, default=100)
    min_gpu_ram_gb: float = Field(ge=0, default=0)
    verified: bool = True


class Caps(StrictModel):
    max_usd: float = Field(gt=0)
    max_minutes: float = Field(gt=0)


class Transfer(StrictModel):
    """Bytes the quote charges for: the bundle uploaded and the evidence expected back."""

    expected_evidence_mb: float = Field(ge=0, default=20)
    upload_extra_mb: float = Field(ge=0, default=0)  # e.g. wheels that travel with the bundle


class Workdir(StrictModel):
    """`[workdir]`: the user's folder the run uploads (instead of the harness's own bundle); the steps run in
    it on the host. The selection rules are spec/workdir.py's (docs/run.md)."""

    path: str  # in a profile file: relative to the file's folder; "." for that folder
    exclude: list[str] = Field(default_factory=list)  # globs left out beside .gitignore
    include: list[str] = Field(default_factory=list)  # credential files taken in (spec/credentials.py)
    max_mb: float = Field(gt=0, le=MAX_WORKDIR_MAX_MB, default=DEFAULT_WORKDIR_MAX_MB)

    @field_validator("path")
    @classmethod
    def _path(cls, path: str) -> str:
        if not path.strip():  # never the current directory by accident
            raise ValueError("the workdir path is empty: give a folder ('.' for the one the profile file is in)")
        return path

    @field_validator("exclude", "include")
    @classmethod
    def _globs(cls, globs: list[str], info: ValidationInfo) -> list[str]:
        return [_glob(str(info.field_name), g) for g in globs]


def _glob(field: str, glob: str) -> str:
    try:
        return check_glob(field, glob)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None


class ImageRef(StrictModel):
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


class ImageExpect(StrictModel):
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


class HarnessProfile(StrictModel):
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
    requires: Requires = Requires()  # what it can run on: checked per offer and on the host (spec/requires.py)
    receipt: ReceiptPolicy = ReceiptPolicy()  # what the host must deliver before any work (spec/receipt.py)
    transfer: Transfer = Transfer()
    remote_env: dict[str, str] = Field(default_factory=dict)
    steps: list[Step]
    pytest_node_ids: list[str] = Field(default_factory=list)
    # False: the steps run on any host (the smoke profile's CPU round). `fleet --sim` swaps a GPU profile's
    # steps for the smoke profile's, since simulated hosts have no GPU.
    require_gpu: bool = True
    workdir: Workdir | None = None  # None: the harness's own bundle (host/bundle.py HOST_PAYLOAD)
    artifacts: list[str] = Field(default_factory=list)  # globs in the workdir, pulled into <run>/artifacts/

    @field_validator("artifacts")
    @classmethod
    def _artifact_globs(cls, globs: list[str]) -> list[str]:
        return [_glob("artifacts", g) for g in globs]

    @model_validator(mode="after")
    def _artifacts_need_workdir(self) -> HarnessProfile:
        if self.artifacts and self.workdir is None:
            raise ValueError("artifacts are globs in the workdir: declare [workdir] too")
        return self

    @field_validator("remote_env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        # refused when the profile is read (exit 2), as --remote-env refuses them, never after renting
        for key, value in env.items():
            if not ENV_KEY_RE.match(key):
                raise ValueError(f"remote_env name {key!r} is not a shell variable name ([A-Za-z_][A-Za-z0-9_]*)")
            env_value("remote_env", key, value)
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


class QualifiedDriver(StrictModel):
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


MAX_TOML_BYTES = 1 << 20  # a profile or config file is a few KB; anything past this is not one


def load_toml(path: Path) -> dict[str, Any]:
    """A TOML file's table, or a ConfigError naming the file and what is wrong with it (missing, not a regular
    file, too large, not UTF-8, not TOML): never a traceback and never a silent default."""
    try:
        text = read_regular_file(path, max_bytes=MAX_TOML_BYTES).decode("utf-8")
        return tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"file not found: {path}") from None
    except UnusableFile as exc:
        raise ConfigError(f"{path} cannot be read as a TOML file: it is {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); TOML files are UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses per nesting level: a 5000-deep array is bad input, not a crash
        raise ConfigError(f"{path}: invalid TOML: nested too deeply") from None


def validation_message(source: str, exc: ValidationError) -> str:
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
        prof = HarnessProfile.model_validate(load_toml(path))
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from None
    if prof.workdir is not None:  # a workdir is found beside its profile file, wherever the command runs
        where = (path.parent / Path(prof.workdir.path).expanduser()).as_posix()
        prof = prof.model_copy(update={"workdir": prof.workdir.model_copy(update={"path": where})})
    return prof


def load_driver_policy(profiles_dir: Path = PROFILES_DIR) -> DriverPolicy:
    path = profiles_dir / "qualified-drivers.toml"
    try:
        return DriverPolicy(drivers=load_toml(path).get("driver", []))
    except ValidationError as exc:
        raise ConfigError(validation_message(str(path), exc)) from None
