"""Data parallelism, one process per GPU: the NCCL environment, then one apply_ function per concern,
applied in a fixed order (torchtitan's): activation checkpointing, compile, then the reduction.

Every reduction keeps the model's weights in bf16 and an fp32 master copy (plus AdamW moments) in the
optimizer, so the update is not lost to bf16 rounding. Gradients are reduced in bf16.

- `apply_ddp`: torch DDP (static graph, gradients as bucket views) + fused AdamW on full fp32 masters.
- `apply_zero2(overlap=False)`: parameters live in flat per-bucket buffers; after backward each bucket's
  gradient is reduce-scattered so every rank receives only the shard it owns; AdamW state exists for that
  shard only; updated shards are all-gathered back into the parameters.
- `apply_zero2(overlap=True)` ("zero2o"): the same buckets and the same collectives in the same order,
  but each bucket's reduce-scatter is issued from a post-accumulate-grad hook as soon as its last gradient
  lands, so communication overlaps the rest of backward. Bitwise equal to zero2 by construction.
- `apply_zero2(fused_optim=True)`: the same state, updated by one fused kernel pass per bucket shard
  (remote.kernels.adamw). At world size 1 there is nothing to reduce: no gradient buckets, no zeroing, no
  collectives; autograd hands each gradient over as is and the kernel writes the bf16 weight in place.
  zero2 and zero2o take the identical path there, so they stay bitwise equal.

The owner reduction and the order of its adds. Rank r owns slice r of every bucket; each element of an owned
slice is the sum of `world` bf16 values, one per rank. bf16 addition is commutative but not associative, so
the reduced bits are decided by the order of the world - 1 adds and by nothing else (every add widens both
operands to fp32, adds, rounds to bf16: torch's `add_`, NCCL's and gloo's bf16 sums alike). One collective per
bucket, never one reduction per rank:

- order "rank" (default under gloo; `VH_REDUCE_ORDER=rank` on CUDA): one `all_to_all_single` hands rank r the
  world copies of its slice, which it folds in rank order, ((g0 + g1) + g2) + ... + g(N-1). The bits are a
  function of the per-rank gradients alone: the same for any bucket size or layout, any backend algorithm,
  zero2 and zero2o, and reproducible in one process from the N gradients (tests/remote/test_worlds.py). It
  costs one receive buffer per bucket (the size of the bucket) and N - 1 local adds per owned element.
- order "backend" (default under NCCL): one `reduce_scatter_tensor`, in the order the backend's algorithm
  takes. NCCL's ring sums each owner's slice in a rotation of its ring (which rotation, per channel, is NCCL's
  choice: UNCONFIRMED); the same run to run for the same sizes, topology and NCCL settings (`--nccl-pcie`
  pins algorithm, protocol and channels), but not across bucket layouts. gloo's (measured, torch 2.15) is an
  all-reduce then the slice, whose order depends on where an element falls in gloo's own segments: that is
  why gloo runs take the rank order.

At world 2 both orders are a single add, so they give the same bits. zero2 and zero2o issue the same
collectives on the same buffers in the same bucket order and fold/update only after every one completed, so
they make the same adds in the same order under either order: bitwise equal by construction (tested at
world 2, 4 and 8 under gloo).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint

from remote import knobs
from remote.host.envprobe import mask_env
from remote.kernels import registry
from remote.kernels.adamw import FusedMasterAdamW
from remote.training.model import Transformer
from remote.training.profiles import TrainConfig

# NVLink multicast can take a shared host's GPUs out of service: off in NCCL, PyTorch and NVSHMEM, always.
MULTICAST_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# PCIe-only hosts (no NVLink, often no P2P through the root complex): ring over host memory, fixed channels.
PCIE = {"NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "4",
        "NCCL_MAX_NCHANNELS": "8", "NCCL_BUFFSIZE": "8388608"}
RECORDED_ENV_PREFIXES = ("NCCL_", "TORCH_SYMM_MEM", "NVSHMEM_", "PYTORCH_CUDA_ALLOC_CONF",
                         "CUBLAS_WORKSPACE_CONFIG", "TORCH_NCCL", "CUDA_VISIBLE_DEVICES", "TORCHINDUCTOR_",
                         "TORCH_BLAS_", "CUBLASLT_")  # and the workload's own knobs (remote.knobs)
REDUCE_ORDERS = ("rank", "backend")
_ALIGN = 64  # elements: every parameter and every shard starts 128-byte aligned in the flat buffers


def set_process_env(nccl_pcie: bool) -> dict[str, str]:
    """Before CUDA/NCCL start. setdefault: an operator's explicit value wins, except multicast, which is
    forced off even if the caller's environment says otherwise."""
    os.environ.update(MULTICAST_OFF)
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if nccl_pcie:
        for key, value in PCIE.items():
            os.environ.setdefault(key, value)
    return recorded_env()


def recorded_env() -> dict[str, str]:
    """The NCCL/allocator environment and the workload's knobs for the evidence; a --remote-env value is
    recorded as "***"."""
    env = {k: v for k, v in os.environ.items() if k.startswith(RECORDED_ENV_PREFIXES)}
    env |= knobs.given(knobs.KernelKnobs, knobs.TrainingKnobs, knobs.MpsKnobs)
    return mask_env(dict(sorted(env.items())))


def reduce_order(backend: str) -> str:
    """The owner reduction's add order (module docstring): as requested (`remote.knobs`), else rank under
    gloo, backend under NCCL (its reduce-scatter, the measured path)."""
    return knobs.training().reduce_order or ("backend" if backend == "nccl" else "rank")


def apply_act_ckpt(model: Transformer) -> None:
    """Per-layer activation checkpointing (non-reentrant); parameter names stay as they were."""
    for block in model.blocks:
        # the instance's forward replaced by a checkpointed call of itself (the module, its names unchanged)
        block.forward = _checkpointed(block.forward)  # type: ignore[method-assign]


def _checkpointed(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    def run(*args: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint(forward, *args, use_reentrant=False)
        return out

    return run


def apply_kernels(model: Transformer, device: torch.device) -> list[str]:
    """Switch the model onto the hand-written kernels that are active here (before compile: Dynamo
    traces the choice as a constant). Returns the active model-side kernels."""
    done = []
    if registry.active("loss", device):
        model.ce_fused = True
        done.append("loss")
    if registry.active("swiglu", device):
        from remote.kernels.swiglu import swiglu

        for block in model.blocks:
            block.ffn.swiglu = swiglu
        done.append("swiglu")
    if registry.active("mlp", device):
        from remote.kernels import mlp

        for i, block in enumerate(model.blocks):
            block.ffn.mlp = mlp.mlp
            with torch.no_grad():  # quack's (gate, up) row pairs, once; the state hands [gate; up] back
                block.ffn.w13.weight.copy_(mlp.to_kernel_layout(block.ffn.w13.weight))
            model.param_layouts[f"layers.{i}.ffn.w13.weight"] = mlp.to_model_layout
        done.append("mlp")
    if registry.active("norm", device):
        from remote.kernels import norm

        for block in model.blocks:
            block.norms = norm
        done.append("norm")
    if registry.active("rope", device):
        from remote.kernels.rope import rope_qkv

        for block in model.blocks:
            block.attn.rope = rope_qkv
        done.append("rope")
    return done


def apply_compile(model: Transformer) -> None:
    """One graph per layer (identical layers hit the compile cache) plus the fused loss chunk kernel.
    nn.Module.compile works in place, so parameter names and objects are unchanged."""
    for block in model.blocks:
        block.compile(fullgraph=True)
    model.ce_kernel = torch.compile(model.ce_kernel, fullgraph=True)


class _MasterAdamW:
    """Fused AdamW over fp32 master copies of bf16 tensors (whole parameters or flat shards)."""

    def __init__(self, sources: Sequence[torch.Tensor], train: TrainConfig) -> None:
        self.masters = [nn.Parameter(s.detach().float().clone()) for s in sources]
        self.grads = [torch.zeros_like(m) for m in self.masters]
        for m, g in zip(self.masters, self.grads, strict=True):
            m.grad = g
        fused = self.masters[0].device.type in ("cuda", "cpu")
        self.opt = torch.optim.AdamW(self.masters, lr=train.lr, betas=(train.beta1, train.beta2),
                                     weight_decay=train.weight_decay, fused=fused)

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], outs: list[torch.Tensor], grad_scale: float = 1.0) -> None:
        for mine, g in zip(self.grads, grads, strict=True):
            mine.copy_(g)
        if grad_scale != 1.0:
            torch._foreach_mul_(self.grads, grad_scale)
        self.opt.step()
        for out, m in zip(outs, self.masters, strict=True):
            out.copy_(m)

    def state(self, i: int) -> dict[str, torch.Tensor]:
        st = self.opt.state[self.masters[i]]
        return {"master": self.masters[i].detach(), "exp_avg": st["exp_avg"], "exp_avg_sq": st["exp_avg_sq"],
                "step": st["step"]}

    def numel(self) -> int:
        return sum(m.numel() for m in self.masters)


def _as_is(t: torch.Tensor) -> torch.Tensor:
    return t


class DdpRunner:
    def __init__(self, model: Transformer, names: dict[int, str], train: TrainConfig,
                 group: dist.ProcessGroup, device: torch.device) -> None:
        self.module, self.names, self.group = model, names, group
        self.reduce_order = "backend"  # DDP's all-reduce, in the order the backend's algorithm takes
        self.params = list(model.parameters())
        self.wrapped = DistributedDataParallel(
            model, process_group=group, bucket_cap_mb=train.bucket_cap_mb, gradient_as_bucket_view=True,
            static_graph=True, device_ids=[device.index] if device.type == "cuda" else None)
        self.optim = _MasterAdamW(self.params, train)

    def forward_backward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.wrapped(tokens, targets)
        loss.backward()
        return loss.detach()

    def step(self) -> None:
        grads = [p.grad for p in self.params]
        if any(g is None for g in grads):  # static_graph DDP gives every parameter a bucket view
            raise RuntimeError("DDP left a parameter without a gradient")
        self.optim.step([g for g in grads if g is not None], [p.data for p in self.params])
        for g in grads:  # grads are views into DDP's buckets: zero, never None
            if g is not None:
                g.zero_()

    def optimizer_numel(self) -> int:
        return self.optim.numel()

    def canonical_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Full parameters and optimizer state, canonical names; every rank holds it all under DDP."""
        for i, p in enumerate(self.params):
            name = self.names[id(p)]
            canon = self.module.param_layouts.get(name, _as_is)
            yield f"param.{name}", canon(p.detach())
            st = self.optim.state(i)
            for key in ("master", "exp_avg", "exp_avg_sq"):
                yield f"optim.{name}.{key}", canon(st[key])
        yield "optim.step", self.optim.state(0)["step"]


def apply_ddp(model: Transformer, names: dict[int, str], train: TrainConfig, group: dist.ProcessGroup,
              device: torch.device) -> DdpRunner:
    return DdpRunner(model, names, train, group, device)


class _Bucket:
    """A run of parameters sharing one flat bf16 weight buffer and one flat bf16 gradient buffer
    (with_grads=False: weights only; autograd's own gradient tensors are read where they land)."""

    def __init__(self, params: list[nn.Parameter], world: int, rank: int, with_grads: bool = True,
                 with_recv: bool = False) -> None:
        self.params, self.offsets = params, []
        total = 0
        for p in params:
            self.offsets.append(total)
            total += -(-p.numel() // _ALIGN) * _ALIGN
        self.numel = -(-total // (world * _ALIGN)) * world * _ALIGN  # shards equal and aligned
        self.shard = self.numel // world
        ref = params[0]
        self.flat_param = torch.zeros(self.numel, dtype=ref.dtype, device=ref.device)
        self.my_slice = slice(rank * self.shard, (rank + 1) * self.shard)
        if with_grads:
            self.flat_grad = torch.zeros_like(self.flat_param)
            self.shard_grad = torch.empty(self.shard, dtype=ref.dtype, device=ref.device)
            self.shard_out = torch.empty_like(self.shard_grad)  # updated shard, all-gather input
        # rank order: the world copies of this rank's slice, row r from rank r (all-to-all output)
        self.recv = torch.empty(world, self.shard, dtype=ref.dtype, device=ref.device) if with_recv else None
        with torch.no_grad():
            for p, off in zip(params, self.offsets, strict=True):
                view = self.flat_param[off:off + p.numel()].view_as(p)
                view.copy_(p)
                p.data = view  # the Parameter object (and its name) survives; its storage is the bucket
                # autograd accumulates in place into an existing .grad: the bucket fills with no copy
                p.grad = self.flat_grad[off:off + p.numel()].view_as(p) if with_grads else None
        self.ready = 0


class Zero2Runner:
    def __init__(self, model: Transformer, names: dict[int, str], train: TrainConfig,
                 group: dist.ProcessGroup, overlap: bool, fused_optim: bool = False) -> None:
        self.module, self.names, self.group, self.overlap = model, names, group, overlap
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.direct = fused_optim and self.world == 1  # nothing to reduce: read autograd's gradients as is
        self.reduce_order = reduce_order(dist.get_backend(group))
        self.buckets = self._make_buckets(list(model.parameters()), int(train.bucket_cap_mb * 2**20))
        shards = [b.flat_param[b.my_slice] for b in self.buckets]
        self.optim: FusedMasterAdamW | _MasterAdamW = (
            FusedMasterAdamW(shards, train.lr, train.beta1, train.beta2, train.weight_decay) if fused_optim
            else _MasterAdamW(shards, train))
        self.handles: list[dist.Work] = []
        self.launched = 0
        self.pending_gathers: dict[int, dist.Work] = {}  # bucket -> all-gather still in flight (zero2o only)
        if overlap and not self.direct:
            # zero2o also overlaps the parameter all-gather with the next forward: each bucket is waited for
            # just before the first stage that reads it, and gathered in that order.
            self.stage_buckets = self._stage_buckets(model)
            self.gather_order = sorted(range(len(self.buckets)), key=self._first_stage)
            model.before_stage = self._wait_stage
            for i, b in enumerate(self.buckets):
                for p in b.params:
                    p.register_post_accumulate_grad_hook(lambda _p, _i=i: self._on_grad_ready(_i))

    def _make_buckets(self, params: list[nn.Parameter], cap_bytes: int) -> list[_Bucket]:
        """Reverse registration order ~ the order backward produces gradients, so bucket 0 fills first."""
        groups: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if groups[-1] and size + nbytes > cap_bytes:
                groups.append([])
                size = 0
            groups[-1].append(p)
            size += nbytes
        recv = self.reduce_order == "rank" and self.world > 1
        return [_Bucket(g, self.world, self.rank, with_grads=not self.direct, with_recv=recv) for g in groups]

    def _stage_of(self, p: nn.Parameter) -> int:
        """The forward stage that first reads `p`: -1 the embedding (and the tied head), i layer i, n the norm."""
        name = self.names[id(p)]
        if name.startswith("layers."):
            return int(name.split(".")[1])
        return -1 if name.startswith("tok_embeddings.") else len(self.module.layers)

    def _first_stage(self, i: int) -> int:
        return min(self._stage_of(p) for p in self.buckets[i].params)

    def _stage_buckets(self, model: Transformer) -> dict[int, list[int]]:
        stages: dict[int, list[int]] = {}
        for i in range(len(self.buckets)):
            stages.setdefault(self._first_stage(i), []).append(i)
        return stages

    def _wait_stage(self, stage: int) -> None:
        for i in self.stage_buckets.get(stage, ()):
            work = self.pending_gathers.pop(i, None)
            if work is not None:
                work.wait()  # the compute stream waits for the gather; the host does not block

    def wait_params(self) -> None:
        """Every parameter whole again (before reading them outside a forward: the leaf root, evidence)."""
        for i in list(self.pending_gathers):
            self.pending_gathers.pop(i).wait()

    def _launch(self, i: int) -> None:
        """Bucket i's owner reduction: one collective (the module docstring says in which order it adds)."""
        b = self.buckets[i]
        if b.recv is not None:
            work = dist.all_to_all_single(b.recv.view(-1), b.flat_grad, group=self.group, async_op=True)
        else:
            work = dist.reduce_scatter_tensor(b.shard_grad, b.flat_grad, op=dist.ReduceOp.SUM, group=self.group,
                                              async_op=True)
        self.handles.append(_handle(work))
        self.launched = i + 1

    def _finish_reductions(self) -> None:
        """Wait for every bucket's collective; in rank order, fold the received copies g0 + g1 + ... in place."""
        for h in self.handles:
            h.wait()
        for b in self.buckets:
            if b.recv is not None:
                fold_in_rank_order(b.recv, out=b.shard_grad)

    def _on_grad_ready(self, i: int) -> None:
        self.buckets[i].ready += 1
        # Launch strictly in bucket order, so the collective sequence is identical to zero2's.
        while self.launched < len(self.buckets) and \
                self.buckets[self.launched].ready == len(self.buckets[self.launched].params):
            self._launch(self.launched)

    def forward_backward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss: torch.Tensor = self.module(tokens, targets)
        loss.backward()
        return loss.detach()

    @torch.no_grad()
    def step(self) -> None:
        if self.direct:
            self._step_direct()
            return
        for i in range(self.launched, len(self.buckets)):  # zero2: all of them; zero2o: none normally
            self._launch(i)
        self._finish_reductions()
        self.wait_params()  # a previous step's gathers (none normally: the forward waited for them)
        order = self.gather_order if self.overlap else range(len(self.buckets))
        optim = self.optim
        if isinstance(optim, FusedMasterAdamW):  # each bucket's gather starts as soon as its update is done
            optim.begin_step()
            for i in order:
                b = self.buckets[i]
                optim.update(i, b.shard_grad, b.shard_out, grad_scale=1.0 / self.world)
                self.pending_gathers[i] = self._gather(i)
        else:
            optim.step([b.shard_grad for b in self.buckets], [b.shard_out for b in self.buckets],
                       grad_scale=1.0 / self.world)
            for i in order:
                self.pending_gathers[i] = self._gather(i)
        if not self.overlap:
            self.wait_params()
        for b in self.buckets:
            b.flat_grad.zero_()
            b.ready = 0
        self.handles, self.launched = [], 0

    def _gather(self, i: int) -> dist.Work:
        b = self.buckets[i]
        return _handle(dist.all_gather_into_tensor(b.flat_param, b.shard_out, group=self.group, async_op=True))

    def _step_direct(self) -> None:
        """World size 1, fused optimizer: one kernel per parameter reads the gradient autograd produced
        (its storage, no copy into a bucket) and writes master/m/v and the bf16 weight in place; the
        gradient is then dropped, so the next backward hands over a fresh one (no zeroing pass)."""
        optim = self.optim
        assert isinstance(optim, FusedMasterAdamW)  # direct is fused at world size 1
        optim.begin_step()
        for i, b in enumerate(self.buckets):
            for p, off in zip(b.params, b.offsets, strict=True):
                grad = p.grad if p.grad is not None else torch.zeros_like(p)  # unused: AdamW on zero grad
                optim.update(i, grad, p.data, offset=off)
                p.grad = None

    def optimizer_numel(self) -> int:
        return self.optim.numel()

    def canonical_state(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Collective: every rank must iterate. Rank 0 receives full, unpadded tensors under the same
        names DDP uses; other ranks get nothing (they still take part in the gathers)."""
        self.wait_params()
        for i, b in enumerate(self.buckets):
            st = self.optim.state(i)
            full = {}
            for key in ("master", "exp_avg", "exp_avg_sq"):
                full[key] = torch.empty(b.numel, dtype=st[key].dtype, device=st[key].device)
                dist.all_gather_into_tensor(full[key], st[key].contiguous(), group=self.group)
            if self.rank != 0:
                continue
            for p, off in zip(b.params, b.offsets, strict=True):
                name = self.names[id(p)]
                canon = self.module.param_layouts.get(name, _as_is)
                yield f"param.{name}", canon(p.detach())
                for key in ("master", "exp_avg", "exp_avg_sq"):
                    yield f"optim.{name}.{key}", canon(full[key][off:off + p.numel()].view(p.shape))
        if self.rank == 0:
            yield "optim.step", self.optim.state(0)["step"]


def _handle(work: dist.Work | None) -> dist.Work:
    """An async collective's handle (torch types it optional: with async_op=True there always is one)."""
    if work is None:
        raise RuntimeError("an async collective returned no handle")
    return work


def fold_in_rank_order(parts: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = ((parts[0] + parts[1]) + parts[2]) + ...: one rounded add per row, left to right (never a tree)."""
    out.copy_(parts[0])
    for row in parts[1:]:
        out.add_(row)
    return out


def apply_zero2(model: Transformer, names: dict[int, str], train: TrainConfig, group: dist.ProcessGroup,
                overlap: bool, fused_optim: bool = False) -> Zero2Runner:
    return Zero2Runner(model, names, train, group, overlap, fused_optim)


@dataclass(frozen=True)
class ParallelConfig:
    """How a model is parallelised: the reduction and the optional transforms (run_mfu_dist.py's flags)."""

    reduction: str  # "ddp" | "zero2" | "zero2o"
    train: TrainConfig
    act_ckpt: bool = False
    compile: bool = False


@dataclass(frozen=True)
class World:
    """Where the reduction runs: its process group and this rank's device."""

    group: dist.ProcessGroup
    device: torch.device


def parallelize(model: Transformer, cfg: ParallelConfig, world: World) -> DdpRunner | Zero2Runner:
    """Every transform, in its one fixed order (torchtitan's): canonical names before anything wraps the
    model; kernels before compile (Dynamo traces the choice as a constant); activation checkpointing, so
    compile sees the checkpointed layers; compile; the reduction last, over the final modules."""
    if cfg.reduction not in ("ddp", "zero2", "zero2o"):
        raise ValueError(f"unknown reduction {cfg.reduction!r}")
    names = {id(p): n for n, p in model.named_parameters()}
    apply_kernels(model, world.device)
    if cfg.act_ckpt:
        apply_act_ckpt(model)
    if cfg.compile:
        apply_compile(model)
    if cfg.reduction == "ddp":
        return apply_ddp(model, names, cfg.train, world.group, world.device)
    return apply_zero2(model, names, cfg.train, world.group, overlap=cfg.reduction == "zero2o",
                       fused_optim=registry.active("optim", world.device))


__all__ = ["MULTICAST_OFF", "PCIE", "REDUCE_ORDERS", "DdpRunner", "ParallelConfig", "World", "Zero2Runner", "apply_act_ckpt", "apply_compile",
           "apply_ddp", "apply_kernels", "apply_zero2", "fold_in_rank_order", "recorded_env", "reduce_order",
           "set_process_env"]
