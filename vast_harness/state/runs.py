"""The runs an evidence directory holds (its own and its fleets'), found by id, unique part of an id, or path;
and, past that directory, wherever the ledger says a run's evidence is (each line names it) or the state
directory keeps it (the default before a config file's `evidence_dir` moved new runs elsewhere).

Used by `vast-e2e report`, `logs` and `costs`, which read evidence and call no API.
"""

from __future__ import annotations

from pathlib import Path

from vast_harness.errors import ConfigError
from vast_harness.state.dirs import SIM_SUBDIR, state_dir
from vast_harness.state.ledger import LEDGER_FILE, Ledger

RESULT_NAME = "harness-result.json"


def default_evidence_dir() -> Path:
    """Where runs write evidence unless told otherwise: the user's state directory (state/dirs.py)."""
    return state_dir()


def run_dirs(evidence_dir: Path) -> list[Path]:
    """Every run directory: a directory with a record or step logs, directly under the evidence dir or under
    one of its `fleet-*` directories. Sorted by name (run ids start with their UTC time)."""
    found: list[Path] = []
    try:
        tops = sorted(p for p in evidence_dir.iterdir() if p.is_dir())
    except OSError:
        return found
    for top in tops:
        if top.name == SIM_SUBDIR:  # --sim runs keep their own state (and evidence) beside the real ones
            found += run_dirs(top)
        elif top.name.startswith("fleet-"):
            found += sorted(p for p in top.iterdir() if p.is_dir() and _is_run(p))
        elif _is_run(top):
            found.append(top)
    return sorted(found, key=lambda p: p.name)


FLEET_PREFIX = "fleet-"
REAP_PREFIX = "reap-"  # a reap's evidence directory (actions/reap.py names it so)
FLEET_LEDGER_NAME, FLEET_RESULT_NAME = "fleet.jsonl", "fleet-result.json"
FLEET_MARKS = (FLEET_LEDGER_NAME, FLEET_RESULT_NAME)  # a fleet's ledger and its result: what makes a fleet directory


def find_fleet(evidence_dir: Path, ref: str) -> Path | None:
    """A fleet directory by path, by id (`fleet-...`) or a unique part of one starting `fleet-`; None when
    `ref` names no fleet by its form (a run's id), ConfigError (exit 2) when it has a fleet's form but names
    none or several."""
    given = Path(ref).expanduser()
    if given.is_dir() and any((given / mark).is_file() for mark in FLEET_MARKS):
        return given
    if not ref.startswith(FLEET_PREFIX):
        return None
    fleets: list[Path] = []
    for top in (evidence_dir, evidence_dir / SIM_SUBDIR):
        try:
            fleets += sorted(p for p in top.iterdir() if p.is_dir() and p.name.startswith(FLEET_PREFIX)
                             and any((p / mark).is_file() for mark in FLEET_MARKS))
        except OSError:
            continue
    exact = [p for p in fleets if p.name == ref]
    named = exact or [p for p in fleets if ref in p.name]
    if len(named) == 1:
        return named[0]
    if not named:
        latest = ", ".join(p.name for p in fleets[-3:]) or "none"
        raise ConfigError(f"no fleet {ref!r} in {evidence_dir} (latest: {latest}); give a fleet id or its "
                          "directory (--evidence-dir to look elsewhere)")
    raise ConfigError(f"{ref!r} names {len(named)} fleets ({', '.join(p.name for p in named[:5])}): give more of "
                      "the id")


def ledger_files(evidence_dir: Path) -> list[Path]:
    """The ledgers that name runs: the state dir's and its --sim part's; an evidence dir may hold an older one."""
    homes = [evidence_dir, evidence_dir / SIM_SUBDIR, state_dir(), state_dir() / SIM_SUBDIR]
    return list(dict.fromkeys(h / LEDGER_FILE for h in homes if (h / LEDGER_FILE).is_file()))


def runs_elsewhere(evidence_dir: Path, ledgers: list[Path] | None = None) -> dict[str, Path]:
    """Run directories outside `evidence_dir`, by run id: where the ledgers' lines say each run's evidence is,
    then the state directory's own runs (older lines name no directory)."""
    found: dict[str, Path] = {}
    for path in ledger_files(evidence_dir) if ledgers is None else ledgers:
        for e in Ledger(path).entries():
            if e.evidence and e.run_id not in found:
                where = Path(e.evidence)
                if where.name == e.run_id and _is_run(where):
                    found[e.run_id] = where
    if state_dir().expanduser() != evidence_dir:
        for p in run_dirs(state_dir().expanduser()):
            found.setdefault(p.name, p)
    mine = evidence_dir.resolve() if evidence_dir.exists() else evidence_dir
    return {rid: p for rid, p in found.items() if mine not in p.resolve().parents}


def _is_run(path: Path) -> bool:
    return (path / RESULT_NAME).is_file() or (path / "steps").is_dir()


def refuse_file_on_path(path: Path, what: str) -> None:
    """ConfigError (exit 2) when `path`, or the nearest part of it that exists, is not a directory: a reader
    would otherwise report "nothing here" for a mistyped path."""
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                raise ConfigError(f"{what} {path} cannot be used: {part} is not a directory")
            return


def latest_run(evidence_dir: Path) -> Path:
    """The newest run (run ids start with their UTC time); exit 2 naming the directory when there is none."""
    refuse_file_on_path(evidence_dir, "the evidence directory")
    # a reap's record (`reap-<time>`) is no run of the user's and would sort after every run id
    runs = [p for p in run_dirs(evidence_dir) if not p.name.startswith(REAP_PREFIX)]
    if not runs:
        raise ConfigError(f"no run in {evidence_dir} yet; give a run id or the run's directory (--evidence-dir "
                          "to look elsewhere)")
    return max(runs, key=lambda p: p.name)


def find_run(evidence_dir: Path, ref: str) -> Path:
    """A run by path, by id, or by a part of its id that names exactly one run; else exit 2 naming why."""
    given = Path(ref).expanduser()
    if given.is_dir() and _is_run(given):
        return given
    refuse_file_on_path(evidence_dir, "the evidence directory")
    runs = run_dirs(evidence_dir)
    if not any(ref and ref in p.name for p in runs):  # not here: where the ledger or the state dir has it
        runs = sorted(runs_elsewhere(evidence_dir).values(), key=lambda p: p.name)
    exact = [p for p in runs if p.name == ref]
    if exact:
        return exact[0]
    partial = [p for p in runs if ref and ref in p.name]
    if len(partial) == 1:
        return partial[0]
    if not partial:
        latest = ", ".join(p.name for p in runs[-3:]) or "none"
        raise ConfigError(f"no run {ref!r} in {evidence_dir} (latest: {latest}); give a run id, part of one, or "
                          "the run's directory (--evidence-dir to look elsewhere)")
    names = ", ".join(p.name for p in partial[:5])
    raise ConfigError(f"{ref!r} names {len(partial)} runs ({names}{', ...' if len(partial) > 5 else ''}): give more "
                      "of the id")
