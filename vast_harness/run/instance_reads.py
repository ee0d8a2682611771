"""What reads of a run's rented instance tell the run, whoever makes them (the boot's polls, the price watch
while the steps run, the last read before teardown).

Three facts: the first read that shows the instance (recorded in the ledger: from then on null reads can prove
it gone); the host's own price when it is higher than the search's (the meter is re-priced, the cap deadline
moves earlier, a price that breaks the cap cancels the run, exit 6); and a delete that was not ours (the
instance was shown, and now a read does not show it: the run stops, the teardown still proves it absent).

The price comes from every row of ours any read shows, not only the per-id reads: when those fail (refused,
a retired path) the v1 list by id is read instead, and each absence-proof round's three reads re-price the
meter too (`on_row`, `on_proof_round`; never raising: the teardown calls them), and so does the ownership
read's row of ours (`take_own_row`, run/instances.py).

A fourth: the contract's end (`end_date`). Vast's docs say a contract keeps its price until then, a host's raise
applying after it only once the renter accepts (docs/vast-behaviours.md), and the offer's end was checked against
the time cap before renting; a row that shows the end inside the time cap (the host moved its offer's end in
after the search) makes it the run's deadline, and the pending increase on the contract, if any, prices what
runs past it (`on_contract_end`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from vast_harness.caps.meter import CostMeter, finite_positive, plausible_dph
from vast_harness.console.money import per_hour
from vast_harness.console.output import Output
from vast_harness.console.when import utc
from vast_harness.errors import CapReachedError, ExitCode, Interrupted, VastError
from vast_harness.instance.absence import is_lingering
from vast_harness.records import CreatedInstance, PriceChange, ProofRound
from vast_harness.run.rent_book import RentBook
from vast_harness.state.ledger import Ledger
from vast_harness.vast.client import VastClient
from vast_harness.vast.models import Instance, epoch
from vast_harness.vast.row_price import row_price, rows_of

MIN_READ_WITHIN_S = 2.0  # a poll's read (per-id, or the list row in its place) answers within a poll, within
MAX_READ_WITHIN_S = 5.0  # these bounds (Vast answers in ~0.5 s)
LAST_PRICE_READ_RETRY_S = 5.0  # the last price read, the prelude's last act: brief, the DELETE comes next
# The last price read as a whole (the list row, then the per-id read): the DELETE waits behind it, so a stalled
# API costs it this long at most, not each read's own timeout (red team r8: 65 s).
LAST_PRICE_READ_S = 6.0
WATCH_JOIN_S = 5.0  # the price watcher's thread gets this long to notice the steps ended

Cancel = Callable[[str, ExitCode], None]



def take_own_row(meter: CostMeter, out: Output, inst: CreatedInstance, row: Instance, *, source: str) -> None:
    """A parsed row of `inst` that carries its label, read by anything but the reads here (the ownership read
    before a DELETE, run/instances.py): the run's, and its price counts like a list row's. Never raises."""
    inst.label_seen = True
    reason = None if row.dph_total is not None else "no usable dph_total (missing, null, not a number or negative)"
    _took(meter, out, inst, meter.observe_price(inst.instance_id, row.dph_total, source=source, reason=reason), source)


def _took(meter: CostMeter, out: Output, inst: CreatedInstance, change: PriceChange | None, source: str) -> None:
    """A higher price `meter` took from a row of `inst` (`source`): the user told, the instance's price raised."""
    if change is not None and change.billed_dph_usd is not None:
        out.warn(f"instance {inst.instance_id} bills {per_hour(change.billed_dph_usd)}, not the "
                 f"{per_hour(change.searched_dph_usd)} last read ({source}): the accrued figure counts "
                 "it from the instance's start")
        inst.dph_usd = plausible_dph(change.billed_dph_usd)


class InstanceReads:
    def __init__(self, *, client: VastClient, ledger: Ledger, run_id: str, meter: CostMeter, book: RentBook,
                 out: Output, cancel: Cancel, poll_s: float,
                 deleting: Callable[[int], bool] = lambda _id: False,
                 switch_allowance_s: float | None = None,
                 on_outbid: Callable[[CreatedInstance, str], None] | None = None) -> None:
        self.client, self.ledger, self.run_id, self.meter, self.book, self.out = client, ledger, run_id, meter, book, out
        # Whether a DELETE of ours (the teardown's or the cap guard's) is on its way for an instance: a read
        # that then no longer shows it, even one sent before, says nothing about anyone else.
        self._deleting = deleting
        self._cancel = cancel  # RunState.cancel: stop at the next phase boundary, then the usual teardown
        self.poll_s = poll_s  # how often the price watch re-reads the rented instance while the steps run
        # A poll's per-id read is one attempt: the next poll is its retry, and when it fails the list row is read
        # at once (red team r8, r9: retried for a poll interval, a 2000x price ran 12.5x over the cap meanwhile).
        self.read_retry_s = 0.0
        # How long one poll's read may take to answer: a stalled one is cut then and the list row read instead
        # (red team r10: a stall waited out the client's 30 s timeout while the host billed 500x).
        self.read_within_s = min(max(poll_s, MIN_READ_WITHIN_S), MAX_READ_WITHIN_S)
        # The host's dead-man switch deletes the instance this long after it boots (cap + grace): past it, an
        # instance gone with no DELETE of ours was most likely deleted by the switch (the run was stopped)
        self.switch_allowance_s = switch_allowance_s
        # --interruptible: a read that shows the instance paused (outbid) stops the work within one poll
        self.on_outbid = on_outbid
        # instance -> the contract's end a row last showed (epoch), on the run's clock when inside the time cap,
        # and the pending increase's factor known for past it
        self._contract_ends: dict[int, tuple[float, float | None, float | None]] = {}
        self._pending_unread: set[int] = set()  # instances whose pending increases could not be read (said)
        # instance -> why its absence is no news (a kept host's `down` after an earlier DELETE of the hold's, or
        # past the deadline its switch deletes it by): found gone, it is proven gone, nobody else's doing
        self.expected_gone: dict[int, str] = {}
        self.gone_by: dict[int, float] = {}  # an expected-gone instance's bill ends at this moment at the latest

    def record_raise(self, change: PriceChange) -> None:
        """A higher price the meter took, into the ledger (best effort, like every line after the intent): a
        run killed before its record is then estimated by `costs` at it, not at the search's price."""
        inst = next((i for i in self.book.created if i.instance_id == change.instance_key), None)
        if inst is None or change.billed_dph_usd is None:
            return
        self.ledger.append(self.run_id, "repriced", inst.label, instance_id=inst.instance_id,
                           dph_usd=plausible_dph(change.billed_dph_usd), detail=change.source)

    def on_read(self, inst: CreatedInstance, read: Instance | None) -> None:
        """Every per-id read of the rented instance: the first that shows it is recorded, and its own price
        replaces the search's when higher. Raises CapReachedError when that price breaks the cap."""
        if read is not None and read.label != inst.label and not (inst.seen or inst.label_seen):
            return  # a row not proven the run's (run/instances.py decides whose it is): not seen, not priced
        if read is not None and read.label == inst.label:
            inst.label_seen = True
        if read is not None and not inst.seen:
            inst.seen = True
            self.ledger.append(self.run_id, "seen", inst.label, instance_id=inst.instance_id, detail="in a per-id read")
        if read is None:
            return
        if read.end_date_unix is not None and read.end_date_unix == self._contract_ends.get(inst.instance_id, (None,))[0]:
            self.pending_increase(inst)  # the same end: what a host asks past it may have changed
        else:
            self.on_contract_end(inst, read.end_date_unix)
        if read.dph_total is None:  # no usable price sent: the last good one stands, and why is recorded
            self.meter.observe_price(inst.instance_id, None, source="per-id read",
                                     reason="no usable dph_total (missing, null, not a number or negative)")
            return
        if finite_positive(read.dph_total) and read.dph_total > inst.dph_usd:
            self.out.warn(f"instance {inst.instance_id} bills {per_hour(read.dph_total)}, not the "
                          f"{per_hour(inst.dph_usd)} the search showed: the cap deadline moves earlier")
            inst.dph_usd = plausible_dph(read.dph_total)
        self.meter.reprice(inst.instance_id, read.dph_total)

    def on_contract_end(self, inst: CreatedInstance, end_unix: float | None) -> None:
        """A row's `end_date` for `inst`'s contract. Past the time cap it changes nothing (the price holds for
        the whole run); inside it, it becomes the run's deadline (Vast stops the instance there unless a raise
        was accepted), said once. Never raises."""
        if end_unix is None or end_unix == self._contract_ends.get(inst.instance_id, (None,))[0]:
            return
        server_now = self.client.server_clock.now()  # the same clock as the row's date; else the wall clock
        end_s = self.meter.now() + end_unix - (server_now if server_now is not None else time.time())
        inside = end_s < self.meter.t0 + self.meter.max_seconds
        self._contract_ends[inst.instance_id] = (end_unix, end_s if inside else None, None)
        self.meter.set_contract_end(inst.instance_id, end_s=end_s if inside else None, end_unix=end_unix)
        if inside:
            self.out.warn(f"instance {inst.instance_id}'s contract ends {utc(end_unix)}, "
                          f"{max(0.0, end_s - self.meter.now()):.0f} s from now, before the time cap: Vast stops it "
                          "then unless a price increase on it is accepted, so the run's work ends before it")
            self.pending_increase(inst)

    def pending_increase(self, inst: CreatedInstance) -> None:
        """While `inst`'s contract ends inside the time cap, what a pending increase on it asks prices any time
        past its end (GET pending-price-increases, one bounded read; not once our DELETE is on its way). Never
        raises: an unreadable list leaves the contract's own price, said."""
        entry = self._contract_ends.get(inst.instance_id)
        if entry is None or entry[1] is None or self._deleting(inst.instance_id):
            return
        end_unix, end_s, known = entry
        try:
            rows = self.client.pending_price_increases(within_s=self.read_within_s)
        except VastError as exc:
            if inst.instance_id not in self._pending_unread:  # said once, not at every poll
                self._pending_unread.add(inst.instance_id)
                self.out.warn(f"could not read the pending price increases ({exc}): time past instance "
                              f"{inst.instance_id}'s contract end is counted at its own price")
            return
        row = next((r for r in rows if r.contract_id == inst.instance_id), None)
        factor = None if row is None else row.factor
        if factor is None or factor == known:
            return
        self._contract_ends[inst.instance_id] = (end_unix, end_s, factor)
        self.meter.set_contract_end(inst.instance_id, end_s=end_s, end_unix=end_unix, after_factor=factor)
        self.out.warn(f"instance {inst.instance_id}'s host asks {factor:.3g}x its price from the contract's end "
                      "(a pending price increase, never accepted here): any time past it is counted at that price")

    def on_row(self, inst: CreatedInstance, body: Any, *, source: str) -> None:
        """Every row of `inst` in a read's parsed body other than the per-id reads `on_read` takes (the v1 list
        by id, an absence-proof round's reads): a higher price re-prices the meter from the instance's start,
        an unreadable one is recorded and the last good price kept. Until a read has shown the instance as the
        run's, a row with another label, or none, counts for nothing: a create answer can name another's instance,
        whose price is not the run's. Bookkeeping: never raises."""
        proven = inst.seen or inst.label_seen
        for row in rows_of(body, inst.instance_id):
            if row.get("label") == inst.label:
                inst.label_seen = True  # the run's: its DELETE needs no ownership read first
            elif not proven:
                continue
            price = row_price(row)
            _took(self.meter, self.out, inst, self.meter.observe_price(
                inst.instance_id, price.dph_usd, source=source, reason=price.reason), source)
            self.on_contract_end(inst, epoch(row.get("end_date")))

    def on_proof_round(self, inst: CreatedInstance, r: ProofRound) -> None:
        """An absence-proof round's three reads, each a row of ours when it shows one (a lingering row too: it
        still states the contract's price). Never raises."""
        for source, exchange in (("absence proof, per-id read", r.per_id), ("absence proof, list by id", r.list_by_id),
                                 ("absence proof, list by label", r.list_by_label)):
            if exchange.get("status") == 200:
                self.on_row(inst, exchange.get("json"), source=source)

    def list_price(self, inst: CreatedInstance, *, within_s: float) -> None:
        """`inst`'s price from its v1 list row, read by id: what still shows it when its per-id reads fail (a
        refused or retired path). One unretried read; a failed one changes nothing. Never raises."""
        x = self.client.list_instances_raw(instance_id=inst.instance_id, within_s=within_s)
        if x.status == 200:
            self.on_row(inst, x.json, source="list by id")

    def check_gone(self, inst: CreatedInstance, read: Instance | None) -> None:
        """A shown instance that a read no longer shows (or shows destroyed) was deleted by someone else."""
        if inst.seen and (read is None or is_lingering(read)) and not self._deleting(inst.instance_id):
            self.vanished(inst, "a read of it no longer shows it" if read is None else "a read shows it destroyed")

    def vanished(self, inst: CreatedInstance, how: str) -> None:
        """Our instance went away and we sent no DELETE: someone else deleted it (a reap elsewhere, the
        console). Say so, stop the work; the teardown still proves it absent."""
        if inst.instance_id in self.book.vanished:
            return
        if inst.instance_id in self.expected_gone:
            self.out.info(f"instance {inst.instance_id} is already gone: {self.expected_gone[inst.instance_id]}")
            if inst.instance_id in self.gone_by:
                self.meter.stop_instance(inst.instance_id, min(self.meter.now(), self.gone_by[inst.instance_id]))
            return
        started = self.meter.accrual_start(inst.instance_id)
        if self.switch_allowance_s is not None and started is not None \
                and self.meter.now() - started > self.switch_allowance_s:
            # The switch counts from the host's boot, after the create: its allowance had run out by now at most
            how += (f"; {self.meter.now() - started:.0f} s after its create, past its dead-man switch's allowance "
                    f"of {self.switch_allowance_s:.0f} s from boot: most likely this run's own dead-man switch "
                    "deleted it while the run was not running")
        self.book.vanished[inst.instance_id] = how
        why = f"instance {inst.instance_id} was deleted by someone else: no DELETE of ours ({how})"
        self.out.warn(why)
        self._cancel(why, ExitCode.FAILED)

    @contextlib.contextmanager
    def watch_prices(self, inst: CreatedInstance | None) -> Iterator[None]:
        """While the body runs (the steps), re-read `inst` every `poll_s` (hosts re-price running contracts): a
        higher price re-prices the meter; one that breaks the cap, or moves the work deadline into the past,
        cancels the run (exit 6) and the running step is cut. The last read comes later, at the end of the
        teardown's prelude, just before the DELETE (`teardown.final_price_reads`)."""
        stop = threading.Event()

        def watch() -> None:
            while inst is not None and not stop.wait(self.poll_s):
                try:
                    read = self.client.get_instance(inst.instance_id, max_retry_s=self.read_retry_s,
                                                    within_s=self.read_within_s)
                except VastError:
                    # The per-id read failed: the list row still carries the price (a failed one changes nothing).
                    self.list_price(inst, within_s=self.read_within_s)
                    if stop.is_set() or self._deleting(inst.instance_id):
                        return  # the body ended meanwhile: the teardown reads from here on
                    if self.meter.cut_by_cap():
                        self._cancel(f"{self.meter.cap_reached()}; instance {inst.instance_id} bills "
                                     f"${inst.dph_usd:.4f}/h", ExitCode.CAP_REACHED)
                        return
                    continue
                except RuntimeError:  # httpx: the run ended and closed its client under a read still out
                    if stop.is_set():
                        return
                    raise
                if stop.is_set() or self._deleting(inst.instance_id):
                    return  # the body ended while this read was out: the teardown reads from here on
                if inst.seen and (read is None or is_lingering(read)):
                    self.vanished(inst, "a read of it no longer shows it running" if read is None
                                  else "a read shows it destroyed")
                    return
                if self.on_outbid is not None and read is not None and read.paused is not None:
                    self.on_outbid(inst, read.paused)
                    return
                try:
                    self.on_read(inst, read)
                    if self.meter.cut_by_cap():
                        raise CapReachedError(f"{self.meter.cap_reached()}; instance {inst.instance_id} bills "
                                              f"${inst.dph_usd:.4f}/h")
                except CapReachedError as exc:
                    self._cancel(str(exc), ExitCode.CAP_REACHED)
                    return

        thread = threading.Thread(target=watch, name=f"vh-price-{self.run_id}", daemon=True)
        thread.start()
        signalled = False
        try:
            yield
        except Interrupted:
            signalled = True  # a signal: the DELETE goes first, so no waiting on the watcher, no last read
            raise
        finally:
            stop.set()
            thread.join(timeout=0.1 if signalled else WATCH_JOIN_S)

    @contextlib.contextmanager
    def watch_while_deleting(self, inst: CreatedInstance) -> Iterator[None]:
        """While our DELETE is in flight (an API that holds it for tens of seconds) the host still bills, at
        whatever it charges now: re-read the price every `poll_s` until a read no longer shows the instance, so
        a re-price there reaches the meter and the verdict (a run over its cap is never exit 0). Never cancels
        anything: the teardown is already running."""
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.poll_s):
                try:
                    read = self.client.get_instance(inst.instance_id, max_retry_s=0.0, within_s=self.poll_s)
                except VastError:
                    self.list_price(inst, within_s=self.poll_s)  # the list row still states the price
                    continue
                except RuntimeError:  # httpx: the client closed under this read (the run is over)
                    if stop.is_set():
                        return
                    raise
                if read is None or is_lingering(read):
                    return  # our DELETE (or someone's) took effect: nothing more bills
                with contextlib.suppress(CapReachedError):  # recorded by the meter; the verdict says over cap
                    self.on_read(inst, read)

        thread = threading.Thread(target=watch, name=f"vh-delete-price-{self.run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=WATCH_JOIN_S)

    def last_price_read(self, inst: CreatedInstance, *, max_retry_s: float = LAST_PRICE_READ_RETRY_S) -> None:
        """One more read of the rented price (a re-price can land between two polls, or steps can be shorter
        than one): the record bills what the host billed, and a run over the cap is not a pass (the verdict
        turns it into exit 6). The list row by id first, the per-id read when the list fails or shows no
        row; the DELETE follows at once (its pacing is its own, not the reads'). Bounded as a whole by LAST_PRICE_READ_S and by the meter's prelude deadline (the DELETE keeps
        its half of the margin): the DELETE is waiting. Never raises."""
        until = min(self.meter.prelude_deadline(), self.meter.now() + LAST_PRICE_READ_S)
        left_s = until - self.meter.now()
        if left_s <= 0:
            self.out.warn(f"no time left before the DELETE to re-read instance {inst.instance_id}'s price; the "
                          f"record bills the last price read ({per_hour(inst.dph_usd)})")
            return
        x = self.client.list_instances_raw(instance_id=inst.instance_id, within_s=left_s / 2)
        if x.status == 200 and rows_of(x.json, inst.instance_id):
            self.on_row(inst, x.json, source="list by id")
            return
        left_s = until - self.meter.now()
        try:
            read = self.client.get_instance(inst.instance_id, max_retry_s=min(max_retry_s, left_s), within_s=left_s)
            self.on_read(inst, read)
        except CapReachedError as exc:
            self.out.warn(str(exc))
        except VastError as exc:
            self.out.warn(f"could not re-read instance {inst.instance_id}'s price before its DELETE: {exc}; the "
                          f"record bills the last price read ({per_hour(inst.dph_usd)})")
