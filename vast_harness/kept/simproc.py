"""The simulator of a `--sim` kept host: a `python -m vast_harness.sim` of its own, detached, that outlives the
`up` which started it (an embedded one dies with its process, and the held instance with it).

`up --sim` starts it (its own session, so a Ctrl-C or a closed terminal of the `up` does not reach it; its output
in `<state>/sim/held/sim-<hold>.log`) and records its URL, pid and the pid's start in the hold's record. `down`
stops it when no other hold uses it (`run/hold.stop_detached_sim`); else it stops itself once no instance has
been live for a few seconds (the switch deleted the last one) or at the end of its lifetime (the hold's time
cap and a margin), so nothing of it lingers. Its timings are the embedded simulator's (`Timings.sim()`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel

from vast_harness.clock import now_s
from vast_harness.errors import ConfigError
from vast_harness.state.process import process_start
from vast_harness.timings import Timings

SIM_OFFERS = 1000  # as the embedded simulator (api.py): every profile finds offers
START_S = 30.0  # the simulator answers within this, or the `up` stops
EMPTY_EXIT_S = 60.0  # it stops this long after its last instance is gone and the last call (a reap may come)
LIFETIME_MARGIN_S = 120.0  # past the hold's time cap: the switch's deletion and a reap's proof fit in it


# Starts the simulator in a session of its own and exits at once, printing its pid: the simulator is then no
# child of the command (nothing reaps it, nothing warns about it; it outlives the command, as it must).
_LAUNCHER = ("import subprocess, sys\n"
             "with open(sys.argv[1], 'ab') as log:\n"
             "    p = subprocess.Popen(sys.argv[2:], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,"
             " start_new_session=True)\n"
             "print(p.pid)\n")


class DetachedSim(BaseModel):
    url: str
    pid: int
    pid_start: str | None
    log: str


def start_detached_sim(held_dir: Path, hold_id: str, *, timings: Timings, lifetime_s: float) -> DetachedSim:
    """Start the simulator and wait until it listens; ConfigError (nothing rented) when it does not."""
    held_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    log = held_dir / f"sim-{hold_id}.log"
    argv = [sys.executable, "-m", "vast_harness.sim", "--port", "0", "--seed", "0",
            "--boot-seconds", f"{timings.min_boot_s:g}", "--rate-scale", f"{timings.pacing_scale:g}",
            "--offers", str(SIM_OFFERS), "--exit-when-empty", f"{EMPTY_EXIT_S:g}",
            "--max-lifetime", f"{lifetime_s + LIFETIME_MARGIN_S:.0f}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VAST_API_KEY")}  # it needs none
    launched = subprocess.run([sys.executable, "-c", _LAUNCHER, str(log), *argv], env=env, cwd=str(held_dir),
                              capture_output=True, text=True, timeout=START_S, check=False)
    try:
        pid = int(launched.stdout.strip())
    except ValueError:
        raise ConfigError(f"the kept host's simulator did not start: {launched.stderr[-300:]!r}; nothing rented"
                          ) from None
    sim = DetachedSim(url="", pid=pid, pid_start=process_start(pid), log=str(log))
    return sim.model_copy(update={"url": _wait_listening(sim, log)})


def _wait_listening(sim: DetachedSim, log: Path) -> str:
    deadline = now_s() + START_S
    seen = b""
    with open(log, "rb") as fh:
        while now_s() < deadline:
            seen += fh.read()
            for line in seen.decode("utf-8", "replace").splitlines():
                if "listening on " in line:
                    return line.rsplit("listening on ", 1)[1].strip()
            if process_start(sim.pid) != sim.pid_start:
                break  # it exited
            time.sleep(0.05)
    stop_sim(sim)
    raise ConfigError(f"the kept host's simulator did not start (its log: {log}): "
                      f"{seen.decode('utf-8', 'replace')[-300:]!r}; nothing rented")


def stop_sim(sim: DetachedSim) -> None:
    """Stop a simulator this `up` started and no hold uses (the `up` failed)."""
    if process_start(sim.pid) == sim.pid_start:
        try:
            os.kill(sim.pid, signal.SIGTERM)
        except OSError:
            pass
