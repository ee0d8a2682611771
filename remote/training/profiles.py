"""Model/training profiles: profiles/models/<name>.toml -> a validated, typed Profile.

Unknown keys and out-of-range values stop with a message naming the field, so a typo in a profile
cannot silently fall back to a default.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from remote.host.paths import MODEL_PROFILES_DIR
from remote.training.model import ModelConfig

PROFILE_DIR = MODEL_PROFILES_DIR
ATTENTION_PATHS = ("fa4", "fa4-det", "cudnn", "cudnn-det", "flash", "efficient", "math")  # remote.attention.backend.CHOICES


class ProfileError(ValueError):
    """A profile is missing, malformed, or has a field out of range."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    micro_batch: int
    steps: int
    """Total steps of one round, warm-up included."""
    warmup_steps: int = 3
    """Steps excluded from timing (compile, allocator growth, NCCL setup); at least 3."""
    lr: float = 3e-4
    beta1: float = 0.9
    beta2: float = 0.95
    weight_decay: float = 0.1
    seed: int = 1234
    bucket_cap_mb: float = 128
    """Gradient bucket size for DDP and the zero2 reductions."""
    ce_chunk_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.micro_batch < 1:
            raise ProfileError(f"train.micro_batch must be >= 1, got {self.micro_batch}")
        if self.warmup_steps < 3:
            raise ProfileError(f"train.warmup_steps must be >= 3 (timing excludes warm-up), got "
                               f"{self.warmup_steps}")
        if self.steps <= self.warmup_steps:
            raise ProfileError(f"train.steps ({self.steps}) must exceed train.warmup_steps "
                               f"({self.warmup_steps}) so at least one step is timed")
        if self.lr <= 0 or self.bucket_cap_mb <= 0 or self.ce_chunk_tokens <= 0:
            raise ProfileError("train.lr, train.bucket_cap_mb and train.ce_chunk_tokens must be positive")


@dataclass(frozen=True, kw_only=True)
class Profile:
    name: str
    description: str
    device: str
    world_size: int | None
    """Required number of ranks (None: any)."""
    required_attention: tuple[str, ...]
    """Attention paths an evidence file of this profile may report (empty: any)."""
    model: ModelConfig
    train: TrainConfig


def _build(cls: type[Any], table: dict[str, Any], where: str) -> Any:
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown field(s) {', '.join(unknown)}")
    try:
        return cls(**table)
    except TypeError as exc:
        raise ProfileError(f"{where}: {exc}") from None
    except ValueError as exc:
        raise ProfileError(f"{where}: {exc}") from None


def load_profile(name: str, directory: Path = PROFILE_DIR) -> Profile:
    path = directory / f"{name}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in directory.glob("*.toml"))
        raise ProfileError(f"unknown profile {name!r} (no {path}); known: {', '.join(known) or 'none'}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML: {exc}") from None
    top = {"name", "description", "device", "world_size", "required_attention", "model", "train"}
    unknown = sorted(set(data) - top)
    if unknown:
        raise ProfileError(f"{path}: unknown field(s) {', '.join(unknown)}")
    if data.get("name") != name:
        raise ProfileError(f"{path}: field name = {data.get('name')!r} does not match the file name")
    if data.get("device") not in ("cuda", "cpu"):
        raise ProfileError(f"{path}: device must be 'cuda' or 'cpu', got {data.get('device')!r}")
    required = tuple(data.get("required_attention", ()))
    bad = [p for p in required if p not in ATTENTION_PATHS]
    if bad:
        raise ProfileError(f"{path}: required_attention has unknown path(s) {bad}; known {ATTENTION_PATHS}")
    world = data.get("world_size")
    if world is not None and (not isinstance(world, int) or world < 1):
        raise ProfileError(f"{path}: world_size must be a positive integer, got {world!r}")
    return Profile(name=name, description=str(data.get("description", "")), device=data["device"],
                   world_size=world, required_attention=required,
                   model=_build(ModelConfig, data.get("model", {}), f"{path} [model]"),
                   train=_build(TrainConfig, data.get("train", {}), f"{path} [train]"))
