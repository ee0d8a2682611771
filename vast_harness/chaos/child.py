"""`python -m vast_harness.chaos.child JOB.json`: one guarded run in a process of its own (network scenarios).

The network scenarios need what an in-process run cannot give: a run that can be killed when it hangs, and
its real stdout/stderr to search for tracebacks. The run is the CLI's (`GuardedRun` with the console
`Output`, its signal handling and exit code), with the scenario's steps and the chaos suite's scaled clocks,
which no CLI flag can set. Nothing here catches an exception: one that escapes is a finding.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from vast_harness.chaos.engine import ChildJob, _client, chaos_spec
from vast_harness.config import load_driver_policy
from vast_harness.output import Output
from vast_harness.runner import GuardedRun


def main(argv: list[str]) -> int:
    job = ChildJob.model_validate_json(Path(argv[0]).read_text())
    spec = chaos_spec(api_url=job.api_url, evidence_dir=job.evidence_dir, steps=job.steps,
                      max_minutes=job.max_minutes, max_usd=job.max_usd, boot_retries=job.boot_retries,
                      proof_interval_s=job.proof_interval_s)
    job.t0_file.write_text(repr(time.time()))
    with _client(job.api_url) as client:
        run = GuardedRun(spec, client, load_driver_policy(), Output())
        run.teardown_budget_s = job.teardown_budget_s
        return run.execute().exit_code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
