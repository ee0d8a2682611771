"""Artifact scenarios (issue 43): a secret inside a binary artifact, as an account kind.

* ``secret_artifact``  the real CLI (`vast-e2e run`, in a process of its own) runs a command that writes a binary
                 file holding a value the run must mask, prints that value, and pulls the file back with
                 `--artifact`. The variant (cycling with the seed) says which file and which value: a zip archive
                 as `torch.save` writes one, the value in its pickle (`zip`: what HF Trainer's
                 `training_args.bin` holds with `push_to_hub`), the value amid random bytes (`raw`), or the
                 account key itself, handed to the host as a setting (`account_key`). Judged: the artifact is
                 byte for byte what the command wrote and its recorded sha256 is the host's (else
                 `artifact_altered`); it is private and a warning names the file and the secret's name in the
                 console, the record and the report (else `secret_leak`, `secret_unwarned`); no other file or
                 output of the run holds the value (else `secret_leak`); and, as for every account kind, nothing
                 leaks, no absence is false, no traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

from vast_harness.chaos.account import CHILD_LIMIT_S, MORE_KINDS, AccountOutcome, AccountPlan, _mismatch
from vast_harness.chaos.engine import KEY, SCALE
from vast_harness.chaos.judge import Violation, secret_leaks
from vast_harness.masking import ACCOUNT_KEY, spoken
from vast_harness.resources import data_root
from vast_harness.sim.server import SimServer

ARTIFACT = "out/blob.bin"
# The command's file, made the same way on the host (the simulator's hosts run this machine's Python) and here
# by the judge: what the artifact must be, byte for byte.
_MAKE = '''
import io, pickle, random, zipfile


def make(variant, seed, value):
    rng = random.Random(seed)
    noise = bytes(rng.getrandbits(8) for _ in range(4096))
    if variant == "raw":
        return noise[:2048] + value.encode() + noise[2048:]
    buf = io.BytesIO()  # torch.save's layout: a stored (uncompressed) zip, the object pickled in data.pkl
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        for name, data in (("archive/data.pkl", pickle.dumps({"hub_token": value, "lr": 3e-4}, protocol=2)),
                           ("archive/data/0", noise), ("archive/version", b"3\\n")):
            zf.writestr(zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0)), data)
    return buf.getvalue()
'''
_SCRIPT = _MAKE + '''

import os, sys

os.makedirs("out", exist_ok=True)
value = os.environ[sys.argv[2]]
with open("out/blob.bin", "wb") as fh:
    fh.write(make(sys.argv[1], int(sys.argv[3]), value))
print("wrote out/blob.bin holding", value)
'''


def expected_artifact(variant: str, seed: int, value: str) -> bytes:
    namespace: dict[str, Any] = {}
    exec(compile(_MAKE, "<chaos artifact>", "exec"), namespace)  # noqa: S102 - this module's own source text
    made: bytes = namespace["make"](variant, seed, value)
    return made


def run_secret_artifact(plan: AccountPlan, sim: SimServer, work: Path, outcome: AccountOutcome) -> None:
    variant = plan.variant or "zip"
    rng = random.Random(plan.seed)
    if variant == "account_key":  # the host was given the key (a setting, a workdir file): the run must mask it
        name, value, said = "LEAK", KEY, ACCOUNT_KEY
        given = ["--remote-env", f"LEAK={KEY}"]
    else:
        name, value = "HF_TOKEN", "hf_" + "".join(rng.choice("abcdefghijkmnpqrstuvwxyzABCDEFGH23456789")
                                                   for _ in range(30))
        said, given = name, ["--remote-secret", name]
    workdir, state, cwd = work / "proj", work / "state-a", work / "cli"
    for folder in (workdir, cwd):
        folder.mkdir()
    (workdir / "gen.py").write_text(_SCRIPT)
    argv = ["run", "--api-url", sim.url, "--pacing-scale", str(SCALE), "--proof-interval", "0.1",
            "--max-minutes", "2", "--workdir", str(workdir), "--artifact", "out", *given, "--",
            "python", "gen.py", variant, name, str(plan.seed)]
    env = dict(os.environ, VAST_API_KEY=KEY, VAST_HARNESS_HOME=str(state), PYTHONPATH=str(data_root()))
    env[name] = value
    try:
        p = subprocess.run([sys.executable, "-m", "vast_harness.chaos.child", "--cli", "--sim-timings", "--", *argv],
                           cwd=cwd, env=env, capture_output=True, text=True, timeout=CHILD_LIMIT_S, check=False)
        code: int | None = p.returncode
        console = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        code, console = None, "".join(s.decode(errors="replace") if isinstance(s, bytes) else s or ""
                                      for s in (exc.stdout, exc.stderr))
        outcome.violations.append(Violation(kind="hang", detail=f"the run did not end in {CHILD_LIMIT_S:g} s"))
    (work / "run.log").write_text(console)
    outcome.exit_codes = [code]
    if code != 0:
        _mismatch(outcome, f"a run whose artifact holds {spoken(said)} exited {code}: {console[-600:]}")
    run_dir = next((d for d in state.iterdir() if (d / "harness-result.json").is_file()), None) \
        if state.is_dir() else None
    if run_dir is None:
        _mismatch(outcome, "the run left no harness-result.json: nothing judged")
        return
    kept = run_dir / "artifacts" / ARTIFACT
    outcome.violations += artifact_violations(kept, expected_artifact(variant, plan.seed, value), run_dir, said,
                                              console)
    outcome.violations += secret_leaks(work, value, kept=kept, what=spoken(said))


def artifact_violations(kept: Path, expected: bytes, run_dir: Path, said: str, console: str) -> list[Violation]:
    """The artifact byte for byte, its recorded sha256 the host's, and the warning wherever a reader looks."""
    found: list[Violation] = []
    digest = hashlib.sha256(expected).hexdigest()
    if not kept.is_file() or kept.read_bytes() != expected:
        found.append(Violation(kind="artifact_altered", detail=f"{ARTIFACT} is not what the command wrote ("
                               f"{'missing' if not kept.is_file() else hashlib.sha256(kept.read_bytes()).hexdigest()}"
                               f", expected {digest})"))
    try:
        arts = json.loads((run_dir / "harness-result.json").read_text()).get("artifacts") or {}
    except (OSError, ValueError):
        arts = {}
    recorded = ((arts.get("sha256") or {}).get(ARTIFACT), (arts.get("host_sha256") or {}).get(ARTIFACT))
    if recorded != (digest, digest):
        found.append(Violation(kind="artifact_altered", detail=f"recorded sha256 (here, the host's) {recorded}, "
                               f"the command wrote {digest}"))
    report = (run_dir / "report.html").read_text(errors="replace") if (run_dir / "report.html").is_file() else ""
    where = {"console": f"artifact {ARTIFACT} holds {spoken(said)}" in console,
             "record": (arts.get("secrets_found") or {}).get(ARTIFACT) == [said],
             "report": ARTIFACT in report and said in report}
    found += [Violation(kind="secret_unwarned", detail=f"{ARTIFACT} holds {spoken(said)}: not said in the {w}")
              for w, said_there in where.items() if not said_there]
    return found


MORE_KINDS["secret_artifact"] = run_secret_artifact
