"""`vast-e2e summary`: a run as the Markdown page a CI job summary shows (reports/markdown.py), on stdout, and
the figures a CI step hands on (`--outputs FILE`: `name=value` lines, as GitHub's `$GITHUB_OUTPUT` takes them).

Which run: the one named; else the one the run command's `--json` result (`--result FILE`) names; else, when that
result is missing or empty (the run was killed before it printed one), the latest run in the evidence directory.
A refused run (exit 2 or 5: no evidence kept) is rendered from its result alone. `--reap-result FILE` adds the
follow-up reap's `--json` object. Reads files only: no API call, nothing created.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.evidence.run import NOTIFICATIONS_FILE
from vast_harness.files import read_regular_file
from vast_harness.masking import mask
from vast_harness.reports.markdown import job_summary, outputs
from vast_harness.reports.run import load_run
from vast_harness.state.runs import find_run, latest_run
from vast_harness.vast.url import shown

MAX_RESULT_BYTES = 8 << 20  # a run's --json object with every step: far below this


def read_result(path: Path | None, flag: str) -> dict[str, Any] | None:
    """A command's `--json` object from `path`; None when there is none to read (missing, empty, cut short by a
    kill: "no verdict" is what the page then says). A path that is not a regular file is exit 2."""
    if path is None:
        return None
    try:
        data = read_regular_file(path, max_bytes=MAX_RESULT_BYTES)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{flag} {shown(path)}: {exc.strerror or exc}") from None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _run_dir(evidence_dir: Path, run: str | None, result: dict[str, Any] | None) -> Path | None:
    if run is not None:
        return find_run(evidence_dir, run)
    if result is not None:
        named = result.get("evidence_dir")
        if isinstance(named, str) and Path(named).is_dir():
            return Path(named)
        if result.get("exit_code") in (ExitCode.BAD_INPUT, ExitCode.NO_OFFER) or "error" in result:
            return None  # refused before renting: no evidence was kept
    try:
        return latest_run(evidence_dir)
    except ConfigError:
        return None


def show_summary(out: Output, evidence_dir: Path, run: str | None, *, result_file: Path | None = None,
                 reap_file: Path | None = None, outputs_file: Path | None = None,
                 artifact_name: str | None = None) -> int:
    result = read_result(result_file, "--result")
    reap = read_result(reap_file, "--reap-result")
    run_dir = _run_dir(evidence_dir, run, result)
    facts = load_run(run_dir) if run_dir is not None else None
    notes = read_result(run_dir / NOTIFICATIONS_FILE, NOTIFICATIONS_FILE) if run_dir is not None else None
    page = job_summary(facts, result=result, reap=reap, notifications=notes, artifact_name=artifact_name)
    out.stdout.write(page)
    out.stdout.flush()
    if outputs_file is not None:
        lines = "".join(f"{k}={v}\n" for k, v in outputs(facts, result).items())
        try:
            with outputs_file.open("a", encoding="utf-8") as fh:  # the CI's file: appended to, as its steps do
                fh.write(mask(lines))
        except OSError as exc:
            raise ConfigError(f"--outputs {shown(outputs_file)}: cannot write ({exc.strerror or exc})") from None
    if facts is None and result is None:
        out.warn(mask(f"no run found in {evidence_dir} and no result to read: the page says so"))
    return 0
