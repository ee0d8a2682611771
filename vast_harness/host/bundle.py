"""The workload bundle: a reproducible tarball of exactly what the host needs (`HOST_PAYLOAD`).

Reproducible (sorted entries, zeroed mtimes and owners, fixed gzip header) so that the same tree always gives
the same sha256, which goes into the evidence: a reader can check which code ran on the host.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Callable, Iterable, Sequence
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
    keep, held = _no_key_copy(account_keys)
    bundle = _pack(selection.root, [(f"{WORKDIR_DIR}/{f.rel}", Path(f.rel)) for f in selection.files], keep)
    kept = [f for f in selection.files if f.rel not in held]
    if not kept:
        raise ConfigError(f"--workdir {selection.root}: nothing to upload (every file left is a copy of the "
                          "account's API key)")
    record = WorkdirRecord(path=str(selection.root), sha256=bundle.sha256, files=bundle.files,
                           bytes=sum(f.bytes for f in kept), excluded=selection.excluded,
                           symlinks_skipped=selection.symlinks, left_out=_left_out(selection, held),
                           included=selection.included)
    return bundle.model_copy(update={"workdir": record})


def _no_key_copy(account_keys: Sequence[str]) -> tuple[Callable[[Path, bytes], bool], set[str]]:
    """A `_pack` filter that leaves out a file whose bytes hold an account key, and the set it names them in."""
    needles = key_needles(account_keys)
    held: set[str] = set()

    def keep(rel: Path, data: bytes) -> bool:
        if holds_key(data, needles):
            held.add(rel.as_posix())
            return False
        return True

    return keep, held


def _left_out(selection: WorkdirSelection, held: Iterable[str]) -> list[LeftOut]:
    return sorted([*selection.left_out, *(LeftOut(path=rel, why=KEY_COPY, includable=False) for rel in held)],
                  key=lambda i: i.path)


DELETE_LIST = ".vh-delete.lst"  # a delta's files to remove from the host's workdir, NUL-separated, beside work/


class WorkdirDelta(BaseModel):
    """What a kept host's `exec` uploads: the workdir files whose content differs from what the host has (by
    sha256, `manifest`), and the names the host has that the workdir no longer does. `bundle` is None when
    nothing changed. `manifest` is what the host has once the delta is applied."""

    bundle: Bundle | None
    changed: list[str]
    deleted: list[str]
    manifest: dict[str, str]
    workdir: WorkdirRecord

    @property
    def size_bytes(self) -> int:
        return self.bundle.size_bytes if self.bundle is not None else 0


def file_manifest(selection: WorkdirSelection, account_keys: Sequence[str] = ()) -> tuple[dict[str, str], set[str]]:
    """Each selected file's sha256, by its posix path relative to the workdir, and the files whose bytes hold an
    account key (never sent: not in the manifest), from one read of each."""
    needles = key_needles(account_keys)
    out: dict[str, str] = {}
    held: set[str] = set()
    for f in selection.files:
        try:
            data = (selection.root / f.rel).read_bytes()
        except OSError as exc:  # removed or unreadable since it was listed
            raise ConfigError(f"cannot read {selection.root / f.rel} for the upload: {exc.strerror or exc}") from None
        if holds_key(data, needles):
            held.add(f.rel)
        else:
            out[f.rel] = hashlib.sha256(data).hexdigest()
    return out, held


def build_workdir_delta(selection: WorkdirSelection, have: dict[str, str], *, sent_before: Iterable[str] = (),
                        account_keys: Sequence[str] = ()) -> WorkdirDelta:
    """The files of `selection` whose sha256 is not what the host `have`s (empty: every file), under `work/`
    like a full workdir bundle, plus `DELETE_LIST` naming what the host has, or was ever sent (`sent_before`),
    that the selection no longer has. A file that holds an account key is never sent, as in a run's upload: the
    host's copy of it, if any, is removed."""
    manifest, held = file_manifest(selection, account_keys)
    changed = sorted(rel for rel, digest in manifest.items() if have.get(rel) != digest)
    deleted = sorted((set(have) | set(sent_before)) - set(manifest))
    bundle = None
    if changed or deleted:
        extra = ({DELETE_LIST: b"".join(rel.encode("utf-8", "surrogateescape") + b"\0" for rel in deleted)}
                 if deleted else {})
        keep, late = _no_key_copy(account_keys)  # a file edited since it was hashed is checked again
        bundle = _pack(selection.root, [(f"{WORKDIR_DIR}/{rel}", Path(rel)) for rel in changed], keep, extra=extra)
        sent = bundle_manifest(bundle)
        held |= late
        changed = [rel for rel in changed if rel in sent]
        # as packed: a file changed since it was hashed goes as the host gets it; one left out late is not there
        manifest = {rel: digest for rel, digest in (manifest | sent).items() if rel not in late}
    record = WorkdirRecord(path=str(selection.root), sha256=_manifest_sha256(manifest), files=len(manifest),
                           bytes=selection.total_bytes, excluded=selection.excluded, symlinks_skipped=selection.symlinks,
                           left_out=_left_out(selection, held), included=selection.included)
    return WorkdirDelta(bundle=bundle, changed=changed if bundle else [], deleted=deleted if bundle else [],
                        manifest=manifest, workdir=record)


def _manifest_sha256(manifest: dict[str, str]) -> str:
    """One digest of a whole workdir's content: its files' paths and sha256s, in order (`sha256sum` lines)."""
    text = "".join(f"{digest}  {rel}\n" for rel, digest in sorted(manifest.items()))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def workdir_selection(spec: RunSpec) -> WorkdirSelection | None:
    """What may be uploaded of the spec's `[workdir]` (None: it has none), by one set of rules for a run's upload
    and each of a kept host's: never the key files or the harness's own directories (`RunSpec.never_upload`),
    no credential file that `--include` did not take in, nothing .gitignore or `--exclude` leaves out (and, as
    it is packed, no file whose bytes hold an account key: `spec.account_keys`)."""
    wd = spec.profile.workdir
    if wd is None:
        return None
    return select_workdir(Path(wd.path), exclude=wd.exclude, include=wd.include, max_mb=wd.max_mb,
                          never_upload=spec.never_upload, skip_dirs=spec.harness_dirs, account_keys=spec.account_keys)


def bundle_for(spec: RunSpec) -> Bundle:
    """What a run uploads: its profile's `[workdir]` when it has one (`workdir_selection`), else the harness's
    own payload."""
    selection = workdir_selection(spec)
    return build_bundle() if selection is None else build_workdir_bundle(selection, spec.account_keys)


def bundle_manifest(bundle: Bundle) -> dict[str, str]:
    """The workdir files a bundle carries (under `work/`), each one's sha256 by its path in the workdir: what the
    host has once it is unpacked, read from the bytes sent (a file changed since it was packed is not in it)."""
    out: dict[str, str] = {}
    prefix = f"{WORKDIR_DIR}/"
    with tarfile.open(fileobj=io.BytesIO(bundle.data), mode="r:gz") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(prefix):
                data = tar.extractfile(member)
                assert data is not None  # a regular file's
                out[member.name[len(prefix):]] = hashlib.sha256(data.read()).hexdigest()
    return out


def _pack(root: Path, members: list[tuple[str, Path]],
          keep: Callable[[Path, bytes], bool] = lambda rel, data: True, *,
          extra: dict[str, bytes] | None = None) -> Bundle:
    """The members, read once each; `keep` sees each file's bytes and may leave it out; then `extra`'s in-memory
    files (name -> bytes)."""
    raw = io.BytesIO()
    count = 0
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, rel in members:
            try:
                data = (root / rel).read_bytes()
                mode = (root / rel).stat().st_mode
            except OSError as exc:  # a workdir file removed or unreadable since it was listed
                raise ConfigError(f"cannot read {root / rel} for the upload: {exc.strerror or exc}") from None
            if not keep(rel, data):
                continue
            count += 1
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if mode & 0o111 else 0o644
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
        for name, data in sorted((extra or {}).items()):  # not counted: `files` are the workdir's
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime, info.uid, info.gid = len(data), 0o644, 0, 0, 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=count)
