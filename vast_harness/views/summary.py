"""`vast-e2e summary`: a run as the Markdown page a CI job summary shows (reports/markdown.py), on stdout, and
the figures a CI step hands on (`--outputs FILE`: `name=value` lines, as GitHub's `$GITHUB_OUTPUT` takes them).

Which run: the one named; else, with `--result FILE`, that run's only: the directory its `--json` result names
(or its run id's); when the result says nothing (missing, empty, cut short, not a JSON object: "no verdict"),
only a run that started after the file was opened (a shell's `> FILE` truncates it just before the run starts;
the run id begins with its start), never an earlier run's; without `--result`, the latest run. A refused run
(exit 2 or 5: no evidence kept) is rendered from its result alone. A kept host's hold (its record's profile
`kept`) is shown as the hold: held or ended, its cost and time so far from the hold's record in the state
directory. A run killed before its record is shown from its files: the steps with a log and no outcome (cut
off), the GPUs its hosts' receipts name, and its dollars as `costs` estimates them from the ledgers once a line
closes its instances' span (else not known). `--reap-result FILE` adds the follow-up reap's `--json` object.
Reads files only: no API call, nothing created.
"""

from __future__ import annotations

import calendar
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vast_harness.clock import now_s
from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, ExitCode
from vast_harness.evidence.run import NOTIFICATIONS_FILE
from vast_harness.files import read_regular_file
from vast_harness.masking import mask
from vast_harness.reports.markdown import Hold, job_summary, outputs
from vast_harness.reports.run import load_run
from vast_harness.reports.run_facts import RunFacts
from vast_harness.state.dirs import SIM_SUBDIR, state_dir
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.runs import find_run, latest_run, run_dirs
from vast_harness.vast.url import shown
from vast_harness.views.costs import ledger_entries, ledger_paths, run_estimate

MAX_RESULT_BYTES = 8 << 20  # a run's --json object with every step: far below this
_RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-z]+")
_NAMED_RUN_ID = re.compile(rb'"run_id"\s*:\s*"(\d{8}T\d{6}Z-[0-9a-z]+)"')


@dataclass
class Result:
    """What `--result FILE` holds: the command's `--json` object, or why there is none (`why`), the run id a
    cut-short object still names, and when the file was last written."""

    value: dict[str, Any] | None = None
    why: str = ""
    run_id: str | None = None
    mtime_unix: float | None = None


def read_result(path: Path | None, flag: str) -> dict[str, Any] | None:
    """A command's `--json` object from `path`; None when there is none to read (missing, empty, cut short by a
    kill, not an object). A path that is not a regular file is exit 2."""
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


def read_run_result(path: Path) -> Result:
    """The run command's `--json` result (the module's docstring), never an error: a result that cannot be read
    is the run's "no verdict", said with its reason."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = None
    try:
        data = read_regular_file(path, max_bytes=MAX_RESULT_BYTES)
    except FileNotFoundError:
        return Result(why=f"there is no result file ({shown(path)}): the run never started, or printed nothing")
    except OSError as exc:
        return Result(why=f"its result {shown(path)} is unreadable ({exc.strerror or exc})", mtime_unix=mtime)
    named = _NAMED_RUN_ID.search(data)
    hint = named.group(1).decode() if named else None
    if not data.strip():
        return Result(why=f"its result {shown(path)} is empty: the run was killed (or its runner went away) "
                          "before it printed one", mtime_unix=mtime)
    try:
        value = json.loads(data)
    except ValueError:
        what = "binary, not JSON" if b"\0" in data or not _is_text(data) else "not JSON (cut short?)"
        return Result(why=f"its result {shown(path)} is unreadable ({what})", run_id=hint, mtime_unix=mtime)
    if not isinstance(value, dict):
        what = {type(None): "null", list: "an array", str: "a string", bool: "a boolean"}.get(type(value), "a number")
        return Result(why=f"its result {shown(path)} is unreadable (JSON {what}, not the run's object)",
                      run_id=hint, mtime_unix=mtime)
    run_id = value.get("run_id")
    return Result(value=value, run_id=run_id if isinstance(run_id, str) else None, mtime_unix=mtime)


def _is_text(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _started_unix(run_dir: Path) -> float | None:
    """When a run started, from its id (UTC, whole seconds), or None for a directory no run id names."""
    if _RUN_ID.fullmatch(run_dir.name) is None:
        return None
    try:
        return float(calendar.timegm(time.strptime(run_dir.name[:16], "%Y%m%dT%H%M%SZ")))
    except ValueError:
        return None


def _by_id(evidence_dir: Path, run_id: str) -> Path | None:
    try:
        found = find_run(evidence_dir, run_id)
    except ConfigError:
        return None
    return found if found.name == run_id else None  # that run's only: never another a part of the id names


def _run_dir(evidence_dir: Path, run: str | None, result_file: Path | None, result: Result) -> Path | None:
    if run is not None:
        return find_run(evidence_dir, run)
    if result_file is None:
        try:
            return latest_run(evidence_dir)
        except ConfigError:
            return None
    r = result.value
    if r is not None:
        named = r.get("evidence_dir")
        if isinstance(named, str) and Path(named).is_dir():
            return Path(named)
        if r.get("exit_code") in (ExitCode.BAD_INPUT, ExitCode.NO_OFFER) or "error" in r:
            return None  # refused before renting: no evidence was kept
    if result.run_id is not None:
        return _by_id(evidence_dir, result.run_id)
    if r is not None or result.mtime_unix is None:
        return None
    # Nothing names the run: only one that started after its result file was opened can be it
    opened = int(result.mtime_unix)
    after = [p for p in run_dirs(evidence_dir) if (_started_unix(p) or -1.0) >= opened]
    return max(after, key=lambda p: p.name) if after else None


def _hold(facts: RunFacts) -> Hold | None:
    """A kept host's hold, when `facts` is one's (docs/kept-host.md): its state, and its cost and time so far
    from the hold's record while it is held (the evidence's record is its last command's figure)."""
    r = facts.result
    if r.get("profile") != "kept":
        return None
    hold_id = str(r.get("run_id") or facts.dir.name)
    verdict = r.get("absence", {}).get("verdict") if isinstance(r.get("absence"), dict) else None
    record = _held_record(hold_id) if verdict == "held" else None
    if record is None:
        total = r.get("timings", {}).get("total_s") if isinstance(r.get("timings"), dict) else None
        accrued = r.get("accrued_usd")
        return Hold(state="held" if verdict == "held" else "ended", record_found=False,
                    accrued_usd=accrued if isinstance(accrued, int | float) else None,
                    elapsed_s=total if isinstance(total, int | float) else None)
    left_s = record.left_s()
    state = record.state if record.state != "held" or left_s > 0 else "expired"
    return Hold(state=state, record_found=True, accrued_usd=record.accrued_now_usd(),
                elapsed_s=now_s() - record.t0.to_mono(), max_usd=record.max_usd, max_minutes=record.max_minutes,
                name=record.name, why_deadline=record.why_deadline(), left_s=left_s, gpu=record.gpu)


def _held_record(hold_id: str) -> HeldHost | None:
    home = state_dir().expanduser()
    for store in (HeldStore(home), HeldStore(home / SIM_SUBDIR)):
        try:
            found = [h for h in store.all() if h.hold_id == hold_id]
        except (OSError, ConfigError):
            continue
        if found:
            return found[0]
    return None


def _estimate_usd(evidence_dir: Path, facts: RunFacts | None, result: dict[str, Any] | None,
                  hold: Hold | None) -> float | None:
    """A run killed before its record and its result said a figure: its dollars from the ledgers, as `costs`
    estimates them (None until a line closes each instance's span: its DELETE or proof of absence)."""
    if facts is None or hold is not None or "accrued_usd" in facts.result or (result or {}).get("accrued_usd"):
        return None
    return run_estimate(facts.dir.name, ledger_entries(ledger_paths(evidence_dir)))[1]


def show_summary(out: Output, evidence_dir: Path, run: str | None, *, result_file: Path | None = None,
                 reap_file: Path | None = None, outputs_file: Path | None = None,
                 artifact_name: str | None = None) -> int:
    got = read_run_result(result_file) if result_file is not None else Result()
    result = got.value
    reap = read_result(reap_file, "--reap-result")
    run_dir = _run_dir(evidence_dir, run, result_file, got)
    facts = load_run(run_dir) if run_dir is not None else None
    hold = _hold(facts) if facts is not None else None
    notes = read_result(run_dir / NOTIFICATIONS_FILE, NOTIFICATIONS_FILE) if run_dir is not None else None
    estimated_usd = _estimate_usd(evidence_dir, facts, result, hold)
    page = job_summary(facts, result=result, reap=reap, notifications=notes, artifact_name=artifact_name,
                       no_verdict=got.why, hold=hold, estimated_usd=estimated_usd)
    out.stdout.write(page)
    out.stdout.flush()
    if outputs_file is not None:
        lines = "".join(f"{k}={v}\n" for k, v in outputs(facts, result, hold=hold, run_id=got.run_id,
                                                              estimated_usd=estimated_usd).items())
        try:
            with outputs_file.open("a", encoding="utf-8") as fh:  # the CI's file: appended to, as its steps do
                fh.write(mask(lines))
        except OSError as exc:
            raise ConfigError(f"--outputs {shown(outputs_file)}: cannot write ({exc.strerror or exc})") from None
    if facts is None and result is None:
        out.warn(mask(f"no run found in {evidence_dir} and no result to read: the page says so"))
    return 0
