"""`vast-e2e logs RUN [STEP]` and `vast-e2e report RUN`: a run's step logs and its report, from the evidence.

A step log keeps the bytes the host sent; shown on a terminal they go through `output.terminal_safe` like any
host output (escape codes escaped), and `--raw` writes them as they are (for a pipe or a file).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

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


def show_logs(out: Output, run_dir: Path, step: str | None, *, raw: bool = False) -> int:
    logs = step_logs(run_dir)
    if step is None:
        rows = [{"step": p.stem, "bytes": p.stat().st_size, "path": str(p)} for p in logs]
        if out.json_mode:
            out.emit_json({"run": run_dir.name, "dir": str(run_dir), "logs": rows})
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
    chosen = [p for p in logs if p.stem == step]
    if not chosen:
        raise ConfigError(f"run {run_dir.name} has no log for step {step!r} (steps: "
                          f"{', '.join(p.stem for p in logs) or 'none'})")
    data = chosen[0].read_bytes()
    if out.json_mode:
        out.emit_json({"run": run_dir.name, "step": step, "path": str(chosen[0]),
                       "text": data.decode("utf-8", "replace")})
    elif raw:
        out.stdout.write(data.decode("utf-8", "surrogateescape"))
        out.stdout.flush()
    else:
        text = data.decode("utf-8", "replace")
        # split on "\n" only: splitlines() also breaks at \v, \f, \x1c-\x1e, \x85, U+2028/9, so a host could
        # forge lines ("✓ step ...") out of characters the console shows escaped
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        out.stdout.write("".join(terminal_safe(line) + "\n" for line in lines))
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
