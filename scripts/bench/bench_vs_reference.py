"""Our trainer against the stacks a user would pick instead, all in one call, at one micro-batch and shape.

Runs, each in its own process (a crash, a compile cache or a memory pool never leaks into the next):

- `ours`: scripts/run_mfu_dist.py with the profile's own settings (zero2o, compiled, no kernel knobs in the
  environment: what a user runs), and `deterministic`: the same with --deterministic --replay;
- `fast-cudnn`: `ours` with `--attention cudnn`, the fast default before FA4 (issue 32's yardstick for the
  deterministic run: `deterministic_vs_baseline_fast`); `previous-fast`: `ours` with the kernel set before the
  norm / rope kernels (`VH_KERNELS=loss,swiglu,optim`; `ours_vs_previous_fast`, `deterministic_vs_previous_fast`);
- the references, HF transformers' LlamaForCausalLM built from a LlamaConfig of the same shape (no
  download), bf16 weights, SDPA attention, fused AdamW on the bf16 weights:
  `hf-layer` (torch.compile per decoder layer, the scope ours uses), `hf-model` (the whole model compiled),
  `hf+liger-layer` / `hf+liger-model` (the same with the Liger kernels applied the documented way,
  `apply_liger_kernel_to_llama(rope, rms_norm, swiglu, fused_linear_cross_entropy)`);
- `torchtitan`: torchtitan's own Trainer (its llama3 model at this shape, its parallelize with torch.compile
  of model and loss, its AdamW, gradient clipping and single-device bf16 autocast), activation checkpointing
  off as in ours; only the data comes from here (the same synthetic tokens, no tokenizer or dataset), since a
  throughput run needs neither. Needs the `torchtitan` wheel (0.2.2 runs on torch 2.11) with torchdata and tyro.

Everything is timed with CUDA events after the same warm-up and scored with the same FLOPs/token and peak.
The record (schema 2) holds `ours`, `deterministic`, `references`, `strongest`, `ratio_vs_strongest` and
`deterministic_vs_fast` (and, with `fast-cudnn` run, `baseline_fast` and `deterministic_vs_baseline_fast`); `scripts/check_gpu_evidence.py --kind mfu` validates it.

    python scripts/bench/bench_vs_reference.py --micro-batch 16 --out bench-vs-reference.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repo root
sys.path.insert(0, str(ROOT))

SCHEMA = "vast-harness/bench-vs-reference/2"
REFERENCES = ("hf-layer", "hf+liger-layer", "hf-model", "hf+liger-model", "torchtitan")  # whole-model compiles late (slow)
OURS = ("ours", "deterministic", "fast-cudnn", "previous-fast")
RECORD_KEY = {"ours": "ours", "deterministic": "deterministic", "fast-cudnn": "baseline_fast",
              "previous-fast": "previous_fast"}
# previous-fast: the fast default before the norm / rope kernels (issue 32 call 3's: fa4 + loss, swiglu, optim)
PREVIOUS_KERNELS = {"VH_KERNELS": "loss,swiglu,optim"}
TARGETS = {"ratio_vs_strongest": 1.13, "deterministic_vs_fast": 0.97, "deterministic_vs_baseline_fast": 1.00,
           "deterministic_vs_previous_fast": 1.00}
from remote.knobs import KERNEL_PREFIXES as KNOB_PREFIXES  # noqa: E402 (after the sys.path line above)


def reference_run(profile_name: str, name: str, micro_batch: int, steps: int, warmup: int) -> dict:
    import torch

    from remote.accounting import mfu
    from remote.training import data
    from remote.training.profiles import load_profile

    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise SystemExit(f"error: the reference needs transformers ({exc})") from None
    liger_version = None
    if "liger" in name:
        try:
            import liger_kernel
            from liger_kernel.transformers import apply_liger_kernel_to_llama
        except ImportError as exc:
            raise SystemExit(f"error: {name} needs liger-kernel ({exc})") from None
        liger_version = getattr(liger_kernel, "__version__", None) or _dist_version("liger-kernel")
        # Before the model is built: Liger swaps the modeling module's classes and the CausalLM forward.
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
                                    fused_linear_cross_entropy=True)
    scope = name.rsplit("-", 1)[1]
    cfg = load_profile(profile_name).model
    hf_cfg = LlamaConfig(hidden_size=cfg.d_model, intermediate_size=cfg.ffn_hidden,
                         num_hidden_layers=cfg.n_layers, num_attention_heads=cfg.n_heads,
                         num_key_value_heads=cfg.n_kv_heads, vocab_size=cfg.vocab_size,
                         max_position_embeddings=cfg.seq_len, rope_theta=cfg.rope_theta,
                         rms_norm_eps=cfg.norm_eps, tie_word_embeddings=True, use_cache=False)
    hf_cfg._attn_implementation = "sdpa"
    device = torch.device("cuda")
    torch.manual_seed(0)
    with device:
        model = LlamaForCausalLM(hf_cfg)
    model.to(torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    if scope == "model":
        step_model = torch.compile(model)
    else:
        for layer in model.model.layers:
            layer.compile()
        step_model = model
    times, losses = [], []
    torch.cuda.reset_peak_memory_stats()
    for step in range(steps):
        tokens, _ = data.batch(0, 0, step, micro_batch, cfg.seq_len, cfg.vocab_size, device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step_model(input_ids=tokens, labels=tokens).loss  # HF shifts the labels itself
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        end.record()
        times.append((start, end))
        losses.append(loss.detach())
    torch.cuda.synchronize()
    step_s = [s.elapsed_time(e) / 1e3 for s, e in times][warmup:]
    tokens_per_s = micro_batch * cfg.seq_len * len(step_s) / sum(step_s)
    peak = mfu.peak_for(torch.cuda.get_device_name())
    impl = f"transformers {transformers.__version__} LlamaForCausalLM" + \
        (f" + liger-kernel {liger_version}" if liger_version else "")
    return {"name": name, "impl": impl, "compile_scope": scope, "liger": liger_version is not None,
            "micro_batch": micro_batch, "seq_len": cfg.seq_len, "warmup_steps": warmup, "step_times_s": step_s,
            "loss_per_step": torch.stack(losses).float().cpu().tolist(), "tokens_per_s": tokens_per_s,
            "flops_per_token": cfg.flops_per_token(), "peak_tflops": peak.tflops,
            "mfu": mfu.mfu(tokens_per_s, cfg.flops_per_token(), peak.tflops),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "liger_kernel": liger_version, "triton": _dist_version("triton")}}


def torchtitan_run(profile_name: str, micro_batch: int, steps: int, warmup: int, dump_dir: str) -> dict:
    """torchtitan's Trainer at our shape (world 1), each train_step timed with CUDA events."""
    import dataclasses
    import socket
    import sys as _sys
    import types

    import torch

    from remote.accounting import mfu
    from remote.training import data
    from remote.training.profiles import load_profile

    try:
        import datasets  # noqa: F401 - torchtitan's llama3 package imports it; the synthetic loader never uses it
    except ImportError:  # a stand-in so the import succeeds; calling it is an error, and nothing here calls it
        stub = types.ModuleType("datasets")
        stub.Dataset = stub.load_dataset = None  # type: ignore[attr-defined]
        dist_stub = types.ModuleType("datasets.distributed")
        dist_stub.split_dataset_by_node = None  # type: ignore[attr-defined]
        _sys.modules.update({"datasets": stub, "datasets.distributed": dist_stub})
    try:
        from torchtitan import train as tt_train
        from torchtitan.config import ConfigManager
        from torchtitan.models import llama3
        from torchtitan.protocols.train_spec import register_train_spec
    except ImportError as exc:
        raise SystemExit(f"error: the torchtitan reference needs torchtitan, torchdata and tyro ({exc})") from None
    cfg = load_profile(profile_name).model
    hidden = int(1.5 * int(2 * 4 * cfg.d_model / 3))  # torchtitan's FeedForward sizing (Llama-3.2-1B: 1.5, 256)
    if -(-hidden // 256) * 256 != cfg.ffn_hidden:
        raise SystemExit(f"error: torchtitan's llama3 sizing gives another FFN width than {cfg.ffn_hidden}")
    args = llama3.TransformerModelArgs(dim=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                       n_kv_heads=cfg.n_kv_heads, vocab_size=cfg.padded_vocab,
                                       ffn_dim_multiplier=1.5, multiple_of=256, norm_eps=cfg.norm_eps,
                                       rope_theta=cfg.rope_theta, max_seq_len=cfg.seq_len)

    class Synthetic:
        """(input_dict, labels) on the CPU, the same tokens our runs draw; torchtitan moves them itself."""

        def __init__(self) -> None:
            self.step = 0

        def __iter__(self):
            while True:
                tokens, targets = data.batch(0, 0, self.step, micro_batch, cfg.seq_len, cfg.vocab_size,
                                             torch.device("cpu"))
                self.step += 1
                yield {"input": tokens}, targets

        def state_dict(self) -> dict:
            return {"step": self.step}

        def load_state_dict(self, state: dict) -> None:
            self.step = state["step"]

    spec = dataclasses.replace(llama3.get_train_spec(), model_args={"vh": args}, build_tokenizer_fn=None,
                               build_dataloader_fn=lambda **_kw: Synthetic(), build_validator_fn=None)
    register_train_spec("vh_llama3", spec)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    job = ConfigManager().parse_args([
        "--job.dump_folder", dump_dir, "--model.name", "vh_llama3", "--model.flavor", "vh",
        "--training.local_batch_size", str(micro_batch), "--training.seq_len", str(cfg.seq_len),
        "--training.steps", str(steps), "--compile.enable", "--activation_checkpoint.mode", "none",
        "--metrics.log_freq", str(steps + 1), "--lr_scheduler.warmup_steps", "1"])
    marks: list = []
    inner = tt_train.Trainer.train_step

    def timed(self, data_iterator):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        inner(self, data_iterator)
        end.record()
        marks.append((start, end))

    tt_train.Trainer.train_step = timed  # type: ignore[method-assign]
    torch.cuda.reset_peak_memory_stats()
    trainer = tt_train.Trainer(job)
    try:
        trainer.train()
    finally:
        torch.cuda.synchronize()
        trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    step_s = [s.elapsed_time(e) / 1e3 for s, e in marks][warmup:]
    tokens_per_s = micro_batch * cfg.seq_len * len(step_s) / sum(step_s)
    peak = mfu.peak_for(torch.cuda.get_device_name())
    version = _dist_version("torchtitan")
    return {"name": "torchtitan", "impl": f"torchtitan {version} Trainer (llama3, compile model+loss, AC none, "
                                          f"bf16 autocast)",
            "compile_scope": "layer", "liger": False, "micro_batch": micro_batch, "seq_len": cfg.seq_len,
            "warmup_steps": warmup, "step_times_s": step_s, "tokens_per_s": tokens_per_s,
            "flops_per_token": cfg.flops_per_token(), "peak_tflops": peak.tflops,
            "mfu": mfu.mfu(tokens_per_s, cfg.flops_per_token(), peak.tflops),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30,
            "model_params": sum(p.numel() for m in trainer.model_parts for p in m.parameters()),
            "versions": {"torch": torch.__version__, "torchtitan": version, "torchdata": _dist_version("torchdata"),
                         "tyro": _dist_version("tyro"), "triton": _dist_version("triton")}}


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def user_env() -> dict[str, str]:
    """The environment without kernel knobs: the profile's own settings are what gets measured."""
    return {k: v for k, v in os.environ.items() if not k.startswith(KNOB_PREFIXES)}


def _child(cmd: list[str], out: Path, log: Path, timeout_s: float, env: dict[str, str] | None = None
           ) -> tuple[dict | None, str | None]:
    t0 = time.monotonic()
    with open(log, "w") as fh:
        try:
            proc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=user_env() | (env or {}),
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout_s:.0f} s"
    if proc.returncode != 0 or not out.is_file():
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        return None, f"exit {proc.returncode} after {time.monotonic() - t0:.0f} s: {' | '.join(tail)[-400:]}"
    return json.loads(out.read_text()), None


def ours_run(args: argparse.Namespace, name: str, work: Path) -> tuple[dict | None, str | None]:
    out = work / f"mfu-{name}.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", args.profile, "--device",
           "cuda", "--reduction", "zero2o", "--compile", "--micro-batch", str(args.micro_batch), "--steps",
           str(args.steps), "--out", str(out)]
    if name == "deterministic":
        cmd += ["--deterministic", "--replay"]
    if name == "fast-cudnn":
        cmd += ["--attention", "cudnn"]
    record, err = _child(cmd, out, work / f"{name}.log", args.timeout_s * (2 if name == "deterministic" else 1),
                         PREVIOUS_KERNELS if name == "previous-fast" else None)
    return (_annotate(record, args.profile) if record is not None else None), err


def _annotate(record: dict, profile: str) -> dict:
    """The loss chunk the run used, and whether it is the profile's own (not an environment knob's)."""
    from remote.training.profiles import load_profile

    chunk = record.get("kernels", {}).get("ce_chunk_tokens")
    record["ce_chunk_tokens"] = chunk
    record["ce_chunk_is_profile_default"] = chunk == load_profile(profile).train.ce_chunk_tokens
    return record


def ref_child(args: argparse.Namespace, name: str, work: Path) -> tuple[dict | None, str | None]:
    out = work / f"ref-{name.replace('+', '-')}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--reference", name, "--profile", args.profile,
           "--micro-batch", str(args.micro_batch), "--steps", str(args.steps), "--warmup-steps",
           str(args.warmup_steps), "--out", str(out)]
    return _child(cmd, out, work / f"ref-{name.replace('+', '-')}.log", args.timeout_s)


def summarize(record: dict) -> dict:
    """strongest, the ratios and the targets, from the record's own numbers (the checker recomputes them)."""
    refs = record["references"]
    ours, det = record.get("ours"), record.get("deterministic")
    if refs:
        best = max(refs, key=lambda r: r["mfu"])
        record["strongest"] = best["name"]
        if ours:
            record["ratio_vs_strongest"] = ours["mfu"] / best["mfu"]
            record["ratios"] = {r["name"]: ours["mfu"] / r["mfu"] for r in refs}
    if ours and det:
        record["deterministic_vs_fast"] = det["mfu"] / ours["mfu"]
    if det and record.get("baseline_fast"):
        record["deterministic_vs_baseline_fast"] = det["mfu"] / record["baseline_fast"]["mfu"]
    if record.get("previous_fast"):
        if ours:
            record["ours_vs_previous_fast"] = ours["mfu"] / record["previous_fast"]["mfu"]
        if det:
            record["deterministic_vs_previous_fast"] = det["mfu"] / record["previous_fast"]["mfu"]
    record["targets"] = TARGETS
    record["met"] = {k: record[k] >= v for k, v in TARGETS.items() if k in record}
    return record


def _versions() -> dict:
    """Versions and GPU name without a CUDA context in this (parent) process: the children measure."""
    from remote.host import envprobe

    gpus, _ = envprobe.smi_gpus()
    return envprobe.versions() | {"gpu_name": gpus[0].get("name") if gpus else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mfu-dense-1b-dp1")
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--runs", default=",".join((*OURS, *REFERENCES)),
                    help=f"comma list of {', '.join((*OURS, *REFERENCES))}")
    ap.add_argument("--timeout-s", type=float, default=240, help="per run (deterministic gets twice this)")
    ap.add_argument("--work", help="keep every run's JSON and log here (default: a temporary folder)")
    ap.add_argument("--ours-evidence", help="use this run_mfu_dist record as `ours` instead of running it")
    ap.add_argument("--deterministic-evidence", help="likewise for `deterministic`")
    ap.add_argument("--reference", choices=REFERENCES, help=argparse.SUPPRESS)  # child mode: one reference
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    runs = [r.strip() for r in args.runs.split(",") if r.strip()]
    unknown = sorted(set(runs) - set(OURS) - set(REFERENCES))
    if unknown or args.micro_batch < 1 or args.steps <= args.warmup_steps:
        print(f"error: bad --runs {unknown} or --micro-batch/--steps", file=sys.stderr)
        return 2
    from remote.training import evidence, parallel

    parallel.set_process_env(nccl_pcie=False)  # multicast off here too, before CUDA starts
    if args.reference == "torchtitan":
        with tempfile.TemporaryDirectory() as dump:
            evidence.write(args.out, torchtitan_run(args.profile, args.micro_batch, args.steps, args.warmup_steps,
                                                    dump))
        return 0
    if args.reference:
        evidence.write(args.out, reference_run(args.profile, args.reference, args.micro_batch, args.steps,
                                               args.warmup_steps))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp)
        work.mkdir(parents=True, exist_ok=True)
        record: dict = {"schema": SCHEMA, "created_unix": time.time(), "profile": args.profile,
                        "micro_batch": args.micro_batch, "steps": args.steps, "warmup_steps": args.warmup_steps,
                        "references": [], "failed": {}}
        record["versions"] = _versions()
        for name, given in (("ours", args.ours_evidence), ("deterministic", args.deterministic_evidence)):
            if given:  # measured earlier in the same session (e.g. scripts/gpu/h200_kernels.sh); not run again
                record[name] = _annotate(json.loads(Path(given).read_text()), args.profile)
                runs = [r for r in runs if r != name]
        for name in runs:
            t0 = time.monotonic()
            result, err = (ours_run if name in OURS else ref_child)(args, name, work)
            if err:
                record["failed"][name] = err
                print(f"[bench] {name} FAILED: {err}", flush=True)
                continue
            if name in OURS:
                record[RECORD_KEY[name]] = result
            else:
                record["references"].append(result)
            print(f"[bench] {name} mfu {result['mfu']:.4f} tokens/s {result['tokens_per_s']:.0f} "
                  f"({time.monotonic() - t0:.0f} s)", flush=True)
            evidence.write(args.out, summarize(record))  # after every run: a time limit keeps what was measured
        evidence.write(args.out, summarize(record))
    for name in OURS:
        if RECORD_KEY[name] in record:
            r = record[RECORD_KEY[name]]
            print(f"[bench] {name:14s} mfu {r['mfu']:.4f} tokens/s {r['tokens_per_s']:8.0f} "
                  f"attention {r['attention_backend']} chunk {r['ce_chunk_tokens']} "
                  f"replay {r.get('replay_match', '-')}")
    for r in record["references"]:
        ratio = record.get("ratios", {}).get(r["name"])
        print(f"[bench] {r['name']:14s} mfu {r['mfu']:.4f} tokens/s {r['tokens_per_s']:8.0f} "
              f"mem {r['peak_mem_gib']:5.1f} GiB  ours/it {ratio if ratio is None else round(ratio, 3)}")
    print(f"[bench] strongest {record.get('strongest')} ratio {record.get('ratio_vs_strongest')} "
          f"deterministic/fast {record.get('deterministic_vs_fast')} deterministic/baseline-fast "
          f"{record.get('deterministic_vs_baseline_fast')} met {record['met']}", flush=True)
    return 1 if record["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
