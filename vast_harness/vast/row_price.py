"""The hourly price an instance's row states, read from the raw JSON of any read of it, and why not when not.

Vast's per-id read (`show_instance.yaml`) and its v1 list (`show_instances.yaml`, `select_cols` `*`) both carry
`dph_total`: $/h, storage at the instance's disk included, bandwidth not. Only that field is read: the
`search`/`instance` breakdowns differ between the docs' example and what the list returns, and which of them is
the contract's rate is not sourced. A row that states no usable price (the field missing, null, not a number,
not finite, zero or negative) gives no figure and a reason: the caller keeps the last good price and records
why. A number sent as a string is read as its number (as `models.finite_number` reads every figure): a price
read too high is safe for an upper bound, one dropped is not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from vast_harness.vast.models import finite_number

PRICE_FIELD = "dph_total"


class RowPrice(BaseModel):
    """What one row says the instance costs: `dph_usd` ($/h, positive and finite), or None and `reason`."""

    model_config = ConfigDict(frozen=True)

    dph_usd: float | None
    reason: str | None = None


def row_price(row: Mapping[str, Any]) -> RowPrice:
    """The row's `dph_total` as a positive finite $/h, or None with the reason it is not one. Never raises."""
    if PRICE_FIELD not in row:
        return RowPrice(dph_usd=None, reason=f"no {PRICE_FIELD} in the row")
    raw = row[PRICE_FIELD]
    if raw is None:
        return RowPrice(dph_usd=None, reason=f"{PRICE_FIELD} is null")
    number = finite_number(raw)
    if number is None:
        what = "not finite" if isinstance(raw, float) and not math.isfinite(raw) else "not a number"
        return RowPrice(dph_usd=None, reason=f"{PRICE_FIELD} is {what}: {_shown(raw)}")
    if number <= 0:
        return RowPrice(dph_usd=None, reason=f"{PRICE_FIELD} is not positive: {_shown(raw)}")
    return RowPrice(dph_usd=number)


def rows_of(body: Any, instance_id: int) -> list[Mapping[str, Any]]:
    """The rows of `instance_id` in a read's parsed body: a per-id read's `instances` (an object or a list) or a
    v1 list page's `instances`; rows of other ids, and bodies of any other shape, give none. Never raises."""
    if not isinstance(body, Mapping):
        return []
    rows = body.get("instances")
    if isinstance(rows, Mapping):
        rows = [rows]
    if not isinstance(rows, list):
        return []
    return [row for row in rows if isinstance(row, Mapping) and _same_id(row.get("id"), instance_id)]


def _same_id(value: Any, instance_id: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value == instance_id


def _shown(raw: Any) -> str:
    """The raw value for a record, short: a host-controlled string could be anything."""
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


__all__ = ["PRICE_FIELD", "RowPrice", "row_price", "rows_of"]
