"""The cap's last line on this machine: a thread that deletes the run's instances when the cap is near and the
run has not begun to.

Every wait of the run is bounded by the meter's deadlines, so its teardown starts its DELETE by the prelude
deadline (half the teardown margin before the cap). That holds only while nothing blocks the main thread
past its bound: a disk that takes seconds per fsync (an NFS home, a saturated CI machine), a
library call that ignores its timeout, a bug. The guard does not depend on any of them. Once the hard
deadline is `TeardownBudget.guard_s` away, it cancels the run (exit 6) and sends the DELETE
itself, for every instance of the run whose teardown has not claimed it; the teardown, when it gets there,
takes the guard's answer as its first DELETE and proves absence as usual. The guard writes nothing to disk
before its DELETE, and only ever deletes instances a read has shown to be this run's: one that is not proven so
(a create answer named it, no read could show its label yet) is asked about again at its next pass.

A teardown claims an instance (`claim`) before its own DELETE, so the two never race: what the guard has
claimed the teardown waits for, and what the teardown has claimed the guard leaves alone.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Literal

from vast_harness.caps.meter import CostMeter
from vast_harness.records import DeleteAck

GUARD_POLL_S = 0.25  # how often the deadline is re-read (a re-price moves it earlier)
CLAIM_WAIT_S = 5.0  # beyond the DELETE's own bounds: how long a teardown waits for the guard's answer
# Whose an instance is, as the guard asks before its DELETE: "ours" (a read showed the run's label: deleted),
# "not_ours" (its row carries another label: never deleted), "unproven" (no read has shown its label: not now,
# asked again at the next pass).
Owned = Literal["ours", "not_ours", "unproven"]


class CapGuard:
    def __init__(self, *, meter: CostMeter, live: Callable[[], list[int]],
                 delete: Callable[[int, float], DeleteAck], on_fire: Callable[[str], None],
                 describe_now: Callable[[], str] = lambda: "",
                 owned: Callable[[int], Owned] = lambda _i: "ours") -> None:
        """`live()`: ids of the run's instances that still bill; `delete(instance_id, land_by_mono)`: one DELETE
        of it (never raises); `on_fire(reason)`: told before the first DELETE (the run cancels itself, exit 6);
        `describe_now()`: what the run is doing, for the reason; `owned(instance_id)`: whose it is (`Owned`): only
        "ours" is deleted. `note(instance_id)` adds an instance a create answer named before the run has booked
        it."""
        self.meter, self._live, self._delete, self._on_fire = meter, live, delete, on_fire
        self._describe_now = describe_now
        self._owned = owned
        self._lock = threading.Lock()
        self._claimed: set[int] = set()
        self._noted: set[int] = set()
        self._acks: dict[int, DeleteAck] = {}
        self._done: dict[int, threading.Event] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fire_by = math.inf  # sooner than the cap: a signal asked for the DELETE now
        self._early_why = ""
        self.fired_reason: str | None = None

    def fire_at(self) -> float:
        """When the guard acts, on the meter's clock."""
        return min(self._cap_point(), self._fire_by)

    def _cap_point(self) -> float:
        return self.meter.hard_deadline() - self.meter.budget.guard_s

    def fire_by(self, mono: float, why: str) -> None:
        """Act no later than `mono` (a signal: its DELETE must not wait for a main thread stuck on a disk).
        Lock-free: a signal handler calls it on the main thread, which may hold the guard's lock."""
        if mono < self._fire_by:
            self._early_why, self._fire_by = why, mono

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="vh-cap-guard", daemon=True)
            self._thread.start()

    def stop(self, *, wait_s: float = 0.0) -> None:
        """The teardown is over: nothing is left for the guard. A DELETE or a read it has in flight finishes on its
        own; `wait_s`: wait that long for it (whoever closes the client next)."""
        self._stop.set()
        if wait_s > 0 and self._thread is not None:
            self._thread.join(wait_s)

    @property
    def fired(self) -> bool:
        return self.fired_reason is not None

    def is_claimed(self, instance_id: int) -> bool:
        """Whether a DELETE of ours (the teardown's or the guard's) is on its way, or done, for `instance_id`."""
        with self._lock:
            return instance_id in self._claimed

    def note(self, instance_id: int) -> None:
        """A create's answer named `instance_id`: it bills from now, booked or not."""
        with self._lock:
            self._noted.add(instance_id)

    def forget(self, instance_id: int) -> None:
        """A noted instance turned out not to be the run's (its row carries another label): never DELETE it."""
        with self._lock:
            self._noted.discard(instance_id)

    def claim(self, instance_id: int) -> DeleteAck | None:
        """The teardown is about to DELETE `instance_id`: from now on the guard leaves it alone. When the guard
        has already sent its DELETE, wait for that answer and return it (the teardown's first DELETE)."""
        with self._lock:
            if instance_id not in self._claimed:
                self._claimed.add(instance_id)
                return None
            done = self._done.get(instance_id)
        if done is not None:
            done.wait(CLAIM_WAIT_S + max(0.0, self.meter.hard_deadline() - self.meter.now()))
        with self._lock:
            self._claimed.add(instance_id)  # the teardown's from here, whatever the guard decided meanwhile
            return self._acks.get(instance_id)

    def _watch(self) -> None:
        while True:
            left_s = self.fire_at() - self.meter.now()
            if left_s > 0:
                if self._stop.wait(min(GUARD_POLL_S, left_s)):
                    return
                continue
            if self._stop.is_set():
                return
            with self._lock:
                targets = sorted((set(self._live()) | self._noted) - self._claimed)
                for instance_id in targets:
                    self._claimed.add(instance_id)
                    self._done[instance_id] = threading.Event()
            if targets:
                self._act(targets)
            if self._stop.wait(GUARD_POLL_S):  # a create still in flight may rent one more: it goes too
                return

    def _act(self, targets: list[int]) -> None:
        ours: list[int] = []
        unproven: list[int] = []
        for instance_id in targets:  # whose each is, before any DELETE: a create answer can name another's
            try:
                answer = self._owned(instance_id)
            except RuntimeError:  # httpx: the run ended and closed its client under this read
                if not self._stop.is_set():
                    raise
                answer = "unproven"
            if answer == "ours":
                ours.append(instance_id)
                continue
            with self._lock:
                self._noted.discard(instance_id)
                if answer == "unproven":  # asked again at the next pass (a read may show its label by then)
                    unproven.append(instance_id)
                    self._claimed.discard(instance_id)
                done = self._done.pop(instance_id)
            done.set()
        if self.fired_reason is None:
            self._fire(ours, unproven)
        for instance_id in ours:
            ack: DeleteAck | None = None
            try:
                ack = self._delete(instance_id, self.meter.hard_deadline())
            finally:
                with self._lock:
                    if ack is not None:
                        self._acks[instance_id] = ack
                    self._done[instance_id].set()
            if ack is not None and ack.acknowledged and ack.t_ack_mono is not None:
                # Billing ends at the acknowledged DELETE, whenever the run's own teardown gets to it (its main
                # thread may be stuck on a disk that does not answer).
                self.meter.stop_instance(instance_id, ack.t_ack_mono)

    def _fire(self, ours: list[int], unproven: list[int]) -> None:
        """The run told (cancelled, exit 6) before the guard's first DELETE, with what the guard deletes and what
        it may not."""
        doing = self._describe_now()
        now = self.meter.now()
        left_s = self.meter.hard_deadline() - now
        if now < self._cap_point() and self._early_why:
            when = self._early_why
        elif left_s >= 0:
            when = f"the {self.meter.binding_cap()} cap is {left_s:.1f} s away"
        else:  # the process was stopped past it (SIGSTOP, a suspended machine): nothing ran until now
            when = f"the {self.meter.binding_cap()} cap passed {-left_s:.1f} s ago"
        sent = (f"the cap guard sent the DELETE for instance(s) {', '.join(str(i) for i in ours)}" if ours
                else "the cap guard sent no DELETE")
        if unproven:
            sent += (f"; none to instance(s) {', '.join(str(i) for i in unproven)}, which a create answer named but "
                     "no read has shown with the run's label (not proven ours)")
        self.fired_reason = (f"{when} and the run had not sent its own DELETE" + (f" (it was in {doing})" if doing else "")
                             + f": {sent}")
        self._on_fire(self.fired_reason)

    def acknowledged(self) -> dict[int, DeleteAck]:
        """The guard's own DELETEs that the API acknowledged, by instance id."""
        with self._lock:
            return {i: a for i, a in self._acks.items() if a.acknowledged}

    def deleted_ids(self) -> set[int]:
        """Every instance the guard sent (or is sending) a DELETE for."""
        with self._lock:
            return set(self._done)


__all__ = ["CapGuard", "Owned"]
