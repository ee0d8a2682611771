"""Every session runs away from the user's own directories and leaves the checkout as it found it.

Before any test, fixture or xdist worker starts, `pytest_configure` points HOME and the XDG base directories
(state, config, cache, data) at a temporary directory and drops the user's `VAST_*` variables, so no process of
the session (this one, the workers, every CLI a test starts) reaches the user's harness state (ledger, live-run
registrations, evidence), config file or the official CLI's key file (`~/.config/vastai/vast_api_key`). uv's own
cache and interpreters stay where they are: the wheel test builds and installs offline from them.

Three checks hold it (tests/isolation.py; tests/harness/test_suite_isolation.py shows each one working): an
audit hook in every process of the session fails the test during which anything opened, listed or changed a
path under the user's directories; at the end the session fails when a file there changed that names this
session's temporary directories (a run of ours that got there through a process the hook cannot see); and it
fails when the checkout gained or changed a file (`git status`, ignored files included).

Every test also gets its own harness state directory (`VAST_HARNESS_HOME`), in this process and in the CLI
processes it starts.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import isolation
from vast_harness.masking import MASKER
from vast_harness.state import dirs

_session: dict[str, object] = {}  # in the process that made the session home: what the end compares with
GUARD = pytest.StashKey[isolation.UserDirGuard]()
COLLECTION = pytest.StashKey["Collection"]()


DEFAULT_SET_WORKERS = 6  # the default set mostly waits: six workers overlap the waits, even on two cores
SLOW_SET_WORKERS = 2  # torchrun worlds and the whole chaos suite (its caps timed to the tenth of a second) need
# the cores themselves: on two cores four workers of them put runs past their caps


def cache_bytecode(environ: dict[str, str] | os._Environ[str]) -> Path | None:
    """Under PYTHONDONTWRITEBYTECODE (set on this project's machines) nothing is cached: every xdist worker
    rewrote every test module's asserts (about 8 s of CPU each) and every CLI process a test starts compiled the
    package again. The session caches bytecode outside the checkout instead, in a directory of this user's own
    (0700: a shared temp directory must not hand us another user's bytecode), kept between sessions, for this
    process and every one it starts. Returns the directory, or None where nothing changed."""
    if not environ.get("PYTHONDONTWRITEBYTECODE") or environ.get("PYTHONPYCACHEPREFIX"):
        return None
    prefix = Path(tempfile.gettempdir()) / f"vast-harness-test-pycache-{os.getuid()}"
    try:
        prefix.mkdir(mode=0o700, exist_ok=True)
        st = prefix.lstat()
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None  # not ours alone: no cache rather than a planted one
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    environ["PYTHONPYCACHEPREFIX"] = str(prefix)
    sys.dont_write_bytecode = False
    sys.pycache_prefix = str(prefix)
    return prefix


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject.toml addopts): six workers when the slow tests are left out, two when any run
    (`-m slow`, `-m ""`); PYTEST_XDIST_AUTO_NUM_WORKERS, or `-n N` on the command line, still wins."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if given:
        return int(given)
    return DEFAULT_SET_WORKERS if config.option.markexpr == "not slow" else SLOW_SET_WORKERS


def pytest_configure(config: pytest.Config) -> None:
    cache_bytecode(os.environ)
    home = isolation.isolate_session(os.environ)
    if home is not None:  # the controller (or the one process of -n 0): it checks and cleans up at the end
        _session.update(home=home, user_files=isolation.file_times(isolation.guarded_dirs(os.environ)),
                        checkout=isolation.checkout_status())
    config.stash[GUARD] = isolation.UserDirGuard(isolation.guarded_dirs(os.environ))  # after the look above


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    guard = item.config.stash[GUARD]
    guard.current = item.nodeid
    try:
        return (yield)
    finally:
        guard.current = "(between tests)"


@pytest.fixture(autouse=True)
def _no_user_dirs(pytestconfig: pytest.Config) -> Iterator[None]:
    """Fails the test (in its teardown) during which, or before which since the last test's check (a module
    fixture of its), this process touched a user directory."""
    yield
    guard = pytestconfig.stash[GUARD]
    touched, guard.reported = guard.seen[guard.reported:], len(guard.seen)
    assert not touched, f"the user's own directories were touched: {touched[:5]}"


@pytest.fixture(autouse=True)
def _a_masker_of_its_own() -> Iterator[None]:
    """What a test's runs (and the module fixtures set up before it) told the process's masker is forgotten
    after it: one test's secret never masks another test's text."""
    yield
    MASKER.forget()


@dataclass(frozen=True)
class Collection:
    """What this process collected (an xdist worker collects the whole session): tests run and deselected, the
    files they are in, and the filters (tests/harness/test_suite_figures.py compares the size with the docs)."""

    selected: int
    deselected: int
    files: frozenset[Path]
    markexpr: str
    keyword: str


_deselected: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config.stash[COLLECTION] = Collection(
        selected=len(session.items), deselected=len(_deselected),
        files=frozenset(item.path for item in [*session.items, *_deselected]),
        markexpr=session.config.option.markexpr, keyword=session.config.option.keyword)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if "home" not in _session:
        return
    problems: list[str] = []
    basetemp = session.config._tmp_path_factory.getbasetemp()  # the workers' basetemps are under it
    user_files = _session["user_files"]
    assert isinstance(user_files, dict)
    for path in isolation.written_by(user_files, isolation.guarded_dirs(os.environ),
                                     (str(_session["home"]), str(basetemp))):
        problems.append(f"{path}, a user's file, was written by this session")
    before = _session["checkout"]
    after = isolation.checkout_status()
    if before is not None and after is not None and after != before:
        problems += [f"the checkout changed while the tests ran: {line}" for line in sorted(after ^ before)]
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        for line in problems:
            if reporter is not None:
                reporter.write_line(f"ERROR: {line}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config: pytest.Config) -> None:
    if "home" in _session:
        shutil.rmtree(str(_session["home"]), ignore_errors=True)


@pytest.fixture(autouse=True)
def _harness_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "vh-state"
    monkeypatch.setenv("VAST_HARNESS_HOME", str(state))
    # resolve(environ={...}) given a mapping that names no state directory would fall back to platformdirs (the
    # session's XDG_STATE_HOME, shared by a worker's tests): it gets the test's own directory instead.
    real = dirs.state_dir

    def state_dir(environ: Mapping[str, str] | None = None) -> Path:
        named = environ is None or environ.get(dirs.STATE_ENV, "").strip() or environ.get("XDG_STATE_HOME", "")
        return real(environ) if named else state

    monkeypatch.setattr("vast_harness.spec.resolve.user_state_dir", state_dir)
    return state
