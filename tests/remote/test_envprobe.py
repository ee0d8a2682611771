"""The env probe reads the image's torch, CUDA runtime and cuDNN without importing torch, and they are the
values torch itself reports; a declared expectation that the image does not meet exits non-zero naming both;
masked --remote-env values never reach its record."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remote import knobs
from remote.host import envprobe

ROOT = Path(__file__).resolve().parents[2]


def test_image_facts_are_what_torch_reports():
    import torch

    facts = envprobe.image_facts()
    assert facts["torch"] == torch.__version__
    assert facts["cuda"] == torch.version.cuda
    if torch.backends.cudnn.is_available():
        v = torch.backends.cudnn.version()  # e.g. 92600 for 9.26.0
        assert envprobe.version_matches(f"{v // 10000}.{v // 100 % 100}", facts["cudnn"]), (v, facts)


def test_the_probe_does_not_import_torch(tmp_path):
    out = tmp_path / "env.json"
    code = ("import sys, remote.host.envprobe as e; rc = e.main(['--out', sys.argv[1]]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    record = json.loads(out.read_text())
    assert record["image"]["torch"] and record["image_check"]["verdict"] == "none declared"


@pytest.mark.parametrize(("expected", "actual", "ok"), [
    ("2.11.0", "2.11.0+cu128", True), ("2.11", "2.11.0", True), ("2.11.0", "2.1.0", False),
    ("2.11.0", "2.11.1", False), ("12.8", "12.8", True), ("12.8", "12.9", False), ("9", "9.10.2.21", True),
    ("9", "8.9.7", False), ("9.10", "9.1.0", False), ("2.11.0", None, False),
])
def test_version_prefix_match(expected, actual, ok):
    assert envprobe.version_matches(expected, actual) is ok


def _run_probe(tmp_path, *flags):
    out = tmp_path / "env.json"
    done = subprocess.run([sys.executable, "-m", "remote.host.envprobe", "--out", str(out), *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, check=False)
    return done, json.loads(out.read_text())


def test_a_mismatching_image_exits_nonzero_naming_both_values(tmp_path):
    actual = envprobe.image_facts()
    done, record = _run_probe(tmp_path, "--expect-torch", "1.10.0", "--expect-cuda", "11.3", "--expect-cudnn", "8")
    assert done.returncode == envprobe.IMAGE_MISMATCH_EXIT
    assert f"declares 1.10.0, the image has {actual['torch']}" in done.stderr
    assert "declares 11.3" in done.stderr
    assert record["image_check"]["verdict"] == "mismatch"  # the record is written before failing


def test_a_matching_image_passes(tmp_path):
    actual = envprobe.image_facts()
    flags = ["--expect-torch", actual["torch"].split("+")[0]]
    if actual["cuda"]:
        flags += ["--expect-cuda", actual["cuda"]]
    if actual["cudnn"]:
        flags += ["--expect-cudnn", actual["cudnn"].split(".")[0]]
    done, record = _run_probe(tmp_path, *flags)
    assert done.returncode == 0, done.stderr
    assert record["image_check"]["verdict"] == "match" and "image check passed" in done.stderr


def test_cudnn_from_a_header_or_a_soname_when_no_wheel(tmp_path, monkeypatch):
    monkeypatch.setattr(envprobe, "_CUDNN_DISTS", ())
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    lib = tmp_path / "torch" / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.8").write_text("")
    assert envprobe._cudnn_version(tmp_path / "torch") == ("8", str(lib / "libcudnn.so.8"))
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cudnn_version.h").write_text(
        "#define CUDNN_MAJOR 9\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n")
    assert envprobe._cudnn_version(tmp_path / "torch")[0] == "9.1.0"


def test_torch_version_py_is_read_without_running_it(tmp_path):
    (tmp_path / "version.py").write_text("from typing import Optional\n__version__ = '2.11.0+cu128'\n"
                                         "cuda: Optional[str] = '12.8'\nraise SystemExit('never run')\n")
    assert envprobe._module_constant(tmp_path / "version.py", "__version__") == "2.11.0+cu128"
    assert envprobe._module_constant(tmp_path / "version.py", "cuda") == "12.8"


def test_masked_remote_env_values_never_reach_the_record(monkeypatch):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "vh-distinctive-9137")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv(knobs.MASKED_ENV, "NCCL_SOCKET_IFNAME OTHER")
    record = envprobe.probe()
    assert "vh-distinctive-9137" not in json.dumps(record)
    assert record["env"]["NCCL_SOCKET_IFNAME"] == "***" and record["env"]["NCCL_DEBUG"] == "INFO"
    assert record["remote_env_names"] == ["NCCL_SOCKET_IFNAME", "OTHER"]


def test_what_a_simulated_host_says_it_offers_is_in_the_record(monkeypatch):
    monkeypatch.setenv("VAST_SIM_HOST", "simulated host: Python 3.11.7 in a venv of its own; network off")
    assert envprobe.probe()["env"]["VAST_SIM_HOST"].endswith("network off")
