"""`vast-e2e reap`: delete and prove absent every instance a run may have left billing.

Two sources, because either alone can miss one: the ledger (every instance a run recorded and never proved
gone, and every create intent whose outcome is unknown, looked up by label) and the live list (every
instance whose label carries the project's prefix). Exit 0 only when all are proven absent.
"""

from __future__ import annotations

import time

from vast_harness.client import VastClient
from vast_harness.config import LABEL_PREFIX, RunSpec
from vast_harness.errors import VastError
from vast_harness.evidence import RunEvidence
from vast_harness.ledger import Ledger
from vast_harness.lifecycle import InstanceTeardown, find_by_label, teardown_instance
from vast_harness.output import Output


def _live_with_prefix(client: VastClient) -> dict[int, str]:
    return {i.id: i.label or "" for i in client.list_instances() if (i.label or "").startswith(LABEL_PREFIX)}


def reap_all(spec: RunSpec, client: VastClient, out: Output) -> int:
    ledger = Ledger(spec.evidence_dir / "ledger.jsonl")
    pending, unknown_labels = ledger.unproven()
    targets: dict[int, str] = {i: e.label for i, e in pending.items()}
    for label in sorted(unknown_labels):
        for instance_id in find_by_label(client, label, attempts=1, wait_s=0, sleep=time.sleep):
            targets.setdefault(instance_id, label)
    try:
        targets.update({i: lab for i, lab in _live_with_prefix(client).items() if i not in targets})
    except VastError as exc:
        out.error(f"could not list live instances: {exc}")
        return 3
    run_id = "reap-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    reports: list[InstanceTeardown] = []
    for instance_id, label in sorted(targets.items()):
        deadline = time.monotonic() + max(60.0, 8 * spec.proof_interval_s + 60.0)
        reports.append(teardown_instance(client, ledger, run_id=run_id, label=label, instance_id=instance_id,
                                         interval_s=spec.proof_interval_s, deadline=deadline))
    ev = RunEvidence(spec.evidence_dir / run_id)
    ev.write_json("absence-proof.json", {"interval_s": spec.proof_interval_s,
                                         "instances": [r.model_dump() for r in reports]})
    ev.write_manifest()
    unproven = [r.instance_id for r in reports if r.verdict != "gone"]
    if out.json_mode:
        out.emit_json({"reaped": {r.instance_id: r.verdict for r in reports}, "unproven": unproven,
                       "evidence_dir": str(ev.dir)})
    else:
        from rich.table import Table

        t = Table(title=f"reap: {len(reports)} instance(s)", header_style="bold")
        for col in ("instance", "label", "deletes", "verdict"):
            t.add_column(col)
        for r in reports:
            t.add_row(str(r.instance_id), targets[r.instance_id], str(len(r.deletes)), r.verdict)
        out.out.print(t)
        out.out.print("all proven absent" if not unproven else f"[red]NOT proven absent: {unproven}[/]")
    return 0 if not unproven else 3
