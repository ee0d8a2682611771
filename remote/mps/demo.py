"""Two CUDA processes that prove their MPS attachment the way the training code does.

The learner initialises CUDA, calls `attach_current_process` (which raises before any helper is
spawned if it is not attached), then starts one helper on the same GPU, which does the same. Run it
under the wrapper: `python -m remote.mps --manifest m.json -- python -m remote.mps.demo`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="remote.mps.demo")
    p.add_argument("--role", choices=("learner", "helper"), default="learner")
    p.add_argument("--hold-s", type=float, default=0.0, help="stay alive this long after attaching")
    p.add_argument("--no-attach", action="store_true", help="use CUDA but never prove attachment")
    a = p.parse_args(argv)
    import torch

    from remote.mps.attach import MpsNotAttached, attach_current_process

    torch.cuda.set_device(0)
    x = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    checksum = float((x @ x).float().abs().sum().item())
    if not a.no_attach:
        try:
            rec = attach_current_process(a.role, 0, 0)
        except MpsNotAttached as exc:
            print(f"mps_demo: {exc}", file=sys.stderr)
            return 1
        print(json.dumps({k: rec[k] for k in ("role", "pid", "device_uuid", "mps_enabled_attr", "attached")}))
    rc = 0
    if a.role == "learner":
        helper = [sys.executable, "-m", "remote.mps.demo", "--role", "helper", "--hold-s", str(a.hold_s)]
        rc = subprocess.run(helper + (["--no-attach"] if a.no_attach else []), check=False).returncode
    time.sleep(a.hold_s)
    torch.cuda.synchronize()  # no GPU work in flight at exit (docs/mps.md)
    print(f"mps_demo {a.role}: checksum {checksum:.3e}, helper rc {rc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
