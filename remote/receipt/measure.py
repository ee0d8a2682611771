"""The receipt's measurements on one device, each in steady state and bounded by the seconds it is given.

Every figure is a median over iterations timed on the device (CUDA events; the CPU path, used by the tests and
the simulator, times with the wall clock), after a warm-up, on random data (zeros run faster: METHOD.md) and
operands larger than L2. Units are in the names: TFLOP/s, GB/s (1e9 bytes per second), seconds.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

GB = 1e9
# Square 8192 is the shape public achieved-matmul tables quote (ml-engineering's MAMF, this workplace's KINDS.md);
# the other two are the 1B model's own training GEMMs at micro-batch 8 (16384 tokens): w13 and w2 forward.
CUDA_SHAPES = ((8192, 8192, 8192), (16384, 16384, 2048), (16384, 2048, 8192))
CPU_SHAPES = ((256, 256, 256), (512, 256, 128))
HBM_COPY_BYTES = 2 << 30  # per buffer; a copy reads and writes it, so 4 GiB move per iteration
HOST_COPY_BYTES = 256 << 20  # pinned host buffer for host<->device copies: ~5 ms a copy at Gen5 x16
BURN_MIN_WINDOWS = 12  # the check asks for 10 (remote/checks/receipt.py)
BURN_OVERRUN = 3.0
BURN_MIN_GRACE_S = 3.0
BURN_WINDOW_S = 0.5  # the burn is timed in windows this long, so a clock that drops mid-burn shows


@dataclass
class Timed:
    """One measure: its median and spread over `iterations`, or why it was not taken."""

    median: float | None = None
    best: float | None = None
    worst: float | None = None
    iterations: int = 0
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class BurnResult:
    seconds: float = 0.0
    windows_tflops: list[float] = field(default_factory=list)
    windows_t_s: list[float] = field(default_factory=list)
    error: str | None = None

    def summary(self) -> dict[str, Any]:
        w = self.windows_tflops
        half = len(w) // 2
        return {
            "seconds": round(self.seconds, 3),
            "windows": len(w),
            "tflops_median": _r(statistics.median(w)) if w else None,
            "tflops_min": _r(min(w)) if w else None,
            "tflops_first_half": _r(statistics.median(w[:half])) if half else None,
            "tflops_second_half": _r(statistics.median(w[half:])) if half else None,
            "windows_tflops": [_r(x) for x in w],
            "windows_t_s": [round(t, 3) for t in self.windows_t_s],
            "error": self.error,
        }


def _r(x: float) -> float:
    """Five significant digits: 683.19 TFLOP/s on a GPU, 0.0041 on a busy CPU (never rounded to 0)."""
    return float(f"{x:.5g}")


def is_cuda(device: torch.device) -> bool:
    return device.type == "cuda"


@contextlib.contextmanager
def on(device: torch.device) -> Iterator[None]:
    """Make `device` current for this thread: events and streams belong to the current device, and each GPU is
    measured from a thread of its own."""
    if is_cuda(device):
        with torch.cuda.device(device):
            yield
    else:
        yield


class _Timer:
    """Times one call: CUDA events on a GPU (the work is asynchronous), the wall clock on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def time_s(self, fn: Callable[[], object]) -> float:
        if is_cuda(self.device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end)) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def _repeat(device: torch.device, fn: Callable[[], object], *, warmup_s: float, measure_s: float,
            min_iters: int = 5, max_iters: int = 200) -> list[float]:
    """Warm up for `warmup_s`, then time single calls until `measure_s` is spent (at least `min_iters`)."""
    timer = _Timer(device)
    # Each warm-up call is waited for: unwaited, asynchronous launches fill the device's queue (~1,000 deep) and
    # the warm-up overran its seconds several times over (a lent H200, 2026-12-06: 15 s of copies for 5 s).
    until = time.perf_counter() + warmup_s
    timer.time_s(fn)
    while time.perf_counter() < until:
        timer.time_s(fn)
    times: list[float] = []
    until = time.perf_counter() + measure_s
    while len(times) < max_iters and (len(times) < min_iters or time.perf_counter() < until):
        times.append(timer.time_s(fn))
    return times


def _rates(work: float, times: list[float], seconds: float) -> Timed:
    rates = sorted(work / t for t in times if t > 0)
    if not rates:
        return Timed(error="no timed iteration", seconds=seconds)
    return Timed(median=_r(statistics.median(rates)), best=_r(rates[-1]), worst=_r(rates[0]),
                 iterations=len(rates), seconds=round(seconds, 3))


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if is_cuda(device) else torch.float32


def _matmul(device: torch.device, shape: tuple[int, int, int], *, seconds: float) -> Timed:
    """Dense matmul of (m, k) @ (k, n) in bf16 (fp32 on the CPU): TFLOP/s counted as 2*m*n*k per product."""
    m, n, k = shape
    t0 = time.perf_counter()
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(m, k, device=device, dtype=_dtype(device), generator=gen)
        b = torch.randn(k, n, device=device, dtype=_dtype(device), generator=gen)
        c = torch.empty(m, n, device=device, dtype=_dtype(device))
        times = _repeat(device, lambda: torch.mm(a, b, out=c), warmup_s=seconds * 0.3, measure_s=seconds * 0.7)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # OOM on a small card, a broken device
        return Timed(error=f"{type(exc).__name__}: {str(exc)[:200]}", seconds=time.perf_counter() - t0)
    return _rates(2.0 * m * n * k / 1e12, times, time.perf_counter() - t0)


def _device_copy(device: torch.device, *, seconds: float, nbytes: int | None = None) -> Timed:
    """A device-to-device copy (HBM on a GPU, RAM on the CPU): GB/s counting the bytes read and written."""
    t0 = time.perf_counter()
    if nbytes is None:
        nbytes = HBM_COPY_BYTES if is_cuda(device) else 64 << 20
        if is_cuda(device):
            free, _ = torch.cuda.mem_get_info(device)
            nbytes = min(nbytes, free // 8)
    try:
        src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        times = _repeat(device, lambda: dst.copy_(src), warmup_s=seconds * 0.2, measure_s=seconds * 0.8)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        return Timed(error=f"{type(exc).__name__}: {str(exc)[:200]}", seconds=time.perf_counter() - t0)
    return _rates(2.0 * nbytes / GB, times, time.perf_counter() - t0)


def pinned_buffer(nbytes: int = HOST_COPY_BYTES) -> torch.Tensor:
    """Page-locked host memory for the copy engines; its content does not matter to a copy, so it is not filled."""
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)


def _host_copy(device: torch.device, direction: str, *, seconds: float, host: torch.Tensor | None = None) -> Timed:
    """Pinned host memory to the GPU (`h2d`) or back (`d2h`) through the copy engines: GB/s one way."""
    if not is_cuda(device):
        return Timed(error="not applicable: no host-device link on the CPU")
    t0 = time.perf_counter()
    try:
        buf = host if host is not None else pinned_buffer()
        dev = torch.empty(buf.numel(), dtype=torch.uint8, device=device)

        def fn() -> object:
            return dev.copy_(buf, non_blocking=True) if direction == "h2d" else buf.copy_(dev, non_blocking=True)

        times = _repeat(device, fn, warmup_s=min(0.5, seconds * 0.2), measure_s=seconds * 0.8, max_iters=400)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        return Timed(error=f"{type(exc).__name__}: {str(exc)[:200]}", seconds=time.perf_counter() - t0)
    return _rates(buf.numel() / GB, times, time.perf_counter() - t0)


def _burn(device: torch.device, *, seconds: float, shape: tuple[int, int, int] | None = None) -> BurnResult:
    """A sustained matmul for `seconds`, timed in ~0.5 s windows: a GPU whose clock drops after a while (power,
    heat) shows it in the later windows. At most two windows are queued ahead of the one being timed."""
    m, n, k = shape or (CUDA_SHAPES[0] if is_cuda(device) else CPU_SHAPES[0])
    result = BurnResult()
    t0 = time.perf_counter()
    try:
        gen = torch.Generator(device=device).manual_seed(1)
        a = torch.randn(m, k, device=device, dtype=_dtype(device), generator=gen)
        b = torch.randn(k, n, device=device, dtype=_dtype(device), generator=gen)
        c = torch.empty(m, n, device=device, dtype=_dtype(device))
        one_s = min(_Timer(device).time_s(lambda: torch.mm(a, b, out=c)) for _ in range(3))
        window_s = min(BURN_WINDOW_S, seconds / 20)  # a short burn still has ~20 windows to compare
        per_window = max(1, round(window_s / max(one_s, 1e-6)))
        flop_one = 2.0 * m * n * k / 1e12
        pending: list[tuple[Any, Any, float, int]] = []
        end_at = t0 + seconds

        def settle(entry: tuple[Any, Any, float, int]) -> int:
            """Record one window; the products the next window should hold to last `window_s` (a loaded CPU or
            a clock that dropped makes each product slower than the first ones were)."""
            start, end, t_launch, count = entry
            if is_cuda(device):
                end.synchronize()
                elapsed = float(start.elapsed_time(end)) / 1e3
            else:
                elapsed = end - start
            result.windows_tflops.append(flop_one * count / elapsed)
            result.windows_t_s.append(t_launch - t0)
            return max(1, round(window_s * count / max(elapsed, 1e-9)))

        # The time asked, and at least BURN_MIN_WINDOWS windows (a loaded CPU's one product can outlast a short
        # burn's window), within BURN_OVERRUN times the time asked, never less than BURN_MIN_GRACE_S past it (a
        # loaded machine can stall one window for most of a second), counted from here (the setup above may
        # already have outlasted a short burn).
        hard_end = time.perf_counter() + max(seconds * BURN_OVERRUN, seconds + BURN_MIN_GRACE_S)
        while time.perf_counter() < end_at or (len(result.windows_tflops) + len(pending) < BURN_MIN_WINDOWS
                                                and time.perf_counter() < hard_end):
            t_launch = time.perf_counter()
            if is_cuda(device):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(per_window):
                    torch.mm(a, b, out=c)
                end.record()
                pending.append((start, end, t_launch, per_window))
                while len(pending) > 2:
                    per_window = settle(pending.pop(0))
            else:
                start_s = time.perf_counter()
                for _ in range(per_window):
                    torch.mm(a, b, out=c)
                per_window = settle((start_s, time.perf_counter(), t_launch, per_window))
        for entry in pending:
            settle(entry)
    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
        result.error = f"{type(exc).__name__}: {str(exc)[:200]}"
    result.seconds = time.perf_counter() - t0
    return result


def matmul(device: torch.device, shape: tuple[int, int, int], *, seconds: float) -> Timed:
    with on(device):
        return _matmul(device, shape, seconds=seconds)


def device_copy(device: torch.device, *, seconds: float, nbytes: int | None = None) -> Timed:
    with on(device):
        return _device_copy(device, seconds=seconds, nbytes=nbytes)


def host_copy(device: torch.device, direction: str, *, seconds: float, host: torch.Tensor | None = None) -> Timed:
    with on(device):
        return _host_copy(device, direction, seconds=seconds, host=host)


def burn(device: torch.device, *, seconds: float, shape: tuple[int, int, int] | None = None) -> BurnResult:
    with on(device):
        return _burn(device, seconds=seconds, shape=shape)
