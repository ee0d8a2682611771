"""Whose instance a create answer named: only a row that carries the run's own label is the run's.

A create answer can name another instance of the account (`wrong_contract`: the user's `prod-database`, an
unlabelled console instance, another run's). Before the run deletes an instance that no read has shown with its
label (the boot's first read failed, or the cap came first), one read of its row decides: another label, or none,
and it is not the run's. A row that cannot be read (reads lag creates; the API failed) decides nothing: it is
deleted as before, as `reap` does, and its absence proof says what is there. A row that does carry the run's
label states the price the host bills: the run's meter takes it like any row's.
"""

from __future__ import annotations

from collections.abc import Callable

from vast_harness.clock import Clock
from vast_harness.errors import VastError
from vast_harness.records import CreatedInstance
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance


def record_disowned(ledger: Ledger, run_id: str, inst: CreatedInstance, row_label: str) -> None:
    """The ledger's line that takes the instance off the run's books: `reap` neither deletes it as the run's nor
    counts it as what the run's label made (it keeps looking for the run's own by the label)."""
    ledger.append(run_id, "disowned", inst.label, instance_id=inst.instance_id,
                  detail=f"its row carries {f'the label {row_label!r}' if row_label else 'no label'}")


def foreign_label(client: VastClient, inst: CreatedInstance, *, within_s: float, clock: Clock,
                  on_own_row: Callable[[Instance], None] | None = None) -> str | None:
    """The label (`""` for none) of `inst`'s row when it is not the run's; None when the row carries the run's
    label (then `on_own_row` is given it: its price counts) or cannot be read. The v1 list by id first (the
    read that still answers when per-id reads fail: a refused v0 path, a 5xx), then one per-id attempt."""
    until = clock() + within_s
    try:
        row = next((r for r in client.list_instances(instance_id=inst.instance_id, within_s=within_s / 2)
                    if r.id == inst.instance_id), None)
    except VastError:
        row = None
    if row is None:
        try:
            row = client.get_instance(inst.instance_id, max_retry_s=0.0, within_s=max(0.1, until - clock()))
        except VastError:
            return None
    if row is None or row.id != inst.instance_id:
        return None
    if row.label == inst.label:
        if on_own_row is not None:
            on_own_row(row)
        return None
    return row.label or ""
