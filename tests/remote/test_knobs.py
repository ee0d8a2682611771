"""remote/knobs.py is the one place the workload reads a `VH_*` variable: typed, documented, refusing bad values.

The scan below is what makes "one place" true: outside remote/knobs.py no module of remote/ spells a `VH_`
name (a string constant, an f-string piece or a keyword argument; docstrings may mention them), so none can
read one, directly or through a constant.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from remote import knobs

ROOT = Path(__file__).resolve().parents[2]
KNOBS_FILE = ROOT / "remote" / "knobs.py"


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are module, class or function docstrings, or a field's doc string."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for stmt in body:
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and \
                        isinstance(stmt.value.value, str):
                    ids.add(id(stmt.value))
    return ids


def vh_names_spelled(source: str) -> list[str]:
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs and \
                "VH_" in node.value:
            found.append(f"line {node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.keyword) and node.arg and node.arg.startswith("VH_"):
            found.append(f"line {node.value.lineno}: keyword {node.arg}")
    return found


def test_no_module_but_knobs_spells_a_vh_name() -> None:
    bad = {}
    for path in sorted((ROOT / "remote").rglob("*.py")):
        if path == KNOBS_FILE:
            continue
        found = vh_names_spelled(path.read_text())
        if found:
            bad[str(path.relative_to(ROOT))] = found
    assert not bad


@pytest.mark.parametrize("source", [
    'import os\nmode = os.environ.get("VH_MPS_MODE")\n',
    'import os\nNAME = "VH_CE_BLOCK"\nblock = int(os.environ[NAME])\n',
    'import os\nk = "CE"\nblock = os.getenv(f"VH_{k}_BLOCK")\n',
    'import os\nenv = dict(os.environ, VH_MPS_MODE="on")\n',
])
def test_the_scan_sees_every_way_of_reading_one(source: str) -> None:
    assert vh_names_spelled(source)


def test_a_docstring_may_name_a_knob() -> None:
    assert not vh_names_spelled('"""Set VH_KERNELS=none to run the torch paths."""\n\n\ndef f():\n    """VH_X."""\n')


def test_every_knob_is_documented_and_listed_in_the_workload_doc() -> None:
    lines = knobs.describe().splitlines()
    assert len(lines) == len(knobs.names()) > 0
    undocumented = [name for name, line in zip(knobs.names(), lines, strict=True) if line == name]
    assert not undocumented
    assert all(line.startswith(name) for name, line in zip(knobs.names(), lines, strict=True))
    doc = (ROOT / "docs" / "workload.md").read_text()
    assert [name for name in knobs.names() if f"`{name}`" not in doc] == []


def test_defaults_with_nothing_set() -> None:
    k = knobs.KernelKnobs.from_env({})
    assert (k.selection.resolve(("a", "b"), ("a",)), k.on_cpu, k.ce_block, k.mlp_gemms) == ({"a"}, False, 4096, "fused")
    assert k.chunk_tokens(8192) == 8192
    t = knobs.TrainingKnobs.from_env({})
    assert (t.reduce_order, t.profile_out, t.profile_steps) == (None, None, 2)
    assert knobs.MpsKnobs.from_env({}).mode is None and knobs.HostKnobs.from_env({}).masked_env == frozenset()


@pytest.mark.parametrize(("env", "field", "value"), [
    ({"VH_KERNELS": ""}, "selection", knobs.KernelSelection(default=False)),
    ({"VH_KERNELS": "all,mlp"}, "selection", knobs.KernelSelection(default=True, names=frozenset({"mlp"}))),
    ({"VH_KERNELS": " Loss, optim "}, "selection", knobs.KernelSelection(default=False,
                                                                         names=frozenset({"loss", "optim"}))),
    ({"VH_CE_CHUNK": "16384"}, "ce_chunk", 16384),
    ({"VH_CE_PROGRAMS": "0"}, "ce_programs", 0),
    ({"VH_MLP_GEMMS": "ALL"}, "mlp_gemms", "all"),
    ({"VH_MLP_GEMMS": ""}, "mlp_gemms", "fused"),  # empty: the default, as before
    ({"VH_MLP_TUNED": "on"}, "mlp_tuned", True),
    ({"VH_MLP_CHECK": "fused-tuned"}, "mlp_check", ("fused-tuned",)),
])
def test_kernel_values_parse(env: dict[str, str], field: str, value: object) -> None:
    assert getattr(knobs.KernelKnobs.from_env(env), field) == value


@pytest.mark.parametrize(("area", "env", "message"), [
    (knobs.KernelKnobs, {"VH_CE_CHUNK": "many"}, "VH_CE_CHUNK='many' is not an integer"),
    (knobs.KernelKnobs, {"VH_CE_PROGRAMS": "-1"}, "VH_CE_PROGRAMS='-1' must be >= 0"),
    (knobs.KernelKnobs, {"VH_CE_BLOCK": "3000"}, "VH_CE_BLOCK='3000' must be a power of two"),
    (knobs.KernelKnobs, {"VH_SWIGLU_WARPS": "0"}, "VH_SWIGLU_WARPS='0' must be a power of two"),
    (knobs.KernelKnobs, {"VH_MLP_GEMMS": "some"}, "VH_MLP_GEMMS='some'; known: fused, all"),
    (knobs.KernelKnobs, {"VH_MLP_TUNED": "maybe"}, "VH_MLP_TUNED='maybe': expected 1/0"),
    (knobs.KernelKnobs, {"VH_MLP_CHECK": "fast"}, "VH_MLP_CHECK='fast': a comma list of untuned, tuned"),
    (knobs.KernelKnobs, {"VH_CE_BLOK": "4096"}, "VH_CE_BLOK: no such knob"),
    (knobs.KernelKnobs, {"VH_MLP_DETERMINISTIC": "1"}, "VH_MLP_DETERMINISTIC: no such knob"),  # retired in round 6
    (knobs.TrainingKnobs, {"VH_REDUCE_ORDER": "ring"}, "VH_REDUCE_ORDER='ring'; known: rank, backend"),
    (knobs.TrainingKnobs, {"VH_TORCH_PROFILE_STEPS": "0"}, "VH_TORCH_PROFILE_STEPS='0' must be >= 1"),
    (knobs.MpsKnobs, {"VH_MPS_MODE": "yes"}, "VH_MPS_MODE='yes'; known: on, off"),
])
def test_a_bad_value_names_the_variable_and_what_it_takes(area: type, env: dict[str, str], message: str) -> None:
    with pytest.raises(knobs.KnobError) as exc:
        area.from_env(env)
    assert message in str(exc.value)


def test_unknown_kernel_names_are_refused_against_the_registry_list() -> None:
    selection = knobs.KernelKnobs.from_env({"VH_KERNELS": "loss,swigl"}).selection
    with pytest.raises(knobs.KnobError, match=r"VH_KERNELS names unknown kernel\(s\) \['swigl'\]"):
        selection.resolve(("loss", "swiglu"), ("loss",))


def test_variables_of_other_parts_are_left_alone() -> None:
    """A user's --remote-env VH_PRIVATE_TOKEN, the harness's VH_RUN_ID: not the workload's to refuse."""
    env = {"VH_PRIVATE_TOKEN": "x", "VH_RUN_ID": "r1", "VH_PEAK_TFLOPS": "1"}
    for area in knobs.AREAS:
        area.from_env(env)


def test_parsed_once_reload_and_override(knob_env) -> None:
    knob_env("VH_MLP_GEMMS", "all")
    assert knobs.kernels().mlp_gemms == "all"
    with knobs.override(mlp_gemms="fused", reduce_order="rank"):
        assert knobs.kernels().mlp_gemms == "fused" and knobs.training().reduce_order == "rank"
    assert knobs.kernels().mlp_gemms == "all" and knobs.training().reduce_order is None
    with pytest.raises(TypeError, match="no knob field"), knobs.override(mlp_gemm="all"):
        pass


def test_a_bad_value_elsewhere_does_not_stop_an_area_that_is_fine(knob_env) -> None:
    knob_env("VH_CE_BLOCK", "x")
    assert knobs.mps().mode is None  # an MPS client is not stopped by a kernel typo
    with pytest.raises(knobs.KnobError, match="VH_CE_BLOCK"):
        knobs.check_all()


def test_given_records_values_as_set(knob_env) -> None:
    knob_env("VH_CE_BLOCK", "x")  # recorded even though the parse refuses it
    knob_env("VH_MPS_MODE", "on")
    knob_env("VH_PRIVATE_TOKEN", "secret")
    assert knobs.given(knobs.KernelKnobs)["VH_CE_BLOCK"] == "x"
    assert "VH_MPS_MODE" not in knobs.given(knobs.KernelKnobs) and knobs.given()["VH_MPS_MODE"] == "on"
    assert "VH_PRIVATE_TOKEN" not in knobs.given()


def test_the_module_prints_its_table() -> None:
    out = subprocess.run([sys.executable, "-m", "remote.knobs"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[0].startswith("VH_ADAMW_BLOCK: elements per program")
