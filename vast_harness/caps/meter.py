"""The run's one clock: what it has cost so far, and until when each phase may work.

Every phase that can take time asks the meter for its deadline (create, boot wait, SSH connect, upload,
each step, the drain of a step's output, the evidence pull) and reports the bytes it moved. The meter turns
both caps into one monotonic *work deadline*:

    hard deadline  = min(t0 + time cap,  now + (max_usd - accrued - reserved transfers) / live $/s,
                         the earliest end of a live instance's contract inside the time cap)
    work deadline  = hard deadline - teardown margin      (room for DELETE and the absence proof)

Accrued dollars are per second at each instance's price from create to its DELETE acknowledgement, plus
bytes either way at the higher of `inet_down_cost` and `inet_up_cost` ($/GB, GB = 1e9 bytes; whose "up" is not
sourced). The figure is an upper bound: Vast bills the GPU only from `running` (storage while loading), the
meter from the PUT. A price
re-read from the rented instance replaces the search price when it is higher (retroactively: the host
billed it from the start); a price that cannot be read as a positive finite number, or that leaves no time
to work, stops the run (exit 6). Any other read that shows the instance's row (a v1 list row, an absence-proof
round in the teardown) re-prices it the same way through `observe_price`, which never raises: an unreadable
price there is ignored and recorded. Thread-safe: transfers report bytes from worker threads.

A rental contract keeps its price until its end date; past it Vast stops the instance, unless the renter
accepted a host's pending increase, which then bills (docs/vast-behaviours.md). Offers whose end date falls
inside the time cap are not rented, so a contract end inside it is a host that moved its offer's end in after
the search: it becomes the hard deadline (`set_contract_end`), and any time billed past it (a teardown that
overran) counts at the pending increase's price, never lower than the contract's.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

from vast_harness.clock import now_s
from vast_harness.console.when import utc
from vast_harness.errors import CapReachedError, ConfigError
from vast_harness.records import PriceChange
from vast_harness.spec.receipt import ReceiptPolicy
from vast_harness.timings import TeardownBudget, Timings

BYTES_PER_GB = 1e9
TEARDOWN_MIN_S = 60.0  # per instance: delete + absence proof, at least this long
# No host charges this per hour (the dearest 8-GPU offers are tens of $/h): a row above it is corrupt. Such a
# price stops the run like one that breaks the cap, and is billed at this ceiling so every figure stays finite.
MAX_PLAUSIBLE_DPH_USD = 1_000_000.0
# A wait that ended this close to its cap-derived deadline was cut by the cap (timers fire a little early).
CAP_CUT_SLACK_S = 0.05


def minimum_cap_s(timings: Timings, receipt: ReceiptPolicy | None = None) -> float:
    """The shortest time cap a run can keep: boot allowance + the least receipt (when one is taken) + teardown
    margin. The one place it is computed."""
    return timings.min_boot_s + receipt_min_total_s(timings, receipt) + timings.teardown_margin_s


def receipt_min_total_s(timings: Timings, receipt: ReceiptPolicy | None) -> float:
    """The least a receipt takes on the host, its grace included; 0 when none is taken."""
    return timings.receipt_min_s + timings.receipt_grace_s if receipt is not None and receipt.enabled else 0.0


def check_minimum_cap(max_minutes: float, timings: Timings, receipt: ReceiptPolicy | None = None) -> None:
    """Refuse (ConfigError, exit 2) a time cap that cannot cover boot, the receipt and teardown: before any rent,
    and in a --dry-run too, so the preview never shows a plan the run would refuse (a cap that leaves no time
    for the receipt would rent, pay, and end at exit 6 before any work)."""
    minimum_s = minimum_cap_s(timings, receipt)
    if max_minutes * 60.0 < minimum_s:
        receipt_s = receipt_min_total_s(timings, receipt)
        parts = (f"{timings.min_boot_s:g} s to boot + "
                 + (f"{receipt_s:g} s for the least receipt ([receipt] enabled = false skips it) + " if receipt_s
                    else "") + f"{timings.teardown_margin_s:g} s teardown margin")
        raise ConfigError(
            f"--max-minutes {max_minutes:g} cannot cover boot{', the receipt' if receipt_s else ''} and teardown: "
            f"the minimum is {minimum_s / 60:.3g} min ({parts}); nothing rented")


def teardown_budget_s(proof_interval_s: float) -> float:
    """How long one instance's delete + absence proof may take before it is declared unproven (exit 3), for a
    run and for reap: room for eight proof intervals above the floor. The one place it is computed."""
    return max(TEARDOWN_MIN_S, 8 * proof_interval_s + TEARDOWN_MIN_S)


def expected_teardown_s(proof_interval_s: float, pacing_scale: float = 1.0) -> float:
    """How long one instance's teardown usually takes, for the live view: its DELETE and two proof rounds of
    three reads (seven calls, ~0.5 s each on Vast, scaled like their pacing) one proof interval apart. Read
    lag and lingering rows make it longer, up to `teardown_budget_s`."""
    return proof_interval_s + 7 * 0.5 * pacing_scale


def finite_positive(value: float | None) -> bool:
    """True for a usable price. Written so NaN fails (every comparison with NaN is false)."""
    return value is not None and isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def plausible_dph(dph_usd: float) -> float:
    """A usable price as the meter bills it: at most MAX_PLAUSIBLE_DPH_USD, so no figure the run computes or
    records overflows (a row stating $1e306/h made the accrued figure inf and the record a traceback)."""
    return min(dph_usd, MAX_PLAUSIBLE_DPH_USD)


def usd_up(usd: float, places: int = 6) -> float:
    """A dollar figure to `places` decimals, rounded up: the accrued figure is an upper bound of the bill, and
    rounding to nearest could put it a fraction of a micro-dollar under (red team r6). A figure too large for
    that grid (or not finite) is returned as it is: never an OverflowError in a record."""
    scale = 10.0**places
    scaled = usd * scale
    if not math.isfinite(scaled):
        return usd
    return math.ceil(round(scaled, 3)) / scale


class _Accrual:
    __slots__ = ("after_factor", "contract_end", "contract_end_unix", "dph_usd", "end", "start")

    def __init__(self, dph_usd: float, start: float) -> None:
        self.dph_usd, self.start = dph_usd, start
        self.end: float | None = None  # set when the instance stops accruing
        self.contract_end: float | None = None  # the contract's end on the run's clock, when inside the time cap
        self.contract_end_unix: float | None = None  # the same, as the row said it (for messages)
        self.after_factor = 1.0  # the price past the contract's end, as a multiple of its own (>= 1)

    def usd(self, now: float) -> float:
        end = self.end if self.end is not None else now
        if self.contract_end is None or end <= self.contract_end:
            return max(0.0, end - self.start) * self.dph_usd / 3600.0
        cut = max(self.start, self.contract_end)
        return (max(0.0, cut - self.start) + (end - cut) * self.after_factor) * self.dph_usd / 3600.0


class CostMeter:
    def __init__(self, *, max_usd: float, max_seconds: float, teardown_margin_s: float,
                 t0: float | None = None, clock: Callable[[], float] = now_s,
                 on_raise: Callable[[PriceChange], None] | None = None) -> None:
        """`on_raise`: told of every higher price the meter takes (outside its lock), so the run can put it
        in the ledger: a run killed before its record is then estimated at it, not at the search's price."""
        self._on_raise = on_raise
        self.max_usd, self.max_seconds, self.teardown_margin_s = max_usd, max_seconds, teardown_margin_s
        self.budget = TeardownBudget(margin_s=teardown_margin_s)  # the margin's shares (prelude, guard, pull)
        self.clock = clock
        self.t0 = clock() if t0 is None else t0
        self._lock = threading.Lock()
        self._instances: dict[int, _Accrual] = {}
        self.usd_per_byte_up = 0.0  # into the host: max(inet_down_cost, inet_up_cost)
        self.usd_per_byte_down = 0.0  # out of the host: the same
        self.bytes_up = 0
        self.bytes_down = 0
        self.settled_usd = 0.0  # what instances before this process's accrued (a kept host's outbid hosts)
        self.expected_up = 0  # transfers the run will still make, reserved out of the money cap
        self.expected_down = 0
        self.price_changes: list[PriceChange] = []
        self._ignored: set[tuple[int, str, str]] = set()  # (instance, source, reason) already recorded

    # ------------------------------------------------------------------------------------- inputs
    def set_transfer(self, *, inet_down_cost_usd_per_gb: float | None, inet_up_cost_usd_per_gb: float | None,
                     expected_up_bytes: int = 0, expected_down_bytes: int = 0) -> None:
        with self._lock:
            # both directions at the higher rate: whose "up" inet_up_cost names is not sourced (quote.py)
            rate = max(inet_down_cost_usd_per_gb or 0.0, inet_up_cost_usd_per_gb or 0.0) / BYTES_PER_GB
            self.usd_per_byte_up = max(self.usd_per_byte_up, rate)
            self.usd_per_byte_down = max(self.usd_per_byte_down, rate)
            self.expected_up, self.expected_down = expected_up_bytes, expected_down_bytes

    def start_instance(self, key: int, dph_usd: float, t_start: float | None = None) -> None:
        if not finite_positive(dph_usd) or dph_usd > MAX_PLAUSIBLE_DPH_USD:
            raise CapReachedError(f"instance {key}: price ${dph_usd}/h is not a positive finite number below "
                                  f"${MAX_PLAUSIBLE_DPH_USD:,.0f}/h; the cap cannot be kept")
        with self._lock:
            self._instances[key] = _Accrual(dph_usd, self.clock() if t_start is None else t_start)

    def forget_instance(self, key: int) -> None:
        """Instance `key` was never the run's (a create answer named another's): what its create billed is now
        counted on the instance that carries the run's label, from the same PUT."""
        with self._lock:
            self._instances.pop(key, None)

    def stop_instance(self, key: int, t_end: float) -> None:
        with self._lock:
            acc = self._instances.get(key)
            if acc is not None and acc.end is None:
                acc.end = t_end

    def resume_instance(self, key: int) -> None:
        """A DELETE answered "deleted" and a read shows the instance live after it (Vast's 200 "success" once
        deleted nothing): it bills again, and its time counts against the time cap again."""
        with self._lock:
            acc = self._instances.get(key)
            if acc is not None:
                acc.end = None

    def end_instance_at(self, key: int, t_end: float) -> None:
        """The instance's bill ends at `t_end`, the DELETE that deleted it, whatever an earlier DELETE that
        deleted nothing stopped it at."""
        with self._lock:
            acc = self._instances.get(key)
            if acc is not None:
                acc.end = t_end

    def bill_until(self, key: int, t_end: float) -> None:
        """An instance not proven gone bills at least until `t_end`, whatever a DELETE's answer stopped it at
        (Vast's 200 "success" once deleted nothing: the accrued figure must stay an upper bound of the bill)."""
        with self._lock:
            acc = self._instances.get(key)
            if acc is not None and (acc.end is None or acc.end < t_end):
                acc.end = t_end

    def set_contract_end(self, key: int, *, end_s: float | None, end_unix: float | None = None,
                         after_factor: float | None = None) -> None:
        """Instance `key`'s contract ends at `end_s` (this meter's clock; None: past the time cap, nothing to
        do): the hard deadline comes no later, and time past it bills at `after_factor` x the contract's price
        (a pending increase's; at least 1: the contract's own when none is known)."""
        with self._lock:
            acc = self._instances.get(key)
            if acc is None:
                return
            acc.contract_end, acc.contract_end_unix = end_s, end_unix
            acc.after_factor = max(1.0, after_factor or 1.0) if end_s is not None else 1.0

    def _contract_end(self) -> tuple[float, float | None] | None:
        """The earliest end of a live instance's contract (the run's clock, and as the row said it), if any."""
        with self._lock:
            ends = [(a.contract_end, a.contract_end_unix) for a in self._instances.values()
                    if a.end is None and a.contract_end is not None]
        return min(ends, key=lambda e: e[0]) if ends else None

    def reprice(self, key: int, billed_dph_usd: float | None) -> None:
        """The instance's own price: tighten the deadline if higher; stop (CapReachedError) if it breaks the cap."""
        with self._lock:
            acc = self._instances.get(key)
        if acc is None or billed_dph_usd is None:
            return  # not sent: the search price stands
        if not finite_positive(billed_dph_usd):
            self.price_changes.append(PriceChange(instance_key=key, searched_dph_usd=acc.dph_usd,
                                                  billed_dph_usd=None, outcome="refused"))
            raise CapReachedError(f"instance {key} reports a price of ${billed_dph_usd}/h: not a positive finite "
                                  "number, so the cap cannot be kept")
        if billed_dph_usd <= acc.dph_usd * (1 + 1e-9):
            return
        searched = acc.dph_usd
        with self._lock:
            acc.dph_usd = plausible_dph(billed_dph_usd)
        implausible = billed_dph_usd > MAX_PLAUSIBLE_DPH_USD
        left_s = self.remaining_s()
        outcome = "tightened" if left_s > 0 and not implausible else "refused"
        change = PriceChange(instance_key=key, searched_dph_usd=searched, billed_dph_usd=billed_dph_usd,
                             outcome=outcome)
        self.price_changes.append(change)
        self._raised(change)
        if implausible:
            raise CapReachedError(
                f"instance {key} reports a price of ${billed_dph_usd:.4g}/h, above ${MAX_PLAUSIBLE_DPH_USD:,.0f}/h, "
                "more than any host charges: billed at that ceiling, and the cap cannot be kept")
        if left_s <= 0:
            raise CapReachedError(
                f"instance {key} bills ${billed_dph_usd:.4f}/h, not the ${searched:.4f}/h the search showed: "
                f"at that price ${self.max_usd:g} leaves no time to work before the teardown margin")

    def observe_price(self, key: int, dph_usd: float | None, *, source: str,
                      reason: str | None = None) -> PriceChange | None:
        """A price any read of the instance showed (a list row, an absence-proof round, a per-id read that sent
        none): bookkeeping, so it never raises, not even in a teardown. A higher price counts from the
        instance's start, like `reprice` (when it rose is unknown: the earliest moment it could have applied),
        and tightens the deadline; learnt with no time left ("late"), the run's next check stops it and
        `over_cap` tells the verdict. A price that is not a positive finite number is ignored, the last good
        price kept, its `reason` recorded once per source. Returns what was recorded, if anything."""
        with self._lock:
            acc = self._instances.get(key)
            if acc is None:
                return None
            if dph_usd is None or not finite_positive(dph_usd):
                why = reason or f"price {dph_usd!r} is not a positive finite number"
                if (key, source, why) in self._ignored:
                    return None
                self._ignored.add((key, source, why))
                change = PriceChange(instance_key=key, searched_dph_usd=acc.dph_usd, billed_dph_usd=None,
                                     outcome="ignored", source=source, reason=why)
                self.price_changes.append(change)
                return change
            if dph_usd <= acc.dph_usd * (1 + 1e-9):
                return None
            before, acc.dph_usd = acc.dph_usd, plausible_dph(dph_usd)
        change = PriceChange(instance_key=key, searched_dph_usd=before, billed_dph_usd=dph_usd,
                             outcome="late" if self.remaining_s() <= 0 or self.over_cap() else "tightened",
                             source=source)
        with self._lock:
            self.price_changes.append(change)
        self._raised(change)
        return change

    def _raised(self, change: PriceChange) -> None:
        if self._on_raise is not None:
            self._on_raise(change)

    def add_settled(self, usd: float) -> None:
        """Dollars earlier instances of the same caps accrued and that no longer bill (a kept host's hosts
        before an outbid): counted against the money cap as they are."""
        with self._lock:
            self.settled_usd += max(0.0, usd)

    def add_bytes(self, *, up: int = 0, down: int = 0) -> None:
        with self._lock:
            self.bytes_up += up
            self.bytes_down += down

    # ------------------------------------------------------------------------------------ figures
    def accrued_usd(self, now: float | None = None) -> float:
        now = self.clock() if now is None else now
        with self._lock:
            compute = sum(a.usd(now) for a in self._instances.values()) + self.settled_usd
            return compute + self.bytes_up * self.usd_per_byte_up + self.bytes_down * self.usd_per_byte_down

    def instance_accrued_usd(self, key: int, now: float | None = None) -> float:
        """One instance's compute so far (an interruptible run's attempt), 0 for one never started."""
        now = self.clock() if now is None else now
        with self._lock:
            accrual = self._instances.get(key)
            return accrual.usd(now) if accrual is not None else 0.0

    def _reserved_usd(self) -> float:
        return (max(0, self.expected_up - self.bytes_up) * self.usd_per_byte_up
                + max(0, self.expected_down - self.bytes_down) * self.usd_per_byte_down)

    def live_usd_per_s(self) -> float:
        now = self.clock()
        with self._lock:
            return sum(a.dph_usd * (a.after_factor if a.contract_end is not None and now >= a.contract_end else 1.0)
                       for a in self._instances.values() if a.end is None) / 3600.0

    def hard_deadline(self, now: float | None = None) -> float:
        """When a cap is reached: the time cap, the moment accrued dollars reach the money cap, or the end of a
        live instance's contract, whichever comes first."""
        now = self.clock() if now is None else now
        deadline = self.t0 + self.max_seconds
        rate = self.live_usd_per_s()
        if rate > 0:
            with self._lock:
                reserved = self._reserved_usd()
            deadline = min(deadline, now + (self.max_usd - self.accrued_usd(now) - reserved) / rate)
        contract = self._contract_end()
        return deadline if contract is None else min(deadline, contract[0])

    def binding_cap(self, now: float | None = None) -> str:
        """What sets the hard deadline now: "time", "dollar" or "contract" (what a cut by the cap is said as)."""
        deadline = self.hard_deadline(now)
        contract = self._contract_end()
        if contract is not None and deadline >= contract[0]:
            return "contract"
        return "time" if deadline >= self.t0 + self.max_seconds else "dollar"

    def cap_reached(self) -> str:
        """How a cut by the cap is said: which cap, and the figures."""
        figures = (f"accrued ${self.accrued_usd():.4f} of ${self.max_usd:g}, {self.elapsed_s():.0f} s of "
                   f"{self.max_seconds:.0f} s")
        contract = self._contract_end()
        if self.binding_cap() == "contract" and contract is not None:
            when = utc(contract[1]) if contract[1] is not None else "before the time cap"
            return (f"the instance's contract ends {when}, where Vast stops it (or bills a price increase "
                    f"accepted on it), so the run ends before it, keeping the teardown margin ({figures})")
        return f"the {self.binding_cap()} cap is reached, keeping the teardown margin ({figures})"

    def work_deadline(self, now: float | None = None) -> float:
        """Until when work may go on and still leave the teardown margin before the cap."""
        return self.hard_deadline(now) - self.teardown_margin_s

    def prelude_deadline(self, now: float | None = None) -> float:
        """Until when what comes before the first DELETE (the last price read, the evidence pull, the switch's
        log) may run: the rest of the teardown margin stays for the DELETE and its retries."""
        return self.hard_deadline(now) - self.budget.prelude_s

    def accrual_start(self, key: int) -> float | None:
        """When the meter started billing instance `key` (this meter's clock), None if it never did."""
        with self._lock:
            acc = self._instances.get(key)
            return None if acc is None else acc.start

    def now(self) -> float:
        """The run's clock (monotonic): what every deadline the meter hands out is measured on."""
        return self.clock()

    def cut_by_cap(self, deadline: float | None = None, *, ends_early_s: float = 0.0) -> bool:
        """Whether a wait that just ended was ended by the cap: now is at (or within CAP_CUT_SLACK_S of) the
        work deadline, or of `deadline`, a phase deadline the meter handed out. `ends_early_s`: how long before
        its deadline the wait gives up by design (an SSH connect starts no attempt it cannot finish). The one
        place this is decided: a cut by the cap is exit 6, a timeout of the phase's own is not."""
        now = self.clock()
        limit = self.work_deadline(now) if deadline is None else deadline
        return now >= limit - CAP_CUT_SLACK_S - ends_early_s

    def remaining_s(self) -> float:
        now = self.clock()
        return self.work_deadline(now) - now

    def deadline(self, limit_s: float | None = None) -> float:
        """A phase's deadline: its own limit from now, never past the work deadline."""
        now = self.clock()
        wd = self.work_deadline(now)
        return wd if limit_s is None else min(wd, now + limit_s)

    def check(self, phase: str) -> None:
        """Raise CapReachedError when no time is left for `phase`."""
        if self.remaining_s() <= 0:
            raise CapReachedError(f"cap reached before {phase}: stopping to keep the teardown margin "
                                  f"(accrued ${self.accrued_usd():.4f} of ${self.max_usd:g}, "
                                  f"{self.clock() - self.t0:.0f} s of {self.max_seconds:.0f} s)")

    def affordable_down_bytes(self, until: float) -> float:
        """Bytes out of the host that still fit the money cap if work goes on until `until` (inf when free)."""
        if self.usd_per_byte_down <= 0:
            return math.inf
        now = self.clock()
        spend = self.live_usd_per_s() * (max(0.0, until - now) + self.teardown_margin_s)
        return max(0.0, (self.max_usd - self.accrued_usd(now) - spend) / self.usd_per_byte_down)

    def affordable_up_bytes(self, until: float) -> float:
        if self.usd_per_byte_up <= 0:
            return math.inf
        now = self.clock()
        spend = self.live_usd_per_s() * (max(0.0, until - now) + self.teardown_margin_s)
        with self._lock:
            reserved_down = max(0, self.expected_down - self.bytes_down) * self.usd_per_byte_down
        return max(0.0, (self.max_usd - self.accrued_usd(now) - spend - reserved_down) / self.usd_per_byte_up)

    def elapsed_s(self) -> float:
        """Time charged against the time cap: from t0 to the last DELETE acknowledgement (now while live)."""
        now = self.clock()
        with self._lock:
            ends = [a.end if a.end is not None else now for a in self._instances.values()]
        return (max(ends) if ends else now) - self.t0

    def over_cap(self) -> str | None:
        """Why the run went over a cap, or None. A run over its cap never exits 0."""
        accrued = self.accrued_usd()
        if accrued > self.max_usd:
            return f"accrued ${accrued:.6f} is over the ${self.max_usd:g} cap"
        with self._lock:
            rented = bool(self._instances)
        if rented and self.elapsed_s() > self.max_seconds:
            return f"the instance lived {self.elapsed_s():.1f} s, over the {self.max_seconds:.1f} s cap"
        return None
