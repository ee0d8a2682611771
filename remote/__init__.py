"""The workload: what runs on the rented GPU host (or any GPU machine), from the unpacked bundle.

It imports the standard library and PyTorch only (Triton, quack, FlashAttention-4 and the cuDNN frontend where
they are installed), never the control plane: the host has whatever image it was rented with, and
`vast_harness` is not on it (`tests/remote/test_host_imports.py`, the import-linter contract).

- `training/`: the 1B decoder, its data-parallel training round and the MFU record that round writes;
- `attention/`: the attention paths (PyTorch's SDPA backends, FlashAttention-4, cuDNN's own graph API) and the
  probe that pins one for the run;
- `kernels/`: the hand-written kernels that replace torch paths in the step, each probed on the device first;
- `accounting/`: how a run's numbers are counted: sourced peaks and MFU, the state's Merkle root, where a
  profiled step's time went;
- `host/`: the machine itself: the environment probe and image check, where the data is, the proofs plan;
- `mps/`: CUDA MPS: a daemon the run owns, and proof that every CUDA process attached to it;
- `checks/`: the evidence checkers behind `scripts/check_gpu_evidence.py` (no torch: they run anywhere).

Data beside the code: `peaks.json` (the sourced peak table, which the control plane reads as a file) and
`host-requirements*.txt` (the hash-pinned wheels the mfu profile installs on the host).
"""
