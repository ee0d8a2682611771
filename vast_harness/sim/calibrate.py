"""The simulator's timings from a canary's measurements (`vast-e2e canary` writes canary.json).

`python -m vast_harness.sim --calibrate canary.json` starts the simulator with the measured read lag (a
`read_lag` fault on every create), linger (`--linger-seconds`), boot time (`--boot-seconds`) and, from a
`canary --interruptible`, the rate of the copy off a stopped instance (`--copy-bytes-per-s`), so tests and
the chaos suite can run on one account's real numbers instead of our guesses. Reads the JSON only: the
simulator imports nothing of the harness.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class CalibrationError(ValueError):
    """canary.json is missing, unreadable, or holds no usable measurement."""


@dataclass(frozen=True)
class Calibration:
    source: str
    boot_seconds: float | None  # create answered -> running
    linger_seconds: float | None  # a destroyed row readable for this long (0: null at once)
    read_lag_seconds: float | None  # create answered -> the later of the first per-id read and list row
    copy_bytes_per_s: float | None = None  # the copy off a stopped instance (canary --interruptible)

    def fault_items(self) -> list[str]:
        """SPEC items the measurement implies (to join a --faults plan)."""
        return [f"read_lag:{self.read_lag_seconds:.3f}:*"] if self.read_lag_seconds else []

    def describe(self) -> str:
        def s(v: float | None) -> str:
            return "not measured" if v is None else f"{v:g} s"
        copy = "not measured" if self.copy_bytes_per_s is None else f"{self.copy_bytes_per_s:.0f} B/s"
        return (f"calibrated from {self.source}: boot {s(self.boot_seconds)}, read lag {s(self.read_lag_seconds)}, "
                f"linger {s(self.linger_seconds)}, copy {copy}")


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def load(path: str | Path) -> Calibration:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CalibrationError(f"--calibrate {path}: cannot read a canary.json ({exc})") from None
    if not isinstance(data, dict) or data.get("schema_version") != 1:
        raise CalibrationError(f"--calibrate {path}: not a canary.json of schema_version 1")
    raw_lag = data.get("read_lag")
    lag: dict[str, Any] = raw_lag if isinstance(raw_lag, dict) else {}
    lags = [v for v in (_seconds(lag.get("per_id_s")), _seconds(lag.get("list_s"))) if v is not None]
    raw_bid = data.get("interruptible")
    bid: dict[str, Any] = raw_bid if isinstance(raw_bid, dict) else {}
    rate = _seconds(bid.get("copy_bytes_per_s"))  # a non-negative finite number, as the seconds are
    cal = Calibration(source=str(path), boot_seconds=_seconds(data.get("boot_s")),
                      linger_seconds=_seconds(data.get("linger_s")), read_lag_seconds=max(lags) if lags else None,
                      copy_bytes_per_s=rate or None)
    if cal.boot_seconds is None and cal.linger_seconds is None and cal.read_lag_seconds is None:
        raise CalibrationError(f"--calibrate {path}: the canary measured nothing usable (did it boot?)")
    return cal
