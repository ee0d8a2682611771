"""The workload's sourced dense bf16 peaks (`remote/peaks.json`), read as data: which GPUs an MFU can be
measured on. The control plane never imports `remote/` (it ships to the host as files); the rows are matched
exactly as `remote/accounting/mfu.py` matches them: in order, every substring of `match_all` in the lower-cased name,
the first matching row decides, and a row with `tflops` 0 is known but unsourced (refused).
"""

from __future__ import annotations

import json
from functools import cache

from pydantic import BaseModel

from vast_harness.errors import ConfigError
from vast_harness.resources import data_root

PEAKS_FILE = ("remote", "peaks.json")


class PeakRow(BaseModel):
    match_all: list[str]
    tflops: float
    source: str = ""


class PeakTable(BaseModel):
    peaks: list[PeakRow]

    def row_for(self, gpu_name: str) -> PeakRow | None:
        """The first row whose every substring is in the lower-cased name (sourced or not); None if none."""
        name = gpu_name.lower()
        return next((row for row in self.peaks if all(n in name for n in row.match_all)), None)

    def sourced_tflops(self, gpu_name: str) -> float | None:
        """The sourced dense bf16 peak for this GPU name, or None (no row, or a row without a source)."""
        row = self.row_for(gpu_name)
        return row.tflops if row is not None and row.tflops > 0 else None


@cache
def load_peaks() -> PeakTable:
    path = data_root().joinpath(*PEAKS_FILE)
    try:
        return PeakTable.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        raise ConfigError(f"{path}: the sourced peak table cannot be read ({exc})") from None
