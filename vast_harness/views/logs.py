"""`vast-e2e logs [RUN] [STEP]` and `vast-e2e report RUN`: a run's step logs and its report, from the evidence.

A step log keeps the bytes the host sent; shown on a terminal they go through `terminal.terminal_safe` like any
host output (escape codes escaped), each line as a terminal leaves it after its carriage returns (a progress
bar's last frame, `carriage.shown_segment`), and `--raw` writes them as they are (for a pipe or a file). Without a
STEP every log is printed in the order the steps ran, each under a header line; `--list` gives the table.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from vast_harness.console.carriage import shown_segment
from vast_harness.console.output import Output
from vast_harness.console.terminal import safe_cells, terminal_safe
from vast_harness.errors import ConfigError, HarnessError
from vast_harness.evidence.run import manifest_line, write_whole
from vast_harness.reports.run import REPORT_NAME, write_run_report


def step_logs(run_dir: Path) -> list[Path]:
    """The run's step logs in the order the steps ran (steps.tsv), then any others by name."""
    logs = {p.stem: p for p in sorted((run_dir / "steps").glob("*.log"))}
    order: list[str] = []
    try:
        for line in (run_dir / "steps.tsv").read_text(errors="replace").splitlines():
            name = line.split("\t", 1)[0]
            if name in logs and name not in order:
                order.append(name)
    except OSError:
        pass
    return [logs[n] for n in order] + [p for n, p in logs.items() if n not in order]


def shown_text(data: bytes, *, raw: bool) -> str:
    """A step log's bytes as `logs` prints them: as sent with `raw`, else line by line as a terminal would
    show them, control characters escaped. Lines break at "\\n" only: splitlines() also breaks at \\v, \\f,
    \\x1c-\\x1e, \\x85, U+2028/9, so a host could forge lines ("✓ step ...") out of characters shown escaped."""
    if raw:
        return data.decode("utf-8", "surrogateescape")
    lines = data.decode("utf-8", "replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return "".join(terminal_safe(shown_segment(line)) + "\n" for line in lines)


def step_header(path: Path) -> str:
    """The line above each step's log when every log is printed (the step's name escaped like host text)."""
    return f"==> step {terminal_safe(path.stem)} ({path.stat().st_size} bytes) <=="


def show_logs(out: Output, run_dir: Path, step: str | None, *, raw: bool = False, list_only: bool = False) -> int:
    logs = step_logs(run_dir)
    if step is None and list_only:
        rows = [{"step": p.stem, "bytes": p.stat().st_size, "path": str(p)} for p in logs]
        if out.json_mode:
            out.emit_json({"run": run_dir.name, "dir": str(run_dir), "logs": rows})
            return 0
        if not rows:
            out.out.print(terminal_safe(f"run {run_dir.name} has no step logs (no step ran)"))
            return 0
        from rich.table import Table

        t = Table(title=terminal_safe(f"Step logs of {run_dir.name}"), header_style="bold")
        for col in ("step", "bytes", "path"):
            t.add_column(col, overflow="fold")
        for r in rows:
            t.add_row(*safe_cells(r["step"], r["bytes"], r["path"]))
        out.out.print(t)
        out.info(f"vast-e2e logs {run_dir.name} STEP prints one")
        return 0
    if step is None:
        if out.json_mode:
            out.emit_json({"run": run_dir.name, "dir": str(run_dir), "logs": [
                {"step": p.stem, "bytes": p.stat().st_size, "path": str(p),
                 "text": p.read_bytes().decode("utf-8", "replace")} for p in logs]})
            return 0
        if not logs:
            out.info(f"run {run_dir.name} has no step logs (no step ran)")
            return 0
        for p in logs:
            out.stdout.write(step_header(p) + "\n" + shown_text(p.read_bytes(), raw=raw))
        out.stdout.flush()
        return 0
    chosen = [p for p in logs if p.stem == step]
    if not chosen:
        raise ConfigError(f"run {run_dir.name} has no log for step {step!r} (steps: "
                          f"{', '.join(p.stem for p in logs) or 'none'})")
    data = chosen[0].read_bytes()
    if out.json_mode:
        out.emit_json({"run": run_dir.name, "step": step, "path": str(chosen[0]),
                       "text": data.decode("utf-8", "replace")})
    else:
        out.stdout.write(shown_text(data, raw=raw))
        out.stdout.flush()
    return 0


def rebuild_report(out: Output, run_dir: Path) -> int:
    """Rebuild `report.html` from the run's evidence; the manifest's line for it follows (only that line: a
    rebuild never vouches for the other files again)."""
    try:
        path = write_run_report(run_dir)
        manifest = run_dir / "manifest.sha256"
        if manifest.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines = [ln for ln in manifest.read_text(errors="surrogateescape").splitlines()
                     if ln.partition("  ")[2] != REPORT_NAME or ln.startswith("\\")]  # that one entry only
            write_whole(manifest, "\n".join([*lines, manifest_line(digest, REPORT_NAME)]) + "\n",
                        errors="surrogateescape")
        else:
            out.warn(f"{run_dir.name} has no manifest.sha256 (the run could not write it): the report is not "
                     "listed in one, and a rebuild never writes one for files it did not write")
    except OSError as exc:
        raise HarnessError(f"cannot write {REPORT_NAME} in {terminal_safe(str(run_dir))}: "
                           f"{exc.strerror or exc}") from None
    if out.json_mode:
        out.emit_json({"run": run_dir.name, "report": str(path)})
    else:
        out.out.print(terminal_safe(str(path)))
    return 0
