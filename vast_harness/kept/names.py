"""Which kept hosts there are, and the one that a command names: found in the user's state directory (real holds)
or its `sim/` part (`--sim` holds), never both; every refusal (exit 2) lists the held hosts."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from vast_harness.errors import ConfigError
from vast_harness.state.dirs import SIM_SUBDIR, state_dir
from vast_harness.state.held import HeldHost, HeldStore, check_name


def stores(environ: Mapping[str, str] | None = None) -> list[HeldStore]:
    """The real holds' store, then the `--sim` holds'."""
    home = state_dir(os.environ if environ is None else environ).expanduser()
    return [HeldStore(home), HeldStore(home / SIM_SUBDIR)]


def held_hosts(environ: Mapping[str, str] | None = None) -> list[tuple[HeldStore, HeldHost]]:
    return [(store, record) for store in stores(environ) for record in store.all()]


def describe(record: HeldHost) -> str:
    """One held host for a list: its name, where, its state and when it ends on its own."""
    left_s = record.left_s()
    where = "simulated" if record.sim else record.api_url
    inst = f"instance {record.instance_id}" if record.instance_id is not None else "no instance yet"
    if record.state == "ending":
        return f"{record.name} ({inst}, {where}): ending, {record.message or 'not proven gone'}"
    ends = (f"{record.why_deadline()} deadline in {_span(left_s)}" if left_s > 0 else
            f"expired {_span(-left_s)} ago ({record.why_deadline()})")
    return f"{record.name} ({inst}, {where}, {record.state}): {ends}"


def listing(environ: Mapping[str, str] | None = None) -> str:
    found = held_hosts(environ)
    if not found:
        return "no kept host is held (`vast-e2e up NAME` makes one)"
    return "held: " + "; ".join(describe(r) for _, r in found)


def find(name: str, environ: Mapping[str, str] | None = None) -> tuple[HeldStore, HeldHost]:
    """The kept host `name`; ConfigError (exit 2) listing the held ones when there is none by that name."""
    check_name(name)
    for store in stores(environ):
        record = store.load(name)
        if record is not None:
            return store, record
    raise ConfigError(f"no kept host {name!r}: {listing(environ)}")


def refuse_held(name: str, environ: Mapping[str, str] | None = None) -> None:
    """`up NAME` for a name that is held already (real or simulated): exit 2, listing them."""
    check_name(name)
    for store in stores(environ):
        if store.path(name).exists():
            raise ConfigError(f"{name!r} is already a kept host; `vast-e2e down {name}` ends it, or pick another "
                              f"name. {listing(environ)}")


def _span(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def utc(unix: float | None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix)) if unix else "?"
