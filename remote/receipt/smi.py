"""What `nvidia-smi` reports about each GPU: the PCIe link, clocks and clock-event reasons, power, temperature,
ECC and row-remap counters. One query per call, parsed field by field; a field the driver does not support
(`[N/A]`, `[Not Supported]`, an unknown field name on an older driver) is None with its raw text kept, never a
guess. Standard library only.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

SMI_TIMEOUT_S = 15.0

# NVML's nvmlClocksEventReason* bits (nvml.h; the same bits as the older nvmlClocksThrottleReason*): what
# `clocks_event_reasons.active` packs into one hex mask.
EVENT_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# The reasons that mean the GPU delivers less than it should under a full burn. A SW power cap is normal for a
# 700 W card under a full matmul (delivered.md: active in 97% of an H200 training run's samples): recorded only.
BAD_EVENT_REASONS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")

# Newer drivers name the mask clocks_event_reasons; older ones clocks_throttle_reasons (same bits).
_REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")

SAMPLE_FIELDS = ("index", "uuid", "clocks.sm", "clocks.max.sm", "power.draw", "temperature.gpu",
                 "pcie.link.gen.current", "pcie.link.width.current", "utilization.gpu")
LINK_MAX_FIELDS = ("pcie.link.gen.max", "pcie.link.width.max")
ECC_FIELDS = ("ecc.mode.current", "ecc.errors.uncorrected.volatile.total",
              "ecc.errors.uncorrected.aggregate.total", "ecc.errors.corrected.volatile.total",
              "retired_pages.pending")
REMAP_FIELDS = ("gpu_uuid", "remapped_rows.correctable", "remapped_rows.uncorrectable", "remapped_rows.pending",
                "remapped_rows.failure")


def available() -> bool:
    return shutil.which("nvidia-smi") is not None


def parse_value(raw: str) -> float | str | None:
    """A CSV cell: a number (units stripped by nounits), a word (`Enabled`, `Yes`, a hex mask), or None."""
    text = raw.strip()
    if not text or text.startswith("[") or text in {"N/A", "Not Supported"}:
        return None
    try:
        return float(text)
    except ValueError:
        return text


def as_int(value: float | str | None) -> int | None:
    """A cell that holds a whole number (an index, a link generation), else None."""
    return int(value) if isinstance(value, float) else None


def parse_mask(value: float | str | None) -> int | None:
    if isinstance(value, str):
        try:
            return int(value, 16) if value.lower().startswith("0x") else int(value)
        except ValueError:
            return None
    return int(value) if isinstance(value, float) else None


def reasons_of(mask: int | None) -> list[str]:
    if mask is None:
        return []
    return [name for name, bit in EVENT_REASON_BITS.items() if mask & bit]


def parse_rows(text: str, fields: Sequence[str]) -> list[dict[str, float | str | None]]:
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(fields):
            continue
        rows.append({f: parse_value(c) for f, c in zip(fields, cells, strict=True)})
    return rows


def _run(args: list[str], timeout_s: float = SMI_TIMEOUT_S) -> tuple[int, str]:
    try:
        proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, f"{type(exc).__name__}: {exc}"
    return proc.returncode, proc.stdout if proc.returncode == 0 else (proc.stdout + proc.stderr)


def query_gpu(fields: Sequence[str]) -> tuple[list[dict[str, float | str | None]], str | None]:
    """One `--query-gpu` of `fields` for every GPU, by index; (rows, None) or ([], why)."""
    if not available():
        return [], "nvidia-smi is not on PATH"
    rc, out = _run([f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"])
    if rc != 0:
        return [], f"nvidia-smi --query-gpu exit {rc}: {out.strip()[:300]}"
    return parse_rows(out, fields), None


def query_each(fields: Sequence[str]) -> tuple[list[dict[str, float | str | None]], dict[str, str]]:
    """Like `query_gpu`, but a field this driver refuses drops only itself: ({index: row}, {field: why})."""
    rows, why = query_gpu(("index", *fields))
    if why is None:
        return rows, {}
    refused: dict[str, str] = {}
    merged: dict[float | str | None, dict[str, float | str | None]] = {}
    for f in fields:
        part, err = query_gpu(("index", f))
        if err is not None:
            refused[f] = err
            continue
        for row in part:
            merged.setdefault(row["index"], {"index": row["index"]}).update(row)
    return list(merged.values()), refused


def reason_field() -> str | None:
    """The name this driver gives the clock-event mask, or None when it has neither."""
    for name in _REASON_FIELDS:
        rows, why = query_gpu(("index", name))
        if why is None and rows:
            return name
    return None


def remapped_rows() -> tuple[list[dict[str, float | str | None]], str | None]:
    if not available():
        return [], "nvidia-smi is not on PATH"
    rc, out = _run([f"--query-remapped-rows={','.join(REMAP_FIELDS)}", "--format=csv,noheader,nounits"])
    if rc != 0:
        return [], f"nvidia-smi --query-remapped-rows exit {rc}: {out.strip()[:300]}"
    return parse_rows(out, REMAP_FIELDS), None


@dataclass
class Sampler:
    """Samples `fields` (plus the clock-event mask) of every GPU every `interval_s` in a thread, while a
    measurement runs: `with Sampler(...) as s: burn()`, then `s.samples`. One nvidia-smi process per sample
    (not `-lms`: a process that buffers its output could keep it from us until it is killed)."""

    fields: Sequence[str] = SAMPLE_FIELDS
    interval_s: float = 0.5
    reason_name: str | None = None
    samples: list[dict[str, float | str | None]] = field(default_factory=list)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        if not available():
            self.error = "nvidia-smi is not on PATH"
            return self
        self._thread = threading.Thread(target=self._loop, name="receipt-smi", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(SMI_TIMEOUT_S + 1)

    def _loop(self) -> None:
        fields = (*self.fields, self.reason_name) if self.reason_name else tuple(self.fields)
        t0 = time.perf_counter()
        while not self._stop.is_set():
            started = time.perf_counter()
            rows, why = query_gpu(fields)
            if why is not None:
                self.error = why
                return
            for row in rows:
                row["t_s"] = round(started - t0, 3)
                if self.reason_name:
                    row["event_reasons"] = ",".join(reasons_of(parse_mask(row.pop(self.reason_name))))
                self.samples.append(row)
            self._stop.wait(max(0.0, self.interval_s - (time.perf_counter() - started)))
