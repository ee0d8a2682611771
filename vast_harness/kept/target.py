"""What a later command of a kept host works with: the hold checked usable for it (held, not expired, this
machine's, this API's and account's), and the run spec that targets it (its API, its caps, its state and
evidence directories; a `--sim` hold's detached simulator and the key it was made with)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import SecretStr

from vast_harness.console.output import Output
from vast_harness.errors import ConfigError, UnwritableDirError
from vast_harness.kept.names import describe, listing
from vast_harness.kept.watcher_proc import start_watcher
from vast_harness.masking import ACCOUNT_KEY, MASKER
from vast_harness.run.hold import HoldStages, finish_hold, hold_terms
from vast_harness.run.host_work import HostWork
from vast_harness.run.runner import GuardedRun
from vast_harness.spec.known_secrets import key_sha256, teach_key_file
from vast_harness.spec.profile import load_driver_policy
from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
from vast_harness.spec.values import check_evidence_dir
from vast_harness.state.held import HeldHost, HeldStore
from vast_harness.state.ledger import account_fingerprint
from vast_harness.state.process import ProcessId, this_host
from vast_harness.vast.client import VastClient

KEPT_PROFILE = "kept"  # every command of a hold records this profile: `costs` groups the holds under it
WATCH_WAIT_S = 600.0  # a command waits this long for the hold's watcher to finish with an outbid it found
FIRST_PUSH_S = 60.0  # from the host's onstart to the `up`'s first push of the idle deadline, at most
# What a command of an interruptible hold takes from its own flags; the rest is the `up`'s (its offer filters,
# image, --setup, the bid terms), so a replacement host is rented and set up as the `up` did
COMMAND_OWN = ("key_file", "poll_s", "pacing_scale", "proof_interval_s", "command", "workdir", "artifact", "exclude",
               "include", "workdir_max_mb", "remote_env", "remote_secret", "remote_secret_file")


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
    if command == "down":  # past its deadline too: it reads the instance, deletes what is there, proves it gone
        return
    if record.expired():
        raise ConfigError(f"kept host {name!r} is past its deadline: {describe(record)}. Its dead-man switch "
                          f"should have deleted the host by now, unless the switch could not act (stopped or killed "
                          f"on the host); `vast-e2e down {name}` reads it, deletes it if it is still there, proves it "
                          f"gone and ends the hold. {listing()}")
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
              spec_of: Callable[[RunOptions], RunSpec] = resolve,
              warn_instead: Callable[[str], None] | None = None) -> RunSpec:
    """The spec of a command on `record`'s host: its API, caps, state and evidence directories; the key as any
    command reads it (a `--sim` hold's is its simulator's). An `--api-url` or a key of another target is
    refused: the hold is not theirs (exit 2). So is a hold whose evidence directory cannot be used, or whose
    `up`'s key file no longer holds the key, unless `warn_instead` is told (what deletes: `down`, the watcher,
    goes on)."""
    name = record.name
    check_hold_evidence(record, warn_instead)
    if options.api_url is not None and (record.sim or options.api_url.rstrip("/") != record.api_url.rstrip("/")):
        raise ConfigError(f"kept host {name!r} is held on {'its own simulator' if record.sim else record.api_url}, "
                          f"not {options.api_url}: give no --api-url (the hold knows its API). {listing()}")
    options = bid_options(record, options)
    root = Path(record.evidence_dir).parent
    if warn_instead is not None:  # what deletes never stops at an evidence root gone wrong (a file in its place)
        try:
            check_evidence_dir(root, f"kept host {name}'s evidence root", consequence="")
        except UnwritableDirError:
            pass  # a full or read-only one: resolve warns, and the deletion goes on
        except ConfigError as exc:
            warn_instead(f"{exc}; this command's evidence goes to {store.dir.parent / record.hold_id} instead")
            root = store.dir.parent
    given = options.model_copy(update={
        "sim": record.sim, "api_url": None if record.sim else record.api_url, "max_usd": record.max_usd,
        "max_minutes": record.max_minutes, "evidence_dir": root, "state_dir": store.dir.parent})
    teach_key_file(record.key_file)  # before resolve selects the workdir: files holding it stay home
    spec = spec_of(given)
    check_hold_key(record, warn_instead)
    spec = spec.model_copy(update={"profile": spec.profile.model_copy(update={"name": KEPT_PROFILE})})
    if record.sim:
        assert record.sim_key is not None
        return spec.model_copy(update={"api_url": record.api_url, "api_key": SecretStr(record.sim_key)})
    assert spec.api_key is not None
    if record.account is not None and account_fingerprint(spec.api_key.get_secret_value()) != record.account:
        raise ConfigError(f"kept host {name!r} belongs to the account whose key fingerprint is {record.account}; "
                          f"this key is another account's: give that key (--key-file or VAST_API_KEY). {listing()}")
    return spec


def check_hold_evidence(record: HeldHost, on_unusable: Callable[[str], None] | None = None) -> None:
    """Every command of a hold writes its record and logs into the hold's one evidence directory."""
    evidence = Path(record.evidence_dir)
    try:
        check_evidence_dir(evidence, f"kept host {record.name}'s evidence directory",
                           consequence=f"kept host {record.name} stays held")
        for sub in ("steps", "remote"):  # where each command's logs and pulled files go
            if (evidence / sub).is_symlink() or ((evidence / sub).exists() and not (evidence / sub).is_dir()):
                raise ConfigError(f"kept host {record.name}'s evidence directory {evidence}: {sub}/ is not a "
                                  "directory")
    except ConfigError as exc:
        if on_unusable is None:
            raise ConfigError(f"{exc} (kept host {record.name} stays held; `vast-e2e down {record.name}` deletes it "
                              "all the same)") from None
        on_unusable(str(exc))


def check_hold_key(record: HeldHost, warn_instead: Callable[[str], None] | None = None) -> None:
    """The key in the `up`'s --key-file is masked, and files holding it stay home, in every later command: read
    again from its path, or known from this command's own key inputs (its --key-file, VAST_API_KEY). Known from
    neither (the file moved, rewritten or removed), a command would upload and print it: refused."""
    if record.key_file_sha256 is None:
        return
    if any(key_sha256(known) == record.key_file_sha256 for known in MASKER.values(ACCOUNT_KEY)):
        return
    problem = (f"kept host {record.name} was set up with --key-file {record.key_file}, which no longer holds that "
               "key (moved, rewritten or removed): files holding it would reach the host and show it in clear")
    if warn_instead is None:
        raise ConfigError(f"{problem}. Give --key-file with that key (kept host {record.name} stays held)")
    warn_instead(problem)


def bid_options(record: HeldHost, options: RunOptions) -> RunOptions:
    """An interruptible hold's command: the `up`'s options (recorded), with the command's own (`COMMAND_OWN`);
    another hold's, as given."""
    if not record.up_options:
        return options
    base = RunOptions.model_validate(record.up_options)
    own = {name: getattr(options, name) for name in COMMAND_OWN if getattr(options, name) is not None}
    return base.model_copy(update={**own, "command": options.command or ["true"], "dry_run": False})


def first_idle_s(spec: RunSpec, idle_s: float) -> int:
    """The host's first idle deadline, from its onstart: the idle time, and room for what comes before the `up`
    first pushes it: the SSH connect, the arrival check and the switch's arm probe (up to 50 s on Vast), then the
    receipt, as long as its budget and grace allow (a run's own, `run/receipt.py`)."""
    receipt = spec.profile.receipt
    receipt_s = receipt.budget_s + spec.timings.receipt_grace_s if receipt.enabled else 0.0
    return int(idle_s + min(FIRST_PUSH_S, spec.teardown_margin_s) + receipt_s)


def run_on_hold(spec: RunSpec, record: HeldHost, stages: HoldStages, out: Output,
                host_work: type[HostWork] = HostWork) -> int:
    """A later command of the hold as a guarded run on its instance; an interruptible hold's may rent a
    replacement after an outbid, its switch's first idle allowance as the `up`'s."""
    assert spec.api_key is not None
    idle_first_s = first_idle_s(spec, record.idle_s) if record.bid is not None else None
    stages.idle_first_s = idle_first_s
    with VastClient(spec.api_key.get_secret_value(), base_url=spec.api_url, pacing_scale=spec.pacing_scale) as client:
        run = GuardedRun(spec, client, load_driver_policy(), out, run_id=record.hold_id, host_work=host_work,
                         stages=stages, hold=hold_terms(record, spec.timings.teardown_budget,
                                                        idle_first_s=idle_first_s),
                         on_created=stages.on_created if record.bid is not None else None)
        code = run.execute().exit_code
    if record.bid is not None and stages.command != "watch":  # the watcher, started again if it died
        ensure_watcher(store_of(stages), record.name, pacing_scale=spec.pacing_scale)
    return code


def store_of(stages: HoldStages) -> HeldStore:
    return stages.store


def ensure_watcher(store: HeldStore, name: str, *, pacing_scale: float) -> None:
    """An interruptible hold still held (or outbid) has its watcher running (`kept/watch.py`); started here when
    it is not (the `up`'s, or one that died: `kill -9`, the laptop's sleep)."""
    fresh = store.load(name)
    if fresh is not None and fresh.state in ("held", "outbid"):
        start_watcher(store, fresh, pacing_scale=pacing_scale)
