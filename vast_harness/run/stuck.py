"""A run whose main thread does not come back after the cap guard's DELETE: ended a bound later.

The cap guard deletes the run's instances at the cap whatever the main thread is doing (caps/guard.py). A main
thread blocked in a write to a disk that does not answer (a hung NFS or FUSE evidence dir) never reaches its
teardown: the process lived on for good, its heartbeat describing a step on a host deleted minutes before.
`StuckRunWatch`, armed when the guard fires, waits for the run to finish for as long as a whole teardown may take
(`bound_s`); past that it proves every instance the guard deleted absent itself (the teardown's own proof), says
the outcome on stderr with plain writes (never the evidence disk, never a console lock the stuck thread may
hold), and ends the process: exit 6 when every one is proven gone, else 3. Nothing is written to the evidence
dir: that is what hangs. The ledger keeps the run's `created` lines, so `reap` still sees anything not proven.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from vast_harness.caps.guard import CapGuard
from vast_harness.clock import Clock
from vast_harness.errors import ExitCode
from vast_harness.instance.absence import prove_absent
from vast_harness.masking import mask
from vast_harness.run.rent_book import RentBook
from vast_harness.vast.client import VastClient

STUCK_GRACE_S = 5.0  # beyond a whole teardown's budget: what a slow but healthy main thread is given


def exit_process(code: int) -> None:
    """Ends the process at once: no atexit, no flush of files on the hung disk (a test replaces it)."""
    os._exit(code)


def _say(text: str) -> None:
    try:
        os.write(2, f"{mask(text)}\n".encode("utf-8", "replace"))
    except OSError:
        pass


class StuckRunWatch:
    def __init__(self, *, guard: CapGuard, client: VastClient, book: RentBook, clock: Clock,
                 bound_s: Callable[[], float], proof_interval_s: float, proof_budget_s: Callable[[], float],
                 accrued_usd: Callable[[], float]) -> None:
        """`bound_s()`: how long after the guard fired the run may take to finish; `proof_budget_s()`: one
        instance's absence proof; `accrued_usd()`: the meter's figure (it stopped at the guard's acknowledged
        DELETE)."""
        self._guard, self._client, self._book, self._clock = guard, client, book, clock
        self._bound_s, self._proof_interval_s, self._proof_budget_s = bound_s, proof_interval_s, proof_budget_s
        self._accrued_usd = accrued_usd
        self._finished = threading.Event()
        self._thread: threading.Thread | None = None
        self.exit_process: Callable[[int], None] = lambda code: exit_process(code)  # an in-process caller's own

    def arm(self) -> None:
        """The guard fired: from now on the run has `bound_s()` to finish."""
        if self._thread is None and not self._finished.is_set():
            self._thread = threading.Thread(target=self._watch, name="vh-stuck-run", daemon=True)
            self._thread.start()

    def finished(self) -> None:
        """The main thread's teardown and verdict are done: nothing for the watch to do."""
        self._finished.set()

    def _watch(self) -> None:
        bound_s = self._bound_s()
        if self._finished.wait(bound_s):
            return
        acks = self._guard.acknowledged()
        labels = {i.instance_id: i.label for i in self._book.created}
        lines, proven = [], True
        for instance_id in sorted(self._guard.deleted_ids()):
            ack = acks.get(instance_id)
            if ack is None:
                proven = False
                lines.append(f"instance {instance_id}: the cap guard's DELETE was not acknowledged")
                continue
            proof = prove_absent(self._client, instance_id, labels.get(instance_id, ""),
                                 interval_s=self._proof_interval_s, deadline=self._clock() + self._proof_budget_s(),
                                 clock=self._clock)
            proven = proven and proof.verdict == "gone"
            lines.append(f"instance {instance_id}: {proof.verdict} ({len(proof.rounds)} proof rounds)")
        for inst in self._book.live():  # named by a create answer, its label never read: the guard sent nothing
            if inst.instance_id not in self._guard.deleted_ids():
                proven = False
                lines.append(f"instance {inst.instance_id}: no DELETE sent (not proven the run's: no read showed "
                             "its label)")
        if self._finished.is_set():
            return  # it came back meanwhile: its own verdict stands
        code = ExitCode.CAP_REACHED if proven else ExitCode.NOT_PROVEN_GONE
        _say(f"vast-e2e: the run's main thread has not come back {bound_s:.0f} s after the cap guard's DELETE (an "
             "evidence disk that does not answer?); the run ends here without writing its evidence.")
        for line in lines:
            _say(f"  {line}")
        verdict = "every instance proven gone" if proven else "NOT every instance proven gone: run `vast-e2e reap`"
        _say(f"exit {int(code)}: {verdict}; accrued ${self._accrued_usd():.4f} (billing ended at the DELETE)")
        self.exit_process(int(code))
