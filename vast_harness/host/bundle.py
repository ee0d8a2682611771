"""The workload bundle: a reproducible tarball of exactly what the host needs (`HOST_PAYLOAD`).

Reproducible (sorted entries, zeroed mtimes and owners, fixed gzip header) so that the same tree always gives
the same sha256, which goes into the evidence: a reader can check which code ran on the host.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable, Sequence
from pathlib import Path

from pydantic import BaseModel

from vast_harness.errors import ConfigError
from vast_harness.records import WorkdirLeftOut as LeftOut
from vast_harness.records import WorkdirRecord
from vast_harness.resources import data_root
from vast_harness.spec.resolve import RunSpec
from vast_harness.spec.workdir import KEY_COPY, WorkdirSelection, holds_key, key_needles, select_workdir

# What goes to the host, relative to data_root(), read off the profiles' step commands; local-only tools
# (chaos, benchmarks, the CLI script) stay here. A directory ships whole. The wheel packages the same paths
# (pyproject.toml force-include; tests/harness/test_wheel.py keeps the two in step).
HOST_PAYLOAD = (
    "remote",                         # python3 -m remote.{envprobe,mps,plan}, imported by the scripts below
    "profiles/models",                # remote.training.profiles: the model/training profiles
    "profiles/harness",               # remote.host.plan pytest-ids: the proofs profile's node ids
    "scripts/run_mfu_dist.py",        # every profile's training round
    "scripts/vast_mfu_remote.sh",     # mfu: the sweep
    "scripts/sweep_report.py",        # mfu: the sweep's table
    "scripts/check_gpu_evidence.py",  # every profile's check step
    "tests/__init__.py",              # proofs: the GPU tests, with their package markers
    "tests/remote/__init__.py",
    "tests/remote/test_gpu.py",
)
_SKIP_PARTS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


WORKDIR_DIR = "work"  # a workdir bundle unpacks under ~/vh/work: the host's evidence/ beside it stays the harness's


class Bundle(BaseModel):
    data: bytes
    sha256: str
    files: int
    workdir: WorkdirRecord | None = None  # a `run` bundle: the user's workdir, as recorded

    @property
    def size_bytes(self) -> int:
        return len(self.data)


class PayloadMissing(ConfigError):
    """A HOST_PAYLOAD entry is not under the data root: the host would fail mid-run, so nothing is rented."""


def _members(root: Path, entries: tuple[str, ...] = HOST_PAYLOAD) -> list[Path]:
    paths: set[Path] = set()
    for entry in entries:
        top = root / entry
        if top.is_file():
            paths.add(Path(entry))
            continue
        if not top.is_dir():
            raise PayloadMissing(f"host payload {entry!r} missing under {root}")
        for path in top.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix not in _SKIP_SUFFIXES:
                paths.add(rel)
    return sorted(paths)


def build_bundle(root: Path | None = None, entries: tuple[str, ...] = HOST_PAYLOAD) -> Bundle:
    """The host payload (or `entries` of it: the receipt's own, host/receipt.py), reproducible."""
    root = root or data_root()
    return _pack(root, [(str(rel), rel) for rel in _members(root, entries)])


def build_workdir_bundle(selection: WorkdirSelection, account_keys: Sequence[str] = ()) -> Bundle:
    """The user's selected workdir files under `work/`; its sha256 is the workdir's in the record. A file whose
    bytes hold an account key is left out and named (its bytes are read here anyway: not twice)."""
    needles = key_needles(account_keys)
    held: set[str] = set()

    def keep(rel: Path, data: bytes) -> bool:
        if holds_key(data, needles):
            held.add(rel.as_posix())
            return False
        return True

    bundle = _pack(selection.root, [(f"{WORKDIR_DIR}/{f.rel}", Path(f.rel)) for f in selection.files], keep)
    kept = [f for f in selection.files if f.rel not in held]
    if not kept:
        raise ConfigError(f"--workdir {selection.root}: nothing to upload (every file left is a copy of the "
                          "account's API key)")
    left_out = sorted([*selection.left_out, *(LeftOut(path=rel, why=KEY_COPY, includable=False) for rel in held)],
                      key=lambda i: i.path)
    record = WorkdirRecord(path=str(selection.root), sha256=bundle.sha256, files=bundle.files,
                           bytes=sum(f.bytes for f in kept), excluded=selection.excluded,
                           symlinks_skipped=selection.symlinks, left_out=left_out, included=selection.included)
    return bundle.model_copy(update={"workdir": record})


def bundle_for(spec: RunSpec) -> Bundle:
    """What a run uploads: its profile's `[workdir]` when it has one (never the key files or the harness's own
    directories: `RunSpec.never_upload`), else the harness's own payload."""
    wd = spec.profile.workdir
    if wd is None:
        return build_bundle()
    keys = spec.account_keys
    return build_workdir_bundle(select_workdir(Path(wd.path), exclude=wd.exclude, include=wd.include,
                                               max_mb=wd.max_mb, never_upload=spec.never_upload,
                                               skip_dirs=spec.harness_dirs, account_keys=keys), keys)


def _pack(root: Path, members: list[tuple[str, Path]],
          keep: Callable[[Path, bytes], bool] = lambda rel, data: True) -> Bundle:
    """The members, read once each; `keep` sees each file's bytes and may leave it out."""
    raw = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, rel in members:
            try:
                data = (root / rel).read_bytes()
            except OSError as exc:  # a workdir file removed or unreadable since it was listed
                raise ConfigError(f"cannot read {root / rel} for the upload: {exc.strerror or exc}") from None
            if not keep(rel, data):
                continue
            count += 1
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if (root / rel).stat().st_mode & 0o111 else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=count)
