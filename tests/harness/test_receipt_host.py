"""Taking the receipt on the host (host/receipt.py): the one command, the payload with its launcher, and every
way the host's answer can be unusable (a flood, no record, not JSON, a payload that would not unpack, a lost
link, an image that cannot measure), each named; and the launcher itself, on a python without torch or with a
CPU-only one ("not measured", exit 3) and with torch (it runs `python -m remote.receipt`)."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from remote.checks import receipt as host_check
from tests.harness.sim_receipts import sim_offer, sim_receipt
from vast_harness.host.receipt import (
    FILE_MARK,
    LAUNCHER_DIR,
    MAX_OUTPUT_BYTES,
    PROGRAM,
    RC_MARK,
    receipt_command,
    receipt_payload,
    run_receipt,
)
from vast_harness.records import StepOutcome

ROOT = Path(__file__).resolve().parents[2]


class _Host:
    """A session double: prints `lines` (or floods) and ends as `outcome` says."""

    def __init__(self, lines: list[str], *, rc: int | None = 0, flood: bool = False, lost: bool = False) -> None:
        self.lines, self.rc, self.flood, self.lost = lines, rc, flood, lost
        self.commands: list[str] = []

    def run(self, command: str, *, on_line, timeout_s: float, stop: threading.Event | None = None, env=None):
        self.commands.append(command)
        for line in self.lines:
            on_line("stdout", line)
        while self.flood and not (stop is not None and stop.is_set()):
            on_line("stdout", "x" * 1000)
        if self.lost:
            return StepOutcome(rc=None, seconds=0.1, connection_lost=True, detail="connection lost")
        if self.flood:
            return StepOutcome(rc=None, seconds=0.1, timed_out=True, detail="stopped")
        return StepOutcome(rc=self.rc, seconds=0.1)


def _read(host: _Host):
    seen = [0]
    read = run_receipt(host, budget_s=90, timeout_s=30, stop=threading.Event(),  # type: ignore[arg-type]
                       on_bytes=lambda n: seen.__setitem__(0, seen[0] + n))
    return read, seen[0]


GOOD = json.dumps(sim_receipt(sim_offer(__import__("random").Random(1), "H100 SXM"), 3), indent=1).splitlines()


def test_a_record_is_read_with_the_receipts_own_lines_and_its_path_and_every_byte_counted():
    host = _Host(["receipt: GPU 0 ...", f"{RC_MARK} 0", f"{FILE_MARK} /root/.vh-receipt/receipt.json", *GOOD])
    read, counted = _read(host)
    assert read.problem == "" and read.doc["schema"] == "vh-receipt" and read.rc == 0
    assert read.host_path == "/root/.vh-receipt/receipt.json" and read.output == ["receipt: GPU 0 ..."]
    assert counted == read.bytes_read == sum(len(line) + 1 for line in host.lines)
    assert host.commands == [receipt_command(90)]


@pytest.mark.parametrize(("host", "says"), [
    (_Host([], flood=True), f"more than {MAX_OUTPUT_BYTES} bytes (flooding)"),
    (_Host(["boom", f"{RC_MARK} 1", f"{FILE_MARK} /r.json"]), "wrote no record (exit 1): boom"),
    (_Host([f"{RC_MARK} 0", f"{FILE_MARK} /r.json", "{not json"]), "is not JSON"),
    (_Host([f"{RC_MARK} 0", f"{FILE_MARK} /r.json", "[" * 100_000 + "]" * 100_000]), "nested too deeply"),
    (_Host(["tar: error", f"{RC_MARK} 97"], rc=97), "payload could not be unpacked on the host: tar: error"),
    (_Host(["receipt: starting"], lost=True), "did not finish: connection lost"),
])
def test_an_unusable_answer_is_named_never_parsed_as_a_receipt(host, says):
    read, _ = _read(host)
    assert read.doc is None and says in read.problem, read.problem


def test_an_image_that_cannot_measure_is_said_as_the_launcher_says_it():
    read, _ = _read(_Host(["vh-receipt: no torch in this image", f"{RC_MARK} 3", f"{FILE_MARK} /r.json"]))
    assert read.not_measured and read.problem == "no torch in this image" and read.doc is None


def test_the_payload_holds_the_receipt_its_launcher_and_nothing_else_and_is_reproducible():
    payload = receipt_payload()
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(payload.data))) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert f"{LAUNCHER_DIR}/{PROGRAM}" in names and names[f"{LAUNCHER_DIR}/{PROGRAM}"].mode & 0o111
    assert "remote/__init__.py" in names and "remote/receipt/__main__.py" in names
    assert all(n == "remote/__init__.py" or n.startswith("remote/receipt/") for n in names)
    assert receipt_payload(ROOT).sha256 == payload.sha256 and payload.size_bytes < 64_000


def test_the_command_appends_our_launcher_last_so_the_hosts_own_answers_first():
    command = receipt_command(61.5)
    assert f'export PATH="$PATH:$HOME/.vh-receipt/{LAUNCHER_DIR}"' in command
    assert "--budget-s 61.5" in command and 'chmod 700 "$HOME/.vh-receipt"' in command


# ------------------------------------------------------------------------------ the launcher on this machine
def _unpacked(tmp_path: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(gzip.decompress(receipt_payload().data))) as tar:
        tar.extractall(tmp_path / "payload", filter="data")
    return tmp_path / "payload" / LAUNCHER_DIR / PROGRAM


def _python_shim(tmp_path: Path, *flags: str, pythonpath: Path | None = None) -> dict[str, str]:
    """A PATH whose python3 is this interpreter with `flags` (-I -S: no site-packages, so no torch)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "python3"
    env = f"PYTHONPATH={pythonpath} " if pythonpath else ""
    shim.write_text(f"#!/bin/sh\n{env}exec {sys.executable} {' '.join(flags)} \"$@\"\n")
    shim.chmod(0o755)
    return {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(tmp_path)}


def test_the_launcher_says_not_measured_without_torch(tmp_path):
    launcher = _unpacked(tmp_path)
    done = subprocess.run([launcher, "--out", tmp_path / "r.json"], capture_output=True, text=True, timeout=60,
                          env=_python_shim(tmp_path, "-I", "-S"))
    assert done.returncode == 3 and "vh-receipt: no torch in this image" in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_the_launcher_says_not_measured_with_a_cpu_only_torch(tmp_path):
    fake = tmp_path / "site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    dist = fake / "torch-2.11.0+cpu.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.11.0+cpu\n")
    done = subprocess.run([_unpacked(tmp_path), "--out", tmp_path / "r.json"], capture_output=True, text=True,
                          timeout=60, env=_python_shim(tmp_path, "-s", pythonpath=fake))
    assert done.returncode == 3 and "a CPU-only torch (2.11.0+cpu)" in done.stderr


@pytest.mark.slow
def test_the_launcher_runs_the_receipt_where_torch_is(tmp_path):
    """The payload as uploaded, run from its own directory with this machine's torch, on the CPU."""
    out = tmp_path / "r.json"
    done = subprocess.run([_unpacked(tmp_path), "--out", out, "--budget-s", "20", "--device", "cpu"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin",
                               "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert host_check.check(out) == [] and json.loads(out.read_text())["device"] == "cpu"


def test_the_simulators_answer_is_a_valid_receipt(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("\n".join(GOOD))
    assert host_check.check(path) == []


REAL = ROOT / ".evidence/receipt-2026-12-06/h100-call4-payload"


def test_a_real_h100_hosts_answer_to_the_receipt_command_is_read_and_passes_like_for_like():
    """What a lent H100 printed for `receipt_command(90)` (the payload and launcher shipped, run by bash as a
    host runs it) reads as the run reads it and passes the default policy against an H100 offer's figures."""
    from tests.harness.test_receipt_judge import OFFERS, POLICY, REFS
    from vast_harness.host.receipt_judge import judge

    assert "vh-receipt --out" in (REAL / "receipt_cmd.sh").read_text()  # receipt_command(90) at commit 115a52a
    read, _ = _read(_Host((REAL / "host-answer.txt").read_text().splitlines()))
    assert read.problem == "" and read.rc == 0 and read.doc == json.loads((REAL / "receipt.json").read_text())
    judged = judge(read.doc, OFFERS["H100 SXM"], POLICY, REFS)
    assert judged.verdict == "passed", judged.reason
    assert judged.host_wall_s is not None and judged.host_wall_s <= 90
