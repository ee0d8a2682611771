"""What runs on the rented host imports only the standard library and PyTorch: images differ, and a missing
numpy or pydantic there must not end a paid run (nor may a hidden use such as `Tensor.numpy()`)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = set(sys.stdlib_module_names) | {"torch", "remote", "triton", "pytest", "tests"}
# Optional extras that are imported inside a try/except or only for an opt-in feature.
# kernels/check.py times quack's rmsnorm (shipped with the FA4 wheels) inside a guarded block.
OPTIONAL = {"transformers", "cudnn", "flash_attn", "quack"}  # cudnn_sdpa.py and fa4.py: late and guarded imports


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_remote_modules_import_only_stdlib_and_torch():
    bad = {}
    for path in sorted((ROOT / "remote").rglob("*.py")):
        extra = _imports(path) - ALLOWED - OPTIONAL
        if extra:
            bad[str(path.relative_to(ROOT))] = sorted(extra)
    assert not bad


@pytest.mark.slow
def test_tiny_round_runs_without_numpy(tmp_path):
    out = tmp_path / "mfu.json"
    argv = ["scripts/run_mfu_dist.py", "--profile", "tiny-cpu", "--device", "cpu", "--reduction", "zero2o",
            "--deterministic", "--replay", "--steps", "4", "--peak-tflops", "1", "--out", str(out)]
    code = ("import runpy, sys; sys.modules['numpy'] = None; "  # blocked before torch looks for it
            f"sys.argv = {argv!r}; runpy.run_path('scripts/run_mfu_dist.py', run_name='__main__')")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["replay_match"] is True
