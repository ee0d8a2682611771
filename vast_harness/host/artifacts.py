"""`--artifact` globs pulled from the host's workdir, smallest file first, under a deadline and a size budget.

Smallest first so that one huge checkpoint cannot crowd the metrics and logs out of the budget: a file that
would pass what is left is skipped (named in the record), and the smaller ones after it still come. The listing
and the copies run under `HostSession.bounded`, so a stalled link or the deadline ends the pull with what
arrived kept. A glob that selects nothing on the host is named (`unmatched`): the run's evidence is then
incomplete (docs/run.md), as a file left on the host would make it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path, PurePosixPath

from vast_harness.errors import LocalDiskRefused, SshTransferError
from vast_harness.host.ssh import HostSession, TreePull
from vast_harness.records import ArtifactPull
from vast_harness.spec.workdir import ArtifactGlobs

MAX_LISTED_FILES = 200_000  # a workdir tree past this (a dataset unpacked by the setup) is not walked further


def pull_artifacts(session: HostSession, remote_dir: str, globs: ArtifactGlobs, local_dir: Path, *,
                   deadline: float, max_bytes: float, on_bytes: Callable[[int], None] | None = None,
                   abandon: Callable[[], bool] | None = None) -> ArtifactPull:
    """Pull the files under `remote_dir` that a glob selects into `local_dir`, keeping their relative paths."""
    record = ArtifactPull(globs=list(globs.globs))
    names = TreePull()  # its local_name escapes control characters in a host's file name, as the evidence pull does
    chosen: list[tuple[str, int]] = []
    done: set[str] = set()
    current = [""]

    def work() -> None:
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
            local = names.local_name(PurePosixPath(rel))
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
                record.bytes += got
                record.files.append(local)
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
    problems = []
    if record.unmatched:
        problems.append(f"matched nothing on the host: {', '.join(record.unmatched)}")
    if record.skipped:
        problems.append(f"{len(record.skipped)} file(s) over the size budget or gone: {', '.join(record.skipped[:5])}")
    if cut:
        problems.append(f"cut with {len(record.left)} selected file(s) not pulled: {cut}")
    record.complete = not problems
    record.detail = "; ".join(problems)
    return record
