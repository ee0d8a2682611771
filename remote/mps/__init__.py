"""CUDA MPS for the workload: a daemon we own, per-process proof of attachment, a manifest, a clean stop.

    python -m remote.mps [--manifest FILE] [--foreign refuse|use] [--thread-pct N] -- CMD ...

Modules (standard library only; see docs/mps.md for the MPS facts they rely on):

- `wrapper`: the command above (start, run CMD, validate every client, stop; its exit codes);
- `control`: talking to `nvidia-cuda-mps-control` (find it, launch, readiness, pid file, defaults);
- `attach`: `attach_current_process`, called by every CUDA process to prove it is a client;
- `manifest`: the JSON record the wrapper writes (checked by `remote.checks.mps`);
- `stop`: draining clients and stopping the daemon we own, escalating to signals;
- `supervisor`: the watcher that stops our daemon when the wrapper itself is killed;
- `bench`, `bench_worker`: the MPS on/off GEMM benchmark (`scripts/bench/bench_mps.py`);
- `demo`: two CUDA processes that attach, for a manual check on a GPU host.

The package imports only `attach` and `control` here, so `python -m remote.mps.<module>` runs each module
without it being imported twice.
"""

from __future__ import annotations

from remote.mps.attach import (
    CudaDeviceFacts,
    MpsNotAttached,
    MpsUnexpectedlyAttached,
    attach_current_process,
    configured_mode,
    probe_cuda_device,
)
from remote.mps.control import ForeignDaemonError, MpsError

__all__ = [
    "CudaDeviceFacts", "ForeignDaemonError", "MpsError", "MpsNotAttached", "MpsUnexpectedlyAttached",
    "attach_current_process", "configured_mode", "probe_cuda_device",
]
