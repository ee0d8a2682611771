"""Everything bitwise replay needs, in one function, called before CUDA starts (docs/mfu.md).

What is NOT set here on purpose: NCCL's algorithm stays whatever the flags chose. At world size 2 every
reduced element is one IEEE addition a+b, which is commutative, so the sum is the same bits whatever the
ring/tree/channel choice (docs/mfu.md); for >2 ranks `--nccl-pcie` pins Ring/Simple and the channel count.
"""

from __future__ import annotations

import os
import random

import torch

CUBLAS_WORKSPACE = ":4096:8"


def set_determinism(seed: int, deterministic: bool) -> dict[str, str | bool]:
    """Seed every RNG; in deterministic mode switch on every knob replay needs. Returns what was set."""
    os.environ.setdefault("PYTHONHASHSEED", str(seed))  # for child processes (compile workers)
    random.seed(seed)
    torch.manual_seed(seed)
    # TF32 off in both modes: the model runs bf16, and fp32 matmuls (if any) must not change precision.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if not deterministic:
        return {"deterministic": False}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError("set_determinism(deterministic=True) must run before CUDA is initialised "
                           "(CUBLAS_WORKSPACE_CONFIG is read when the cuBLAS handle is created)")
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
    # NVLS reductions are not deterministic; multicast is off anyway (parallel.nccl_env), keep it explicit.
    os.environ.setdefault("NCCL_ALGO", "^NVLS")
    torch.use_deterministic_algorithms(True)  # strict: SDPA flash gets its deterministic backward
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # Strict mode would fill every torch.empty with NaN: a cost with no replay benefit (torchtitan does this).
    # (set through setattr: torch adds this attribute to the module at import; its type stubs do not declare it)
    setattr(torch.utils.deterministic, "fill_uninitialized_memory", False)
    try:  # Inductor: no numerics-changing autotuning, compiled RNG equal to eager
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
        if hasattr(inductor_config, "deterministic"):
            inductor_config.deterministic = True
    except ImportError:  # pragma: no cover - inductor is part of every torch build we run
        pass
    return {"deterministic": True, "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE,
            "use_deterministic_algorithms": True, "fill_uninitialized_memory": False}
