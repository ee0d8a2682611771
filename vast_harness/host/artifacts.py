"""`--artifact` globs pulled from the host's workdir, smallest file first, under a deadline and a size budget,
byte for byte.

Smallest first so that one huge checkpoint cannot crowd the metrics and logs out of the budget: a file that
would pass what is left is skipped (named in the record), and the smaller ones after it still come. The listing
and the copies run under `HostSession.bounded`, so a stalled link or the deadline ends the pull with what
arrived kept. A glob that selects nothing on the host is named (`unmatched`): the run's evidence is then
incomplete (docs/run.md), as a file left on the host would make it.

An artifact is the user's output (a checkpoint, a `training_args.bin`), so it is never rewritten: not masked,
kept private (files 0600, folders 0700), its sha256 recorded beside the one the host computed of its own copy (a
file that arrived different is no pass). It is searched for every key and secret this process knows, in every
form the masker knows (masking.py); what is found is named, file and secret's name, never the value.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from vast_harness.errors import LocalDiskRefused, SshTransferError
from vast_harness.host.ssh import HostSession, TreePull
from vast_harness.masking import MASKER
from vast_harness.records import ArtifactPull
from vast_harness.spec.workdir import ArtifactGlobs

MAX_LISTED_FILES = 200_000  # a workdir tree past this (a dataset unpacked by the setup) is not walked further
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700
_HASH_COMMAND_CHARS = 32 * 1024  # one host command hashes the files whose quoted names fit in this
_HASH_CHUNK_BYTES = 4 * 1024 * 1024
UNVERIFIED = "-"  # what the host answers for a file it could not hash


def pull_artifacts(session: HostSession, remote_dir: str, globs: ArtifactGlobs, local_dir: Path, *,
                   deadline: float, max_bytes: float, on_bytes: Callable[[int], None] | None = None,
                   abandon: Callable[[], bool] | None = None) -> ArtifactPull:
    """Pull the files under `remote_dir` that a glob selects into `local_dir`, keeping their relative paths."""
    record = ArtifactPull(globs=list(globs.globs))
    names = TreePull()  # its local_name escapes control characters in a host's file name, as the evidence pull does
    chosen: list[tuple[str, int]] = []
    done: set[str] = set()
    current = [""]
    pulled: dict[str, str] = {}  # local name -> the host's relative path
    _private_dir(local_dir, local_dir)

    refused = [""]

    def work() -> None:
        if (link := session.symlink_on_the_way(remote_dir)) is not None:  # the evidence pull's rule
            refused[0] = link
            return
        listed = session.list_files(remote_dir, max_files=MAX_LISTED_FILES)
        used: set[str] = set()
        for rel, size in listed:
            hits = globs.matching(rel)
            if hits:
                used.update(hits)
                chosen.append((rel, size))
        record.unmatched = [g for g in globs.globs if g not in used]
        chosen.sort(key=lambda item: (item[1], item[0]))
        for rel, size in chosen:
            left = max_bytes - record.bytes
            if size > left:
                record.skipped.append(rel)
                done.add(rel)
                continue
            current[0] = rel
            # Masked here, not after: two names that mask alike must be saved, recorded and checked apart.
            local = names.local_name(PurePosixPath(rel), mask=MASKER.text)
            if MASKER.text(rel) != rel:
                record.redacted.append(local)
            _private_dir(local_dir, (local_dir / local).parent)
            try:
                got = session.get(f"{remote_dir}/{rel}", local_dir / local, max_bytes=left, on_bytes=on_bytes)
            except FileNotFoundError:
                record.skipped.append(rel)
            except LocalDiskRefused:
                raise
            except SshTransferError:
                if not session.is_active():
                    raise
                record.skipped.append(rel)  # grew past the budget while copied
            else:
                (local_dir / local).chmod(PRIVATE_FILE)
                record.bytes += got
                record.files.append(local)
                pulled[local] = rel
            done.add(rel)
            current[0] = ""

    cut = ""
    try:
        session.bounded(f"artifact pull from {remote_dir}", work, deadline=deadline, abandon=abandon)
    except SshTransferError as exc:
        cut = str(exc)
        record.left = list(dict.fromkeys(n for n in [current[0], *(r for r, _ in chosen)] if n and n not in done))
    record.files.sort()
    record.renamed = dict(names.renamed)
    _witness(record, session, remote_dir, local_dir, pulled, deadline=deadline, link_cut=bool(cut))
    problems = []
    if refused[0]:
        record.symlink = refused[0]
        problems.append(f"{refused[0]} on the host is a symlink: not followed (a pull takes only the host's own tree)")
    if record.unmatched:
        problems.append(f"matched nothing on the host: {', '.join(record.unmatched)}")
    if record.skipped:
        problems.append(f"{len(record.skipped)} file(s) over the size budget or gone: {', '.join(record.skipped[:5])}")
    if cut:
        problems.append(f"cut with {len(record.left)} selected file(s) not pulled: {cut}")
    if record.mismatched:
        problems.append(f"{len(record.mismatched)} file(s) arrived different from the host's copy (sha256): "
                        f"{', '.join(record.mismatched[:5])}")
    record.complete = not problems
    record.detail = "; ".join(problems)
    return record


def _private_dir(root: Path, folder: Path) -> None:
    """`folder` and every folder between it and `root` (included), made or made private (0700)."""
    for part in [*reversed(folder.relative_to(root).parents), folder.relative_to(root)]:
        path = root / part
        path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
        path.chmod(PRIVATE_DIR)


def _witness(record: ArtifactPull, session: HostSession, remote_dir: str, local_dir: Path, pulled: dict[str, str],
             *, deadline: float, link_cut: bool) -> None:
    """Each pulled file's sha256 here and the host's (unless the link is gone), and the secrets it holds."""
    host = {} if link_cut or not pulled else host_sha256(session, remote_dir, list(pulled.values()),
                                                           deadline=deadline)
    for local in record.files:
        path = local_dir / local
        record.sha256[local] = file_sha256(path)
        theirs = host.get(pulled[local], UNVERIFIED)
        if theirs == UNVERIFIED:
            record.unverified.append(local)
        else:
            record.host_sha256[local] = theirs
            if theirs != record.sha256[local]:
                record.mismatched.append(local)
        if found := MASKER.found(path):
            record.secrets_found[local] = found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def host_sha256(session: HostSession, remote_dir: str, rels: list[str], *, deadline: float) -> dict[str, str]:
    """The sha256 of each file as the host has it, computed there by `sha256sum` reading the file on its stdin
    (so no name is ever parsed back): one line per file, in order, `-` for one it could not hash. A file the
    host did not answer for (the deadline, a lost link, no sha256sum) is `-` too."""
    found: dict[str, str] = {}
    for batch in _batches(rels):
        lines: list[str] = []
        left_s = deadline - session.clock()
        if left_s <= 0:
            break
        loop = " ".join(shlex.quote(r) for r in batch)
        script = (f"cd {shlex.quote(remote_dir)} && for f in {loop}; do "
                  f"h=$(sha256sum 2>/dev/null < \"$f\") && echo \"${{h%% *}}\" || echo {UNVERIFIED}; done")
        try:
            session.run(script, on_line=lambda stream, line: lines.append(line) if stream == "stdout" else None,
                        timeout_s=left_s)
        except Exception:  # noqa: BLE001 - the witness is best effort: a file it cannot vouch for says so
            break
        for rel, line in zip(batch, lines, strict=False):
            digest = line.strip()
            found[rel] = digest if len(digest) == 64 and all(c in "0123456789abcdef" for c in digest) else UNVERIFIED
    return found


def _batches(rels: list[str]) -> list[list[str]]:
    batches: list[list[str]] = [[]]
    size = 0
    for rel in rels:
        quoted = len(shlex.quote(rel)) + 1
        if batches[-1] and size + quoted > _HASH_COMMAND_CHARS:
            batches.append([])
            size = 0
        batches[-1].append(rel)
        size += quoted
    return [b for b in batches if b]
