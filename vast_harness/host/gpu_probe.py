"""Read the GPUs of the host that arrived: one `nvidia-smi` query over SSH, bounded in time and bytes.

The host is not ours to trust: it may lie (another GPU than the offer said), flood (an endless answer) or say
nothing. The read keeps at most MAX_OUTPUT_BYTES and MAX_GPUS rows and stops the command past them; every
field must have its shape (a number of MiB, a dotted driver version) or the row is unreadable, which counts
as a mismatch upstream (host/gpu_match.py): the run never proceeds on a host it could not read.
"""

from __future__ import annotations

import re
import threading

from pydantic import BaseModel, Field

from vast_harness.host.ssh import HostSession
from vast_harness.records import HostGpu

GPU_QUERY = "nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader"
_HEADER_MARK = "VH-SMI-HEADER"
# The CUDA version is in nvidia-smi's header only (no --query-gpu field on older drivers); the first lines hold it.
COMMAND = f"{GPU_QUERY}; echo {_HEADER_MARK}; nvidia-smi 2>&1 | head -n 12"
MAX_OUTPUT_BYTES = 64 * 1024  # 16 GPUs' rows and a header are ~3 KB; a host sending more is flooding
MAX_GPUS = 16  # Vast's most GPUs per offer
MAX_NAME_CHARS = 96
READ_TIMEOUT_S = 30.0

_MEMORY_RE = re.compile(r"^(\d{1,7}) MiB$")
_DRIVER_RE = re.compile(r"^\d{2,4}(\.\d{1,4}){1,3}$")
_CAP_RE = re.compile(r"^\d{1,2}\.\d{1,2}$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._()/+-]*$")
_CUDA_RE = re.compile(r"CUDA Version:\s*(\d{1,3}\.\d{1,2})\b")


class GpuRead(BaseModel):
    """The host's answer, parsed: its GPUs and CUDA, or what was wrong with the answer."""

    gpus: list[HostGpu] = Field(default_factory=list)
    cuda_version: str | None = None
    problems: list[str] = Field(default_factory=list)  # the answer could not be read as GPUs: refused
    answered: bool = True  # False: no exit status came back (the link was lost, the read timed out)


def parse_answer(lines: list[str]) -> GpuRead:
    """The query's rows (before the header mark) and the CUDA version (after it). Pure; hostile text in."""
    read = GpuRead()
    mark = lines.index(_HEADER_MARK) if _HEADER_MARK in lines else len(lines)
    rows, header = [line.strip() for line in lines[:mark] if line.strip()], lines[mark + 1:]
    if len(rows) > MAX_GPUS:
        read.problems.append(f"nvidia-smi listed {len(rows)} GPUs (more than {MAX_GPUS}: not a Vast host's answer)")
        rows = rows[:MAX_GPUS]
    for row in rows:
        gpu = _parse_row(row)
        if isinstance(gpu, str):
            read.problems.append(gpu)
        else:
            read.gpus.append(gpu)
    if not rows:
        read.problems.append("nvidia-smi listed no GPU")
    found = next((m for line in header[:12] if (m := _CUDA_RE.search(line[:400]))), None)
    if found:
        read.cuda_version = found.group(1)
    else:
        read.problems.append("nvidia-smi's header names no CUDA version")
    return read


def _parse_row(row: str) -> HostGpu | str:
    """One `name, memory, driver, compute_cap` row, or why it is not one (the row quoted, cut short)."""
    shown = repr(row[:120])
    fields = [f.strip() for f in row.split(",")]
    if len(fields) != 4:
        return f"nvidia-smi row {shown} is not name, memory.total, driver_version, compute_cap"
    name, memory, driver, cap = fields
    found = _MEMORY_RE.match(memory)
    if not (_NAME_RE.match(name) and len(name) <= MAX_NAME_CHARS):
        return f"nvidia-smi row {shown}: the GPU name is not one"
    if not found:
        return f"nvidia-smi row {shown}: memory.total is not a number of MiB"
    if not _DRIVER_RE.match(driver):
        return f"nvidia-smi row {shown}: driver_version is not a version"
    return HostGpu(name=name, memory_mib=int(found.group(1)), driver_version=driver,
                   compute_cap=cap if _CAP_RE.match(cap) else None)


def read_gpus(session: HostSession, *, timeout_s: float = READ_TIMEOUT_S) -> GpuRead:
    """Ask the host once; its answer parsed, or the problems (no answer, flooding, cut off) that refuse it."""
    lines: list[str] = []
    kept = [0]
    flood = threading.Event()

    def keep(stream: str, line: str) -> None:
        if stream != "stdout" or flood.is_set():
            return
        kept[0] += len(line) + 1
        if kept[0] > MAX_OUTPUT_BYTES:
            flood.set()  # ends the wait: the channel is closed, nothing more is read
            return
        lines.append(line)

    outcome = session.run(COMMAND, on_line=keep, timeout_s=max(1.0, timeout_s), stop=flood)
    if flood.is_set():
        return GpuRead(problems=[f"nvidia-smi answered more than {MAX_OUTPUT_BYTES} bytes (flooding): refused"])
    if outcome.rc is None:
        return GpuRead(problems=[f"nvidia-smi did not answer: {outcome.detail or 'no exit status'}"], answered=False)
    read = parse_answer(lines)
    if outcome.rc != 0 and not read.gpus:
        read.problems.insert(0, f"nvidia-smi exited {outcome.rc}")
    return read
