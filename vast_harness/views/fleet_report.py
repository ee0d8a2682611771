"""`vast-e2e report FLEET`: a fleet's fleet-report.html rebuilt from fleet-result.json and its runs' evidence."""

from __future__ import annotations

from pathlib import Path

from vast_harness.console.output import Output
from vast_harness.console.terminal import terminal_safe
from vast_harness.errors import HarnessError
from vast_harness.reports.fleet import FLEET_REPORT_NAME, rebuild_fleet_report


def rebuild_fleet(out: Output, fleet_dir: Path) -> int:
    """Rebuild and say where it is (the path, or with --json one object); a disk that takes no write is an
    error naming the directory."""
    try:
        path = rebuild_fleet_report(fleet_dir)
    except OSError as exc:
        raise HarnessError(f"cannot write {FLEET_REPORT_NAME} in {terminal_safe(str(fleet_dir))}: "
                           f"{exc.strerror or exc}") from None
    if out.json_mode:
        out.emit_json({"fleet": fleet_dir.name, "report": str(path)})
    else:
        out.out.print(terminal_safe(str(path)))
    return 0
