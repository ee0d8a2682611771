"""The receipt's host side on the CPU: nvidia-smi parsing (a fake nvidia-smi on PATH plays old and new
drivers), the whole `python -m remote.receipt --device cpu` run with a gloo all-reduce, its budget, and the
evidence checker against the committed GPU receipts and mutations of them."""

from __future__ import annotations

import copy
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from remote.checks import receipt as check
from remote.receipt import smi

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / ".evidence/receipt-2026-12-06/h200-call2/receipt-h200-1.json"

FAKE_SMI = r'''#!/usr/bin/env python3
import os, sys
args = sys.argv[1:]
old = os.environ.get("FAKE_SMI_OLD") == "1"
q = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if q is None:
    sys.exit(0)
values = {"index": "0", "uuid": "GPU-11111111-2222-3333-4444-555555555555", "clocks.sm": "1365",
          "clocks.max.sm": "1980", "power.draw": "697.20", "temperature.gpu": "61", "pcie.link.gen.current": "5",
          "pcie.link.width.current": "16", "utilization.gpu": "100", "pcie.link.gen.max": "5",
          "pcie.link.width.max": "16", "ecc.mode.current": "Enabled", "ecc.errors.uncorrected.volatile.total": "0",
          "ecc.errors.uncorrected.aggregate.total": "0", "ecc.errors.corrected.volatile.total": "0",
          "retired_pages.pending": "[N/A]", "driver_version": "580.159.04",
          "clocks_throttle_reasons.active": "0x0000000000000044",
          "clocks_event_reasons.active": "0x000000000000000C"}
fields = q.split(",")
for f in fields:
    if f not in values or (old and f == "clocks_event_reasons.active"):
        print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
print(", ".join(values[f] for f in fields))
'''


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text(FAKE_SMI)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ['PATH']}")
    return exe


def test_cells_parse_to_numbers_words_or_none() -> None:
    rows = smi.parse_rows("0, 1365, [N/A], Enabled, 0x4\n1, garbage-line\n", ("i", "clk", "pend", "ecc", "mask"))
    assert rows == [{"i": 0.0, "clk": 1365.0, "pend": None, "ecc": "Enabled", "mask": "0x4"}]
    assert smi.parse_value("[Not Supported]") is None and smi.parse_value(" ") is None


@pytest.mark.parametrize(("mask", "reasons"), [
    ("0x0000000000000004", ["sw_power_cap"]),
    ("0x0000000000000048", ["hw_slowdown", "hw_thermal_slowdown"]),
    ("0x0", []),
    ("junk", []),
    (None, []),
], ids=["power-cap", "hw-and-thermal", "none", "junk", "missing"])
def test_clock_event_mask_decodes_to_named_reasons(mask: str | None, reasons: list[str]) -> None:
    assert smi.reasons_of(smi.parse_mask(mask)) == reasons


def test_a_driver_with_the_new_reason_field_is_read_by_that_name(fake_smi: Path) -> None:
    assert smi.reason_field() == "clocks_event_reasons.active"


def test_an_older_driver_falls_back_to_the_throttle_field(fake_smi: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    assert smi.reason_field() == "clocks_throttle_reasons.active"


def test_a_refused_field_drops_only_itself(fake_smi: Path) -> None:
    rows, refused = smi.query_each(("pcie.link.gen.max", "no.such.field"))
    assert rows == [{"index": 0.0, "pcie.link.gen.max": 5.0}]
    assert list(refused) == ["no.such.field"]


def test_the_sampler_reads_clocks_and_decodes_reasons_while_work_runs(fake_smi: Path) -> None:
    import time

    with smi.Sampler(interval_s=0.05, reason_name="clocks_event_reasons.active") as sampler:
        end = time.monotonic() + 20  # each sample is a Python process: slow on a loaded machine
        while len(sampler.samples) < 2 and time.monotonic() < end:
            time.sleep(0.05)
    assert sampler.error is None and len(sampler.samples) >= 2
    first = sampler.samples[0]
    assert first["clocks.sm"] == 1365.0 and first["event_reasons"] == "sw_power_cap,hw_slowdown"


def test_no_nvidia_smi_is_an_error_not_a_guess(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    rows, why = smi.query_gpu(("index",))
    assert rows == [] and why is not None and "not on PATH" in why
    with smi.Sampler() as sampler:
        pass
    assert sampler.samples == [] and sampler.error


@pytest.mark.slow  # a 10 s CPU burn
def test_the_cpu_receipt_runs_end_to_end_within_its_budget_with_a_gloo_allreduce(tmp_path: Path) -> None:
    out = tmp_path / "receipt.json"
    proc = subprocess.run([sys.executable, "-m", "remote.receipt", "--device", "cpu", "--budget-s", "60",
                           "--burn-s", "1.5", "--cpu-world", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(out.read_text())
    assert check.check_record(rec) == []
    assert rec["wall_s"] <= 60
    gpu = rec["gpus"][0]
    assert gpu["matmul"]["tflops"] > 0 and gpu["hbm_copy"]["median"] > 0 and gpu["burn"]["windows"] >= 10
    assert gpu["h2d"]["error"].startswith("not applicable")
    ar = rec["allreduce"]
    assert ar["backend"] == "gloo" and ar["world"] == 2 and ar["correct"] is True and ar["busbw_gbps"] > 0


def test_a_burn_shorter_than_its_windows_still_has_enough_of_them() -> None:
    """A burn asked for less time than the check's windows take (a loaded CPU's short burn) runs on until it has
    them, within its overrun."""
    import torch

    from remote.receipt import measure

    result = measure.burn(torch.device("cpu"), seconds=0.002, shape=(64, 64, 64))
    assert result.error is None
    assert len(result.windows_tflops) >= measure.BURN_MIN_WINDOWS > check.MIN_BURN_WINDOWS
    assert result.seconds < 10.0  # the overrun bound is from the loop's start; setup may be slow on a loaded CPU


def test_bad_usage_is_exit_2_naming_the_flag(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "remote.receipt", "--device", "cpu", "--budget-s", "-1",
                           "--out", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--budget-s" in proc.stderr


# ------------------------------------------------------------------------------------------- the checker
def test_the_committed_h200_receipt_holds_its_claims() -> None:
    assert check.check(H200) == []


def _mutated(fn) -> list[str]:
    rec = json.loads(H200.read_text())
    fn(rec)
    return check.check_record(rec)


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda r: r["gpus"][0]["matmul"].update(tflops=float("nan")), "matmul"),
    (lambda r: r["gpus"][0]["h2d"].update(median=None, error="OOM"), "h2d"),
    (lambda r: r["gpus"][0]["pcie_link"].update(gen_under_load=None), "pcie_link"),
    (lambda r: r["gpus"][0]["burn"].update(windows=3), "burn"),
    (lambda r: r["gpus"][0]["burn"].update(samples=0), "never sampled"),
    (lambda r: r["gpus"][0].pop("ecc_after"), "ECC"),
    (lambda r: r.update(wall_s=r["budget_s"] * 1.2), "over the budget"),
    (lambda r: r.update(version=2), "schema"),
    (lambda r: r.update(gpus=[]), "none measured"),
    (lambda r: r.update(gpus=[r["gpus"][0], copy.deepcopy(r["gpus"][0])]), "allreduce"),
], ids=["nan-matmul", "no-h2d", "link-not-under-load", "short-burn", "no-clock-samples", "no-ecc", "over-budget",
        "schema", "no-gpus", "two-gpus-no-allreduce"])
def test_each_missing_or_bad_measure_is_named(mutate, expected: str) -> None:
    problems = _mutated(mutate)
    assert problems and any(expected in p for p in problems), problems
