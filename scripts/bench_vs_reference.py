"""Our trainer against HF transformers' LlamaForCausalLM at the same shape, micro-batch and sequence.

The reference is what a careful user would write: LlamaForCausalLM built from a LlamaConfig (no download),
bf16 weights, SDPA attention, fused AdamW on the bf16 weights, torch.compile (per decoder layer by
default, the same scope ours uses; --compile-scope model compiles the whole model). Both are timed with
CUDA events after the same warm-up and scored with the same FLOPs/token and peak. Ours is either run
here in a subprocess or read from an evidence file written in the same session (--ours-evidence).

    python scripts/bench_vs_reference.py --micro-batch 8 --out bench-vs-reference.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from remote import data, envprobe, evidence, mfu, parallel  # noqa: E402
from remote.profiles import load_profile  # noqa: E402

SCHEMA = "vast-harness/bench-vs-reference/1"


def reference_run(profile_name: str, micro_batch: int, steps: int, warmup: int, compile_scope: str) -> dict:
    try:
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as exc:
        raise SystemExit(f"error: the reference needs transformers ({exc})") from None
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
    if compile_scope == "model":
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
    return {"impl": f"transformers {transformers.__version__} LlamaForCausalLM", "compile_scope": compile_scope,
            "micro_batch": micro_batch, "seq_len": cfg.seq_len, "step_times_s": step_s,
            "loss_per_step": torch.stack(losses).float().cpu().tolist(), "tokens_per_s": tokens_per_s,
            "flops_per_token": cfg.flops_per_token(), "peak_tflops": peak.tflops,
            "mfu": mfu.mfu(tokens_per_s, cfg.flops_per_token(), peak.tflops),
            "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}


def ours_run(profile_name: str, micro_batch: int, steps: int, extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ours.json"
        cmd = [sys.executable, str(ROOT / "scripts" / "run_mfu_dist.py"), "--profile", profile_name,
               "--device", "cuda", "--reduction", "zero2o", "--compile", "--micro-batch", str(micro_batch),
               "--steps", str(steps), "--out", str(out), *extra]
        subprocess.run(cmd, check=True)
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="mfu-dense-1b-dp1")
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=13)
    ap.add_argument("--warmup-steps", type=int, default=3)
    ap.add_argument("--compile-scope", choices=["layer", "model"], default="layer")
    ap.add_argument("--ours-evidence", help="reuse this evidence file (same micro-batch) instead of running ours")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    parallel.set_process_env(nccl_pcie=False)  # multicast off here too, before CUDA starts
    t0 = time.monotonic()
    reference = reference_run(args.profile, args.micro_batch, args.steps, args.warmup_steps, args.compile_scope)
    print(f"[bench] reference mfu {reference['mfu']:.4f} ({time.monotonic() - t0:.0f} s)", flush=True)
    del_cache()
    if args.ours_evidence:
        ours = json.loads(Path(args.ours_evidence).read_text())
        if ours["micro_batch"] != args.micro_batch:
            raise SystemExit(f"error: {args.ours_evidence} has micro_batch {ours['micro_batch']}, "
                             f"not {args.micro_batch}")
    else:
        ours = ours_run(args.profile, args.micro_batch, args.steps, [])
    record = {"schema": SCHEMA, "created_unix": time.time(), "profile": args.profile,
              "micro_batch": args.micro_batch, "reference": reference, "ours": ours,
              "ratio": ours["mfu"] / reference["mfu"], "versions": envprobe.versions(),
              "ours_kernels": ours.get("kernels", {}).get("active")}
    evidence.write(args.out, record)
    print(f"[bench] ours mfu {ours['mfu']:.4f} (kernels {record['ours_kernels']})  reference mfu "
          f"{reference['mfu']:.4f}  ratio {record['ratio']:.3f}", flush=True)
    return 0


def del_cache() -> None:
    import gc

    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
