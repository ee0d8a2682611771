"""Causal attention through cuDNN's own graph API (the `cudnn` module of the nvidia-cudnn-frontend wheel),
with cuDNN's deterministic backward: the attention path for deterministic runs ("cudnn-det").

Why: PyTorch's SDPA refuses cuDNN under `torch.use_deterministic_algorithms(True)` (its cuDNN backward
accumulates dQ with atomics), so a deterministic run falls back to FlashAttention-2 with its deterministic
backward, which is slower on Hopper. cuDNN has a deterministic backward of its own
(`sdpa_backward(..., use_deterministic_algorithm=True)`), which PyTorch does not ask for. Forward is
deterministic by construction (one CTA per output tile).

Two custom ops (opaque to torch.compile, like the Triton kernels): forward returns (out, stats), stats the
fp32 log-sum-exp cuDNN's backward needs; backward returns (dq, dk, dv). One built graph pair per
(shape, strides, dtype, device), reused for every layer and step. GQA: k/v may have fewer heads than q.
`available()` is False where the wheel, CUDA or a cuDNN that builds the graph is missing; attention.choose
then goes on to the next path.
"""

from __future__ import annotations

import math
from typing import Any

import torch

_GRAPHS: dict[tuple[Any, ...], Any] = {}
_HANDLES: dict[int, Any] = {}


def _cudnn() -> Any:
    import cudnn  # the nvidia-cudnn-frontend wheel; imported late: only deterministic CUDA runs need it

    return cudnn


def frontend_version() -> str | None:
    try:
        return str(getattr(_cudnn(), "__version__", "unknown"))
    except Exception:  # noqa: BLE001 - absent or broken wheel: the path is simply unavailable
        return None


def _handle(device: torch.device, cudnn: Any) -> Any:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _HANDLES:
        _HANDLES[idx] = cudnn.create_handle()
    return _HANDLES[idx]


def _dtype(cudnn: Any, dtype: torch.dtype) -> Any:
    return {torch.bfloat16: cudnn.data_type.BFLOAT16, torch.float16: cudnn.data_type.HALF}[dtype]


def _o_like(q: torch.Tensor) -> torch.Tensor:
    """[B, H, T, D] logical, [B, T, H, D] in memory: the output projection reads it with no copy."""
    b, h, t, d = q.shape
    return q.new_empty((b, t, h, d)).transpose(1, 2)


def _kv_like(x: torch.Tensor) -> torch.Tensor:
    b, h, t, d = x.shape
    return x.new_empty((b, t, h, d)).transpose(1, 2)


def _build(kind: str, tensors: list[torch.Tensor], scale: float, deterministic: bool) -> Any:
    cudnn = _cudnn()
    io = _dtype(cudnn, tensors[0].dtype)
    types = dict(io_data_type=io, intermediate_data_type=cudnn.data_type.FLOAT,
                 compute_data_type=cudnn.data_type.FLOAT)
    try:
        g = cudnn.pygraph(**types, handle=_handle(tensors[0].device, cudnn))
    except TypeError:  # a frontend whose graphs take no handle: execute() still gets ours
        g = cudnn.pygraph(**types)
    ins = [g.tensor_like(t) for t in tensors[:3 if kind == "fwd" else 6]]
    if kind == "fwd":
        (q, k, v), o_buf, stats_buf = ins, tensors[3], tensors[4]
        o, stats = g.sdpa(name="sdpa", q=q, k=k, v=v, is_inference=False, attn_scale=scale, use_causal_mask=True)
        o.set_output(True).set_dim(list(o_buf.shape)).set_stride(list(o_buf.stride()))
        stats.set_output(True).set_dim(list(stats_buf.shape)).set_stride(list(stats_buf.stride()))
        stats.set_data_type(cudnn.data_type.FLOAT)
        outs = [o, stats]
    else:
        q, k, v, o, do, stats = ins[:6]
        dq_buf, dk_buf, dv_buf = tensors[6:9]
        dq, dk, dv = g.sdpa_backward(name="sdpa_backward", q=q, k=k, v=v, o=o, dO=do, stats=stats,
                                     attn_scale=scale, use_causal_mask=True,
                                     use_deterministic_algorithm=deterministic)
        for t, buf in ((dq, dq_buf), (dk, dk_buf), (dv, dv_buf)):
            t.set_output(True).set_dim(list(buf.shape)).set_stride(list(buf.stride()))
        outs = [dq, dk, dv]
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, ins + outs


def _key(kind: str, tensors: list[torch.Tensor], deterministic: bool) -> tuple[Any, ...]:
    return (kind, deterministic, tensors[0].device.index, tensors[0].dtype,
            tuple((tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors))


def _run(kind: str, tensors: list[torch.Tensor], deterministic: bool = True) -> None:
    cudnn = _cudnn()
    tensors = [t.detach() for t in tensors]  # the frontend reads them through DLPack, which refuses autograd leaves
    key = _key(kind, tensors, deterministic)
    if key not in _GRAPHS:
        _GRAPHS[key] = _build(kind, tensors, 1.0 / math.sqrt(tensors[0].shape[-1]), deterministic)
    graph, ports = _GRAPHS[key]
    handle = _handle(tensors[0].device, cudnn)
    cudnn.set_stream(handle, torch.cuda.current_stream(tensors[0].device).cuda_stream)
    workspace = torch.empty(graph.get_workspace_size(), device=tensors[0].device, dtype=torch.uint8)
    graph.execute(dict(zip(ports, tensors, strict=True)), workspace, handle=handle)


@torch.library.custom_op("vh_attn::cudnn_sdpa_fwd", mutates_args=())
def sdpa_fwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    o = _o_like(q)
    b, h, t, _ = q.shape
    stats = torch.empty((b, h, t, 1), device=q.device, dtype=torch.float32)
    _run("fwd", [q, k, v, o, stats])
    return o, stats


@sdpa_fwd.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    b, h, t, _ = q.shape
    return _o_like(q), q.new_empty((b, h, t, 1), dtype=torch.float32)


@torch.library.custom_op("vh_attn::cudnn_sdpa_bwd", mutates_args=())
def sdpa_bwd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor,
             stats: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if 0 in do.stride() or do.stride(-1) != 1:  # an expanded gradient (x.sum().backward()): give it memory
        do = _o_like(q).copy_(do)
    dq, dk, dv = _o_like(q), _kv_like(k), _kv_like(v)
    _run("bwd", [q, k, v, o, do, stats, dq, dk, dv], deterministic)
    return dq, dk, dv


@sdpa_bwd.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, do: torch.Tensor, stats: torch.Tensor, deterministic: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _o_like(q), _kv_like(k), _kv_like(v)


def _setup(ctx: Any, inputs: tuple[Any, ...], output: tuple[torch.Tensor, ...]) -> None:
    ctx.save_for_backward(*inputs, *output)


def _backward(ctx: Any, do: torch.Tensor, _dstats: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o, stats = ctx.saved_tensors
    dq, dk, dv = sdpa_bwd(q, k, v, o, do, stats, True)
    return dq, dk, dv


sdpa_fwd.register_autograd(_backward, setup_context=_setup)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention on [B, H, T, D] (k/v may have fewer heads: GQA), deterministic backward."""
    out: torch.Tensor = sdpa_fwd(q, k, v)[0]
    return out


def available(device: torch.device, dtype: torch.dtype, n_heads: int, n_kv: int, head_dim: int,
              seq: int = 128) -> str | None:
    """None if a small causal fwd+bwd at this head layout builds and runs here; else the reason."""
    if device.type != "cuda":
        return "cudnn-det needs CUDA"
    if frontend_version() is None:
        return "the nvidia-cudnn-frontend wheel (module cudnn) is not importable"
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        base = torch.randn(1, seq, n_heads + 2 * n_kv, head_dim, device=device, dtype=dtype, generator=gen,
                           requires_grad=True)
        q, k, v = base.transpose(1, 2).split([n_heads, n_kv, n_kv], dim=1)
        out = attention(q, k, v)
        out.float().sum().backward()
        if base.grad is None or not torch.isfinite(out).all() or not torch.isfinite(base.grad).all():
            return "non-finite output"
    except Exception as exc:  # noqa: BLE001 - any failure (graph not supported, old cuDNN) means unavailable
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return None
