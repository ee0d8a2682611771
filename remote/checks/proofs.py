"""Checker for a proofs-profile run directory (`.evidence/.../<run_id>/`): every claim the run makes.

`check(path)` takes the run directory (or its harness-result.json) and returns the failed claims:
the run passed on a qualified driver; every planned step ran with rc 0; the manifest matches every file;
the host's evidence validates (mfu with replay_match, the MPS manifest, the GPU tests with no skip); and
every instance is proven absent by two all-'gone' rounds at least the proof interval apart, with the raw
responses to show for it. Standard library only.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

REQUIRED_FILES = ("harness-result.json", "offer-quote.json", "steps.tsv", "absence-proof.json", "manifest.sha256")
REMOTE_FILES = ("env.json", "mfu-proof.json", "mps-manifest.json", "gpu-tests.xml")
# Against a real API the two 'gone' rounds must be at least this far apart, whatever interval the run recorded
# (the harness refuses less unless the API is loopback or --sim; the checker does not take its word for it).
REAL_PROOF_INTERVAL_FLOOR_S = 10.0


def _is_loopback(url: str) -> bool:
    # The same rule as vast_harness/apiurl.is_loopback_url: remote/ runs on the host and never imports it.
    host = (urlparse(url or "").hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _interval_floor_s(result: dict[str, Any]) -> float:
    """The simulator (always on loopback, `--sim` or not) may use shorter intervals; any other API may not."""
    return 0.0 if _is_loopback(str(result.get("api_url", ""))) else REAL_PROOF_INTERVAL_FLOOR_S


def _load(path: Path, failed: list[str]) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except (OSError, ValueError) as exc:
        failed.append(f"{path.name}: unreadable JSON ({exc})")
        return None


def _check_manifest(run_dir: Path, failed: list[str]) -> None:
    listed: set[str] = set()
    for line in (run_dir / "manifest.sha256").read_text().splitlines():
        digest, _, rel = line.partition("  ")
        listed.add(rel)
        target = run_dir / rel
        if not target.is_file():
            failed.append(f"manifest lists {rel}, which is missing")
        elif hashlib.sha256(target.read_bytes()).hexdigest() != digest:
            failed.append(f"manifest sha256 mismatch for {rel}")
    for path in run_dir.rglob("*"):
        rel = path.relative_to(run_dir).as_posix()
        if path.is_file() and rel != "manifest.sha256" and rel not in listed:
            failed.append(f"{rel} is not in manifest.sha256")


def _check_steps(run_dir: Path, result: dict[str, Any], failed: list[str]) -> None:
    rows = [line.split("\t") for line in (run_dir / "steps.tsv").read_text().splitlines() if line.strip()]
    names = [r[0] for r in rows]
    planned = [s["name"] for s in result.get("steps", [])]
    if names != planned:
        failed.append(f"steps.tsv {names} disagrees with harness-result steps {planned}")
    for row in rows:
        if len(row) != 3 or row[1] != "0":
            failed.append(f"step {row[0]} did not pass (steps.tsv row {row})")
        if not (run_dir / "steps" / f"{row[0]}.log").is_file():
            failed.append(f"no log for step {row[0]}")


def _check_absence(proof: dict[str, Any], failed: list[str], floor_s: float = REAL_PROOF_INTERVAL_FLOOR_S) -> None:
    try:
        interval = max(float(proof.get("interval_s", 0)), floor_s)
    except (TypeError, ValueError):
        interval = floor_s
    if not math.isfinite(interval):  # NaN or inf recorded: hold the floor
        interval = floor_s
    instances = proof.get("instances", [])
    if not instances:
        failed.append("absence-proof.json names no instance")
    for inst in instances:
        iid = inst.get("instance_id")
        rounds = (inst.get("proof") or {}).get("rounds", [])
        gone = [r for r in rounds if r.get("verdict") == "gone"]
        if (inst.get("proof") or {}).get("verdict") != "gone" or len(gone) < 2:
            failed.append(f"instance {iid}: absence not proven by two 'gone' rounds")
            continue
        if gone[-1]["t_unix"] - gone[-2]["t_unix"] < interval:
            failed.append(f"instance {iid}: the two 'gone' rounds are less than {interval} s apart")
        for r in gone[-2:]:
            per_id = r.get("per_id", {})
            if per_id.get("status") != 200 or (per_id.get("json") or {}).get("instances", "absent") is not None:
                failed.append(f"instance {iid}: a 'gone' round lacks a 200 with instances: null")
            for key in ("list_by_id", "list_by_label"):
                if r.get(key, {}).get("status") != 200 or (r[key].get("json") or {}).get("instances") != []:
                    failed.append(f"instance {iid}: a 'gone' round's {key} is not a 200 with no rows")


def _check_remote(run_dir: Path, failed: list[str]) -> None:
    from remote.checks import load_checker
    from remote.host.plan import junit_failures

    remote = run_dir / "remote"
    for name in REMOTE_FILES:
        if not (remote / name).is_file():
            failed.append(f"remote/{name} is missing")
    if (remote / "mfu-proof.json").is_file():
        failed += [f"remote/mfu-proof.json: {c}" for c in load_checker("mfu")(remote / "mfu-proof.json")]
        mfu = json.loads((remote / "mfu-proof.json").read_text())
        if mfu.get("replay_match") is not True:
            failed.append("remote/mfu-proof.json: replay_match is not true")
        if mfu.get("attention_backend") in (None, "math"):
            failed.append(f"remote/mfu-proof.json: attention backend {mfu.get('attention_backend')!r} is not a fast path")
    if (remote / "mps-manifest.json").is_file():
        failed += [f"remote/mps-manifest.json: {c}" for c in load_checker("mps")(remote / "mps-manifest.json")]
    if (remote / "gpu-tests.xml").is_file():
        failed += [f"remote/gpu-tests.xml: {p}" for p in junit_failures(remote / "gpu-tests.xml")]


def check(path: Path) -> list[str]:
    run_dir = path.parent if path.is_file() else path
    failed: list[str] = []
    missing = [n for n in REQUIRED_FILES if not (run_dir / n).is_file()]
    if missing:
        return [f"missing evidence file(s): {', '.join(missing)}"]
    result = _load(run_dir / "harness-result.json", failed)
    proof = _load(run_dir / "absence-proof.json", failed)
    if result is None or proof is None:
        return failed
    if result.get("profile") != "proofs":
        failed.append(f"profile is {result.get('profile')!r}, not 'proofs'")
    if result.get("exit_code") != 0:
        failed.append(f"exit_code {result.get('exit_code')} (0 = passed on a qualified driver): {result.get('message')}")
    if result.get("driver_qualified") is not True:
        failed.append("driver_qualified is not true: no bitwise claim can be made")
    if (result.get("absence") or {}).get("verdict") != "gone":
        failed.append(f"absence verdict {(result.get('absence') or {}).get('verdict')!r}, not 'gone'")
    if (result.get("accrued_usd") or 0) > (result.get("caps") or {}).get("max_usd", float("inf")):
        failed.append("accrued_usd exceeds the cost cap")
    _check_steps(run_dir, result, failed)
    _check_absence(proof, failed, _interval_floor_s(result))
    _check_manifest(run_dir, failed)
    _check_remote(run_dir, failed)
    return failed
