"""sha256 Merkle root over named tensors (docs/mfu.md).

Leaf = sha256(name ‖ 0x00 ‖ dtype ‖ 0x00 ‖ shape ‖ 0x00 ‖ raw little-endian contiguous bytes); leaves are
sorted by name; a level with an odd count carries its last node up unchanged. Never torch.save bytes
(pointer- and id-dependent) nor torch.hash_tensor (XOR: blind to order).
"""

from __future__ import annotations

import ctypes
import hashlib
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

assert sys.byteorder == "little", "leaf bytes are defined as little-endian"


def raw_bytes(t: torch.Tensor) -> memoryview:
    """A zero-copy view of a contiguous CPU tensor's bytes, without numpy (the host has only torch).

    The caller keeps `t` alive while the view is used.
    """
    if t.device.type != "cpu" or not t.is_contiguous():
        raise ValueError("raw_bytes needs a contiguous CPU tensor")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_ubyte * nbytes).from_address(t.data_ptr())).cast("B")


def tensor_leaf(name: str, t: torch.Tensor) -> bytes:
    host = t.detach().contiguous().cpu()
    h = hashlib.sha256()
    h.update(name.encode() + b"\0" + str(host.dtype).removeprefix("torch.").encode() + b"\0")
    h.update(",".join(str(s) for s in host.shape).encode() + b"\0")
    # reshape(-1) so 0-dim tensors (optimizer step) view as bytes too; hashlib drops the GIL on big buffers.
    h.update(raw_bytes(host.reshape(-1)))
    return h.digest()


def root_of_leaves(leaves: dict[str, bytes]) -> str:
    level = [leaves[k] for k in sorted(leaves)]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [hashlib.sha256(level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


def merkle_root(tensors: Iterable[tuple[str, torch.Tensor]], workers: int = 8) -> str:
    """Hash leaves in a thread pool (sha256 over GiB of state is the slow part on a 1B model)."""
    items = list(tensors)
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise ValueError("duplicate tensor names in Merkle input")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        digests = list(pool.map(lambda nt: tensor_leaf(*nt), items))
    return root_of_leaves(dict(zip(names, digests, strict=True)))
