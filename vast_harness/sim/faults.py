"""Fault injection: a plan of seeded, composable rules, set at start or replaced at run time.

SPEC grammar (`--faults`, or `{"spec": "..."}` to `PUT /_sim/faults`)::

    SPEC   := ITEM (";" ITEM)*
    ITEM   := "seed=" INT | RULE
    RULE   := KIND (":" ARG)* ["@" PROB]
    PROB   := a float in (0, 1]: the rule fires on each matching event with this probability,
              drawn from the simulator's seeded RNG (or from seed=N when the spec names one).
              A rule with @PROB and no count is permanent; without @PROB the count defaults to 1.
    COUNT  := INT | "*" (unlimited)

    KIND and its ARGs                       effect
    429:ENDPOINT[:COUNT]                    answer 429 in the endpoint's documented body shape
    5xx:ENDPOINT[:COUNT[:STATUS]]           answer 502/503/504 (STATUS fixed, else drawn) as an HTML page
    hang:ENDPOINT:SECONDS[:COUNT]           stall SECONDS, then answer normally
    create_timeout[:COUNT[:SECONDS]]        create the instance, stall SECONDS (default 0), then drop the
                                            connection without a response
    create_stopped[:COUNT]                  create answers 400 invalid_price yet carries new_contract; the
                                            instance exists, stopped, billing storage
    offer_taken[:COUNT]                     the offer is rented by someone else just before create
                                            (410 no_such_ask with cancel_unavail, else 404)
    delete_fail[:COUNT[:STATUS]]            DELETE fails COUNT times with STATUS (default 503; 429 gives
                                            the rate-limit body)
    read_lag:SECONDS[:COUNT]                for SECONDS after create the instance is invisible to reads:
                                            the per-id read answers {"instances": null}, the v1 list has
                                            no row for it, and DELETE answers 404 not_found (deleting
                                            nothing) (for the next COUNT creates, default *)
    create_5xx[:COUNT[:STATUS]]             create the instance, then answer 502/503/504 (an HTML page)
    create_hold:SECONDS[:COUNT]             hold the create SECONDS before creating (a client that gives
                                            up or is interrupted meanwhile still gets an instance)
    linger:SECONDS[:COUNT]                  the next COUNT destroyed instances linger SECONDS (instead of
                                            the simulator's --linger-seconds) as destroyed/unloaded rows
    double_accept[:COUNT]                   the offer was also sold to someone else: the create succeeds
                                            and nothing says otherwise (SkyPilot PR 9117: "this error never
                                            propagates back"); the instance reads `running` with ports, but
                                            its SSH never accepts and its onstart never runs
    container_key_refused[:COUNT]           the next COUNT instances' CONTAINER_API_KEY is refused (401
                                            auth_error) on every call: the dead-man switch cannot act
    v0_deprecated[:COUNT]                   every call on a v0 instance path (/api/v0/instances/{id}/ and
                                            below, any key) answers 410 deprecated_endpoint (COUNT calls,
                                            default *)
    scheduling:SECONDS[:COUNT]              the next COUNT instances wait SECONDS for their GPU before
                                            loading, shown as the docs spell the phase: actual_status
                                            `stopped`, intended_status `running` (manage-instances.mdx:
                                            "Instance enters SCHEDULING status"; no `scheduling` value is
                                            documented); the boot waits
    negative_balance:SECONDS[:COUNT]        SECONDS after running the account's balance goes below $0: its
                                            instances are stopped at once (storage bills); without a saved
                                            card (`card_saved=False`, the default) Vast destroys them after
                                            a grace (NEGATIVE_GRACE_S); with one they stay stopped
                                            (billing.mdx)
    oci_fail[:COUNT]                        actual_status stays `created`, status_msg "OCI runtime create
                                            failed ..."
    manifest_missing[:COUNT]                actual_status stays `created`, status_msg "... manifest for
                                            IMAGE not found ..."
    exit:SECONDS[:COUNT]                    SECONDS after running the container exits: actual_status
                                            exited, processes killed, SSH closed, storage still bills
    credit_zero:SECONDS[:COUNT]             SECONDS after running the account's credit reaches $0: its
                                            instances are stopped (SSH closed), storage still bills
    reprice_offer:FACTOR[:COUNT]            the host re-priced the offer after the search: the instance
                                            is billed at FACTOR x the searched price
    reprice:FACTOR:SECONDS[:COUNT]          SECONDS after running the host raises its listing FACTOR x,
                                            as Vast lets it: new rentals pay the new price, the running
                                            contract keeps its own until its end_date and gets a pending
                                            price increase (GET /instances/pending-price-increases/) that
                                            applies from its end_date only if the renter accepts it;
                                            unaccepted, the contract expires then (stopped, storage bills)
                                            (docs/vast-behaviours.md)
    reprice_silent:FACTOR:SECONDS[:COUNT]   SECONDS after running the running contract's own dph_total
                                            becomes FACTOR x (reads show it, billing follows): what Vast's
                                            docs say cannot happen, kept to test the harness's defence
    contract_end:SECONDS[:COUNT]            the next COUNT contracts end SECONDS after their create (the
                                            host shortened the offer's end date after the search): the
                                            instance stops then unless a pending increase was accepted
    outbid:SECONDS[:COUNT]                  the bid book: SECONDS after running another renter outbids the next
                                            COUNT interruptible instances (`@PROB`: each with that probability):
                                            paused as dstack reads an outbid (actual_status, intended_status,
                                            cur_state, next_state all `stopped`), processes killed, SSH closed,
                                            the disk kept and storage billing; it resumes only by a later
                                            `outbid_resume` (on-demand instances are never outbid)
    outbid_boot:SECONDS[:COUNT]             the same, SECONDS after create, before the instance runs
    outbid_resume:SECONDS[:COUNT]           the price falls: a paused (outbid) instance resumes by itself SECONDS
                                            after it was paused (re-boots, GPU bills again, onstart runs again);
                                            one already deleted stays gone
    outbid_delete[:COUNT]                   the next COUNT DELETEs of a running interruptible instance race an
                                            outbid: it is paused as above and the DELETE answers 200 success
                                            having deleted nothing (only a later read shows the husk)
    copy_fail[:COUNT]                       the copy off a stopped instance (PUT /commands/rsync/) answers
                                            success, but its daemon refuses the transfer (rsync exits non-zero)
    boot_stall[:COUNT]                      the next COUNT instances never leave `loading`
    wrong_contract[:COUNT]                  the create makes its instance but its answer's new_contract
                                            names another live instance of the same account (the oldest)
    started_earlier:SECONDS[:COUNT]         the next COUNT instances' rows report a start_date SECONDS
                                            before their create (an instance left from an earlier day);
                                            only the reported start moves, billing is unchanged
    date_ahead:SECONDS[:COUNT]              the next COUNT answers (default *) carry a `Date` header
                                            SECONDS ahead of the simulator's clock (a server clock that is
                                            wrong); nothing else moves: start_date, billing, /_sim/state
    date_behind:SECONDS[:COUNT]             the same, SECONDS behind; `date_ahead:S:N;date_behind:S` flips
                                            the sign after N answers (date_ahead is asked first)
    offline:SECONDS[:COUNT]                 SECONDS after reaching running the host goes offline:
                                            actual_status offline, processes killed, SSH closed
    show_list[:COUNT]                       the per-id read answers `{"instances": [{...}]}` (Vast's own QA
                                            tool's shape, base-image test_template.py) for COUNT reads
                                            (default *); a not-found read stays `{"instances": null}`
    show_no_ports[:COUNT]                   the per-id read carries no `ports` (COUNT reads, default *);
                                            the v1 list still has them
    error_status[:COUNT]                    the next COUNT instances read `actual_status: "error"` (with a
                                            status_msg) and never run (terminal for Vast's QA tool)
    key_reset:SECONDS[:COUNT]               SECONDS after running Vast refreshes the host's authorized keys:
                                            keys appended by onstart stop working, keys attached through
                                            `POST /instances/{id}/ssh/` (and the account's) keep working
                                            (skypilot PR 10730: "between 9 and 18 hours in")
    delete_noop[:COUNT]                     DELETE answers 200 `success: true` and deletes nothing (COUNT
                                            DELETEs): only a read afterwards shows the instance still there
    ssh_refuse:K                            the next K SSH connections are reset at once
    ssh_drop:SECONDS[:COUNT]                SECONDS into an exec the SSH connection is cut
    gpu_mismatch[:COUNT]                    the next COUNT instances' nvidia-smi reports another GPU than the
                                            offer's (a lying host: the harness must refuse and delete it)
    slow_sftp:BYTES_PER_S[:COUNT]           SFTP reads and writes are throttled (COUNT sessions, default *)
    pcie_slow:FACTOR[:COUNT]                the next COUNT instances' receipt (their `vh-receipt`,
                                            sim/host_receipt.py) reports host<->device copies at FACTOR of
                                            the offer's pcie_bw (a link that is slower than advertised)
    gpu_slow:FACTOR[:COUNT]                 ... its matmul and sustained burn at FACTOR
    hbm_slow:FACTOR[:COUNT]                 ... its HBM copy at FACTOR
    throttle:SECONDS[:COUNT]                ... its clocks drop SECONDS into the burn (a HW thermal slowdown
                                            active from then on; a burn shorter than SECONDS shows nothing)
    ecc_error[:COUNT]                       ... an uncorrectable ECC error during the burn (a GPU that
                                            reports ECC: not a GeForce)

    ENDPOINT := search | create | show | list | destroy | user | ssh | price_increase | copy | manage | any

Example: `429:search:3;5xx:destroy:2;create_timeout;ssh_refuse:2;seed=7`. The JSON form is a list of
rule objects (`{"kind": "5xx", "endpoint": "destroy", "count": 2}`), or `{"seed": 7, "rules": [...]}`.
`FaultPlan.parse` reads either; `FaultPlan.take` is how the simulator asks whether a rule fires.
"""

from __future__ import annotations

import random
import threading
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Kind = Literal["429", "5xx", "hang", "create_timeout", "create_stopped", "offer_taken", "delete_fail",
               "read_lag", "boot_stall", "offline", "ssh_refuse", "ssh_drop", "slow_sftp", "create_5xx",
               "create_hold", "linger", "double_accept", "oci_fail", "manifest_missing", "exit",
               "credit_zero", "reprice_offer", "reprice", "reprice_silent", "contract_end",
               "container_key_refused", "v0_deprecated",
               "scheduling", "negative_balance", "started_earlier", "wrong_contract", "show_list",
               "show_no_ports", "error_status", "key_reset", "delete_noop", "gpu_mismatch", "date_ahead",
               "date_behind", "pcie_slow", "gpu_slow", "hbm_slow", "throttle", "ecc_error", "outbid", "outbid_boot",
               "outbid_resume", "copy_fail", "outbid_delete"]
ENDPOINTS = ("search", "create", "show", "list", "destroy", "user", "ssh", "price_increase", "copy", "manage",
             "any")
GATEWAY_STATUSES = (502, 503, 504)
_NEEDS_ENDPOINT = frozenset({"429", "5xx", "hang"})
_NEEDS_SECONDS = frozenset({"hang", "read_lag", "offline", "ssh_drop", "create_hold", "linger", "exit",
                            "credit_zero", "reprice", "reprice_silent", "contract_end", "scheduling",
                            "negative_balance", "started_earlier", "key_reset", "date_ahead", "date_behind",
                            "throttle", "outbid", "outbid_boot", "outbid_resume"})
_NEEDS_FACTOR = frozenset({"reprice_offer", "reprice", "reprice_silent", "pcie_slow", "gpu_slow", "hbm_slow"})
RECEIPT_KINDS = ("pcie_slow", "gpu_slow", "hbm_slow", "throttle", "ecc_error")  # what a host's receipt lies about
_UNLIMITED_BY_DEFAULT = frozenset({"read_lag", "slow_sftp", "v0_deprecated", "show_list", "show_no_ports",
                                   "date_ahead", "date_behind"})
# Positional ARGs per kind, in SPEC order (after the kind, and after the endpoint where there is one).
_POSITIONAL: dict[str, tuple[str, ...]] = {
    "429": ("count",), "5xx": ("count", "status"), "hang": ("seconds", "count"),
    "create_timeout": ("count", "seconds"), "create_stopped": ("count",), "offer_taken": ("count",),
    "delete_fail": ("count", "status"), "read_lag": ("seconds", "count"), "boot_stall": ("count",),
    "offline": ("seconds", "count"), "ssh_refuse": ("count",), "ssh_drop": ("seconds", "count"),
    "slow_sftp": ("bytes_per_s", "count"), "create_5xx": ("count", "status"), "create_hold": ("seconds", "count"),
    "linger": ("seconds", "count"), "double_accept": ("count",), "oci_fail": ("count",),
    "manifest_missing": ("count",), "exit": ("seconds", "count"), "credit_zero": ("seconds", "count"),
    "reprice_offer": ("factor", "count"), "reprice": ("factor", "seconds", "count"),
    "reprice_silent": ("factor", "seconds", "count"), "contract_end": ("seconds", "count"),
    "container_key_refused": ("count",), "v0_deprecated": ("count",), "scheduling": ("seconds", "count"),
    "negative_balance": ("seconds", "count"), "started_earlier": ("seconds", "count"),
    "wrong_contract": ("count",), "show_list": ("count",), "show_no_ports": ("count",), "error_status": ("count",),
    "key_reset": ("seconds", "count"), "delete_noop": ("count",),
    "gpu_mismatch": ("count",),
    "pcie_slow": ("factor", "count"), "gpu_slow": ("factor", "count"), "hbm_slow": ("factor", "count"),
    "throttle": ("seconds", "count"), "ecc_error": ("count",),
    "date_ahead": ("seconds", "count"), "date_behind": ("seconds", "count"),
    "outbid": ("seconds", "count"), "outbid_boot": ("seconds", "count"), "outbid_resume": ("seconds", "count"),
    "copy_fail": ("count",), "outbid_delete": ("count",),
}


class FaultSpecError(ValueError):
    """A fault SPEC or rule list that does not parse; the message names the offending item."""


class FaultRule(BaseModel):
    """One rule. `count` None means unlimited; `fired` counts how often it has fired so far."""

    model_config = ConfigDict(extra="forbid")

    kind: Kind
    endpoint: Literal["search", "create", "show", "list", "destroy", "user", "ssh", "price_increase", "copy",
                      "manage", "any"] | None = None
    count: int | None = Field(default=1, ge=1)
    prob: float | None = Field(default=None, gt=0.0, le=1.0)
    status: int | None = None
    seconds: float | None = Field(default=None, ge=0.0)
    bytes_per_s: int | None = Field(default=None, gt=0)
    factor: float | None = Field(default=None, gt=0.0, allow_inf_nan=False)
    fired: int = 0

    @model_validator(mode="after")
    def _check(self) -> FaultRule:
        if self.kind in _NEEDS_ENDPOINT and self.endpoint is None:
            raise ValueError(f"fault {self.kind} needs an endpoint, one of {', '.join(ENDPOINTS)}")
        if self.kind == "delete_fail":
            self.endpoint = "destroy"
        if self.kind in _NEEDS_SECONDS and self.seconds is None:
            raise ValueError(f"fault {self.kind} needs SECONDS")
        if self.kind in _NEEDS_FACTOR and self.factor is None:
            raise ValueError(f"fault {self.kind} needs FACTOR")
        if self.kind == "slow_sftp" and self.bytes_per_s is None:
            raise ValueError("fault slow_sftp needs BYTES_PER_S")
        if self.status is not None and self.kind in ("5xx", "create_5xx") and self.status not in GATEWAY_STATUSES:
            raise ValueError(f"fault 5xx status must be one of {GATEWAY_STATUSES}, got {self.status}")
        if self.status is not None and self.kind == "delete_fail" and self.status not in (429, 500,
                                                                                         *GATEWAY_STATUSES):
            raise ValueError(f"fault delete_fail status must be 429 or 5xx, got {self.status}")
        return self

    def exhausted(self) -> bool:
        return self.count is not None and self.fired >= self.count


def _rule_from_item(item: str) -> FaultRule:
    body, _, prob = item.partition("@")
    kind, *args = [part.strip() for part in body.split(":")]
    fields: dict[str, Any] = {"kind": kind}
    if kind in _NEEDS_ENDPOINT:
        if not args:
            raise FaultSpecError(f"fault {item!r}: {kind} needs an endpoint")
        fields["endpoint"], args = args[0], args[1:]
    names = _POSITIONAL.get(kind, ())
    if len(args) > len(names):
        raise FaultSpecError(f"fault {item!r}: too many arguments (expected {', '.join(names) or 'none'})")
    for name, value in zip(names, args, strict=False):
        fields[name] = None if value == "*" else value
    if prob:
        fields["prob"] = prob
        fields.setdefault("count", None)
    elif kind in _UNLIMITED_BY_DEFAULT:
        fields.setdefault("count", None)
    try:
        return FaultRule(**fields)
    except ValidationError as exc:
        raise FaultSpecError(f"fault {item!r}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{where}: {err['msg']}" if where else err["msg"]


class FaultPlan:
    """A thread-safe set of rules; `take` decides (and counts) whether a rule fires."""

    def __init__(self, rules: list[FaultRule] | None = None, seed: int | None = None,
                 rng: random.Random | None = None) -> None:
        self.rules = list(rules or [])
        self.seed = seed
        self._rng = random.Random(seed) if seed is not None else (rng or random.Random(0))
        self._lock = threading.Lock()

    @classmethod
    def parse(cls, spec: str | list[Any] | dict[str, Any] | FaultPlan | None,
              rng: random.Random | None = None) -> FaultPlan:
        """A plan from a SPEC string, a JSON rule list, {"seed", "rules"} or {"spec"}; None is empty."""
        if isinstance(spec, FaultPlan):
            return spec
        if spec is None:
            return cls(rng=rng)
        if isinstance(spec, dict):
            if "spec" in spec:
                return cls.parse(str(spec["spec"]), rng)
            plan = cls.parse(list(spec.get("rules", [])), rng)
            return cls(plan.rules, spec.get("seed"), rng) if spec.get("seed") is not None else plan
        if isinstance(spec, list):
            return cls([_rule_from_json(i, r) for i, r in enumerate(spec)], rng=rng)
        rules, seed = [], None
        for item in (part.strip() for part in spec.split(";")):
            if not item:
                continue
            if item.startswith("seed="):
                try:
                    seed = int(item[5:])
                except ValueError:
                    raise FaultSpecError(f"fault {item!r}: seed must be an integer") from None
            else:
                rules.append(_rule_from_item(item))
        return cls(rules, seed, rng)

    def take(self, kind: str, endpoint: str | None = None) -> FaultRule | None:
        """The first live rule of `kind` (for `endpoint`) that fires now, counted; else None."""
        with self._lock:
            for rule in self.rules:
                if rule.kind != kind or rule.exhausted():
                    continue
                if endpoint is not None and rule.endpoint not in (endpoint, "any"):
                    continue
                if rule.prob is not None and self._rng.random() >= rule.prob:
                    continue
                rule.fired += 1
                return rule
        return None

    def draw_status(self, rule: FaultRule) -> int:
        """A rule's status: fixed, or one of 502/503/504 from the seeded RNG."""
        if rule.status is not None:
            return rule.status
        with self._lock:
            return self._rng.choice(GATEWAY_STATUSES)

    def to_json(self) -> dict[str, Any]:
        with self._lock:
            return {"seed": self.seed, "rules": [r.model_dump() for r in self.rules]}


def _rule_from_json(index: int, raw: Any) -> FaultRule:
    if not isinstance(raw, dict):
        raise FaultSpecError(f"fault rule #{index}: expected an object, got {type(raw).__name__}")
    try:
        return FaultRule(**raw)
    except ValidationError as exc:
        raise FaultSpecError(f"fault rule #{index}: {_first_error(exc)}") from None
