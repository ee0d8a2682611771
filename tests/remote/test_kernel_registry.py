"""The kernel registry (remote/kernels/registry.py): every kernel declared completely, one rule for all of them,
and a kernel whose probe fails replaced by its torch path, down to a training step (CPU; stand-ins for the
probes, which the interpreter tests and `python -m remote.kernels.check` run for real)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from remote import knobs
from remote.kernels import check, registry
from remote.kernels.registry import Kernel, Registry

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device("cpu")


def resolve(dotted: str) -> object:
    """`package.module.Qualified.name` -> the object (the longest importable module prefix, then attributes)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


@pytest.mark.parametrize("kernel", registry.default().kernels.values(), ids=lambda k: k.name)
def test_every_kernel_is_declared_completely(kernel: Kernel) -> None:
    assert callable(kernel.probe) and callable(kernel.runs_on)
    assert callable(resolve(kernel.fallback)), kernel.fallback  # the torch path it gives way to exists
    assert isinstance(kernel.deterministic, bool) and len(kernel.deterministic_why) > 20
    assert kernel.knobs and set(kernel.knobs) <= set(knobs.KernelKnobs.env_names()), kernel.knobs
    assert kernel.summary and kernel.name == kernel.name.lower()


def test_every_launch_knob_belongs_to_one_kernel() -> None:
    owned = [k for kernel in registry.default().kernels.values() for k in kernel.knobs]
    assert len(owned) == len(set(owned))
    assert set(owned) == set(knobs.KernelKnobs.env_names()) - {"selection", "on_cpu"}


def test_every_module_of_the_package_is_a_kernel_or_named_infrastructure() -> None:
    modules = {p.stem for p in (ROOT / "remote" / "kernels").glob("*.py")} - {"__init__"}
    declared = {m for m in modules - set(registry.INFRASTRUCTURE)
                if isinstance(getattr(importlib.import_module(f"remote.kernels.{m}"), "KERNEL", None), Kernel)}
    assert declared == modules - set(registry.INFRASTRUCTURE)
    assert registry.names() == ("loss", "mlp", "norm", "optim", "rope", "swiglu")


def test_the_gpu_checks_probes_section_covers_every_registered_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """One GPU call proves every probe: the section walks the registry, so a new kernel is in it unasked."""
    reg = Registry.of([stand_in("fine"), stand_in("wrong", probe=lambda d: "dx relative error 0.3"),
                       stand_in("elsewhere", runs_on=lambda d: "needs CUDA")])
    monkeypatch.setattr(registry, "_DEFAULT", reg)
    rep = check.Report()
    check.check_probes(rep, CPU)
    assert {c["name"]: c["ok"] for c in rep.checks} == {
        "probe fine: matches the torch path, bitwise twice (ok)": True,
        "probe wrong: matches the torch path, bitwise twice (dx relative error 0.3)": False}
    assert rep.skipped == {"probe elsewhere": "needs CUDA"}  # on a CPU dry run; on CUDA it fails the check
    assert "probes" in check.SECTIONS and set(check.KERNEL_SECTIONS) <= {k.name for k in registry.discover()}
    assert {s for sections in check.KERNEL_SECTIONS.values() for s in sections} <= set(check.SECTIONS)


def test_the_notes_table_lists_every_kernel_and_its_knobs() -> None:
    notes = (ROOT / "remote" / "kernels" / "NOTES.md").read_text()
    env = knobs.KernelKnobs.env_names()
    for kernel in registry.default().kernels.values():
        row = next((line for line in notes.splitlines() if line.startswith(f"| `{kernel.name}` |")), "")
        assert row and all(f"`{env[k]}`" in row for k in kernel.knobs), kernel.name


def test_vh_kernels_resolves_against_the_declared_names(knob_env) -> None:
    knob_env("VH_KERNELS", None)
    assert registry.requested() == frozenset(registry.names())
    knob_env("VH_KERNELS", "all,loss")
    assert registry.requested() == frozenset(registry.names())
    knob_env("VH_KERNELS", "loss,mlp")
    assert registry.requested() == {"loss", "mlp"}
    knob_env("VH_KERNELS", "none")
    assert registry.requested() == frozenset()
    knob_env("VH_KERNELS", "loss,swigl")
    with pytest.raises(knobs.KnobError, match=r"VH_KERNELS names unknown kernel\(s\) \['swigl'\]; known: loss, mlp"):
        registry.requested()


# --- the rule, with stand-ins ------------------------------------------------------------------------------


def stand_in(name: str, *, probe=lambda device: None, runs_on=lambda device: None, deterministic: bool = True,
             default: bool = True) -> Kernel:
    return Kernel(name=name, summary="a stand-in", fallback="torch.nn.functional.silu", probe=probe,
                  deterministic=deterministic, deterministic_why="a stand-in's reason for its decision",
                  knobs=("ce_block",), runs_on=runs_on, default=default)


def test_a_kernel_whose_probe_fails_stays_off_and_the_record_says_why() -> None:
    calls: list[str] = []

    def failing(device: torch.device) -> str:
        calls.append(str(device))
        return "dx relative error 0.3 against the torch reference"

    reg = Registry.of([stand_in("good"), stand_in("bad", probe=failing)])
    assert reg.active("good", CPU) and not reg.active("bad", CPU)
    assert reg.active("bad", CPU) is False and calls == ["cpu"]  # probed once per device
    record = reg.describe(CPU)
    assert record["active"] == ["good"]
    assert record["rejected"] == {"bad": "probe failed: dx relative error 0.3 against the torch reference"}
    assert record["probes"]["bad"]["passed"] is False and record["probes"]["good"]["passed"] is True


def test_a_probe_that_raises_is_a_failed_probe() -> None:
    def crash(device: torch.device) -> str | None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    reg = Registry.of([stand_in("k", probe=crash)])
    assert reg.rejection("k", CPU) == "probe failed: RuntimeError: CUDA error: an illegal memory access was encountered"


def test_a_kernel_that_cannot_run_here_is_not_probed() -> None:
    def never(device: torch.device) -> str:
        raise AssertionError("probed where it cannot run")

    reg = Registry.of([stand_in("k", probe=never, runs_on=lambda d: "needs CUDA")])
    assert reg.rejection("k", CPU) == "needs CUDA" and reg.describe(CPU)["probes"] == {}


def test_deterministic_runs_use_only_kernels_that_allow_it() -> None:
    reg = Registry.of([stand_in("ordered"), stand_in("atomic", deterministic=False)])
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert reg.active("ordered", CPU)
        assert reg.rejection("atomic", CPU) == "not in deterministic runs: a stand-in's reason for its decision"
    finally:
        torch.use_deterministic_algorithms(was)
    assert reg.active("atomic", CPU)


def test_an_opt_in_kernel_runs_only_when_named(knob_env) -> None:
    reg = Registry.of([stand_in("loss"), stand_in("mlp", default=False)])
    knob_env("VH_KERNELS", None)
    assert reg.requested() == {"loss"}
    knob_env("VH_KERNELS", "all,mlp")
    assert reg.requested() == {"loss", "mlp"}


def test_a_name_declared_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="declared twice"):
        Registry.of([stand_in("loss"), stand_in("loss")])


def test_failed_probes_give_the_model_and_optimizer_their_torch_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every real kernel declared runnable here, every probe failing: the wiring leaves the model on its torch
    paths (no fused loss, no kernel modules attached, torch's AdamW) and a step trains."""
    import torch.distributed as dist

    from remote.training import parallel
    from remote.training.model import ModelConfig, build_model
    from remote.training.profiles import TrainConfig

    failing = Registry.of([dataclasses.replace(k, runs_on=lambda d: None, probe=lambda d: "wrong bits")
                           for k in registry.discover()])
    monkeypatch.setattr(registry, "_DEFAULT", failing)
    cfg = ModelConfig(d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, ffn_hidden=12, vocab_size=32, seq_len=8,
                      dtype="float32")
    model = build_model(cfg, CPU, seed=5)
    tokens = torch.randint(0, 32, (2, 8), generator=torch.Generator().manual_seed(3))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        runner = parallel.parallelize(model, parallel.ParallelConfig("zero2", TrainConfig(micro_batch=2, steps=4)),
                                      parallel.World(dist.group.WORLD, CPU))
        assert model.ce_fused is False and model.param_layouts == {}
        assert all(b.norms is None and b.attn.rope is None and b.ffn.swiglu is None and b.ffn.mlp is None
                   for b in model.layers)
        assert isinstance(runner, parallel.Zero2Runner) and isinstance(runner.optim, parallel._MasterAdamW)
        first = runner.forward_backward(tokens, tokens).item()
        runner.step()
        assert runner.forward_backward(tokens, tokens).item() < first
    finally:
        dist.destroy_process_group()
    record = registry.describe(CPU)
    assert record["active"] == [] and set(record["rejected"].values()) == {"probe failed: wrong bits"}


@pytest.mark.slow
def test_the_gpu_check_runs_end_to_end_on_cpu(tmp_path: Path) -> None:
    """`python -m remote.kernels.check --small`: every section through Triton's interpreter, every registered
    kernel's probe passed or (mlp: quack's GEMMs need a GPU) skipped with the reason."""
    pytest.importorskip("triton")
    out = tmp_path / "check.json"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "remote.kernels.check", "--small", "--out", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    record = json.loads(out.read_text())
    passed = {c["name"].split(":")[0] for c in record["checks"] if c["ok"] and c["name"].startswith("probe ")}
    assert passed == {f"probe {n}" for n in ("loss", "norm", "optim", "rope", "swiglu")}
    assert record["skipped"]["probe mlp"] == "mlp needs CUDA (quack's GEMMs)" and record["errors"] == []
    assert record["kernels"] == list(registry.names())
