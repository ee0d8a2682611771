"""`vast-e2e` as the tests run it: the one helper.

`cli(...)` runs the command in this process: `vast_harness.cli.main` with the arguments, the environment and
the current directory given, stdin empty and not a terminal, stdout and stderr captured, and what the command's
process would have exited with as `returncode`. It spares the half second or more a new interpreter spends
importing typer, pydantic, rich and httpx, for the many tests that read only output, exit codes and files.

`cli_process(...)` and `spawn(...)` start `scripts/vast_e2e.py` in a new process, for what only a process shows:
signals, a closed or broken stdout, the interpreter's own exit, a run killed with SIGKILL, two commands at once.

Both take the environment the same way: the session's (tests/conftest.py: a home of its own, no user key) with
`home` (HOME, the state dir `home/state` and the config dir `home/config` under it; the current directory too),
`key` (VAST_API_KEY) and `env` (anything else) laid over it; `sim` adds `--api-url` and `--pacing-scale` for a
test's own simulator.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

from vast_harness.sim import SimServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vast_e2e.py"
SIM_PACING_SCALE = "0.01"
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


Env = Mapping[str, str | None]


def cli_env(*, home: Path | None = None, key: str | None = None, env: Env | None = None) -> dict[str, str]:
    """The session's environment less the API key and URL, with `home`, `key` and `env` laid over it (a None
    in `env` unsets its variable)."""
    made = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "VAST_URL")}
    if home is not None:
        made |= {"HOME": str(home), "VAST_HARNESS_HOME": str(home / "state"), "XDG_CONFIG_HOME": str(home / "config")}
    if key is not None:
        made["VAST_API_KEY"] = key
    for name, value in (env or {}).items():
        if value is None:
            made.pop(name, None)
        else:
            made[name] = value
    return made


def _argv(args: tuple[str, ...], sim: SimServer | None) -> list[str]:
    return [*args, "--api-url", sim.url, "--pacing-scale", SIM_PACING_SCALE] if sim is not None else list(args)


@contextmanager
def _process_state(argv: list[str], environ: Mapping[str, str], cwd: Path) -> Iterator[None]:
    """What a process of its own would have had to itself: argv, environment, directory, signal handlers."""
    saved_argv, saved_env, saved_cwd = sys.argv, dict(os.environ), os.getcwd()
    saved_handlers = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_stdin = sys.stdin
    sys.argv = ["vast-e2e", *argv]
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    sys.stdin = io.StringIO("")
    try:
        yield
    finally:
        sys.stdin = saved_stdin
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for signum, handler in saved_handlers.items():
            signal.signal(signum, handler)
        sys.argv = saved_argv


def cli(*args: str, home: Path | None = None, key: str | None = None, env: Env | None = None,
        sim: SimServer | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`vast-e2e ARGS` in this process (the module's docstring); an exception that escapes `main` is what the
    interpreter makes of it: a traceback on stderr and exit 1."""
    from vast_harness.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = _argv(args, sim)
    where = cwd if cwd is not None else home if home is not None else ROOT
    with _process_state(argv, cli_env(home=home, key=key, env=env), where), redirect_stdout(out), \
            redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - what the interpreter would print and exit with
            traceback.print_exc()
            code = 1
    return subprocess.CompletedProcess(["vast-e2e", *argv], code, out.getvalue(), err.getvalue())


def cli_process(*args: str, home: Path | None = None, key: str | None = None, env: Env | None = None,
                sim: SimServer | None = None, cwd: Path | None = None, timeout: float = 120,
                **popen: Any) -> subprocess.CompletedProcess[str]:
    """`python scripts/vast_e2e.py ARGS` in a new process, run to its end (`popen`: subprocess.run's own)."""
    if "input" not in popen:
        popen.setdefault("stdin", subprocess.DEVNULL)
    if "stdout" not in popen and "stderr" not in popen:
        popen["capture_output"] = True
    return subprocess.run([sys.executable, str(SCRIPT), *_argv(args, sim)], text=True, timeout=timeout,
                          env=cli_env(home=home, key=key, env=env),
                          cwd=cwd if cwd is not None else home if home is not None else ROOT, **popen)


def spawn(*args: str, home: Path | None = None, key: str | None = None, env: Env | None = None,
          sim: SimServer | None = None, cwd: Path | None = None, **popen: Any) -> subprocess.Popen[str]:
    """`python scripts/vast_e2e.py ARGS` started in a new process and left running (`popen`: Popen's own;
    stdout and stderr are pipes unless given)."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("text", True)
    return subprocess.Popen([sys.executable, str(SCRIPT), *_argv(args, sim)], env=cli_env(home=home, key=key, env=env),
                            cwd=cwd if cwd is not None else home if home is not None else ROOT, **popen)
