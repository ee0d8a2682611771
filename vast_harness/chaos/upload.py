"""Upload and step-end scenarios (issue 43), as account kinds: `account.py` runs them, each a guarded run of
`vast-e2e run -- CMD` in a process of its own (chaos/child.py, the suite's clocks) against the simulator; the
variant cycles with the seed.

* ``credentials_in_workdir``  the workdir holds the account's API key file (given with `--key-file` inside it, or
                    the official CLI's `~/.config/vastai/vast_api_key` with $HOME as the workdir) and one file of
                    each credential family. While the run's command waits in its step, the judge reads the
                    simulated host's sandbox itself (every file, the uploaded tarball decompressed): none of their
                    bytes may be there (`secret_on_host`), and each must be named as left out in the record and on
                    the console (`not_named`). The run passes (exit 0).
* ``daemon_command``  the command leaves a process running in the background (`sleep 300 & ...; exit 0`), a
                    `--setup` starts a daemon that prints for ever before the command, or a background process
                    floods the output after the command exits: each step ends on its exit status, well before the
                    time cap (`step_held`), the record says its output was left open, the command runs, and the
                    run exits 0 within its caps (`over_cap_time`, from the simulator's record).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

from vast_harness.chaos.account import (
    MORE_KINDS,
    VARIANTS,
    AccountOutcome,
    AccountPlan,
    _mismatch,
    _spawn_run,
    _wait,
    _wait_for,
)
from vast_harness.chaos.engine import KEY, ChildJob, CommandJob
from vast_harness.chaos.judge import Violation, cap_violations
from vast_harness.sim.server import SimServer

MAX_MINUTES = 1.5  # the runs' time cap: a step held to it shows as step_held (and the run as exit 6)
STEP_ENDS_WITHIN_S = 20.0  # the exit status, the 2 s drain and a loaded machine's slack
IN_STEP_LIMIT_S = 60.0  # from the spawn to the command waiting in its step
# One file per credential family (spec/credentials.py), each with bytes that are found nowhere else.
CREDENTIAL_FILES = (".env", "id_rsa", ".netrc", ".aws/credentials", ".docker/config.json", ".git-credentials",
                    ".kube/config", ".pypirc", "certs/server.key", "deploy_key")
VARIANTS.update({
    "credentials_in_workdir": ("key_file", "official_home"),
    "daemon_command": ("background", "setup_daemon", "background_flood"),
})


def _spawn(work: Path, sim: SimServer, state: Path, command: CommandJob) -> subprocess.Popen[bytes]:
    """`vast-e2e run -- CMD` as `command` says, a guarded run in a process of its own (the suite's clocks), its
    console in `a.log`."""
    job = ChildJob(api_url=sim.url, evidence_dir=state, state_dir=state, steps=[], max_minutes=MAX_MINUTES,
                   max_usd=None, boot_retries=0, proof_interval_s=0.1, t0_file=work / "a.t0", command=command)
    (work / "a.json").write_text(job.model_dump_json())
    return _spawn_run(work / "a.json", work / "a.log")


def _said(work: Path) -> str:
    """The run's console, as one line (it wraps at its width)."""
    return " ".join((work / "a.log").read_text(errors="replace").split())


def _record(state: Path) -> dict[str, Any]:
    for path in state.rglob("harness-result.json"):
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return {}


def _host_bytes(sim: SimServer) -> bytes:
    """Every byte the simulated hosts hold in their sandboxes, a gzip file (the uploaded tarball) decompressed."""
    blobs = []
    for path in sorted(p for p in sim.backend.host_root.rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            data = path.read_bytes()
            blobs.append(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        except (OSError, EOFError, zlib.error):
            continue  # a file the host is still writing, or removed under us
    return b"\n".join(blobs)


# ------------------------------------------------------------------------------------------ credentials
def run_credentials_in_workdir(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "key_file"
    home = work / "home"
    workdir = home if variant == "official_home" else work / "proj"
    key_file = (home / "config" / "vastai" / "vast_api_key" if variant == "official_home"
                else workdir / "vast.key")
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    secrets = {}
    for n, rel in enumerate(CREDENTIAL_FILES):
        secrets[rel] = f"vh-chaos-credential-{plan.seed}-{n}-c4e1"
        body = secrets[rel]
        if rel == "deploy_key":  # known by its content, not its name
            body = f"-----BEGIN OPENSSH PRIVATE KEY-----\n{body}\n-----END OPENSSH PRIVATE KEY-----\n"
        (workdir / rel).parent.mkdir(parents=True, exist_ok=True)
        (workdir / rel).write_text(body)
    (workdir / "train.py").write_text("print('trained')\n")
    gate = work / "gate"
    gate.mkdir()
    wait = f'touch "{gate}/in-step"; while [ ! -e "{gate}/open" ]; do sleep 0.1; done; echo done'
    # $HOME as the workdir holds the harness's state too: left out and named like the key
    state = home / "state" if variant == "official_home" else work / "state-a"
    environ = {"HOME": str(home), "XDG_CONFIG_HOME": str(home / "config"), "VAST_HARNESS_HOME": str(state)}
    proc = _spawn(work, sim, state, CommandJob(command=["sh", "-c", wait], workdir=str(workdir), environ=environ,
                                               key_file=str(key_file) if variant == "key_file" else None))
    in_step = _wait_for(lambda: (gate / "in-step").exists() or proc.poll() is not None, IN_STEP_LIMIT_S)
    on_host = _host_bytes(sim) if in_step and proc.poll() is None else b""
    (gate / "open").touch()
    outcome.exit_codes = [_wait(proc)]
    if not on_host:
        _mismatch(outcome, f"credentials ({variant}): the command never waited in its step: nothing tested")
        return
    if b"train.py" not in on_host and b"trained" not in on_host:
        _mismatch(outcome, f"credentials ({variant}): the workdir is not on the host: the judge read nothing")
    for name, secret in [(key_file.name, KEY), *secrets.items()]:
        if secret.encode() in on_host:
            outcome.violations.append(Violation(kind="secret_on_host", detail=f"credentials ({variant}): the bytes "
                                                f"of {name} are on the host"))
    if outcome.exit_codes != [0]:
        _mismatch(outcome, f"credentials ({variant}): the run exited {outcome.exit_codes}, expected 0")
    left = {item.get("path") for item in _record(state).get("workdir", {}).get("left_out", [])}
    said = _said(work)
    key_rel = key_file.relative_to(workdir).as_posix()
    for rel in [key_rel, *CREDENTIAL_FILES, *(["state/"] if variant == "official_home" else [])]:
        if rel not in left or f"{rel} (" not in said:
            where = " and ".join(w for w, missing in (("the record", rel not in left), ("the console", f"{rel} ("
                                                                                       not in said)) if missing)
            outcome.violations.append(Violation(kind="not_named", detail=f"credentials ({variant}): {rel} was "
                                                f"left out but not named in {where}"))


# ------------------------------------------------------------------------------------------ daemon
def run_daemon_command(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "background"
    workdir = work / "proj"
    workdir.mkdir()
    (workdir / "job.sh").write_text("echo the command ran\n")
    command = {"background": "sleep 300 & echo started; exit 0",
               "setup_daemon": "sh job.sh",
               "background_flood": "yes \"$(printf '%0200d' 0)\" & echo started; exit 0"}[variant]
    setup = ["(while sleep 0.2; do echo tick; done) & echo daemon up"] if variant == "setup_daemon" else None
    state = work / "state-a"
    t_start = time.time()
    proc = _spawn(work, sim, state, CommandJob(command=["sh", "-c", command], workdir=str(workdir), setup=setup))
    outcome.exit_codes = [_wait(proc)]
    record = _record(state)
    steps = record.get("steps", [])
    if outcome.exit_codes != [0]:
        _mismatch(outcome, f"daemon ({variant}): the run exited {outcome.exit_codes}, expected 0 (the command "
                  "exited 0)")
    held = [s for s in steps if s.get("seconds", 0) > STEP_ENDS_WITHIN_S]
    for step in held:
        outcome.violations.append(Violation(kind="step_held", detail=f"daemon ({variant}): step {step.get('name')} "
                                            f"took {step.get('seconds')} s; it exited at once (rc {step.get('rc')})"))
    backgrounded = steps[:1] if variant == "setup_daemon" else steps[-1:]
    if not backgrounded or not all(s.get("output_left_open") for s in backgrounded):
        _mismatch(outcome, f"daemon ({variant}): the record does not say a background process held the output "
                  f"open: {[(s.get('name'), s.get('output_left_open')) for s in steps]}")
    if variant == "setup_daemon" and [(s.get("name"), s.get("rc")) for s in steps] != [("setup-1", 0), ("run", 0)]:
        _mismatch(outcome, f"daemon ({variant}): the command after a daemonising setup did not run: "
                  f"{[(s.get('name'), s.get('rc')) for s in steps]}")
    with contextlib.suppress(OSError, ValueError):  # the run's own start: its time cap counts from there
        t_start = float((work / "a.t0").read_text())
    outcome.violations += cap_violations(sim.state()["instances"], time.time(), t_start, max_usd=float("inf"),
                                         max_seconds=MAX_MINUTES * 60.0, evidence_dir=state)


UPLOAD_SCENARIOS = {"credentials_in_workdir": run_credentials_in_workdir, "daemon_command": run_daemon_command}
MORE_KINDS.update(UPLOAD_SCENARIOS)  # account.run_account runs them (the package imports this module)
