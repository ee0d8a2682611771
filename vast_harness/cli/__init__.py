"""The `vast-e2e` command. `main` is the installed entry point; the app itself lives in `app.py`.

Importing the app takes about a second (typer, pydantic, rich and the harness). A Ctrl-C (or a SIGTERM or
SIGHUP) in that second is a clean exit 130 with one line, not a traceback or a silent 143: nothing is rented yet. The quiet handler is installed when
`main` is called, never on import, and `app.main` puts the default one back before doing anything.
"""

from __future__ import annotations

import os
import signal


def _interrupted_while_starting(signum: int, frame: object) -> None:
    os.write(2, b"error: interrupted before anything was rented\n")
    os._exit(130)


# The signals a run treats as an interrupt (run/signals.py): each is the same clean exit 130 while starting.
STARTUP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def main() -> None:
    for signum in STARTUP_SIGNALS:
        signal.signal(signum, _interrupted_while_starting)
    try:
        from vast_harness.cli.app import main as app_main
    except ModuleNotFoundError as exc:  # a Python without the project's dependencies (typer, pydantic, httpx...)
        os.write(2, f"error: {exc}: run this with the project's environment: `uv run vast-e2e ...` or `uv run "
                    "python scripts/vast_e2e.py ...` (uv installs everything from uv.lock)\n".encode())
        raise SystemExit(2) from None
    app_main()
