"""What a later command of a kept host works with: the hold checked usable for it (held, not expired, this
machine's, this API's and account's), and the run spec that targets it (its API, its caps, its state and
evidence directories; a `--sim` hold's detached simulator and the key it was made with)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from vast_harness.errors import ConfigError
from vast_harness.kept.names import describe, listing
from vast_harness.run.hold import finish_hold
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.ledger import account_fingerprint
from vast_harness.state.process import ProcessId, this_host

KEPT_PROFILE = "kept"  # every command of a hold records this profile: `costs` groups the holds under it


def check_usable(store: HeldStore, record: HeldHost, command: str, *, locked: bool = False) -> None:
    """Refuse (exit 2, listing the held hosts) what `command` cannot work on: a hold of another machine, one
    still being set up or ending (`down` takes those), one past its deadline (its switch deletes it; `reap`
    proves it gone), one whose `--sim` simulator is gone (the hold ends here: its instance went with it).
    `locked`: the command holds the hold's lock (no `up` can be at work on it)."""
    name = record.name
    if record.machine != this_host():
        raise ConfigError(f"kept host {name!r} was made on {record.machine}, not this machine: its locks and "
                          f"clock are there; run `{command}` there. {listing()}")
    if record.sim and not sim_alive(record):
        finish_hold(store, record, proven=True, message="its simulator is gone")
        raise ConfigError(f"kept host {name!r} has ended: its simulator (pid {record.sim_pid}) is gone, and its "
                          f"instance with it. {listing()}")
    if record.expired() and not (command == "down" and record.state == "ending"):
        raise ConfigError(f"kept host {name!r} has expired: {describe(record)}. Its dead-man switch deletes the "
                          f"host; `vast-e2e reap` proves it gone and forgets it. {listing()}")
    if command == "down":
        return
    if record.state == "starting":
        busy = None if locked else store.busy(name)  # holding the lock ourselves, no `up` can be at work
        why = (f"its `up` (pid {busy.pid}) is still setting it up" if busy else
               "its `up` never finished (killed?), so it has no usable host; `vast-e2e down "
               f"{name}` deletes what it rented (else its switch does)")
        raise ConfigError(f"kept host {name!r} is not ready: {why}. {listing()}")
    if record.state == "ending":
        raise ConfigError(f"kept host {name!r} is ending ({record.message or 'down'}). {listing()}")


def sim_alive(record: HeldHost) -> bool:
    if record.sim_pid is None:
        return False
    return ProcessId(host=this_host(), pid=record.sim_pid, start=record.sim_pid_start).running() is not False


def held_spec(store: HeldStore, record: HeldHost, options: RunOptions,
              spec_of: Callable[[RunOptions], RunSpec] = resolve) -> RunSpec:
    """The spec of a command on `record`'s host: its API, caps, state and evidence directories; the key as any
    command reads it (a `--sim` hold's is its simulator's). An `--api-url` or a key of another target is
    refused: the hold is not theirs (exit 2)."""
    name = record.name
    if options.api_url is not None and (record.sim or options.api_url.rstrip("/") != record.api_url.rstrip("/")):
        raise ConfigError(f"kept host {name!r} is held on {'its own simulator' if record.sim else record.api_url}, "
                          f"not {options.api_url}: give no --api-url (the hold knows its API). {listing()}")
    given = options.model_copy(update={
        "sim": record.sim, "api_url": None if record.sim else record.api_url, "max_usd": record.max_usd,
        "max_minutes": record.max_minutes, "evidence_dir": Path(record.evidence_dir).parent,
        "state_dir": store.dir.parent})
    spec = spec_of(given)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"name": KEPT_PROFILE})})
    if record.sim:
        assert record.sim_key is not None
        return spec.model_copy(update={"api_url": record.api_url, "api_key": SecretStr(record.sim_key)})
    assert spec.api_key is not None
    if record.account is not None and account_fingerprint(spec.api_key.get_secret_value()) != record.account:
        raise ConfigError(f"kept host {name!r} belongs to the account whose key fingerprint is {record.account}; "
                          f"this key is another account's: give that key (--key-file or VAST_API_KEY). {listing()}")
    return spec
