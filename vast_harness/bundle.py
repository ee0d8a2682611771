"""The workload bundle: a reproducible tarball of `remote/`, `profiles/` and `scripts/`.

Reproducible (sorted entries, zeroed mtimes and owners, fixed gzip header) so that the same tree always gives
the same sha256, which goes into the evidence: a reader can check which code ran on the host.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

from pydantic import BaseModel

from vast_harness.config import REPO_ROOT

BUNDLE_DIRS = ("remote", "profiles", "scripts")
# The GPU tests the proofs profile runs on the host travel too (with their package markers).
BUNDLE_FILES = ("tests/__init__.py", "tests/remote/__init__.py", "tests/remote/test_gpu.py")
_SKIP_PARTS = {"__pycache__", ".pytest_cache"}
_SKIP_SUFFIXES = {".pyc", ".pyo"}


class Bundle(BaseModel):
    data: bytes
    sha256: str
    files: int

    @property
    def size_bytes(self) -> int:
        return len(self.data)


def _members(root: Path) -> list[Path]:
    paths: list[Path] = []
    for top in BUNDLE_DIRS:
        for path in sorted((root / top).rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not _SKIP_PARTS.intersection(rel.parts) and path.suffix not in _SKIP_SUFFIXES:
                paths.append(rel)
    paths.extend(Path(f) for f in BUNDLE_FILES if (root / f).is_file())
    return paths


def build_bundle(root: Path = REPO_ROOT) -> Bundle:
    raw = io.BytesIO()
    members = _members(root)
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel in members:
            data = (root / rel).read_bytes()
            info = tarfile.TarInfo(str(rel))
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
    return Bundle(data=data, sha256=hashlib.sha256(data).hexdigest(), files=len(members))
