"""A stand-in for a training process, run as the wrapper's CMD in the CPU tests.

It "creates its CUDA context" by registering its PID with the fake daemon (what a real context
does when it connects), then proves attachment through the real `attach_current_process`, with a
probe that reports the attribute a real libcuda would. Options let a test make it misbehave.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from remote.mps import CudaDeviceFacts, MpsNotAttached, attach_current_process

UUID = "GPU-0123abcd-0000-1111-2222-333344445555"


def register(pid: int) -> None:
    subprocess.run(["nvidia-cuda-mps-control"], input=f"fake_register_client {pid}\n", text=True,
                   check=True, capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--role", default="learner")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--no-register", action="store_true", help="context fell back: never connected")
    p.add_argument("--attr", type=int, default=1)
    p.add_argument("--mode", help="override VH_MPS_MODE for this process (a misconfigured rank)")
    p.add_argument("--uuid", default=UUID)
    p.add_argument("--no-attach", action="store_true", help="never call attach_current_process")
    p.add_argument("--helper", action="append", default=[], help="extra args for one helper process")
    p.add_argument("--detach-helpers", action="store_true", help="exit without waiting for the helpers")
    p.add_argument("--ignore-sigterm", action="store_true", help="a stuck process")
    p.add_argument("--ready-file", type=Path)
    p.add_argument("--sleep-s", type=float, default=0.0)
    p.add_argument("--exit", type=int, default=0)
    a = p.parse_args()
    if a.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.mode:
        os.environ["VH_MPS_MODE"] = a.mode
    if not a.no_register:
        register(os.getpid())
    if not a.no_attach:
        try:
            attach_current_process(a.role, a.rank, 0, probe=lambda _i: CudaDeviceFacts(a.attr, a.uuid),
                                   timeout_s=0.3)
        except MpsNotAttached as exc:
            print(f"fake_client: {exc}", file=sys.stderr)
            return 3
    ready = [Path(os.environ["VH_MPS_CLIENT_DIR"]) / f"helper-{i}.ready" for i in range(len(a.helper))]
    helpers = [subprocess.Popen([sys.executable, __file__, *h.split(), "--ready-file", str(r)])
               for h, r in zip(a.helper, ready)]
    if a.detach_helpers:  # leave only once they are MPS clients, so that they outlive us as clients
        deadline = time.monotonic() + 10
        while not all(r.exists() for r in ready) and time.monotonic() < deadline:
            time.sleep(0.02)
    if a.ready_file:
        a.ready_file.write_text(f"{os.getpid()} {os.environ.get('CUDA_MPS_PIPE_DIRECTORY')}\n")
    time.sleep(a.sleep_s)
    if not a.detach_helpers:
        for h in helpers:
            h.wait()
    return a.exit


if __name__ == "__main__":
    sys.exit(main())
