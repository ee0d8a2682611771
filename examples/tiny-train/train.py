"""A tiny training script to copy: `vast-e2e run --workdir examples/tiny-train --artifact checkpoints
--artifact metrics.json -- python train.py` (docs/run.md).

It fits y = 2x + 1 by gradient descent in plain Python (no GPU, no packages: it runs anywhere in seconds),
draws a tqdm-style progress bar, reads a setting (EPOCHS, from --remote-env) and a secret (TRACKER_TOKEN, from
--remote-secret), and writes a checkpoint and a metrics file for `--artifact` to bring back.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

STEPS_PER_EPOCH = 20


def bar(epoch: int, epochs: int, step: int, loss: float) -> None:
    """A tqdm-style bar redrawn in place with \\r (ended by a newline once the epoch is done)."""
    done = step * 30 // STEPS_PER_EPOCH
    sys.stderr.write(f"\rEpoch {epoch}/{epochs} |{'█' * done}{' ' * (30 - done)}| "
                     f"{step}/{STEPS_PER_EPOCH} loss={loss:.4f}")
    sys.stderr.flush()


def main() -> int:
    epochs = int(os.environ.get("EPOCHS", "3"))
    token = os.environ.get("TRACKER_TOKEN", "")
    # Printed here only to show that the harness masks a --remote-secret in every log and file it keeps
    # (you will see ***). Never print a secret in your own code.
    print(f"tracker token: {token or '(none given)'}", flush=True)
    rng = random.Random(0)
    data = [(x, 2.0 * x + 1.0) for x in (rng.uniform(-1, 1) for _ in range(256))]
    w, b, lr, loss = 0.0, 0.0, 0.1, float("inf")
    history = []
    for epoch in range(1, epochs + 1):
        for step in range(1, STEPS_PER_EPOCH + 1):
            batch = rng.sample(data, 32)
            grad_w = sum(2 * (w * x + b - y) * x for x, y in batch) / len(batch)
            grad_b = sum(2 * (w * x + b - y) for x, y in batch) / len(batch)
            w, b = w - lr * grad_w, b - lr * grad_b
            loss = sum((w * x + b - y) ** 2 for x, y in data) / len(data)
            bar(epoch, epochs, step, loss)
            time.sleep(0.01)
        sys.stderr.write("\n")
        history.append({"epoch": epoch, "loss": loss})
    Path("checkpoints").mkdir(exist_ok=True)
    Path("checkpoints/model.json").write_text(json.dumps({"w": w, "b": b}) + "\n")
    Path("metrics.json").write_text(json.dumps({"epochs": epochs, "final_loss": loss, "history": history},
                                               indent=2) + "\n")
    print(f"done: w={w:.3f} b={b:.3f} loss={loss:.5f}; wrote checkpoints/model.json and metrics.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
