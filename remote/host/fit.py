"""The memory fit on the host that arrived: how each 1B run of the profile runs on this GPU, or that it cannot.

The harness decides the fit before renting, from the run's settings and its memory model (vast_harness/spec/fit.py,
docs/profiles.md#the-memory-fit), and hands the decision over as `HT_FIT`: per run, the options it may take in
order of preference and what each needs, `TAG=OPTION:GIB[,OPTION:GIB...]`, space-separated
(`dp2-mb8-compile=none:46.1,ckpt:26.7 replay=none:65.3,ckpt:39.8,compile+ckpt:26.7`). This module makes the
same decision against this host's GPUs (the smallest nvidia-smi `memory.total`, the unit of the offer's
`gpu_ram`): the first option whose need fits.

    python3 -m remote.host.fit flags TAG         print the run's extra flags; exit 3 if it fits in no option
    python3 -m remote.host.fit run TAG -- CMD    run CMD with those flags appended; exit 1 naming the need if
                                                 it fits in no option

Without `HT_FIT` (the sweep script run by hand) nothing is decided: `HT_ACT_CKPT=1` adds `--act-ckpt`, anything
else adds nothing. Standard library only, like all of remote/host.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

from remote.receipt import smi

HOST_VAR = "HT_FIT"
MIB_PER_GIB = 1024
DOES_NOT_FIT = 3  # `flags`' exit code when the run fits in no option: a sweep drops it
OPTION_FLAGS = {"none": [], "ckpt": ["--act-ckpt"], "compile+ckpt": ["--compile", "--act-ckpt"]}


class FitError(ValueError):
    """HT_FIT is malformed: the harness wrote something this module does not read."""


def parse(value: str) -> dict[str, list[tuple[str, float]]]:
    """HT_FIT -> {tag: [(option, GiB), ...]} in the harness's order of preference."""
    runs: dict[str, list[tuple[str, float]]] = {}
    for entry in value.split():
        tag, sep, rest = entry.partition("=")
        options = []
        for item in rest.split(","):
            option, colon, gib = item.partition(":")
            if not (sep and colon and option in OPTION_FLAGS):
                raise FitError(f"{HOST_VAR}: cannot read {entry!r} (TAG=OPTION:GIB[,...], options "
                               f"{', '.join(OPTION_FLAGS)})")
            try:
                options.append((option, float(gib)))
            except ValueError:
                raise FitError(f"{HOST_VAR}: {entry!r}: {gib!r} is not a number of GiB") from None
        runs[tag] = options
    return runs


def gpu_memory_gib() -> tuple[float | None, str]:
    """The smallest GPU's nvidia-smi memory.total in GiB, or (None, why not)."""
    rows, why = smi.query_gpu(("memory.total",))
    sizes = [r["memory.total"] for r in rows if isinstance(r["memory.total"], float)]
    if why is not None or not sizes:
        return None, why or "nvidia-smi reported no memory.total"
    return min(sizes) / MIB_PER_GIB, ""


def decide(tag: str, env: Mapping[str, str], memory_gib: float | None) -> tuple[list[str] | None, str]:
    """(the run's extra flags, or None where it fits in no option; what was decided, in a sentence)."""
    value = env.get(HOST_VAR, "").strip()
    if not value:
        ckpt = env.get("HT_ACT_CKPT", "0").strip() == "1"
        return (["--act-ckpt"] if ckpt else []), f"{tag}: no {HOST_VAR}; HT_ACT_CKPT={env.get('HT_ACT_CKPT', '0')}"
    options = parse(value).get(tag)
    if not options:
        raise FitError(f"{HOST_VAR} has no entry for {tag!r}: the harness did not plan this run")
    if memory_gib is None:  # nothing to compare with: the option that needs least
        option, gib = min(options, key=lambda o: o[1])
        return OPTION_FLAGS[option], f"{tag}: GPU memory unknown; {option} (needs {gib:.1f} GiB), the least"
    for option, gib in options:
        if gib <= memory_gib:
            return OPTION_FLAGS[option], f"{tag}: {option} (needs {gib:.1f} GiB of {memory_gib:.1f} GiB per GPU)"
    least = min(gib for _, gib in options)
    return None, (f"{tag}: needs {least:.1f} GiB per GPU at least "
                  f"({', '.join(f'{o} {g:.1f}' for o, g in options)}); this GPU has {memory_gib:.1f} GiB")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] in ("flags", "run"):
        tag, rest = argv[1], argv[2:]
        if argv[0] == "run" and (not rest or rest[0] != "--" or len(rest) < 2):
            print("usage: python3 -m remote.host.fit run TAG -- CMD [ARGS...]", file=sys.stderr)
            return 2
        memory, why = gpu_memory_gib()
        if memory is None:
            print(f"fit: {why}", file=sys.stderr)
        try:
            flags, said = decide(tag, os.environ, memory)
        except FitError as exc:
            print(f"fit: {exc}", file=sys.stderr)
            return 2
        print(f"fit: {said}", file=sys.stderr)
        if argv[0] == "flags":
            if flags is None:
                return DOES_NOT_FIT
            print(" ".join(flags))
            return 0
        if flags is None:
            print("fit: this host cannot run it: the offer's GPU memory was quoted larger than this host has",
                  file=sys.stderr)
            return 1
        sys.stdout.flush()
        sys.stderr.flush()
        os.execvp(rest[1], [*rest[1:], *flags])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
