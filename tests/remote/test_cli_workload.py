"""Flag and profile refusal (exit 2, a message naming the problem) and the evidence-check dispatcher."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from remote import checks
from remote.training import train

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import check_gpu_evidence  # noqa: E402  (scripts/ is not a package: found through the path above)


@pytest.fixture(autouse=True)
def world_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)


BASE = ["--device", "cpu", "--reduction", "zero2", "--out", "/dev/null"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--profile", "nope", *BASE], "unknown profile 'nope'"),
    (["--profile", "mfu-dense-1b-dp1", *BASE], "is a GPU profile"),
    (["--profile", "mfu-dense-1b-dp2", *BASE], "needs world size 2, got 1"),
    (["--profile", "tiny-cpu", "--replay", *BASE], "--replay needs --deterministic"),
    (["--profile", "tiny-cpu", "--steps", "3", *BASE], "must exceed the profile's 3 warm-up steps"),
    (["--profile", "tiny-cpu", "--micro-batch", "0", *BASE], "--micro-batch must be >= 1"),
    (["--profile", "tiny-cpu", "--compile", *BASE], "--compile is for --device cuda"),
    (["--profile", "tiny-cpu", *BASE], "no sourced bf16 dense peak for device 'cpu'"),
])
def test_bad_flags_and_profiles_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert train.main(argv) == 2
    assert message in capsys.readouterr().err


def test_unknown_reduction_is_an_argparse_error(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        train.main(["--profile", "tiny-cpu", "--device", "cpu", "--reduction", "fsdp", "--out", "x"])
    assert exc.value.code == 2 and "invalid choice: 'fsdp'" in capsys.readouterr().err


def test_dispatcher_names_a_missing_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checks, "KINDS", (*checks.KINDS, "absent"))
    with pytest.raises(checks.CheckerMissing, match=r"remote/checks/absent.py is not present"):
        checks.load_checker("absent")
    with pytest.raises(checks.CheckerMissing, match="unknown evidence kind"):
        checks.load_checker("other")


def test_check_script_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    good = ROOT / ".evidence" / "h200" / "dp1-fast.json"
    assert check_gpu_evidence.main(["--kind", "mfu", str(good)]) == 0
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(json.loads(good.read_text()) | {"mfu": 3.0}))
    assert check_gpu_evidence.main(["--kind", "mfu", str(good), str(bad)]) == 1
    assert "first failed claim" in capsys.readouterr().err


def test_sweep_report_writes_the_table_and_draws_nothing_on_the_host(tmp_path: Path) -> None:
    import sweep_report

    for name in ("dp1-fast.json", "dp1-fast-mb24.json", "dp1-deterministic.json"):
        (tmp_path / f"mfu-{name}").write_text((ROOT / ".evidence" / "h200" / name).read_text())
    assert sweep_report.main([str(tmp_path)]) == 0
    md = (tmp_path / "sweep.md").read_text()
    assert "| w1 zero2o compile | 24 | 0.5742 |" in md and "deterministic" in md
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("mfu-")) == ["sweep.md"]
    assert sweep_report.main([str(tmp_path / "empty")]) == 1


def test_sweep_report_gives_each_run_as_a_fraction_of_the_hosts_measured_matmul(tmp_path: Path) -> None:
    """Beside MFU against the vendor peak: achieved TFLOP/s per GPU over the host's own receipt (the slowest GPU)."""
    import sweep_report

    run = json.loads((ROOT / ".evidence" / "h200" / "dp1-fast-mb24.json").read_text())
    (tmp_path / "mfu-a.json").write_text(json.dumps(run))
    receipt = json.loads((ROOT / ".evidence/receipt-2026-12-06/h200-call2/receipt-h200-1.json").read_text())
    slow = json.loads(json.dumps(receipt["gpus"][0]))
    slow["matmul"]["tflops"] = receipt["gpus"][0]["matmul"]["tflops"] / 2  # a second, slower GPU: the divisor
    receipt["gpus"].append(slow)
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    assert sweep_report.main([str(tmp_path)]) == 0
    md = (tmp_path / "sweep.md").read_text()
    achieved = run["tokens_per_s"] / run["world_size"] * run["flops_per_token"] / 1e12
    assert f"| {achieved:.1f} | {achieved / slow['matmul']['tflops']:.1%} |" in md
    assert f"{slow['matmul']['tflops']:.1f} TFLOP/s dense bf16 matmul (the slowest GPU)" in md
    (tmp_path / "receipt.json").unlink()
    assert sweep_report.main([str(tmp_path)]) == 0
    assert "| no receipt |" in (tmp_path / "sweep.md").read_text()
