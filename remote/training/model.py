"""A dense Llama-style decoder: config, modules, FLOPs per token. No distributed code here.

Shape of the 1B flavour follows Llama-3.2-1B (d 2048, 16 layers, 32 heads, 8 KV heads, SwiGLU 8192,
vocab 128256, tied embeddings). q/k/v and the two SwiGLU input projections are fused into one matmul each
(same parameter count, larger GEMMs). The LM head and the loss are one fused, chunked operation
(`linear_cross_entropy`) so the [tokens x 128k] logits are never held for backward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from remote.attention import backend as attention

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    vocab_size: int
    """Real vocabulary; data never draws a token at or above it."""
    vocab_pad_multiple: int = 256
    """The embedding/head rows are padded up to a multiple of this (tensor-core friendly GEMM shapes)."""
    seq_len: int
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    dtype: str = "bfloat16"
    init_std: float = 0.02

    def __post_init__(self) -> None:
        for name in ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "vocab_size", "seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_heads {self.n_heads} is not divisible by n_kv_heads {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"model head_dim {self.head_dim} must be even for RoPE")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype {self.dtype!r} is not one of {sorted(DTYPES)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def padded_vocab(self) -> int:
        m = max(1, self.vocab_pad_multiple)
        return (self.vocab_size + m - 1) // m * m

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    def param_counts(self) -> dict[str, int]:
        """Parameter counts by role, from the shapes (no model needed)."""
        d, hd = self.d_model, self.head_dim
        attn = d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d
        mlp = 3 * d * self.ffn_hidden
        per_layer = attn + mlp + 2 * d  # two RMSNorm weights
        non_embedding = self.n_layers * per_layer + d  # final norm
        embedding = self.padded_vocab * d
        return {"non_embedding": non_embedding, "embedding": embedding, "lm_head": embedding,
                "total": non_embedding + embedding}

    def flops_per_token(self, causal_halved: bool = False) -> float:
        """6*(N_nonembed + N_lm_head) + 12*L*d*T (PaLM App. B, as nanoGPT/torchtitan/llm-foundry count).

        The head is tied to the embedding but its matmul is real work, so it counts; the lookup does not.
        Recompute (activation checkpointing, flash backward) is excluded: this is MFU, not HFU.
        `causal_halved` halves the attention term (the causal mask skips half the scores), a secondary figure.
        """
        counts = self.param_counts()
        attn = 12.0 * self.n_layers * self.d_model * self.seq_len
        if causal_halved:
            attn /= 2
        return 6 * (counts["non_embedding"] + counts["lm_head"]) + attn


FLOPS_FORMULA = "6*(N_nonembed + N_lm_head) + 12*L*d*T (no causal halving; recompute excluded)"

# RoPE tables depend only on (head_dim, length, theta, dtype, device): computed once per key.
_ROPE_CACHE: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}


def rope_tables(cfg: ModelConfig, seq_len: int, dtype: torch.dtype, device: torch.device
                ) -> tuple[torch.Tensor, torch.Tensor]:
    key = (cfg.head_dim, seq_len, cfg.rope_theta, dtype, str(device))
    if key not in _ROPE_CACHE:
        # Computed in fp64 on the CPU so the tables are the same bits on every device and run.
        inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv)
        emb = torch.cat([freqs, freqs], dim=-1)
        _ROPE_CACHE[key] = (emb.cos().to(dtype).to(device), emb.sin().to(dtype).to(device))
    return _ROPE_CACHE[key]


# The hand-written kernels' entry points, as the modules below hold them once remote.training.parallel attaches
# a kernel (remote/kernels/): None means the torch path.
RopeKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int, int],
                      tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
SwigluKernel = Callable[[torch.Tensor], torch.Tensor]
MlpKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class NormKernels(Protocol):
    """remote.kernels.norm's two entry points."""

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor: ...

    def add_rmsnorm(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; rotate-half convention (the HF Llama layout)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.hd = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wqkv = nn.Linear(cfg.d_model, (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)
        self.rope: RopeKernel | None = None  # remote.kernels.rope.rope_qkv when active (one pass each way)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        if self.rope is not None:  # q, k, v come back [B, T, H, D] contiguous: [B, H, T, D] views below
            q, k, v = self.rope(self.wqkv(x).view(b, t, self.n_heads + 2 * self.n_kv, self.hd), cos, sin,
                                self.n_heads, self.n_kv)
            out = attention.sdpa(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        else:
            qkv = self.wqkv(x).view(b, t, self.n_heads + 2 * self.n_kv, self.hd).transpose(1, 2)
            q, k, v = qkv.split([self.n_heads, self.n_kv, self.n_kv], dim=1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            out = attention.sdpa(q, k, v)
        y: torch.Tensor = self.wo(out.transpose(1, 2).reshape(b, t, self.n_heads * self.hd))
        return y


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w13 = nn.Linear(cfg.d_model, 2 * cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)
        self.swiglu: SwigluKernel | None = None  # remote.kernels.swiglu.swiglu when active (one-pass backward)
        # remote.kernels.mlp.mlp when active: SwiGLU inside the GEMM epilogues (quack), the residual add in
        # w2's; w13's rows are then interleaved (gate_0, up_0, ...), see remote.training.parallel.apply_kernels
        self.mlp: MlpKernel | None = None

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + the MLP of x (the residual add belongs here: the fused path does it in a GEMM)."""
        if self.mlp is not None:
            return self.mlp(x, self.w13.weight, self.w2.weight, residual)
        if self.swiglu is not None:
            act = self.swiglu(self.w13(x))
        else:
            gate, up = self.w13(x).chunk(2, dim=-1)
            act = F.silu(gate) * up
        out: torch.Tensor = residual + self.w2(act)
        return out


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ffn = FeedForward(cfg)
        self.norms: NormKernels | None = None  # remote.kernels.norm when active (the residual add in the norm)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.norms is not None:
            eps = self.attn_norm.eps
            h, y = self.norms.add_rmsnorm(x, self.attn(self.norms.rmsnorm(x, self.attn_norm.weight, eps), cos, sin),
                                          self.ffn_norm.weight, eps)
        else:
            h = x + self.attn(self.attn_norm(x), cos, sin)
            y = self.ffn_norm(h)
        out: torch.Tensor = self.ffn(y, h)
        return out


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.padded_vocab, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.blocks: list[Block] = [b for b in self.layers if isinstance(b, Block)]  # the same modules, typed
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.ce_chunk_tokens = 8192
        self.ce_kernel = _ce_chunk  # replaced by a compiled version under --compile
        self.ce_fused = False  # remote.kernels.loss: one logits buffer, Triton CE, fp32 GEMM accumulation
        # parameter name -> its canonical layout, for parameters a kernel keeps in another one (remote.training.parallel)
        self.param_layouts: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
        # Called with -1 before the embedding, i before layer i and n_layers before the final norm and head:
        # a data-parallel wrapper waits there for the parameters it is still gathering (None: nothing to wait).
        self.before_stage: Callable[[int], None] | None = None

    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """Seeded init on the parameters' own device (fast on GPU; same bits on the same device/stack)."""
        gen = torch.Generator(device=self.tok_embeddings.weight.device).manual_seed(seed)
        out_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)  # GPT-2 residual scaling
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = out_std if name.endswith(("wo.weight", "w2.weight")) else self.cfg.init_std
                p.normal_(0.0, std, generator=gen)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy over all positions (fp32 scalar)."""
        wait = self.before_stage or (lambda _stage: None)
        wait(-1)
        h = self.tok_embeddings(tokens)
        cos, sin = rope_tables(self.cfg, tokens.shape[1], h.dtype, h.device)
        for i, layer in enumerate(self.blocks):
            wait(i)
            h = layer(h, cos, sin)
        wait(len(self.blocks))
        h = self.norm(h)
        return linear_cross_entropy(h.flatten(0, 1), self.tok_embeddings.weight, targets.flatten(),
                                    self.ce_chunk_tokens, self.ce_kernel, fused=self.ce_fused)


def build_model(cfg: ModelConfig, device: torch.device, seed: int) -> Transformer:
    with torch.device(device):
        model = Transformer(cfg)
    model.init_weights(seed)
    return model.to(cfg.torch_dtype)


def _ce_chunk(logits: torch.Tensor, targets: torch.Tensor, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed loss and d(loss*scale)/d(logits) of one chunk, in one pass; fp32 math, logits' dtype out.

    The target is picked with an iota compare, not gather/scatter, so there are no atomics (determinism).
    """
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1, keepdim=True)
    hit = torch.arange(x.shape[-1], device=x.device)[None, :] == targets[:, None]
    loss = (lse.squeeze(-1) - torch.where(hit, x, 0.0).sum(-1)).sum()
    grad = (torch.exp(x - lse) - hit.to(x.dtype)) * scale
    return loss, grad.to(logits.dtype)


CeKernel = Callable[[torch.Tensor, torch.Tensor, float], tuple[torch.Tensor, torch.Tensor]]


class _LinearCrossEntropy(torch.autograd.Function):
    """Head matmul + cross-entropy in token chunks; the gradients are formed in forward (Liger-style),
    so at most one chunk of logits exists at a time and none is saved for backward.

    fused=True: remote.kernels.loss (one reused logits buffer, Triton CE written over the logits, grad_h
    written in place, the head gradient kept in fp32 inside the GEMM and cast once in backward)."""

    @staticmethod
    def forward(ctx: Any, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int,
                kernel: CeKernel, fused: bool = False) -> torch.Tensor:
        ctx.fused = fused
        if fused:
            from remote.kernels import loss as fused_loss

            total, grad_h, grad_w32 = fused_loss.forward_backward(h, weight, targets, chunk_tokens, use_triton=True)
            ctx.weight_dtype = weight.dtype
            ctx.save_for_backward(grad_h, grad_w32)
            return total
        n = h.shape[0]
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        total = torch.zeros((), dtype=torch.float32, device=h.device)
        for start in range(0, n, chunk_tokens):
            hc, tc = h[start:start + chunk_tokens], targets[start:start + chunk_tokens]
            loss, dlogits = kernel(hc @ weight.t(), tc, 1.0 / n)
            total += loss
            grad_h[start:start + chunk_tokens] = dlogits @ weight
            grad_w += (dlogits.t() @ hc).float()
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        return total / n

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        if ctx.fused:
            from remote.kernels import loss as fused_loss

            grad_w = fused_loss.scale_cast(grad_w, grad_out, ctx.weight_dtype, use_triton=True)
            return grad_h * grad_out.to(grad_h.dtype), grad_w, None, None, None, None
        return grad_h * grad_out.to(grad_h.dtype), grad_w * grad_out.to(grad_w.dtype), None, None, None, None


def linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_tokens: int = 8192, kernel: CeKernel = _ce_chunk, fused: bool = False) -> torch.Tensor:
    out: torch.Tensor = _LinearCrossEntropy.apply(h, weight, targets, chunk_tokens, kernel, fused)
    return out
