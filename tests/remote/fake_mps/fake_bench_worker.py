"""A CPU stand-in for remote.mps.bench_worker: same stdin/stdout protocol, sleeps instead of GEMMs.

With VH_MPS_MODE=on it registers with the fake daemon and reports attribute 1, otherwise 0, so the
benchmark's own on/off checks run for real.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from remote.mps.attach import CudaDeviceFacts, attach_current_process
from remote.mps.bench_worker import run_phase

UUID = "GPU-0123abcd-0000-1111-2222-333344445555"


class SleepWork:
    def __init__(self, role: str, mode: str):
        self.role, self.mode = role, mode

    def step(self, size: int, kernels: int) -> float:
        # milliseconds, not fractions of one: a loaded machine's wake-up lag would swamp a shorter sleep
        time.sleep(0.01 if self.role == "learner" else 0.005 * size / 256)
        return 1.0 if self.role == "learner" else float(kernels)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--role", required=True)
    p.add_argument("--cpu", type=int)
    a = p.parse_args()
    mode = os.environ.get("VH_MPS_MODE", "off")
    if mode == "on":
        subprocess.run(["nvidia-cuda-mps-control"], input=f"fake_register_client {os.getpid()}\n",
                       text=True, check=True, capture_output=True)
    record = attach_current_process(a.role, 0, 0, probe=lambda _i: CudaDeviceFacts(int(mode == "on"), UUID),
                                    timeout_s=0.5)
    print(json.dumps({"ready": True, "record": record}), flush=True)
    work = SleepWork(a.role, mode)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "exit":
            break
        print(json.dumps(run_phase(work, cmd)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
