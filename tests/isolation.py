"""The suite's isolation from the user's own directories, and its check that the checkout stays as it was.

`tests/conftest.py` applies these to every session; `tests/harness/test_suite_isolation.py` shows each working.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from vast_harness.state import dirs

ROOT = Path(__file__).resolve().parents[1]
SESSION_HOME_ENV = "VH_TEST_SESSION_HOME"  # set by the process that made the session home; its children inherit
USER_DIRS_ENV = "VH_TEST_USER_DIRS"  # the user's own directories (a JSON list), as that process found them
USER_VARS = ("VAST_API_KEY", "VAST_URL", "VAST_HARNESS_HOME")
XDG = {"XDG_STATE_HOME": "state", "XDG_CONFIG_HOME": "config", "XDG_CACHE_HOME": "cache", "XDG_DATA_HOME": "data"}


def user_dirs(environ: Mapping[str, str]) -> list[Path]:
    """Where the harness and the official CLI keep a user's files (state, config, cache, data, the official
    CLI's key file), as `environ` places them; the platform defaults too, whatever the environment says."""
    home = Path(environ.get("HOME") or Path.home())

    def xdg(name: str, default: str) -> Path:
        value = environ.get(name, "")
        return Path(value) if value and Path(value).is_absolute() else home / default

    config = xdg("XDG_CONFIG_HOME", ".config")
    found = [dirs.state_dir(environ), home / ".local" / "state" / dirs.APP_DIR,
             xdg("XDG_STATE_HOME", ".local/state") / dirs.APP_DIR, config / dirs.APP_DIR, config / "vastai",
             home / ".config" / "vastai", xdg("XDG_CACHE_HOME", ".cache") / dirs.APP_DIR,
             xdg("XDG_DATA_HOME", ".local/share") / dirs.APP_DIR]
    unique: list[Path] = []
    for path in found:
        path = Path(os.path.abspath(path))
        if path not in unique:
            unique.append(path)
    return unique


def uv_dirs(environ: Mapping[str, str]) -> dict[str, str]:
    """uv's package cache and interpreters, where the user's environment has them: tests that build or install
    with uv (the wheel) run offline from them."""
    home = Path(environ.get("HOME") or Path.home())
    cache = Path(environ.get("XDG_CACHE_HOME") or home / ".cache")
    data = Path(environ.get("XDG_DATA_HOME") or home / ".local" / "share")
    return {"UV_CACHE_DIR": environ.get("UV_CACHE_DIR") or str(cache / "uv"),
            "UV_PYTHON_INSTALL_DIR": environ.get("UV_PYTHON_INSTALL_DIR") or str(data / "uv" / "python")}


def isolate_session(environ: os._Environ[str] | dict[str, str]) -> Path | None:
    """Point `environ` (the process's: every process started later inherits it) at a new session home: HOME and
    the XDG directories under it, the user's VAST_* variables dropped. None when a parent process did it
    already (an xdist worker, a pytest run by a test): that one owns the home and removes it."""
    if environ.get(SESSION_HOME_ENV):
        return None
    environ[USER_DIRS_ENV] = json.dumps([str(p) for p in user_dirs(environ)])
    environ.update(uv_dirs(environ))
    home = Path(tempfile.mkdtemp(prefix="vh-test-home-"))
    environ[SESSION_HOME_ENV] = str(home)
    environ["HOME"] = str(home)
    for name, sub in XDG.items():
        (home / sub).mkdir()
        environ[name] = str(home / sub)
    for name in USER_VARS:
        environ.pop(name, None)
    return home


def guarded_dirs(environ: Mapping[str, str]) -> list[Path]:
    return [Path(p) for p in json.loads(environ[USER_DIRS_ENV])]


class UserDirGuard:
    """An audit hook: every open, listing or change of a path under `roots` is recorded with the test that was
    running. Audit hooks see their own process only; the environment keeps the processes a test starts away."""

    EVENTS = frozenset({"open", "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.replace", "os.remove",
                        "os.rmdir", "os.chmod", "os.chown", "os.utime", "os.symlink", "os.link", "os.truncate",
                        "shutil.rmtree", "shutil.copyfile", "shutil.move"})

    def __init__(self, roots: list[Path]) -> None:
        self.roots = tuple(str(r) for r in roots)
        self.seen: list[tuple[str, str, str]] = []
        self.reported = 0  # how many of `seen` a test has already failed for
        self.current = "(before the first test)"
        sys.addaudithook(self._hook)  # for good: an audit hook cannot be removed

    def under(self, path: object) -> bool:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return False  # a file descriptor, None
        try:
            text = os.path.abspath(os.fsdecode(path))
        except (TypeError, ValueError, OSError):
            return False
        return any(text == root or text.startswith(root + os.sep) for root in self.roots)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if event in self.EVENTS:
            for arg in args[:2]:
                if self.under(arg):
                    self.seen.append((self.current, event, os.fsdecode(arg)))  # type: ignore[call-overload]
                    return


def file_times(roots: list[Path]) -> dict[str, int]:
    """Every file under `roots` and its mtime (ns)."""
    found: dict[str, int] = {}
    for root in roots:
        for where, _, files in os.walk(root):
            for name in files:
                path = os.path.join(where, name)
                try:
                    found[path] = os.stat(path).st_mtime_ns
                except OSError:
                    pass
    return found


def written_by(before: dict[str, int], roots: list[Path], marks: tuple[str, ...]) -> list[str]:
    """Files under `roots` new or changed since `before` whose text names one of `marks` (a session's own
    directories: other sessions on the machine may write there too, and are not ours to judge)."""
    found = []
    for path, mtime in file_times(roots).items():
        if before.get(path) == mtime:
            continue
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            continue
        if any(mark in text for mark in marks):
            found.append(path)
    return found


IGNORED_CHANGES = ("__pycache__/", ".pytest_cache/", ".venv/")  # the interpreter's, pytest's and uv's own


def checkout_status(root: Path = ROOT) -> set[str] | None:
    """`git status` of the checkout, untracked and ignored files included (a new directory as one line), less
    IGNORED_CHANGES; None outside a git checkout."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=root,
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return {line for line in done.stdout.splitlines() if not any(s in line for s in IGNORED_CHANGES)}
