"""The MFU/replay workload, top to bottom: flags and knobs -> environment -> process group -> attention probe ->
kernel probes -> one seeded round of N steps (-> the same round again in a fresh process group with --replay)
-> evidence.

Run as `torchrun --standalone --nproc-per-node N scripts/run_mfu_dist.py ...`, or plainly as world size 1.
Exit codes: 0 ok; 1 the run failed (MPS mismatch, ranks whose kernel probes disagree, a crash); 2 bad flags,
knobs, profile or device.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from remote import knobs
from remote.accounting import merkle, mfu
from remote.attention import backend as attention
from remote.host import envprobe
from remote.kernels import registry
from remote.training import data, determinism, evidence, parallel
from remote.training.comm import all_gather_json
from remote.training.evidence import RoundResult
from remote.training.model import build_model
from remote.training.profiles import Profile, ProfileError, load_profile

INIT_TIMEOUT_S = 300  # first rendezvous: peers may still be importing torch
ROUND_TIMEOUT_S = 900  # per-round group: the first step includes compilation on every rank


class UsageError(ValueError):
    """A flag combination that cannot run; exit 2."""


class RunError(RuntimeError):
    """The run started but must be abandoned (e.g. ranks disagree about MPS); exit 1."""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="run_mfu_dist.py", description="1B dense DP training round: MFU + replay")
    ap.add_argument("--profile", required=True, help="profiles/models/<NAME>.toml")
    ap.add_argument("--device", choices=["cuda", "cpu"], required=True)
    ap.add_argument("--reduction", choices=["ddp", "zero2", "zero2o"], required=True)
    ap.add_argument("--act-ckpt", action="store_true", help="activation checkpointing per layer")
    ap.add_argument("--compile", action="store_true", help="torch.compile, one graph per layer")
    ap.add_argument("--nccl-pcie", action="store_true", help="NCCL settings for PCIe-only hosts")
    ap.add_argument("--micro-batch", type=int, help="sequences per rank per step (profile default)")
    ap.add_argument("--steps", type=int, help="steps per round, warm-up included (profile default)")
    ap.add_argument("--deterministic", action="store_true", help="bitwise-replayable mode (docs/mfu.md)")
    ap.add_argument("--replay", action="store_true", help="run the round twice, compare leaf roots")
    ap.add_argument("--attention", default="auto", choices=["auto", *attention.CHOICES])
    ap.add_argument("--peak-tflops", type=float, help="peak bf16 TFLOP/s when the GPU is not in the table")
    ap.add_argument("--out", required=True, help="evidence JSON path (written by rank 0)")
    return ap.parse_args(argv)


def validate(args: argparse.Namespace, profile: Profile, world: int) -> None:
    if profile.world_size is not None and profile.world_size != world:
        raise UsageError(f"profile {profile.name} needs world size {profile.world_size}, got {world} "
                         "(torchrun --nproc-per-node)")
    if args.micro_batch is not None and args.micro_batch < 1:
        raise UsageError(f"--micro-batch must be >= 1, got {args.micro_batch}")
    if args.steps is not None and args.steps <= profile.train.warmup_steps:
        raise UsageError(f"--steps {args.steps} must exceed the profile's {profile.train.warmup_steps} "
                         "warm-up steps (warm-up is never timed)")
    if args.replay and not args.deterministic:
        raise UsageError("--replay needs --deterministic: only a deterministic round is bitwise comparable")
    if profile.device == "cuda" and args.device == "cpu":
        raise UsageError(f"profile {profile.name} is a GPU profile; --device cpu cannot run it")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda but no CUDA device is visible")
    if args.device == "cpu" and args.compile:
        raise UsageError("--compile is for --device cuda (CPU runs are for tests)")


def _dist_env() -> tuple[int, int, int]:
    if "RANK" not in os.environ:  # plain `python scripts/run_mfu_dist.py`: a world of one
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(port))
    return int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")), int(os.environ["WORLD_SIZE"])


def log(rank: int, msg: str) -> None:
    if rank == 0:
        print(f"[train] {msg}", flush=True)


def _comm_device(local_rank: int) -> torch.device:
    """Where metadata collectives put their tensors: NCCL needs CUDA tensors, gloo CPU ones."""
    return torch.device("cuda", local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


def attach_mps(rank: int, local_rank: int, world: int) -> dict[str, Any] | None:
    """VH_MPS_MODE set: attach through remote.mps, then every rank must report the same mode."""
    wanted = knobs.mps().mode
    if wanted is None:
        return None
    from remote.mps import MpsError, MpsNotAttached, attach_current_process  # only when MPS is asked for

    try:
        rec = attach_current_process(role="learner", rank=rank, device_index=local_rank)
        mode = rec.get("mode")
    except (MpsNotAttached, MpsError) as exc:
        rec, mode = None, f"{type(exc).__name__}: {exc}"  # still gathered below, so no peer hangs
    modes = all_gather_json(mode, _comm_device(local_rank))  # everyone reports before anyone aborts
    bad = [r for r, m in enumerate(modes) if m != wanted]
    if bad:
        detail = ", ".join(f"rank {r}: {modes[r]}" for r in range(world))
        raise RunError(f"MPS mode mismatch ({knobs.MPS_MODE}={wanted}); ranks {bad} differ: {detail}")
    return rec


class _Profiler:
    """VH_TORCH_PROFILE_OUT=FILE: torch.profiler over the last VH_TORCH_PROFILE_STEPS steps (default 2), a
    per-op table written to FILE (where a step's milliseconds go); each step is a `vh_step_N` range in the
    trace (remote.accounting.steptrace splits a Chrome trace by them). Off by default: profiling perturbs the timed steps."""

    def __init__(self, path: str | None, steps: int) -> None:
        self.path, self.first = path, max(0, steps - knobs.training().profile_steps)
        self.prof: torch.profiler.profile | None = None

    def mark(self, step: int) -> contextlib.AbstractContextManager[Any]:
        """A named range around one step while profiling; nothing otherwise."""
        if self.prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"vh_step_{step}")

    def maybe_start(self, step: int) -> None:
        if self.path and step == self.first:
            from torch.profiler import ProfilerActivity, profile

            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
            self.prof = profile(activities=acts)
            self.prof.__enter__()

    def stop(self) -> None:
        if self.prof is None or self.path is None:
            return
        torch.cuda.synchronize() if torch.cuda.is_available() else None
        self.prof.__exit__(None, None, None)
        # Sorted by self device time: the inclusive "total" columns double-count nested regions.
        sort = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        with open(self.path, "a") as fh:
            fh.write(self.prof.key_averages().table(sort_by=sort, row_limit=150, max_name_column_width=90) + "\n")
        trace = knobs.training().trace_out
        if trace:  # a Chrome trace (chrome://tracing, ui.perfetto.dev) of the same two steps
            self.prof.export_chrome_trace(trace)
        self.prof = None


def run_round(args: argparse.Namespace, profile: Profile, device: torch.device, rank: int) -> RoundResult:
    cfg, train = profile.model, profile.train
    micro_batch = args.micro_batch or train.micro_batch
    steps = args.steps or train.steps
    backend = "nccl" if device.type == "cuda" else "gloo"
    group = dist.new_group(backend=backend, timeout=timedelta(seconds=ROUND_TIMEOUT_S))  # fresh communicator
    if not isinstance(group, dist.ProcessGroup):  # every rank is a member of the group it creates
        raise RunError(f"rank {rank} is not a member of the round's process group")
    torch.manual_seed(train.seed)
    model = build_model(cfg, device, train.seed)
    model.ce_chunk_tokens = knobs.kernels().chunk_tokens(train.ce_chunk_tokens)
    runner = parallel.parallelize(model, parallel.ParallelConfig(args.reduction, train, act_ckpt=args.act_ckpt,
                                                                 compile=args.compile),
                                  parallel.World(group, device))
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    losses: list[torch.Tensor] = []
    step_peaks: list[int] = []
    gpu_marks: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []  # events time the GPU's work, no host sync
    host_marks: list[tuple[float, float]] = []
    prof = _Profiler(knobs.training().profile_out if rank == 0 else None, steps)
    for step in range(steps):
        prof.maybe_start(step)
        tokens, targets = data.batch(train.seed, rank, step, micro_batch, cfg.seq_len, cfg.vocab_size, device)
        if cuda:
            gpu_marks.append((torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)))
            gpu_marks[-1][0].record()
        else:
            dist.barrier(group)
            start_s = time.perf_counter()
        with prof.mark(step):
            losses.append(runner.forward_backward(tokens, targets))
            runner.step()
        if cuda:
            gpu_marks[-1][1].record()
            step_peaks.append(torch.cuda.max_memory_allocated(device))
        else:
            host_marks.append((start_s, time.perf_counter()))
    prof.stop()
    if cuda:
        torch.cuda.synchronize(device)
        times = [s.elapsed_time(e) / 1e3 for s, e in gpu_marks]
        peak = torch.cuda.max_memory_allocated(device) / 2**30
    else:
        times = [e - s for s, e in host_marks]
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
    losses_f = torch.stack(losses).float().cpu().tolist()  # the one sync point for losses
    state = list(runner.canonical_state())  # collective on zero2: every rank iterates
    root = merkle.merkle_root(state) if rank == 0 else None
    result = RoundResult(losses=losses_f, step_times_s=times[train.warmup_steps:], peak_mem_gib=peak,
                         step_peak_mem_gib=(max(step_peaks[train.warmup_steps:]) / 2**30) if cuda else peak,
                         optimizer_numel=runner.optimizer_numel(), leaf_root=root,
                         extra={"micro_batch": micro_batch, "steps": steps, "all_step_times_s": times,
                                "reduce_order": runner.reduce_order})
    del state, runner, model
    dist.destroy_process_group(group)
    if cuda:
        torch.cuda.empty_cache()
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank, local_rank, world = _dist_env()
    try:
        profile = load_profile(args.profile)
        validate(args, profile, world)
        knobs.check_all()  # a bad VH_* value stops here, not after the first round
        registry.requested()  # VH_KERNELS names only kernels that exist
    except (ProfileError, UsageError, knobs.KnobError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = parallel.set_process_env(args.nccl_pcie)
    det = determinism.set_determinism(profile.train.seed, args.deterministic)  # before CUDA starts
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            timeout=timedelta(seconds=INIT_TIMEOUT_S))
    try:
        return _run(args, profile, device, rank, local_rank, world, env, det)
    except (UsageError, mfu.UnknownGpu, attention.AttentionUnavailable) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        dist.destroy_process_group()


def kernels_record(args: argparse.Namespace, profile: Profile, device: torch.device) -> dict[str, Any]:
    """The registry's account of the kernels (each requested one probed on this device first), as the run
    wires them: the fused optimizer is part of the zero2 runners only."""
    kern = registry.describe(device) | {"ce_chunk_tokens": knobs.kernels().chunk_tokens(profile.train.ce_chunk_tokens)}
    if args.reduction == "ddp" and "optim" in kern["active"]:
        kern["active"].remove("optim")
        kern["rejected"]["optim"] = "reduction ddp: torch's fused AdamW (the fused kernel is wired into zero2 only)"
    return kern


def _run(args: argparse.Namespace, profile: Profile, device: torch.device, rank: int, local_rank: int,
         world: int, env: dict[str, Any], det: dict[str, Any]) -> int:
    mps_rec = attach_mps(rank, local_rank, world)
    cfg = profile.model
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = mfu.peak_for(device_name, args.peak_tflops)  # refuse an unknown GPU before spending time
    choice = attention.choose(device, cfg.torch_dtype, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                              args.attention)
    attention.activate(choice)
    log(rank, f"attention backend: {choice.path}")
    log(rank, f"profile {profile.name} world {world} reduction {args.reduction} device {device_name} "
              f"peak {peak.tflops} TFLOP/s kv {choice.kv_mode}")
    kern = kernels_record(args, profile, device)
    actives = all_gather_json(kern["active"], _comm_device(local_rank))  # every rank probed its own device
    if any(a != actives[0] for a in actives):
        detail = "; ".join(f"rank {r}: {','.join(a) or 'none'}" for r, a in enumerate(actives))
        raise RunError(f"ranks disagree on which kernels passed their probes ({detail}); rank 0's record: "
                       f"{kern['rejected']}")
    log(rank, f"kernels active: {','.join(kern['active']) or 'none'} (requested "
              f"{','.join(kern['requested']) or 'none'}, triton {kern['triton']}, ce chunk {kern['ce_chunk_tokens']})")
    off: dict[str, list[str]] = {}
    for name, why in kern["rejected"].items():
        off.setdefault(why, []).append(name)
    for why, names in off.items():
        log(rank, f"kernels off ({','.join(names)}): {why}")
    first = run_round(args, profile, device, rank)
    second = run_round(args, profile, device, rank) if args.replay else None
    comm = _comm_device(local_rank)
    identities = all_gather_json(envprobe.device_identity(device), comm)
    mems = all_gather_json([first.peak_mem_gib, first.step_peak_mem_gib, first.optimizer_numel], comm)
    if rank == 0:
        record = evidence.build(args=args, profile=profile, world=world, peak=peak, choice=choice,
                                first=first, second=second, identities=identities, mems=mems, env=env,
                                det=det, mps=mps_rec, device=device)
        record["kernels"] = kern
        evidence.write(args.out, record)
        spread = record["step_time_spread"]
        log(rank, "step ms " + " ".join(f"{t * 1e3:.1f}" for t in record["step_times_s"]) +
            f" (even {spread.get('even_mean_ms', 0):.1f} odd {spread.get('odd_mean_ms', 0):.1f})")
        log(rank, f"mfu {record['mfu']:.4f} tokens/s {record['tokens_per_s']:.0f} "
                  f"leaf_root {record['leaf_root'][:16]} replay_match {record.get('replay_match')}")
    return 0
