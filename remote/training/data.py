"""Synthetic token batches, seeded per (seed, rank, step): any rank can regenerate any step's batch.

Each row is an affine chain t[i+1] = (a*t[i] + c) mod V from a random start, with a fraction of positions
replaced by noise, so the loss has something to fall to (a test checks that it falls) while no row or
rank repeats another.
"""

from __future__ import annotations

from functools import lru_cache

import torch

_MULT, _INC, _NOISE = 31, 7, 0.1


@lru_cache(maxsize=8)
def _chain_coefficients(length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """t[i] = A[i]*t[0] + C[i] (mod V): the chain in closed form, so a batch is one vectorised op."""
    mult, inc = [1], [0]
    for _ in range(length - 1):
        mult.append(mult[-1] * _MULT % vocab)
        inc.append((inc[-1] * _MULT + _INC) % vocab)
    return torch.tensor(mult, dtype=torch.int64), torch.tensor(inc, dtype=torch.int64)


def batch(seed: int, rank: int, step: int, micro_batch: int, seq_len: int, vocab: int,
          device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each [micro_batch, seq_len] int64, generated on the CPU (same bits everywhere)."""
    gen = torch.Generator().manual_seed(((seed * 1_000_003 + rank) * 1_000_003 + step) % (2**63))
    start = torch.randint(0, vocab, (micro_batch, 1), generator=gen)
    mult, inc = _chain_coefficients(seq_len + 1, vocab)
    rows = (start * mult[None, :] + inc[None, :]) % vocab  # products < vocab**2: fits int64
    noise = torch.rand(micro_batch, seq_len + 1, generator=gen) < _NOISE
    rows = torch.where(noise, torch.randint(0, vocab, rows.shape, generator=gen), rows)
    if device.type == "cuda":
        rows = rows.pin_memory().to(device, non_blocking=True)
    else:
        rows = rows.to(device)
    return rows[:, :-1], rows[:, 1:]
