"""The simulator's state and rules, with no HTTP: accounts, the market, instances, hosts, billing.

One seeded `random.Random` draws the market, ids, instance keys and (unless a fault spec names its
own seed) fault probabilities. One lock guards the state; slow work (killing a host's processes,
closing its SSH ports) happens outside it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import paramiko

from vast_harness.sim import errors, transitions
from vast_harness.sim.copyd import CopyDaemon
from vast_harness.sim.faults import RECEIPT_KINDS, FaultPlan, FaultRule
from vast_harness.sim.gpus import install_nvidia_smi, install_receipt
from vast_harness.sim.hostpython import RefusingPort, make_host_python
from vast_harness.sim.instances import INCREASE_FIELDS, MAX_EXEC_TIMES, Instance, PriceIncrease, list_page, render
from vast_harness.sim.market import generate_offers, priced, search
from vast_harness.sim.ratelimit import RateLimiter
from vast_harness.sim.sandbox import (
    OwnedRoot,
    Sandbox,
    SandboxClosed,
    container_env,
    marker_for,
    reap_dead_simulators,
    ssh_session_env,
)
from vast_harness.sim.sshhost import SshHost

MIN_DISK_GB = 8.0
MAX_ONSTART_ARGS_CHARS = 4096
MAX_LABEL_CHARS = 256
OTHER_RENTER = -1  # the account index recorded when "someone else" rented an offer (offer_taken)
# Seconds a destroyed instance's row stays readable (per-id read and v1 list) as destroyed/unloaded. The sourced
# shape is none: `{"instances": null}` right after destroy (vast-cli PR 405); a lingering row (a CLI test mock's
# shape) is the option `--linger-seconds S` and the fault `linger`.
DEFAULT_LINGER_S = 0.0
# At a balance <= $0 Vast stops the account's instances at once; deletion comes after a grace, and only without a
# saved card (billing.mdx: "stopped automatically ... a short grace period ... before deletion occurs ... If you do
# not have a credit card saved ... destroyed"). How long the grace is is not documented.
NEGATIVE_GRACE_S = 1.0
ERROR_STATUS_MSG = "Error response from daemon: failed to create task for container: unexpected EOF"
SHOW_SHAPES = ("object", "list")  # the per-id read: docs/dstack's object, or Vast's QA tool's list without ports
NEGATIVE_BALANCE_USD = 0.5  # how far below $0 the negative_balance fault takes the account
OCI_FAIL_MSG = ("Error: container failed to start: OCI runtime create failed: runc create failed: unable to "
                "start container process: error during container init")
RELIST_EXTENSION_S = 86_400.0  # a host raising its price re-lists at least this far past the contract's end
MANIFEST_MSG = "Error response from daemon: manifest for {image} not found: manifest unknown"


@dataclass
class Account:
    index: int
    key: str
    user_id: int
    ssh_keys: list[dict[str, Any]] = field(default_factory=list)
    charged_usd: float = 0.0  # credit taken outside instance billing (the credit_zero fault)
    grace_until: float = 0.0  # a negative balance is tolerated until then (the negative_balance fault)


@dataclass(frozen=True)
class Identity:
    """Who is calling: an account, an instance's CONTAINER_API_KEY, or nobody (search only)."""

    account: Account | None
    container_of: int | None = None  # instance id, for a CONTAINER_API_KEY
    client_ip: str = "127.0.0.1"

    @property
    def rate_key(self) -> str:
        if self.container_of is not None:
            return f"container:{self.container_of}"
        return f"account:{self.account.index}" if self.account else f"ip:{self.client_ip}"


class Backend:
    def __init__(self, seed: int = 0, boot_seconds: float = 0.0, faults: Any = None, num_offers: int = 300,
                 rate_scale: float = 1.0, api_keys: list[str] | None = None, credit_usd: float = 100.0,
                 host_root: str | Path | None = None, linger_seconds: float = DEFAULT_LINGER_S,
                 show_shape: str = "object", card_saved: bool = False, key_reset_s: float | None = None,
                 host_network: bool = False, copy_bytes_per_s: float | None = None) -> None:
        """`show_shape`: "object" (`{"instances": {...}}` with ports: the docs, dstack) or "list"
        (`{"instances": [{...}]}` without ports: base-image test_template.py). `card_saved`: the account has a card
        on file, so a negative balance stops its instances but Vast never destroys them. `key_reset_s`: every
        instance's authorized keys are refreshed this long after it runs (Vast: "between 9 and 18 hours in";
        scale it down), as the `key_reset` fault does for chosen instances. `host_network`: the hosts' pip may
        download (off by default: sim/hostpython.py). `copy_bytes_per_s`: the copy off an instance's rate (None:
        unthrottled; a canary measures it)."""
        if show_shape not in SHOW_SHAPES:
            raise ValueError(f"show_shape must be one of {SHOW_SHAPES}, got {show_shape!r}")
        self.seed, self.boot_s, self.credit_usd = seed, max(0.0, boot_seconds), credit_usd
        self.linger_s = max(0.0, linger_seconds)
        self.show_shape, self.card_saved = show_shape, card_saved
        self.key_reset_s = key_reset_s
        self.host_network = host_network
        self.copy_bytes_per_s = copy_bytes_per_s if copy_bytes_per_s and copy_bytes_per_s > 0 else None
        self.refusing_port = RefusingPort()  # where an offline host's pip is sent: refused at once
        self.rng = random.Random(seed)
        self.lock = threading.RLock()
        self.limiter = RateLimiter(rate_scale)
        self.faults = FaultPlan.parse(faults, self.rng)
        self.api_keys = list(api_keys) if api_keys else None
        # What simulators killed -9 left: their hosts' processes (switches retrying for ever) and sandboxes
        reap_dead_simulators()
        self._own_root: OwnedRoot | None = None
        if host_root is None:
            self._own_root = OwnedRoot()
            self.host_root = self._own_root.path
        else:
            self.host_root = Path(host_root)
        self.host_root.mkdir(parents=True, exist_ok=True)
        self.host_key = paramiko.ECDSAKey.generate()  # fast to make; one per simulator, like a host's
        self.offers = generate_offers(self.rng, num_offers, time.time())
        self.offers_by_id = {o["id"]: o for o in self.offers}
        self.rented: dict[int, tuple[int, int | None]] = {}  # offer id -> (account index, instance id)
        self.accounts: dict[str, Account] = {}
        self.instances: dict[int, Instance] = {}
        self.container_keys: dict[str, int] = {}
        self.calls: list[dict[str, Any]] = []
        self.server_errors: list[str] = []  # exceptions the HTTP server caught (a simulator bug), newest last
        self._next_instance_id = self.rng.randint(20_000_000, 30_000_000)
        self._next_key_id = 1000
        self._next_increase_id = 5_000  # counted, not drawn: a fault firing must not shift the seeded ids
        self._copyd: CopyDaemon | None = None  # made at the first copy asked for
        for key in self.api_keys or []:
            self._account(key)

    # ----- accounts and identity -------------------------------------------------------------
    def _account(self, key: str) -> Account:
        account = self.accounts.get(key)
        if account is None:
            index = len(self.accounts)
            account = Account(index, key, user_id=300_000 + index)
            self.accounts[key] = account
        return account

    def identify(self, key: str | None, client_ip: str) -> Identity | None:
        """The caller for a key; None for an unknown key. An empty key is anonymous."""
        if not key:
            return Identity(None, client_ip=client_ip)
        with self.lock:
            if key in self.container_keys:
                if self.instances[self.container_keys[key]].container_key_refused:
                    return None  # the container_key_refused fault: an unknown key, 401
                return Identity(None, container_of=self.container_keys[key], client_ip=client_ip)
            if self.api_keys is not None and key not in self.api_keys:
                return None
            return Identity(self._account(key), client_ip=client_ip)

    def credit(self, account: Account, now: float) -> float:
        spent = sum(i.billed_usd(now) for i in self.instances.values() if i.account == account.index)
        return self.credit_usd - spent - account.charged_usd

    def user(self, account: Account) -> dict[str, Any]:
        with self.lock:
            credit = self.credit(account, time.time())
            ssh_key = account.ssh_keys[-1]["key"] if account.ssh_keys else ""
            return {"id": account.user_id, "key_id": 50_000 + account.index, "username": f"sim{account.index}",
                    "email": f"sim{account.index}@example.invalid", "fullname": None, "credit": credit,
                    "balance": credit, "ssh_key": ssh_key, "sid": f"sim-{account.index}",
                    "can_pay": credit > 0, "has_billing": True, "billed_verified": True}

    # ----- ssh keys --------------------------------------------------------------------------
    def _new_key(self, account: Account, public_key: str) -> dict[str, Any]:
        self._next_key_id += 1
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return {"id": self._next_key_id, "user_id": account.user_id, "key": public_key.strip(),
                "public_key": public_key.strip(), "created_at": stamp, "deleted_at": None}

    def add_account_key(self, account: Account, public_key: str) -> dict[str, Any]:
        with self.lock:
            entry = self._new_key(account, public_key)
            account.ssh_keys.append(entry)
            return entry

    def add_instance_key(self, account: Account, instance_id: int, public_key: str) -> None:
        with self.lock:
            inst = self._owned(account, instance_id)
            if inst is None:
                raise errors.no_such_instance()
            inst.ssh_keys.append(self._new_key(account, public_key))

    def instance_keys(self, account: Account, instance_id: int) -> list[dict[str, Any]]:
        with self.lock:
            inst = self._owned(account, instance_id)
            if inst is None:
                raise errors.no_such_instance()
            return [{"id": k["id"], "name": f"key-{k['id']}", "public_key": k["key"]} for k in inst.ssh_keys]

    def _authorized(self, instance_id: int, blob: str) -> bool:
        with self.lock:
            inst = self.instances.get(instance_id)
            if inst is None or not inst.live:
                return False
            account = next(a for a in self.accounts.values() if a.index == inst.account)
            keys = account.ssh_keys + inst.ssh_keys
            return any(blob in k["key"].split() for k in keys)

    # ----- market ----------------------------------------------------------------------------
    def search(self, body: dict[str, Any]) -> list[dict[str, Any]]:
        with self.lock:
            market = [dict(o, rented=True, rentable=False) if o["id"] in self.rented else o for o in self.offers]
        return search(market, body)

    # ----- lifecycle -------------------------------------------------------------------------
    def _owned(self, account: Account | None, instance_id: int) -> Instance | None:
        inst = self.instances.get(instance_id)
        if inst is None or account is None or inst.account != account.index:
            return None
        return inst

    def create(self, account: Account, offer_id: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(status, body) of PUT /asks/{offer_id}/; raises SimHTTPError for plain errors."""
        req = _CreateRequest.parse(offer_id, body)
        hold = self.faults.take("create_hold")
        if hold is not None:  # the server holds the request; the instance appears when it is done
            time.sleep(hold.seconds or 0.0)
        with self.lock:
            offer = self.offers_by_id.get(offer_id)
            if offer is None:
                raise errors.no_such_ask_404(offer_id)
            if self.faults.take("offer_taken") and offer_id not in self.rented:
                self.rented[offer_id] = (OTHER_RENTER, None)
            if offer_id in self.rented or not offer["rentable"]:
                raise errors.no_such_ask_410(offer_id) if req.cancel_unavail else errors.no_such_ask_404(offer_id)
            if req.disk_gb > offer["disk_space"]:
                raise errors.invalid_args(f"error 400/3467: Invalid args: disk {req.disk_gb} GB exceeds the "
                                          f"offer's {offer['disk_space']} GB", ask_id=offer_id)
            now = time.time()
            if self.credit(account, now) <= 0:
                raise errors.invalid_args("error 400/3470: insufficient credit", ask_id=offer_id)
            underbid = req.price is not None and req.price < offer["min_bid"]
            stopped_fault = self.faults.take("create_stopped")
            inst = self._new_instance(account, offer, req, now)
            shortened = self.faults.take("contract_end")
            if shortened is not None:  # the host moved its offer's end date in after the caller's search
                offer["end_date"] = inst.end_date = inst.offer["end_date"] = now + (shortened.seconds or 0.0)
            reprice = self.faults.take("reprice_offer")
            if reprice is not None:  # the host re-listed at a new price after the caller's search
                for key in ("dph_base", "dph_total", "min_bid"):
                    inst.offer[key] = inst.offer[key] * (reprice.factor or 1.0)
            if underbid or stopped_fault or req.target_state == transitions.STOPPED:
                inst.status_override = transitions.STOPPED
            elif self.faults.take("boot_stall"):
                inst.never_boots = True
            elif self.faults.take("double_accept"):
                inst.unreachable = True
            elif self.faults.take("error_status"):
                inst.boot_error, inst.error_status = ERROR_STATUS_MSG, True
            elif self.faults.take("oci_fail"):
                inst.boot_error = OCI_FAIL_MSG
            elif self.faults.take("manifest_missing"):
                inst.boot_error = MANIFEST_MSG.format(image=req.image)
            inst.container_key_refused = self.faults.take("container_key_refused") is not None
            inst.gpu_lie = self.faults.take("gpu_mismatch") is not None
            for kind in RECEIPT_KINDS:  # what its receipt will lie about (sim/host_receipt.py)
                rule = self.faults.take(kind)
                if rule is not None:
                    inst.receipt_faults[kind] = (rule.seconds or 0.0) if kind == "throttle" else (rule.factor or 1.0)
            # its receipt's noise: replayable from the simulator's seed, without a draw that moves later ones
            inst.receipt_seed = random.Random(f"{self.seed}-{inst.id}").getrandbits(32)
            scheduling = self.faults.take("scheduling")
            inst.scheduling_s = scheduling.seconds or 0.0 if scheduling is not None else 0.0
            earlier = self.faults.take("started_earlier")
            inst.started_earlier_s = earlier.seconds or 0.0 if earlier is not None else 0.0
            lag = self.faults.take("read_lag")
            inst.read_lag_until = now + (lag.seconds or 0.0) if lag else 0.0
            early_outbid = self.faults.take("outbid_boot") if inst.is_bid and inst.status_override is None else None
            self.rented[offer_id] = (account.index, inst.id)
            self.instances[inst.id] = inst
            self.container_keys[inst.api_key] = inst.id
        self._start_host(inst)
        if early_outbid is not None:  # outbid before it runs: paused while it loads
            self._schedule(inst, early_outbid.seconds or 0.0, self._outbid)
        gateway = self.faults.take("create_5xx")
        if gateway is not None:  # created, then the gateway in front answers an error page
            raise errors.gateway_error(self.faults.draw_status(gateway))
        if underbid or stopped_fault:
            return 400, {"success": False, "error": "invalid_price", "ask_id": offer_id,
                         "msg": f"error 400/3471: bid too low for ask {offer_id}; instance created stopped",
                         "new_contract": inst.id}
        named = inst.id
        if self.faults.take("wrong_contract") is not None:  # the answer names another of the account's instances
            with self.lock:
                others = [i.id for i in self.instances.values()
                          if i.account == account.index and i.id != inst.id and i.live]
            named = min(others) if others else inst.id
        return 200, {"success": True, "new_contract": named, "instance_api_key": inst.api_key}

    def _new_instance(self, account: Account, offer: dict[str, Any], req: _CreateRequest,
                      now: float) -> Instance:
        self._next_instance_id += self.rng.randint(1, 97)
        snapshot = priced(offer, req.disk_gb, bid=req.price is not None)
        if req.price is not None:
            snapshot["dph_total"] = req.price + snapshot["storage_total_cost"]
        return Instance(
            id=self._next_instance_id, account=account.index, offer=snapshot, label=req.label,
            image=req.image, disk_gb=req.disk_gb, onstart=req.onstart, extra_env=req.env,
            runtype=req.runtype, api_key=f"{self.rng.getrandbits(256):064x}",
            jupyter_token=f"{self.rng.getrandbits(256):064x}", created_at=now, is_bid=req.price is not None,
            settled_at=now, ssh_keys=[], end_date=float(offer["end_date"]),  # locked at the rent (the docs)
        )

    def _start_host(self, inst: Instance) -> None:
        account = next(a for a in self.accounts.values() if a.index == inst.account)
        home = self.host_root / f"C.{inst.id}"
        vast_vars = {"CONTAINER_ID": str(inst.id), "CONTAINER_API_KEY": inst.api_key,
                     "VAST_CONTAINERLABEL": f"C.{inst.id}", "PUBLIC_IPADDR": "127.0.0.1",
                     "SSH_PUBLIC_KEY": account.ssh_keys[-1]["key"] if account.ssh_keys else ""}
        marker = marker_for(inst.id, id(inst))
        home.mkdir(parents=True, exist_ok=True)
        image_env = make_host_python(home, network=self.host_network, refusing_port=self.refusing_port.port)
        sandbox = Sandbox(home, container_env(home, marker, vast_vars, inst.extra_env, image_env),
                          ssh_session_env(home, marker, image_env))
        gpu_bin = install_nvidia_smi(home, inst.offer, lie=inst.gpu_lie)  # answers from the offer (sim/gpus.py)
        inst.receipt_report = self.host_root / f"receipt-{inst.id}.json"  # outside the sandbox a destroy removes
        install_receipt(home, inst.offer, faults=inst.receipt_faults, seed=inst.receipt_seed,
                        report=inst.receipt_report, torch="torch" in inst.image.lower())
        for env in (sandbox.env, sandbox.ssh_env):
            env["PATH"] = f"{gpu_bin}{os.pathsep}{env['PATH']}"
        host = SshHost(inst.id, sandbox, self.host_key, lambda blob: self._authorized(inst.id, blob),
                       lambda: self.faults, lambda w, r: self._on_bytes(inst.id, w, r),
                       on_exec=lambda: self._on_exec(inst))
        with self.lock:
            inst.sandbox, inst.host = sandbox, host
            inst.direct_port, inst.proxy_port = host.direct_port, host.proxy_port
            sandbox.env["VAST_TCP_PORT_22"] = str(host.direct_port)
            if not inst.live:  # destroyed while the host was being built
                self._teardown(inst)
                return
            if inst.status_override is not None or inst.never_boots or inst.boot_error is not None:
                return
        self._schedule(inst, max(0.0, inst.end_date - time.time()), self._contract_end)
        delay = transitions.boot_delay_s(self.boot_s) + inst.scheduling_s
        if delay <= 0:
            self._boot(inst)
        else:
            self._schedule(inst, delay, self._boot)

    def _schedule(self, inst: Instance, delay_s: float, action: Callable[[Instance], None]) -> None:
        timer = threading.Timer(delay_s, action, args=(inst,))
        timer.daemon = True
        inst.timers.append(timer)
        timer.start()

    def _boot(self, inst: Instance) -> None:
        with self.lock:
            if not inst.live or inst.status_override is not None:
                return
            now = time.time()
            inst.settle(now)  # GPU billing starts now
            inst.booted_at = now
            if inst.unreachable:  # sold twice: the reads say running, nothing answers
                return
            inst.host.accepting = True
            # (fault kind, what it does once its SECONDS are up, made from its rule), taken in this order
            actions: list[tuple[str, Callable[[FaultRule], Callable[[Instance], None]]]] = [
                ("offline", lambda r: self._go_offline), ("exit", lambda r: self._exit),
                ("credit_zero", lambda r: self._credit_zero),
                ("reprice", lambda r: functools.partial(self._raise_listing, factor=r.factor or 1.0)),
                ("reprice_silent", lambda r: functools.partial(self._reprice, factor=r.factor or 1.0)),
                ("negative_balance", lambda r: self._negative_balance), ("key_reset", lambda r: self._reset_keys)]
            if inst.is_bid:  # the bid book: only interruptible instances are outbid
                actions.append(("outbid", lambda r: self._outbid))
            later = []
            for kind, make in actions:
                rule = self.faults.take(kind) or (self._every_instance_key_reset() if kind == "key_reset" else None)
                if rule is not None:
                    later.append((rule, make(rule)))
        if inst.onstart:
            # destroyed in the meantime (SandboxClosed) or the host dir is gone: nothing left to start
            with contextlib.suppress(SandboxClosed, OSError):
                inst.sandbox.start_onstart(inst.onstart)
        for rule, action in later:
            self._schedule(inst, rule.seconds or 0.0, action)

    def _halt(self, inst: Instance, status: str) -> None:
        """The container stops being reachable with `status` (offline, exited, stopped); billing follows."""
        with self.lock:
            if not inst.live:
                return
            inst.settle(time.time())
            inst.status_override = status
        inst.host.close()
        inst.sandbox.close()

    def outbid_now(self, instance_id: int) -> bool:
        """Outbid instance `instance_id` now, as the `outbid` fault does at its time (a test picks the moment: while
        a command runs, between two); False when it is not a live bid instance."""
        inst = self.instances.get(instance_id)
        if inst is None or not inst.is_bid or not inst.live:
            return False
        self._outbid(inst)
        return True

    def _outbid(self, inst: Instance) -> None:
        """Another renter's higher bid takes the GPU: the instance is paused (stopped, all states `stopped`, as
        dstack reads an outbid), its processes killed and SSH closed; the disk stays and storage bills. A rule
        `outbid_resume` resumes it by itself later."""
        with self.lock:
            if not inst.live or inst.outbid:
                return
            inst.outbid, inst.outbids = True, inst.outbids + 1
            resume = self.faults.take("outbid_resume")
        self._halt(inst, transitions.STOPPED)
        if resume is not None:
            self._schedule(inst, resume.seconds or 0.0, self._resume)

    def manage(self, account: Account, instance_id: int, body: dict[str, Any]) -> dict[str, Any]:
        """PUT /api/v0/instances/{id}/ (manage_instance.yaml, `vastai stop|start instance`): `state` stopped or
        running. A stop halts the container as an outbid does (every state `stopped`, the disk kept, storage
        billing: what Vast shows for either is UNCONFIRMED); a start re-boots a stopped one (onstart again)."""
        state = body.get("state")
        if state not in ("stopped", "running"):
            raise errors.vast_error(400, "invalid_args", "state must be 'stopped' or 'running'")
        with self.lock:
            inst = self._owned(account, instance_id)
            if inst is None or not inst.live:
                raise errors.no_such_instance()
            stopped = inst.status_override is not None
        if state == "stopped" and not stopped:
            inst.user_stopped = True
            self._halt(inst, transitions.STOPPED)
        elif state == "running" and stopped:
            with self.lock:
                inst.settle(time.time())
                inst.outbid, inst.user_stopped, inst.status_override, inst.booted_at = False, False, None, None
            self._start_host(inst)
        return {"success": True}

    def _resume(self, inst: Instance) -> None:
        """The price fell: a paused instance resumes by itself (its container re-boots: onstart runs again, GPU
        bills from running). One deleted meanwhile stays gone."""
        with self.lock:
            if not inst.live or not inst.outbid:
                return
            inst.settle(time.time())
            inst.outbid, inst.status_override, inst.booted_at = False, None, None
            inst.resumes += 1
        self._start_host(inst)

    def _go_offline(self, inst: Instance) -> None:
        self._halt(inst, transitions.OFFLINE)

    def _exit(self, inst: Instance) -> None:
        self._halt(inst, transitions.EXITED)

    def _credit_zero(self, inst: Instance) -> None:
        """The account's credit drops to $0 (charged outside billing): Vast stops its instances."""
        with self.lock:
            account = next(a for a in self.accounts.values() if a.index == inst.account)
            account.charged_usd += max(0.0, self.credit(account, time.time()))
        self.enforce_credit()

    def _negative_balance(self, inst: Instance) -> None:
        """The balance goes below $0: Vast stops the account's instances at once (storage bills on); without a
        saved card it destroys them after a grace."""
        now = time.time()
        with self.lock:
            account = next(a for a in self.accounts.values() if a.index == inst.account)
            account.charged_usd += max(0.0, self.credit(account, now)) + NEGATIVE_BALANCE_USD
            victims = [i for i in self.instances.values() if i.live and i.account == account.index]
        for victim in victims:
            self._halt(victim, transitions.STOPPED)
            if not self.card_saved:
                self._schedule(victim, NEGATIVE_GRACE_S, self._vast_destroy)

    def _every_instance_key_reset(self) -> FaultRule | None:
        """`key_reset_s` as a rule of its own (so the boot schedules it like the fault)."""
        return None if self.key_reset_s is None else FaultRule(kind="key_reset", seconds=self.key_reset_s)

    def _reset_keys(self, inst: Instance) -> None:
        """Vast refreshes the instance's authorized keys, which it owns: what onstart appended is gone; the
        account's keys and the ones attached to the instance through the API stay (skypilot PR 10730)."""
        with self.lock:
            if not inst.live or inst.sandbox is None:
                return
            account = next(a for a in self.accounts.values() if a.index == inst.account)
            keys = [k["key"] for k in account.ssh_keys + inst.ssh_keys]
            inst.keys_reset = True
            path = inst.sandbox.home / ".ssh" / "authorized_keys"
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(k + "\n" for k in keys))

    def _vast_destroy(self, inst: Instance) -> None:
        """Vast ends the instance itself (a balance past its grace): reads show it gone, DELETE answers 404."""
        with self.lock:
            if not inst.live:
                return
            now = time.time()
            inst.settle(now)
            inst.destroyed_at, inst.destroyed_by = now, "vast"
            inst.linger_until = now + self.linger_s
            if self.rented.get(inst.offer["id"], (None, None))[1] == inst.id:
                del self.rented[inst.offer["id"]]
        self._teardown(inst)

    def enforce_credit(self) -> None:
        """Stop every running instance of an account whose credit is at or below $0 (storage still bills),
        once any grace its balance has is over."""
        now = time.time()
        with self.lock:
            broke = {a.index for a in self.accounts.values() if self.credit(a, now) <= 0 and now >= a.grace_until}
            victims = [i for i in self.instances.values() if i.live and i.account in broke
                       and i.status_override is None]
        for inst in victims:
            self._halt(inst, transitions.STOPPED)

    def _reprice(self, inst: Instance, factor: float) -> None:
        """The running contract's own price becomes `factor` x (what the docs say cannot happen: the
        `reprice_silent` fault, and tests of the harness's defence)."""
        with self.lock:
            if not inst.live:
                return
            inst.settle(time.time())
            for key in ("dph_base", "dph_total"):
                inst.offer[key] = inst.offer[key] * factor

    def _raise_listing(self, inst: Instance, factor: float) -> None:
        self.raise_price(inst, factor)

    def raise_price(self, inst: Instance, factor: float) -> PriceIncrease | None:
        """The host raises its price `factor` x (the `reprice` fault): its offer at once, for new rentals; the
        running contract keeps its own and gets a pending increase, to apply from its end_date if the renter
        accepts it."""
        with self.lock:
            if not inst.live:
                return None
            # re-listed at the new price, with an end date past the contract's (hosting-overview.mdx's example)
            ask_end = inst.end_date + RELIST_EXTENSION_S
            offer = self.offers_by_id.get(inst.offer["id"])
            if offer is not None:
                for key in ("dph_base", "min_bid", "storage_cost", "inet_up_cost", "inet_down_cost"):
                    offer[key] = offer[key] * factor
                offer["end_date"] = ask_end = max(ask_end, float(offer["end_date"]))
            self._next_increase_id += 1
            old = {name: float(inst.offer[key]) / per for name, key, per in INCREASE_FIELDS}
            inst.increase = PriceIncrease(id=self._next_increase_id, factor=factor, old=old, ask_end_date=ask_end,
                                          created_at=time.time())
            return inst.increase

    def _contract_end(self, inst: Instance) -> None:
        """The contract's end_date: an accepted increase extends it at the new prices (from now on); otherwise
        it expires and the instance stops (storage bills on until it is destroyed)."""
        with self.lock:
            if not inst.live:
                return
            increase, inst.increase = inst.increase, None
            if increase is not None and increase.accepted:
                inst.settle(time.time())
                for _, key, _ in INCREASE_FIELDS:
                    inst.offer[key] = inst.offer[key] * increase.factor
                inst.offer["dph_total"] = inst.offer["dph_base"] + inst.offer["storage_total_cost"]
                inst.end_date = increase.ask_end_date
                extended = True
            else:
                inst.expired, extended = True, False
        if extended:
            self._schedule(inst, max(0.0, inst.end_date - time.time()), self._contract_end)
        else:
            self._halt(inst, transitions.STOPPED)

    def pending_increases(self, account: Account) -> list[dict[str, Any]]:
        """GET /api/v0/instances/pending-price-increases/: the account's contracts with an unanswered raise."""
        with self.lock:
            return [i.increase.row(i) for i in self.instances.values()
                    if i.account == account.index and i.live and i.increase is not None and not i.increase.accepted]

    def answer_increase(self, account: Account, body: dict[str, Any], *, accept: bool) -> dict[str, Any]:
        """PUT /api/v0/instances/{accept,reject}-price-increase/: body exactly {"pending_price_increase_id": N};
        an unknown, answered or foreign row answers 404 no_pending_price_increase (vast-cli price_increase.py)."""
        pending_id = body.get("pending_price_increase_id")
        if set(body) != {"pending_price_increase_id"} or isinstance(pending_id, bool) or not isinstance(pending_id, int):
            raise errors.vast_error(400, "invalid_request", 'body must be exactly {"pending_price_increase_id": <int>}')
        with self.lock:
            inst = next((i for i in self.instances.values() if i.account == account.index and i.live
                         and i.increase is not None and i.increase.id == pending_id and not i.increase.accepted), None)
            if inst is None or inst.increase is None:
                raise errors.vast_error(404, "no_pending_price_increase", "No pending price increase with that id.")
            if accept:
                inst.increase.accepted = True
            else:
                inst.increase = None  # tombstoned: no cutover follows
            return {"success": True, "pending_price_increase_id": pending_id, "contract_id": inst.id}

    def copy(self, account: Account, body: dict[str, Any]) -> dict[str, Any]:
        """PUT /api/v0/commands/rsync/: a copy with one side local (the official CLI's `copy`, vast-cli
        `vastai/api/storage.py`). The body is the CLI's `{"client_id", "src_id", "dst_id", "src_path",
        "dst_path"}`; an instance side is an id or `C.<id>` of the caller's, stopped or running. The answer
        carries where the client's rsync connects (`src_addr`/`src_port` when copying off an instance,
        `dst_addr`/`dst_port` onto one), as the CLI reads it: sim/copyd.py serves it."""
        src, dst = body.get("src_id"), body.get("dst_id")
        remote = [side for side in (src, dst) if side not in (None, "local")]
        if len(remote) != 1 or not isinstance(body.get("src_path"), str) or not isinstance(body.get("dst_path"), str):
            raise errors.vast_error(400, "invalid_args", "one of src_id, dst_id must be an instance and the other "
                                    "local; src_path and dst_path are strings")
        raw = str(remote[0])
        try:
            instance_id = int(raw[2:] if raw.startswith("C.") else raw)
        except ValueError:
            raise errors.vast_error(400, "invalid_args", f"not an instance id: {raw!r}") from None
        refuse = self.faults.take("copy_fail") is not None
        with self.lock:
            inst = self._owned(account, instance_id)
            if inst is None or not inst.live:
                raise errors.no_such_instance()
            inst.copies += 1
            if self._copyd is None:
                self._copyd = CopyDaemon(self.host_key, on_bytes=lambda iid, n: self._on_bytes(iid, 0, n),
                                         bytes_per_s=self.copy_bytes_per_s)
            copyd = self._copyd
        copyd.grant(instance_id, lambda blob: self._authorized(instance_id, blob), refuse=refuse)
        side = "src" if remote[0] == src else "dst"
        return {"success": True, "msg": "rsync endpoint ready", f"{side}_addr": "127.0.0.1", f"{side}_port": copyd.port}

    def _on_bytes(self, instance_id: int, to_host: int, from_host: int) -> None:
        with self.lock:
            self.instances[instance_id].add_bandwidth(to_host, from_host)

    def _on_exec(self, inst: Instance) -> None:
        with self.lock:
            inst.execs += 1
            if len(inst.exec_times) < MAX_EXEC_TIMES:
                inst.exec_times.append(time.time())

    def _readable(self, inst: Instance | None, now: float) -> TypeGuard[Instance]:
        """Whether reads show `inst` now: live and past its read lag, or destroyed and still lingering."""
        if inst is None or now < inst.read_lag_until:
            return False
        return inst.live or inst.lingering(now)

    def show(self, ident: Identity, instance_id: int) -> dict[str, Any] | None:
        self.enforce_credit()
        with self.lock:
            inst = self._visible(ident, instance_id)
            now = time.time()
            if not self._readable(inst, now):
                return None
            return render(inst, now, self.boot_s)

    def _visible(self, ident: Identity, instance_id: int) -> Instance | None:
        if ident.container_of is not None:
            if ident.container_of != instance_id:
                raise errors.not_allowed("This key can only access its own instance")
            return self.instances.get(instance_id)
        return self._owned(ident.account, instance_id)

    def list(self, account: Account, params: dict[str, str]) -> dict[str, Any]:
        self.enforce_credit()
        with self.lock:
            now = time.time()
            rows = [render(i, now, self.boot_s) for i in self.instances.values()
                    if i.account == account.index and self._readable(i, now)]
        return list_page(rows, params)

    def destroy(self, ident: Identity, instance_id: int) -> None:
        """End an instance: billing stops, the offer returns, processes die, SSH closes."""
        with self.lock:
            inst = self._visible(ident, instance_id)
            now = time.time()
            if inst is None or now < inst.read_lag_until:  # a lagging DELETE: not found, nothing deleted
                raise errors.destroy_not_found()
            if not inst.live:  # a repeat DELETE, lingering or long gone
                raise errors.no_such_instance()
            if self.faults.take("delete_noop") is not None:
                return  # answered 200 success, nothing deleted: only a later read shows it still there
            raced = inst.is_bid and not inst.outbid and self.faults.take("outbid_delete") is not None
            if not raced:
                inst.settle(now)
                inst.destroyed_at, inst.destroyed_by = now, "api"
                linger = self.faults.take("linger")
                inst.linger_until = now + (linger.seconds if linger is not None and linger.seconds is not None
                                           else self.linger_s)
                if self.rented.get(inst.offer["id"], (None, None))[1] == inst.id:
                    del self.rented[inst.offer["id"]]
        if raced:  # the bid book paused it as the DELETE came: answered 200 success, nothing deleted
            self._outbid(inst)
            return
        self._teardown(inst)

    def _teardown(self, inst: Instance, *, remove: bool = True) -> None:
        """Stop the host's timers, SSH endpoints and processes; `remove` also deletes its sandbox."""
        if self._copyd is not None and not inst.live:
            self._copyd.revoke(inst.id)
        for timer in inst.timers:
            timer.cancel()
        if inst.host is not None:
            inst.host.close()
        if inst.sandbox is not None:
            inst.sandbox.close()
            if remove:
                inst.sandbox.remove()

    # ----- control plane ---------------------------------------------------------------------
    def log_call(self, method: str, path: str, status: int, endpoint: str, key_in_url: bool) -> None:
        with self.lock:
            self.calls.append({"method": method, "path": path, "status": status, "time": time.time(),
                               "endpoint": endpoint, "key_in_url": key_in_url})

    def set_faults(self, spec: Any) -> FaultPlan:
        plan = FaultPlan.parse(spec, self.rng)
        with self.lock:
            self.faults = plan
        return plan

    def record_server_error(self, text: str) -> None:
        with self.lock:
            self.server_errors = [*self.server_errors[-49:], text[:4000]]

    def state(self) -> dict[str, Any]:
        with self.lock:
            now = time.time()
            return {
                "now": now, "seed": self.seed, "boot_seconds": self.boot_s,
                "instances": [i.record(now, self.boot_s) for i in self.instances.values()],
                "rented_offers": [{"offer_id": o, "account": a, "instance_id": i}
                                  for o, (a, i) in self.rented.items()],
                "accounts": [{"index": a.index, "user_id": a.user_id, "credit_usd": self.credit(a, now),
                              "ssh_keys": len(a.ssh_keys)} for a in self.accounts.values()],
                "calls": list(self.calls), "faults": self.faults.to_json(),
                "offers_total": len(self.offers), "server_errors": list(self.server_errors),
            }

    def live_count(self) -> tuple[int, int, float | None]:
        """(instances ever created, instances live now, the time of the last API call): cheap to ask often."""
        with self.lock:
            last = self.calls[-1]["time"] if self.calls else None
            return len(self.instances), sum(1 for i in self.instances.values() if i.live), last

    def reset(self) -> None:
        """Forget instances, calls and rentals (ending any live host first); accounts and market stay."""
        self.shutdown_hosts()
        with self.lock:
            for inst in self.instances.values():
                if inst.sandbox is not None:
                    inst.sandbox.remove()
            self.instances.clear()
            self.container_keys.clear()
            for account in self.accounts.values():
                account.charged_usd = 0.0
            self.rented.clear()
            self.calls.clear()
            self.limiter.reset()
            self.faults = FaultPlan(rng=self.rng)

    def shutdown_hosts(self) -> None:
        """Kill every live host's processes and close its ports; the records keep showing them live."""
        with self.lock:
            live = [i for i in self.instances.values() if i.host is not None or i.sandbox is not None]
        for inst in live:
            self._teardown(inst, remove=False)

    def cleanup_root(self) -> None:
        self.refusing_port.close()
        if self._copyd is not None:
            self._copyd.close()
        if self._own_root is not None:
            self._own_root.remove()


@dataclass
class _CreateRequest:
    image: str
    disk_gb: float
    label: str | None
    onstart: str
    env: list[list[str]]
    runtype: str
    price: float | None
    target_state: str
    cancel_unavail: bool

    @classmethod
    def parse(cls, offer_id: int, body: dict[str, Any]) -> _CreateRequest:
        def bad(msg: str) -> errors.SimHTTPError:
            return errors.invalid_args(f"error 400/3467: Invalid args: {msg}", ask_id=offer_id)

        image = body.get("image")
        if not isinstance(image, str) or not image or len(image) > 1024:
            if not body.get("template_hash_id"):
                raise bad("'image' is required (a string of at most 1024 chars)")
            image = f"template/{body['template_hash_id']}"
        disk = body.get("disk", MIN_DISK_GB)
        if isinstance(disk, bool) or not isinstance(disk, int | float) or disk < MIN_DISK_GB:
            raise bad(f"'disk' must be a number >= {MIN_DISK_GB} GB, got {disk!r}")
        label = body.get("label")
        if label is not None and (not isinstance(label, str) or len(label) > MAX_LABEL_CHARS):
            raise bad(f"'label' must be a string of at most {MAX_LABEL_CHARS} chars")
        onstart = body.get("onstart") or ""
        args = body.get("args") or []
        if not isinstance(onstart, str) or not isinstance(args, list):
            raise bad("'onstart' must be a string and 'args' a list")
        if len(onstart) + len(str(body.get("args_str") or "")) + sum(len(str(a)) for a in args) > \
                MAX_ONSTART_ARGS_CHARS:
            raise bad(f"args, args_str and onstart together exceed {MAX_ONSTART_ARGS_CHARS} chars")
        price = body.get("price")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                                  or not 0.001 <= price <= 128.0):
            raise bad(f"'price' must be between 0.001 and 128.0, got {price!r}")
        target = body.get("target_state", transitions.RUNNING)
        if target not in (transitions.RUNNING, transitions.STOPPED):
            raise bad(f"'target_state' must be running or stopped, got {target!r}")
        cancel = body.get("cancel_unavail", price is None and target == transitions.RUNNING)
        runtype = str(body.get("runtype") or ("args" if args or body.get("args_str") else "ssh"))
        return cls(image, float(disk), label, onstart, _parse_env(body.get("env"), bad), runtype,
                   None if price is None else float(price), target, bool(cancel))


def _parse_env(raw: Any, bad: Any) -> list[list[str]]:
    """`env` as a dict (what clients send) or a docker-flag string (what the OpenAPI file says)."""
    if raw is None or raw == "":
        return []
    if isinstance(raw, dict):
        return [[str(k), str(v)] for k, v in raw.items()]
    if not isinstance(raw, str):
        raise bad("'env' must be an object or a docker-flag string")
    pairs, tokens = [], shlex.split(raw)
    for flag, value in zip(tokens[::2], tokens[1::2], strict=False):
        if flag == "-e" and "=" in value:
            pairs.append(value.split("=", 1))
        else:
            pairs.append([f"{flag} {value}", "1"])
    return pairs
