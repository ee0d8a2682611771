"""Whose instance a create answer named: only a row that carries the run's own label is the run's.

A create answer can name another instance of the account (`wrong_contract`: the user's `prod-database`, an
unlabelled console instance, another run's). Before the run deletes an instance that no read has shown with its
label (the boot's first read failed, or the cap came first), one read of its row decides: another label, or none,
and it is not the run's. A row that cannot be read (reads lag creates; the API failed) decides nothing: it is
deleted as before, as `reap` does, and its absence proof says what is there.
"""

from __future__ import annotations

from vast_harness.clock import Clock
from vast_harness.errors import VastError
from vast_harness.records import CreatedInstance
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient


def record_disowned(ledger: Ledger, run_id: str, inst: CreatedInstance, row_label: str) -> None:
    """The ledger's line that takes the instance off the run's books: `reap` neither deletes it as the run's nor
    counts it as what the run's label made (it keeps looking for the run's own by the label)."""
    ledger.append(run_id, "disowned", inst.label, instance_id=inst.instance_id,
                  detail=f"its row carries {f'the label {row_label!r}' if row_label else 'no label'}")


def foreign_label(client: VastClient, inst: CreatedInstance, *, within_s: float, clock: Clock) -> str | None:
    """The label (`""` for none) of `inst`'s row when it is not the run's; None when the row carries the run's
    label or cannot be read. Per-id first, then the v1 list by id (a per-id path may be refused: 410 on v0)."""
    until = clock() + within_s
    try:
        row = client.get_instance(inst.instance_id, within_s=within_s / 2)
    except VastError:
        try:
            row = next(iter(client.list_instances(instance_id=inst.instance_id,
                                                  within_s=max(0.1, until - clock()))), None)
        except VastError:
            return None
    if row is None or row.id != inst.instance_id or row.label == inst.label:
        return None
    return row.label or ""
