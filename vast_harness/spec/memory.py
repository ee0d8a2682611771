"""The GPU memory one rank of the 1B training round needs, from what it runs: the model's shapes, the world
size, the reduction, the micro-batch, activation checkpointing and compile. Decided before renting (the offer
fit, `spec/fit.py`), calibrated on every committed measured peak, each with its evidence (`CALIBRATION`).

What is modelled is `torch.cuda.max_memory_allocated`, the evidence's `rank_step_peak_mem_gib`, on the torch
path: the hand-written kernels (`remote/kernels/`) only lower it (a fused loss, a fused optimizer), and any of
them may fall back on a GPU where its probe fails, so the torch path is the bound. Per rank:

    peak  = state + max(saved + loss, saved_in_backward + grads + head_grad) + workspace

state: parameters x bytes per parameter (`remote/training/parallel.py`):
    zero2, zero2o   2 (bf16 weight) + 2 (bf16 gradient bucket)
                    + [2 + 2 (bf16 owned shard of the gradient, the updated shard)
                       + 16 (fp32 master, its gradient copy, exp_avg, exp_avg_sq)] / world   = 4 + 20 / world
    ddp             2 + 2 + 16 = 20, + 2 on rank 0: measured, rank 0 held 2.30 GiB (2 B/param) more than rank 1
                    at dp2 (.evidence/h200x2/runs/dp2-ddp-mb16.json); cause UNCONFIRMED, counted
    VH_REDUCE_ORDER=rank at world > 1: + 2 (each bucket's all-to-all receive buffer)

Activations, in bf16 vectors of d_model per token (2 x d bytes each), t = micro-batch x seq tokens per rank.
The head and the loss's gradients are formed in the forward, chunk by chunk (`linear_cross_entropy`), so the
peak is the forward's loss, with every tensor the forward saved alive:
    saved (no checkpointing)   L x a       a = 20 compiled, 24 eager, per layer
    saved (checkpointing)      L + 3       each layer's input, the final norm's input, its output, grad_h
    loss                       min(chunk, t) x padded vocab x b + 4 x vocab x d (the fp32 head gradient)
                               b = 6 bytes per logit compiled, 21 eager
and the backward, which can pass it at large t: one layer recomputed under checkpointing (L + a saved), its
gradients in flight (g = 12: the w13 output's 8 and the SwiGLU product's 4) and the bf16 head gradient.

Where the numbers come from:
- a = 20 compiled: the measured slope, 2.4964 GiB per 2048-token sequence between micro-batch 8, 16 and 24
  at world 1 and 2, is 319.5 d-vectors per token, 20.0 per layer.
- b = 6 compiled: the compiled line's intercept, 6.83-6.89 GiB at every world, reduction and micro-batch, less
  the fp32 head gradient (0.98 GiB) is 5.87 GiB = 6 B x 8192 x 128256: the bf16 logits, the bf16 dlogits and
  one more bf16 buffer of their size.
- b = 21 eager: measured where the loss dominates, a checkpointed eager round (kernels off, micro-batch 8, a lent
  H100, .evidence/memory-ckpt-2026-12-06): its 50.40 GiB less the state, the L + 3 saved vectors, the fp32 head
  gradient and the workspace leaves 20.8 bytes per logit. Counted, `_ce_chunk`'s eager temporaries alive at once
  come to 19 (bf16 logits 2, their fp32 copy 4, the target mask 1, exp 4, the mask as float 4, the difference
  4); the measured 21 stands (the counted 19 put the model 1.77 GiB under that round). a = 24 eager is then what
  the micro-batch-8 eager peaks without checkpointing (every world) leave. Compile's effect: 4 vectors per layer
  and 15 bytes per logit less.
- L + 3, g = 12: counted; the checkpointed rounds of the same call (compiled, micro-batch 8 and 12: 35.72 and
  36.32 GiB) sit 0.18-0.19 GiB under the model. The design's 2x RTX 5090 island measured 20.8-24.4 GiB per rank
  at micro-batch 8-12 (dp2, zero2o, checkpointing, compile), its own code, quoted in CALIBRATION: the model sits
  above both.
- workspace 0.25 GiB: what is left; every measured torch-path peak sits 0.22-0.27 GiB below the model.

What the GPU must hold besides (the fit's need): the peak x (1 + FRAGMENTATION) + OUTSIDE_ALLOCATOR_GIB. The
allocator's reserve above what it hands out (expandable segments on) is not measured: 3% is an allowance. Outside
the allocator: the driver's reservation, measured as nvidia-smi's total less torch's (0.47 GiB on an H100 80GB,
.evidence/receipt-2026-12-06/h100-call3; 0.6 GiB on an H200, .evidence/h200/envprobe.json), and the CUDA
context, cuBLAS/cuDNN handles and NCCL buffers, not measured here: 1.5 GiB in all.

Not modelled: determinism (the measured deterministic peaks equal the fast ones), the attention path (all keep
O(t) memory), NCCL's P2P setting, MPS.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from vast_harness.errors import ConfigError
from vast_harness.resources import profiles_dir

GIB = 2**30
BF16_BYTES = 2
Reduction = Literal["ddp", "zero2", "zero2o"]
REDUCTIONS: tuple[Reduction, ...] = ("ddp", "zero2", "zero2o")

# bytes per parameter (module docstring)
WEIGHT_AND_GRAD_BYTES = 4  # bf16 weight + bf16 gradient bucket, every rank
SHARDED_BYTES = 20  # bf16 shard gradient + updated shard (4) and fp32 master, gradient copy, m, v (16)
DDP_BYTES = 20
DDP_RANK0_EXTRA_BYTES = 2
RANK_ORDER_RECV_BYTES = 2
# bf16 d-vectors per token
SAVED_PER_LAYER = {True: 20, False: 24}  # compiled, eager
CKPT_SAVED_OUTSIDE_LAYERS = 3
BACKWARD_GRADS = 12
# bytes per logit of one loss chunk
LOSS_BYTES_PER_LOGIT = {True: 6, False: 21}
HEAD_GRAD_FP32_BYTES = 4
WORKSPACE_GIB = 0.25
# the need on top of the peak
FRAGMENTATION = 0.03
OUTSIDE_ALLOCATOR_GIB = 1.5


@dataclass(frozen=True)
class ModelShape:
    """What the memory depends on in a model profile (`profiles/models/*.toml`: [model] and [train])."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    vocab_pad_multiple: int
    seq_len: int
    micro_batch: int  # the profile's default
    ce_chunk_tokens: int
    world_size: int | None

    @property
    def padded_vocab(self) -> int:
        m = max(1, self.vocab_pad_multiple)
        return -(-self.vocab_size // m) * m

    @property
    def params(self) -> int:
        """Parameters, tied embedding (remote/training/model.py `param_counts`)."""
        d, hd = self.d_model, self.d_model // self.n_heads
        attn = d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d
        per_layer = attn + 3 * d * self.ffn_hidden + 2 * d
        return self.n_layers * per_layer + d + self.padded_vocab * d


def _int(table: dict[str, object], key: str, where: str, default: int | None = None) -> int:
    value = table.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


@cache
def load_model_shape(name: str) -> ModelShape:
    """A model profile's shapes, read as data (the control plane never imports `remote/`)."""
    path = profiles_dir() / "models" / f"{name}.toml"
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"no model profile {name} ({path})") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read ({exc})") from None
    model, train = data.get("model", {}), data.get("train", {})
    world = data.get("world_size")
    return ModelShape(
        name=name, d_model=_int(model, "d_model", str(path)), n_layers=_int(model, "n_layers", str(path)),
        n_heads=_int(model, "n_heads", str(path)), n_kv_heads=_int(model, "n_kv_heads", str(path)),
        ffn_hidden=_int(model, "ffn_hidden", str(path)), vocab_size=_int(model, "vocab_size", str(path)),
        vocab_pad_multiple=_int(model, "vocab_pad_multiple", str(path), 256),
        seq_len=_int(model, "seq_len", str(path)), micro_batch=_int(train, "micro_batch", str(path)),
        ce_chunk_tokens=_int(train, "ce_chunk_tokens", str(path), 8192),
        world_size=world if isinstance(world, int) and not isinstance(world, bool) else None)


@dataclass(frozen=True)
class RunShape:
    """One rank's settings, as run_mfu_dist.py's flags give them."""

    world: int
    micro_batch: int
    reduction: Reduction = "zero2o"
    compile: bool = False
    act_ckpt: bool = False
    ce_chunk_tokens: int | None = None  # VH_CE_CHUNK; None: the model profile's
    rank_order: bool = False  # VH_REDUCE_ORDER=rank


@dataclass(frozen=True)
class Peak:
    """The predicted peak of `torch.cuda.max_memory_allocated` on the busiest rank, by part (GiB)."""

    state_gib: float
    activations_gib: float  # the larger phase's activations, loss and gradients
    workspace_gib: float

    @property
    def total_gib(self) -> float:
        return self.state_gib + self.activations_gib + self.workspace_gib

    @property
    def need_gib(self) -> float:
        """What the GPU must hold: the peak, the allocator's reserve and what lives outside it."""
        return self.total_gib * (1 + FRAGMENTATION) + OUTSIDE_ALLOCATOR_GIB


def state_bytes_per_param(reduction: Reduction, world: int, *, rank_order: bool = False) -> float:
    if reduction == "ddp":
        return DDP_BYTES + DDP_RANK0_EXTRA_BYTES
    extra = RANK_ORDER_RECV_BYTES if rank_order and world > 1 else 0
    return WEIGHT_AND_GRAD_BYTES + extra + SHARDED_BYTES / world


def peak(model: ModelShape, run: RunShape) -> Peak:
    """The module docstring's formula."""
    d, L = model.d_model, model.n_layers
    tokens = run.micro_batch * model.seq_len
    vector = tokens * d * BF16_BYTES
    per_layer = SAVED_PER_LAYER[run.compile]
    chunk = min(run.ce_chunk_tokens or model.ce_chunk_tokens, tokens)
    loss = chunk * model.padded_vocab * LOSS_BYTES_PER_LOGIT[run.compile] \
        + HEAD_GRAD_FP32_BYTES * model.padded_vocab * d
    saved = (L + CKPT_SAVED_OUTSIDE_LAYERS) if run.act_ckpt else L * per_layer
    saved_backward = (L + per_layer) if run.act_ckpt else L * per_layer
    forward = saved * vector + loss
    backward = (saved_backward + BACKWARD_GRADS) * vector + BF16_BYTES * model.padded_vocab * d
    state = model.params * state_bytes_per_param(run.reduction, run.world, rank_order=run.rank_order)
    return Peak(state_gib=state / GIB, activations_gib=max(forward, backward) / GIB, workspace_gib=WORKSPACE_GIB)


def need_gib(model: ModelShape, run: RunShape) -> float:
    """`peak(...).need_gib`, rounded up to 0.1 GiB (the figure the quote shows and the host compares)."""
    return math.ceil(peak(model, run).need_gib * 10) / 10


# --- calibration -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationPoint:
    """A measured peak the model must not fall below, and where it was measured."""

    evidence: str  # a committed file under .evidence/ (its run record, or the record under `key`), or "design"
    key: str | None  # the record's key inside a file holding several (bench-vs-reference's "ours"); None: the file
    model: str
    run: RunShape
    measured_gib: float  # the highest rank's rank_step_peak_mem_gib / rank_peak_mem_gib, 2 decimals
    gpu: str


def _pt(evidence: str, world: int, mb: int, measured: float, *, reduction: Reduction = "zero2o",
        compile: bool = True, act_ckpt: bool = False, ce_chunk_tokens: int | None = None, key: str | None = None,
        gpu: str = "NVIDIA H200") -> CalibrationPoint:
    return CalibrationPoint(evidence=evidence, key=key, model=f"mfu-dense-1b-dp{world}",
                            run=RunShape(world=world, micro_batch=mb, reduction=reduction, compile=compile,
                                         act_ckpt=act_ckpt, ce_chunk_tokens=ce_chunk_tokens),
                            measured_gib=measured, gpu=gpu)


# The torch-path peaks (no hand-written kernel active): one per setting measured, the highest where a setting
# ran more than once. They fix the slope and intercepts; runs with kernels sit lower (tests/harness/
# test_memory_model.py checks every committed peak, kernels or not, against the model).
CALIBRATION: tuple[CalibrationPoint, ...] = (
    _pt(".evidence/h200x2/runs/dp1-zero2o-mb8.json", 1, 8, 54.51),
    _pt(".evidence/h200x2/runs/dp1-zero2o-mb16.json", 1, 16, 74.48),
    _pt(".evidence/h200/dp1-fast-mb24.json", 1, 24, 94.45),
    _pt(".evidence/h200x2/e2e/20261130T185434Z-10d3f6/remote/mfu-dp2-zero2o-mb8-compile-p2pon.json", 2, 8, 43.00),
    _pt(".evidence/h200x2/runs/dp2-zero2o-mb16-pcie.json", 2, 16, 62.97),
    _pt(".evidence/h200x2/runs/dp2-zero2-mb16.json", 2, 16, 62.97, reduction="zero2"),
    _pt(".evidence/h200x2/runs/dp2-ddp-mb16.json", 2, 16, 72.18, reduction="ddp"),
    _pt(".evidence/h200/proofs-2026-11-29/20261129T081707Z-4d6173/remote/mfu-proof.json", 1, 8, 73.18,
        compile=False),
    _pt(".evidence/h200x2/runs/dp2-det-zero2o.json", 2, 8, 61.67, compile=False),
    # Checkpointed, kernels off (VH_KERNELS=none), on a lent H100: scripts/gpu/memory_ckpt.sh (its records name
    # the loss chunk, 8192, the profile's).
    _pt(".evidence/memory-ckpt-2026-12-06/mfu-ckpt-compile-mb8-nokernels.json", 1, 8, 35.72, act_ckpt=True,
        ce_chunk_tokens=8192, gpu="NVIDIA H100 80GB HBM3"),
    _pt(".evidence/memory-ckpt-2026-12-06/mfu-ckpt-compile-mb12-nokernels.json", 1, 12, 36.32, act_ckpt=True,
        ce_chunk_tokens=8192, gpu="NVIDIA H100 80GB HBM3"),
    _pt(".evidence/memory-ckpt-2026-12-06/mfu-ckpt-eager-mb8-nokernels.json", 1, 8, 50.40, act_ckpt=True,
        compile=False, ce_chunk_tokens=8192, gpu="NVIDIA H100 80GB HBM3"),
    # The design's island (2x RTX 5090 over PCIe), its own implementation, quoted by issue 48 as the design's
    # figures: in-step peak 20.8-24.4 GiB per rank at micro-batch 8-12, dp2, zero2o, checkpointing, compile.
    CalibrationPoint(evidence="design", key=None, model="mfu-dense-1b-dp2", gpu="NVIDIA GeForce RTX 5090",
                     run=RunShape(world=2, micro_batch=8, compile=True, act_ckpt=True), measured_gib=20.8),
    CalibrationPoint(evidence="design", key=None, model="mfu-dense-1b-dp2", gpu="NVIDIA GeForce RTX 5090",
                     run=RunShape(world=2, micro_batch=12, compile=True, act_ckpt=True), measured_gib=24.4),
)
