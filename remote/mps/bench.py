"""Benchmark: a learner and helper processes sharing one GPU, MPS on against MPS off.

Each repetition runs two pools of processes (one learner, up to max(--helper-counts) helpers), one
with MPS (a fresh daemon of ours per repetition) and one without, in alternating order. Inside a
pool, phases run the learner alone, one helper alone per kernel size, then every (kernel size,
helper count) point together; each phase discards a warm-up and counts a fixed window.

Reported per point and mode (median over repetitions): learner TFLOP/s, helper kernels/s (summed),
combined throughput normalised to each process alone (learner/learner_alone + sum helper/helper_alone,
"alone" = that process alone on the GPU without MPS, same repetition; 1.0 = pure time-slicing of a
saturated GPU, N = perfect overlap of N processes), and step-time p50/p95. The off pool must show
CU_DEVICE_ATTRIBUTE_MPS_ENABLED == 0 in every process; the on pool must prove attachment.

    python scripts/bench/bench_mps.py --out bench-mps.json [--reps 3] [--sizes 256,1024,2048] [--helper-counts 1,4]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO, Any

from remote import knobs
from remote.host.paths import ROOT
from remote.mps.control import DEFAULT_PIPE_DIR, daemon_answers, find_control_binary
from remote.mps.wrapper import owned_daemon

WORKER_MODULE = "remote.mps.bench_worker"  # the CPU tests swap in a fake worker


class Pool:
    """Worker processes of one arm, driven over stdin/stdout JSON lines."""

    def __init__(self, helpers: int, env: dict[str, str], ready_timeout_s: float = 180.0) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        self.queues: list[queue.Queue[str | None]] = []
        self.threads: list[threading.Thread] = []
        for i, role in enumerate(["learner"] + ["helper"] * helpers):
            proc = subprocess.Popen(
                [sys.executable, "-m", WORKER_MODULE, "--role", role, "--cpu", str(i)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT,
            )
            q: queue.Queue[str | None] = queue.Queue()
            self.threads.append(threading.Thread(target=self._pump, args=(proc, q), daemon=True))
            self.threads[-1].start()
            self.procs.append(proc)
            self.queues.append(q)
        self.ready = [self._read(i, ready_timeout_s) for i in range(len(self.procs))]
        failed = [r.get("error") for r in self.ready if not r.get("ready")]
        if failed:
            self.close()
            raise RuntimeError(f"benchmark workers failed their MPS check: {failed}")

    @staticmethod
    def _pump(proc: subprocess.Popen[str], q: queue.Queue[str | None]) -> None:
        for line in _pipe(proc.stdout):
            q.put(line)
        q.put(None)  # EOF: the worker died; fail now rather than at the timeout

    def _read(self, i: int, timeout_s: float) -> dict[str, Any]:
        try:
            line = self.queues[i].get(timeout=timeout_s)
        except queue.Empty:
            raise RuntimeError(f"worker {i} (pid {self.procs[i].pid}) silent for {timeout_s} s") from None
        if line is None:
            raise RuntimeError(f"worker {i} (pid {self.procs[i].pid}) exited (rc {self.procs[i].wait()})")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def phase(self, active: list[bool], size: int, kernels: int, warm_s: float, window_s: float) -> list[dict[str, Any]]:
        t_start = time.monotonic() + warm_s  # warm-up: steps that start before t_start do not count
        cmd = {"cmd": "phase", "size": size, "kernels": kernels, "t_start": t_start, "t_end": t_start + window_s}
        for proc, on in zip(self.procs, active):
            _pipe(proc.stdin).write(json.dumps(dict(cmd, active=on)) + "\n")
            _pipe(proc.stdin).flush()
        return [self._read(i, warm_s + window_s + 60) for i in range(len(self.procs))]

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                try:
                    _pipe(proc.stdin).write(json.dumps({"cmd": "exit"}) + "\n")
                    _pipe(proc.stdin).close()
                except OSError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for proc, thread in zip(self.procs, self.threads):
            thread.join(timeout=5)
            _pipe(proc.stdout).close()


def _with_stats(result: dict[str, Any]) -> dict[str, Any]:
    """Replace the raw step times (too many to keep) by their p50/p95."""
    s = sorted(result.pop("step_times_s", []))
    if not s:
        return dict(result, p50_ms=None, p95_ms=None)
    return dict(result, p50_ms=1e3 * s[len(s) // 2], p95_ms=1e3 * s[min(len(s) - 1, int(0.95 * len(s)))])


def _pipe(stream: IO[str] | None) -> IO[str]:
    """A worker's stdin or stdout (always a pipe here: Popen was asked for both)."""
    if stream is None:
        raise RuntimeError("a benchmark worker has no pipe")
    return stream


def _median(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return statistics.median(vals) if vals else None


def run_pool(mode: str, a: argparse.Namespace) -> dict[str, Any]:
    """All phases of one arm in one pool of processes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}
    env.update(knobs.mps_mode_env("on" if mode == "on" else "off"), PYTHONPATH=str(ROOT))
    if mode == "on":
        env.update({k: v for k, v in a.daemon_env.items()})
    pool = Pool(max(a.helper_counts), env)
    n, phases = len(pool.procs), []
    try:
        def go(name: str, active: list[bool], size: int, kernels: int) -> None:
            res = pool.phase(active, size, kernels, a.warm_s, a.window_s)
            phases.append({"name": name, "size": size, "kernels": kernels, "active": active,
                           "results": [_with_stats(r) for r in res]})

        go("learner_alone", [True] + [False] * (n - 1), a.sizes[0], a.kernels)
        for size in a.sizes:
            go("helper_alone", [False, True] + [False] * (n - 2), size, a.kernels)
        for size in a.sizes:
            for count in a.helper_counts:
                go("together", [True] + [i < count for i in range(n - 1)], size, a.kernels)
    finally:
        pool.close()
    records = [r["record"] for r in pool.ready]
    return {"mode": mode, "records": records, "phases": phases,
            "attr_values": [r["mps_enabled_attr"] for r in records]}


def _one_rep(rep: int, a: argparse.Namespace, out: dict[str, Any]) -> None:
    order = ("on", "off") if rep % 2 == 0 else ("off", "on")
    for mode in order:
        if mode == "on":
            log_dir = a.log_root / f"rep{rep}" if a.log_root else None
            with owned_daemon(log_dir) as (daemon, info):
                a.daemon_env = daemon.env()
                arm = run_pool("on", a)
                arm["daemon"] = {"daemon_pid": daemon.daemon_pid, "pipe_directory": str(daemon.pipe_dir)}
            arm["daemon"].update(info)
            if not (info["stop"]["daemon_gone"] and info["stop"]["servers_gone"]):
                raise RuntimeError(f"repetition {rep}: MPS daemon did not stop: {info['stop']}")
        else:
            if os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or daemon_answers(find_control_binary(), DEFAULT_PIPE_DIR):
                raise RuntimeError("off arm would not be off: an MPS daemon is reachable from this environment")
            arm = run_pool("off", a)
            if any(v != 0 for v in arm["attr_values"]):
                raise RuntimeError(f"off arm is not off: MPS attribute values {arm['attr_values']}")
        arm["rep"] = rep
        out["arms"].append(arm)
        a.out.write_text(json.dumps(out, indent=1))  # partial results survive a timeout


def _point(arm: dict[str, Any], base: dict[str | int, float], size: int, count: int) -> dict[str, Any]:
    ph = next(p for p in arm["phases"] if p["name"] == "together" and p["size"] == size
              and sum(p["active"][1:]) == count)
    learner, helpers = ph["results"][0], [r for r, on in zip(ph["results"][1:], ph["active"][1:]) if on]
    # A baseline window that completed no step (a descheduled process, a window shorter than a step) has
    # nothing to normalise by: that repetition has no combined figure, and the median is over the others.
    measured = base.get("learner", 0.0) > 0 and base.get(size, 0.0) > 0
    norm = (learner["throughput"] / base["learner"] + sum(h["throughput"] / base[size] for h in helpers)
            if measured else None)
    return {"learner_tflops": learner["throughput"], "helper_kernels_per_s": sum(h["throughput"] for h in helpers),
            "combined_norm": norm, "learner_p50_ms": learner["p50_ms"], "learner_p95_ms": learner["p95_ms"],
            "helper_p50_ms": _median(h["p50_ms"] for h in helpers),
            "helper_p95_ms": max((h["p95_ms"] for h in helpers if h["p95_ms"] is not None), default=None)}


def summarise(out: dict[str, Any], sizes: list[int], counts: list[int]) -> list[dict[str, Any]]:
    rows = []
    reps = sorted({arm["rep"] for arm in out["arms"]})
    for size in sizes:
        for count in counts:
            row: dict[str, Any] = {"size": size, "helpers": count}
            for mode in ("off", "on"):
                per_rep = []
                for rep in reps:
                    arms = {a["mode"]: a for a in out["arms"] if a["rep"] == rep}
                    if "off" not in arms or mode not in arms:
                        continue
                    off = arms["off"]["phases"]
                    base: dict[str | int, float] = {"learner": off[0]["results"][0]["throughput"]}
                    base.update({p["size"]: p["results"][1]["throughput"] for p in off if p["name"] == "helper_alone"})
                    per_rep.append(_point(arms[mode], base, size, count))
                for key in per_rep[0] if per_rep else []:
                    row[f"{key}_{mode}"] = _median(r[key] for r in per_rep)
            rows.append(row)
    return rows


def _f(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    """One line per (helper kernel size, helper count); each cell 'off / on', medians over reps."""
    cols = [("learner TF/s", "learner_tflops", ".0f"), ("helper kernels/s", "helper_kernels_per_s", ".0f"),
            ("combined (norm.)", "combined_norm", ".2f"), ("learner p50 ms", "learner_p50_ms", ".2f"),
            ("learner p95 ms", "learner_p95_ms", ".2f"), ("helper p50 ms", "helper_p50_ms", ".3f")]
    print(f"{'size':>5} {'help':>4} " + " ".join(f"| {name + ' off/on':>24}" for name, _, _ in cols))
    for r in rows:
        cells = [f"{_f(r.get(k + '_off'), spec):>11} / {_f(r.get(k + '_on'), spec):<10}" for _, k, spec in cols]
        print(f"{r['size']:>5} {r['helpers']:>4} " + " ".join(f"| {c:>24}" for c in cells))


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench_mps", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sizes", type=_ints, default=[256, 1024, 2048], help="helper GEMM edge, comma list")
    p.add_argument("--helper-counts", type=_ints, default=[1, 4])
    p.add_argument("--kernels", type=int, default=32, help="helper kernels per step (one sync per step)")
    p.add_argument("--warm-s", type=float, default=0.4)
    p.add_argument("--window-s", type=float, default=1.5)
    p.add_argument("--log-root", type=Path, help="keep each repetition's daemon logs here")
    a = p.parse_args(argv)
    if a.reps < 3:
        p.error("--reps must be at least 3")
    out: dict[str, Any] = {"kind": "mps-bench", "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
           "learner": "4 x bf16 GEMM 8192^3 per step", "helper": "--kernels bf16 GEMMs size^3 per step", "arms": []}
    for rep in range(a.reps):
        _one_rep(rep, a, out)
    out["summary"] = summarise(out, a.sizes, a.helper_counts)
    out["off_arms_verified_off"] = all(v == 0 for arm in out["arms"] if arm["mode"] == "off" for v in arm["attr_values"])
    out["on_arms_attached"] = all(r["attached"] for arm in out["arms"] if arm["mode"] == "on" for r in arm["records"])
    a.out.write_text(json.dumps(out, indent=1))
    print_table(out["summary"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
