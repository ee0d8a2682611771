"""A run's evidence directory (README, "Evidence"): the files, their layout, and the closing manifest.

harness-result.json, offer-quote.json, steps.tsv, steps/<name>.log, remote/, absence-proof.json, and
manifest.sha256 (sha256 of every file above). Nothing here ever holds the API key or a remote_env value.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import sys
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vast_harness.runner import GuardedRun

RESULT_SCHEMA_VERSION = 1


class RunEvidence:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        (self.dir / "steps").mkdir(parents=True, exist_ok=True)
        (self.dir / "remote").mkdir(parents=True, exist_ok=True)

    def write_json(self, name: str, payload: Any) -> Path:
        path = self.dir / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        tmp.replace(path)  # never a half-written evidence file
        return path

    def step_log(self, name: str) -> IO[str]:
        return (self.dir / "steps" / f"{name}.log").open("a", encoding="utf-8")

    def append_step_tsv(self, name: str, rc: int | None, seconds: float) -> None:
        with (self.dir / "steps.tsv").open("a", encoding="utf-8") as fh:
            fh.write(f"{name}\t{'NA' if rc is None else rc}\t{seconds:.3f}\n")

    def write_result(self, run: GuardedRun, exit_code: int, message: str) -> None:
        spec = run.spec
        plan = run.plan
        cand = run.candidate or (plan.chosen if plan else None)
        verdicts = {t.instance_id: t.verdict for t in run.teardowns}
        self.write_json("absence-proof.json", {
            "interval_s": spec.proof_interval_s,
            "instances": [t.model_dump() for t in run.teardowns],
            "verdict": _overall(verdicts),
        })
        workload_s = sum(s.seconds for s in run.steps if s.workload)
        result = {
            "schema_version": RESULT_SCHEMA_VERSION,
            "run_id": run.run_id,
            "profile": spec.profile.name,
            "image": spec.profile.image,
            "api_url": spec.api_url,
            "sim": spec.sim,
            "offer": plan.summary()["offer"] if plan else None,
            "driver_qualified": cand.driver_qualified if cand else None,
            "any_driver": spec.any_driver,
            "caps": {"max_usd": spec.caps.max_usd, "max_minutes": spec.caps.max_minutes,
                     "teardown_margin_s": spec.teardown_margin_s},
            "worst_case_usd": cand.quote.worst_case_usd if cand else None,
            "accrued_usd": round(run.accrued_usd(), 6),
            "bytes": {"uploaded": run.bytes_up, "downloaded": run.bytes_down},
            "bundle_sha256": plan.bundle_sha256 if plan else None,
            "host_key": ({"fingerprint": run.session.host_key_fingerprint, "type": run.session.host_key_type,
                          "endpoint": str(run.session.endpoint)} if run.session else None),
            "remote_env": spec.masked_remote_env,
            "instances": [i.model_dump(exclude={"t_created_mono", "t_deleted_mono"}) for i in run.created],
            "steps": [s.model_dump() for s in run.steps],
            "timings": run.timings | {"workload_steps_s": round(workload_s, 3)},
            "absence": {"verdict": _overall(verdicts), "per_instance": verdicts},
            "api_calls": _stats(run),
            "exit_code": exit_code,
            "message": message,
            "finished_unix": time.time(),
            "harness": {"python": sys.version.split()[0], "platform": platform.platform()},
        }
        self.write_json("harness-result.json", result)
        self.write_manifest()

    def write_manifest(self) -> None:
        lines = []
        for path in sorted(p for p in self.dir.rglob("*") if p.is_file() and p.name != "manifest.sha256"):
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            lines.append(f"{digest}  {path.relative_to(self.dir).as_posix()}")
        (self.dir / "manifest.sha256").write_text("\n".join(lines) + "\n")


def _overall(verdicts: dict[int, str]) -> str:
    if not verdicts:
        return "nothing-created"
    return "gone" if all(v == "gone" for v in verdicts.values()) else "unproven"


def _stats(run: GuardedRun) -> dict:
    return dataclasses.asdict(run.client.stats)
