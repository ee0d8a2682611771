"""A run's milestones as notification events (console/notification.py), posted to its `--notify` URLs.

Built from the run's own typed records (the instance it rented, the teardowns' verdicts, its exit code) and its
meter (the dollars, the elapsed time), each event numbered in the order it was made. The milestones: `rented`
(each create that made an instance), `receipt_failed` (a host refused on its receipt), an interruptible run's
`outbid` (each one, with what happens next) and `replaced` or `resumed` (the run goes on, on another host or the
same), `cap_reached` and `interrupted` (once each, as soon as known: the guard's firing, the signal's exception),
and one last event, `proven_gone` or `not_proven_gone`, after the teardown and the record. Posting never waits (console/notify.py):
nothing here is on the teardown's path. A run that sent no create posts nothing.

`finish` gives the deliveries a short while once the run is over, after its registration is released, and writes
what became of each event to `notifications.json` in the evidence.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar, cast

from vast_harness.caps.meter import CostMeter
from vast_harness.console.notification import (
    CapReachedEvent,
    EventCaps,
    EventCi,
    EventInstance,
    EventOutcome,
    InterruptedEvent,
    NotProvenGoneEvent,
    OutbidEvent,
    ProvenGoneEvent,
    ReceiptFailedEvent,
    RentedEvent,
    ReplacedEvent,
    ResumedEvent,
)
from vast_harness.console.notify import NOTIFY_FLUSH_S, Notifier
from vast_harness.errors import ExitCode
from vast_harness.evidence.run import NOTIFICATIONS_FILE, RunEvidence
from vast_harness.masking import clip
from vast_harness.records import AbsenceSummary, Attempt, CreatedInstance
from vast_harness.spec.resolve import RunSpec
from vast_harness.vast.url import is_loopback_url

MESSAGE_CHARS = 500
OutbidNext = Literal["salvage_and_replace", "replace", "wait", "stop"]
Event = (RentedEvent | ReceiptFailedEvent | OutbidEvent | ReplacedEvent | ResumedEvent | CapReachedEvent
         | InterruptedEvent | ProvenGoneEvent | NotProvenGoneEvent)


def ci_context(environ: Mapping[str, str]) -> EventCi | None:
    """Where the run was started from, when GitHub Actions says so (its default variables); else None."""
    if environ.get("GITHUB_ACTIONS") != "true":
        return None
    repo, run_id = environ.get("GITHUB_REPOSITORY"), environ.get("GITHUB_RUN_ID")
    server = environ.get("GITHUB_SERVER_URL", "https://github.com").rstrip("/")
    return EventCi(provider="github", repository=repo, workflow=environ.get("GITHUB_WORKFLOW"),
                   job=environ.get("GITHUB_JOB"), run_id=run_id, run_attempt=environ.get("GITHUB_RUN_ATTEMPT"),
                   run_url=f"{server}/{repo}/actions/runs/{run_id}" if repo and run_id else None)


_M = TypeVar("_M", bound=Callable[..., None])


def _never_raises(method: _M) -> _M:
    """A milestone's event is made on the run's path (a create, the cap guard's thread): one that cannot be made
    is recorded as not sent, never raised into the run."""
    @functools.wraps(method)
    def guarded(self: RunNotifier, *args: Any, **kwargs: Any) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a notification must not stop a run
            self.notifier.not_made(method.__name__, exc)

    return cast(_M, guarded)


class RunNotifier:
    """One run's events (the module's docstring). With no `--notify` URL every method does nothing; none raises."""

    def __init__(self, spec: RunSpec, run_id: str, meter: CostMeter, *,
                 environ: Mapping[str, str] | None = None, notifier: Notifier | None = None) -> None:
        self.notifier = notifier if notifier is not None else Notifier(spec.notify)
        self._spec, self._run_id, self._meter = spec, run_id, meter
        self._ci = ci_context(os.environ if environ is None else environ)
        self._sequence = itertools.count(1)
        self._once: set[str] = set()
        self._lock = threading.Lock()  # the cap guard's thread and the run's may both make an event
        self._gpus: dict[int, tuple[str | None, int | None]] = {}  # instance id -> its offer's GPU, as rented
        self.posted = 0

    @property
    def active(self) -> bool:
        return bool(self._spec.notify)

    def _common(self, message: str) -> dict[str, object]:
        return {"run_id": self._run_id, "sequence": next(self._sequence), "time_unix": round(time.time(), 3),
                "message": clip(message, MESSAGE_CHARS),
                "sim": self._spec.sim or is_loopback_url(self._spec.api_url), "profile": self._spec.profile.name,
                "caps": EventCaps(max_usd=self._spec.caps.max_usd, max_minutes=self._spec.caps.max_minutes),
                "accrued_usd": round(self._meter.accrued_usd(), 6), "elapsed_s": round(self._meter.elapsed_s(), 3),
                "ci": self._ci}

    def _first(self, name: str) -> bool:
        """True the first time `name` is asked for: the once-only events."""
        with self._lock:
            if name in self._once:
                return False
            self._once.add(name)
            return True

    @_never_raises
    def rented(self, inst: CreatedInstance, *, gpu_name: str | None, num_gpus: int | None) -> None:
        if not self.active:
            return
        self._gpus[inst.instance_id] = (gpu_name, num_gpus)
        instance = _instance(inst, gpu_name=gpu_name, num_gpus=num_gpus)
        what = f"{num_gpus}x {gpu_name}" if gpu_name else f"offer {inst.offer_id}"
        self._post(RentedEvent.model_validate(self._common(
            f"rented instance {inst.instance_id} ({what}, ${inst.dph_usd:.3f}/h) as {inst.label}")
            | {"instance": instance}))

    @_never_raises
    def receipt_failed(self, inst: CreatedInstance, failed: list[str], *, gpu_name: str | None,
                       num_gpus: int | None) -> None:
        if not self.active:
            return
        instance = _instance(inst, gpu_name=gpu_name, num_gpus=num_gpus)
        self._post(ReceiptFailedEvent.model_validate(self._common(
            f"instance {inst.instance_id} refused on its receipt: {'; '.join(failed[:3])}")
            | {"instance": instance, "failed": [clip(line, MESSAGE_CHARS) for line in failed]}))

    @_never_raises
    def outbid(self, inst: CreatedInstance, reason: str, *, stage: str, interruption: int, next: OutbidNext) -> None:
        """The run's host was outbid (the `interruption`-th time), seen at `stage`; `next`: what the run does."""
        if not self.active:
            return
        limit = self._max_interruptions()
        then = {"salvage_and_replace": "its checkpoint is copied off, it is deleted and another host rented",
                "replace": "it is deleted and another host rented", "wait": "the run waits for it to resume",
                "stop": "past --max-interruptions: the run stops"}[next]
        self._post(OutbidEvent.model_validate(self._common(
            f"instance {inst.instance_id} outbid ({interruption} of at most {limit}) at {stage}: {then}")
            | {"instance": self._known(inst), "reason": clip(reason, MESSAGE_CHARS), "stage": stage,
               "interruption": interruption, "max_interruptions": limit, "next": next}))

    @_never_raises
    def replaced(self, inst: CreatedInstance, attempts: list[Attempt], *, interruption: int) -> None:
        """`inst` came up after an outbid host: the run goes on there. Nothing when no host before it in
        `attempts` (the record's, `inst`'s last) ended outbid."""
        if not self.active:
            return
        earlier = attempts[:-1] if attempts and attempts[-1].instance_id == inst.instance_id else attempts
        husk = next((a for a in reversed(earlier) if a.ended.startswith("outbid")), None)
        if husk is None:
            return
        terms = self._spec.interruptible
        salvaged = next((a.salvaged_bytes for a in reversed(earlier) if a.salvaged_bytes > 0), 0)
        checkpoint = None if terms is None or terms.checkpoint is None else salvaged
        resumes = ("from scratch" if not checkpoint else f"from the {checkpoint}-byte checkpoint") \
            if checkpoint is not None else "with the command again"
        self._post(ReplacedEvent.model_validate(self._common(
            f"instance {inst.instance_id} replaces outbid instance {husk.instance_id}: the run resumes {resumes}")
            | {"instance": self._known(inst), "replaces": husk.instance_id, "interruption": max(1, interruption),
               "max_interruptions": self._max_interruptions(), "checkpoint_bytes": checkpoint}))

    @_never_raises
    def resumed(self, inst: CreatedInstance, *, paused_s: float, interruption: int) -> None:
        """The outbid host resumed by itself within the wait: the run goes on on it."""
        if not self.active:
            return
        self._post(ResumedEvent.model_validate(self._common(
            f"instance {inst.instance_id} resumed after {paused_s:.1f} s paused: the run goes on there")
            | {"instance": self._known(inst), "paused_s": round(paused_s, 3), "interruption": interruption,
               "max_interruptions": self._max_interruptions()}))

    def _max_interruptions(self) -> int:
        terms = self._spec.interruptible
        return terms.max_interruptions if terms is not None else 0

    def _known(self, inst: CreatedInstance) -> EventInstance:
        gpu_name, num_gpus = self._gpus.get(inst.instance_id, (None, None))
        return _instance(inst, gpu_name=gpu_name, num_gpus=num_gpus)

    @_never_raises
    def cap_reached(self, reason: str) -> None:
        if self.active and self._first("cap_reached"):
            self._post(CapReachedEvent.model_validate(self._common(reason) | {"reason": clip(reason, MESSAGE_CHARS)}))

    @_never_raises
    def interrupted(self, signal_name: str) -> None:
        if self.active and self._first("interrupted"):
            self._post(InterruptedEvent.model_validate(
                self._common(f"{signal_name}: the run stops and tears down") | {"signal": signal_name}))

    @_never_raises
    def ended(self, code: ExitCode, message: str, absence: AbsenceSummary) -> None:
        """The last event: proven gone, or not (an instance may still bill; the message says reap)."""
        if not self.active or not self._first("ended"):
            return
        outcome = EventOutcome(exit_code=int(code), exit_name=code.name, message=clip(message, MESSAGE_CHARS),
                               absence=_absence(absence.verdict),
                               instances={str(i): v for i, v in sorted(absence.per_instance.items())},
                               unresolved_labels=list(absence.unresolved_labels),
                               not_ours={str(i): clip(why, MESSAGE_CHARS)
                                         for i, why in sorted(absence.not_ours.items())})
        common = self._common(f"exit {int(code)}: {message}") | {"outcome": outcome}
        if code == ExitCode.NOT_PROVEN_GONE or outcome.absence == "unproven":
            self._post(NotProvenGoneEvent.model_validate(common))
        else:
            self._post(ProvenGoneEvent.model_validate(common))

    def _post(self, event: Event) -> None:
        self.posted += 1
        self.notifier.post(event)

    def finish(self, ev: RunEvidence | None, warn: Callable[[str], None], wait_s: float = NOTIFY_FLUSH_S) -> None:
        """The run is over: its last events get `wait_s` to leave, then what became of each is written to the
        evidence (`notifications.json`, and the manifest again) and a delivery that failed is said once, in one
        line (`warn`). Nothing when no event was made."""
        if not self.active or not self.posted:
            self.notifier.close(0.0)
            return
        deliveries = self.notifier.close(wait_s)
        missed = [d for d in deliveries if d.outcome != "delivered"]
        if missed:
            first = missed[0]
            warn(f"notifications: {len(missed)} of {len(deliveries)} not delivered ({first.event} to {first.target}: "
                 f"{first.error or first.outcome}{'; ...' if len(missed) > 1 else ''}); "
                 f"{NOTIFICATIONS_FILE} in the evidence says what became of each")
        if ev is None or not ev.dir.is_dir():
            return
        ev.write_json(NOTIFICATIONS_FILE, {"targets": self.notifier.targets, "events": self.posted,
                                           "deliveries": [d.model_dump() for d in deliveries]})
        ev.write_manifest()


def _instance(inst: CreatedInstance, *, gpu_name: str | None, num_gpus: int | None) -> EventInstance:
    return EventInstance(instance_id=inst.instance_id, label=inst.label, offer_id=inst.offer_id,
                         machine_id=inst.machine_id, dph_usd=round(inst.dph_usd, 6), gpu_name=gpu_name,
                         num_gpus=num_gpus)


def _absence(verdict: str) -> Literal["gone", "nothing-created", "unproven"]:
    return "gone" if verdict == "gone" else "nothing-created" if verdict == "nothing-created" else "unproven"
