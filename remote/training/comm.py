"""Small collectives for metadata, without numpy.

`torch.distributed.all_gather_object` pickles into a tensor and reads it back with `Tensor.numpy()`, so it
fails on a host whose image has PyTorch but no numpy ("Numpy is not available"). These carry JSON through
two plain `all_gather`s (lengths, then padded bytes) and work on gloo (CPU) and NCCL (CUDA) alike.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist


def all_gather_json(obj: Any, device: torch.device) -> list[Any]:
    """Every rank's `obj` (JSON-serialisable), in rank order. Tuples come back as lists."""
    payload = json.dumps(obj, sort_keys=True).encode()
    world = dist.get_world_size()
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    lengths = [torch.zeros_like(length) for _ in range(world)]
    dist.all_gather(lengths, length)
    sizes = [int(t.item()) for t in lengths]
    buf = torch.zeros(max(sizes), dtype=torch.uint8, device=device)
    if payload:
        buf[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8).to(device)
    gathered = [torch.empty_like(buf) for _ in range(world)]
    dist.all_gather(gathered, buf)
    return [json.loads(bytes(t[:n].cpu().tolist())) for t, n in zip(gathered, sizes, strict=True)]
