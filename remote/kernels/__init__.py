"""Hand-written kernels that replace torch paths in the training step where they measured faster, each checked
on the device before a run uses it.

One module per kernel, each declaring its own registry entry (`KERNEL`: what it replaces, its probe, the torch
fallback, whether deterministic runs may use it, its launch knobs): `loss` (the LM head and cross-entropy),
`swiglu`, `adamw` (the kernel named `optim`), `norm` (residual add + RMSNorm), `rope` and `mlp` (the SwiGLU
inside quack's GEMM epilogues). `registry.py` decides which run here (`python -m remote.kernels.registry`
lists them), `jit.py` is Triton where it imports, and `check.py` (`python -m remote.kernels.check`, on a GPU)
compares each with its torch reference at the 1B shapes and times it. `NOTES.md`: the arithmetic per kernel,
the predictions and what the device calls measured.
"""
