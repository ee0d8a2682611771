"""Vast instance states as data, and `--boot-seconds` as time progression.

A created instance walks `null -> loading -> running` (`docs/vast-behaviours.md`). The walk is the
table `BOOT_PATH`: each step names the share of the boot time at which it is reached. `running` is
reached by an event (the boot timer fires, the host's onstart starts), not by a read, so a reader never
sees `running` before the SSH endpoint accepts connections. Faults and the create body can leave the
walk: `stopped` (a create error that still created, or `target_state: stopped`), `offline` (the host
vanished), `exited` (the container ended), `created` with an error in `status_msg` (the container could
not start), or a boot that never completes (stuck in `loading`). A destroyed instance lingers for a while
as a `destroyed` row (intended `destroyed`, cur_state `unloaded`) before reads stop showing it.
"""

from __future__ import annotations

from dataclasses import dataclass

RUNNING = "running"
LOADING = "loading"
STOPPED = "stopped"
OFFLINE = "offline"
EXITED = "exited"
CREATED = "created"  # the contract exists but the container failed to start (status_msg says why)
ERROR = "error"  # terminal for Vast's own QA tool (base-image test_template.py TERMINAL_STATES)
# On-demand creates pass through "Scheduling" (vast-ai/docs PR 951). The documented `actual_status` enum has no
# `scheduling`; manage-instances.mdx: a restart "enters SCHEDULING status" from stopped. The simulator shows the
# phase as `stopped` with intended_status `running` (the scheduling fault).
DESTROYED = "destroyed"  # a destroyed instance's row while it lingers (vast-cli tests model this shape)


@dataclass(frozen=True)
class Step:
    """`status` holds from `at_share` × boot_seconds after create until the next step."""

    status: str | None
    at_share: float


# null for the first tenth of the boot (the read lags the create), loading for the rest (image pull), then running.
BOOT_PATH: tuple[Step, ...] = (Step(None, 0.0), Step(LOADING, 0.1), Step(RUNNING, 1.0))

# States that bill storage only (GPU compute stopped) and the ones that bill nothing. A pending instance (null,
# loading, scheduling) bills storage only too: GPU from `running` (billing.mdx "active/connected";
# manage-instances.mdx "Not charged during loading").
STORAGE_ONLY_STATUSES = frozenset({STOPPED, EXITED, ERROR})
UNBILLED_STATUSES = frozenset({OFFLINE})


def pending_status(elapsed_s: float, boot_s: float) -> str | None:
    """The status a not-yet-booted instance shows `elapsed_s` after create (never `running`)."""
    status: str | None = None
    for step in BOOT_PATH:
        if step.status == RUNNING:
            break
        if elapsed_s >= step.at_share * boot_s:
            status = step.status
    return status


def boot_delay_s(boot_s: float) -> float:
    """Seconds after create at which the instance reaches `running`."""
    return BOOT_PATH[-1].at_share * max(0.0, boot_s)


def contract_states(actual_status: str | None, *, scheduling: bool = False) -> dict[str, str | None]:
    """intended/cur/next states that go with an actual status (dstack reads all three on stop); `scheduling`:
    stopped on its way to running."""
    if actual_status == STOPPED and scheduling:
        return {"intended_status": RUNNING, "cur_state": STOPPED, "next_state": RUNNING}
    if actual_status == STOPPED:
        return {"intended_status": STOPPED, "cur_state": STOPPED, "next_state": STOPPED}
    if actual_status == DESTROYED:  # released on destroy (show-instance docs: `unloaded`)
        return {"intended_status": DESTROYED, "cur_state": "unloaded", "next_state": "unloaded"}
    if actual_status == EXITED:
        return {"intended_status": RUNNING, "cur_state": STOPPED, "next_state": STOPPED}
    return {"intended_status": RUNNING, "cur_state": RUNNING, "next_state": RUNNING}
