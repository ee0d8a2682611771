"""The notification event: one JSON object a run posts to each `--notify` URL at a milestone (docs/notifications.md).

Typed here, once: the run builds each event from its own records (`run/notify.py`), the notifier serialises it
masked (`console/notify.py`), and `docs/notification.schema.json` is `notification_schema()` written out (a test
keeps the two equal and validates every body a receiver got against the file). Every model forbids fields it
does not name, so the schema says `additionalProperties: false` and a receiver can rely on it. Version 1; a
change that removes or retypes a field raises `SCHEMA_VERSION`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

SCHEMA_VERSION: Literal[1] = 1
EVENTS = ("rented", "receipt_failed", "outbid", "replaced", "resumed", "cap_reached", "interrupted", "proven_gone",
          "not_proven_gone")


class _Strict(BaseModel):
    # Every field is sent, defaults included: the schema (serialization mode) then marks every one required.
    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_serialization_defaults_required=True)


class EventCaps(_Strict):
    """The run's two caps."""

    max_usd: float = Field(description="cost cap, dollars (worst case before renting, accrued while running)")
    max_minutes: float = Field(description="time cap, minutes, create to teardown")


class EventCi(_Strict):
    """Where the run was started from, when a CI system says so (GitHub Actions' default variables)."""

    provider: Literal["github"]
    repository: str | None = None
    workflow: str | None = None
    job: str | None = None
    run_id: str | None = None
    run_attempt: str | None = None
    run_url: str | None = Field(default=None, description="the workflow run's page")


class EventInstance(_Strict):
    """An instance the run rented (or was refused on its receipt)."""

    instance_id: int
    label: str = Field(description="vh-<run_id>[-r<n>]-d<deadline>: how reap and status tell it apart")
    offer_id: int
    machine_id: int | None
    dph_usd: float = Field(description="its price, dollars per hour at the rented disk size")
    gpu_name: str | None = None
    num_gpus: int | None = None


class EventOutcome(_Strict):
    """How the run ended and what its teardown proved: the last event of every run that sent a create."""

    exit_code: int = Field(description="the process's exit code (the README's table)")
    exit_name: str = Field(description="its ExitCode name: PASSED, FAILED, NOT_PROVEN_GONE, CAP_REACHED, ...")
    message: str
    absence: Literal["gone", "nothing-created", "unproven"] = Field(
        description="gone: every instance deleted and proven absent; nothing-created: no create made one; "
                    "unproven: an instance may still bill (run `vast-e2e reap`)")
    instances: dict[str, str] = Field(description="instance id -> its absence verdict (gone, present, unknown)")
    unresolved_labels: list[str] = Field(description="labels of creates whose outcome stayed unknown")
    not_ours: dict[str, str] = Field(
        description="instance id -> why it is not the run's: a create answer named it but no read showed it with "
                    "the run's label (another label, or none read), so it was never deleted, billed or proven as "
                    "the run's; whose it is, the account's owner decides")


class _EventBase(_Strict):
    schema_version: Literal[1] = SCHEMA_VERSION
    run_id: str
    sequence: int = Field(ge=1, description="1, 2, 3, ... in the order the run made its events")
    time_unix: float = Field(description="when the run made the event (seconds since the epoch)")
    message: str = Field(description="one line for people, masked like everything the harness writes")
    sim: bool = Field(description="the API is the simulator (--sim or an API on this machine): no money moved")
    profile: str
    caps: EventCaps
    accrued_usd: float = Field(description="the run's accrued dollars when the event was made")
    elapsed_s: float = Field(description="seconds since the run started, on its meter's clock (a suspend counts)")
    ci: EventCi | None = None


class RentedEvent(_EventBase):
    """An instance was created: it bills from now until its DELETE."""

    event: Literal["rented"] = "rented"
    instance: EventInstance


class ReceiptFailedEvent(_EventBase):
    """A host delivered less than its receipt requires: it is deleted, proven gone, and the next offer rented."""

    event: Literal["receipt_failed"] = "receipt_failed"
    instance: EventInstance
    failed: list[str] = Field(description="each failed check: the measure, the measured and the expected value")


class OutbidEvent(_EventBase):
    """An interruptible run's host was outbid (paused): what happens next (docs/interruptible.md)."""

    event: Literal["outbid"] = "outbid"
    instance: EventInstance
    reason: str = Field(description="what the read of the instance showed")
    stage: str = Field(description="the run's stage when it was seen: rent, deadman, receipt, upload, steps, pull")
    interruption: int = Field(ge=1, description="this outbid's number in the run: 1, 2, ...")
    max_interruptions: int = Field(description="--max-interruptions: the outbids the run survives")
    next: Literal["salvage_and_replace", "replace", "wait", "stop"] = Field(
        description="salvage_and_replace: the checkpoint copied off, the host deleted and proven gone, another "
                    "rented; replace: the same without a checkpoint to copy; wait: --on-outbid wait, for the host "
                    "to resume; stop: past --max-interruptions, the run stops (exit 1)")


class ReplacedEvent(_EventBase):
    """Another host came up in place of an outbid one (deleted and proven gone): the run goes on there."""

    event: Literal["replaced"] = "replaced"
    instance: EventInstance
    replaces: int = Field(description="the instance id of the outbid host it replaces")
    interruption: int = Field(ge=1, description="the outbids the run has met so far")
    max_interruptions: int = Field(description="--max-interruptions: the outbids the run survives")
    checkpoint_bytes: int | None = Field(
        description="bytes of the checkpoint salvaged off an outbid host that the new host resumes from; 0: it "
                    "starts from scratch; null: the run has no --checkpoint")


class ResumedEvent(_EventBase):
    """The outbid host resumed by itself within --on-outbid wait: the run goes on there, its disk as it was."""

    event: Literal["resumed"] = "resumed"
    instance: EventInstance
    paused_s: float = Field(description="seconds the run waited for it")
    interruption: int = Field(ge=1, description="the outbids the run has met so far")
    max_interruptions: int = Field(description="--max-interruptions: the outbids the run survives")


class CapReachedEvent(_EventBase):
    """A cap (dollars or time) was reached: the run stops and tears down (exit 6)."""

    event: Literal["cap_reached"] = "cap_reached"
    reason: str


class InterruptedEvent(_EventBase):
    """A signal (Ctrl-C, SIGTERM, SIGHUP; a cancelled CI job) stopped the run: it tears down (exit 130)."""

    event: Literal["interrupted"] = "interrupted"
    signal: str = Field(description="the signal's name, e.g. SIGINT")


class ProvenGoneEvent(_EventBase):
    """The run is over and nothing it rented bills: every instance deleted and proven absent (or none made)."""

    event: Literal["proven_gone"] = "proven_gone"
    outcome: EventOutcome


class NotProvenGoneEvent(_EventBase):
    """The run is over and an instance may still bill (exit 3): `vast-e2e reap` deletes what is left."""

    event: Literal["not_proven_gone"] = "not_proven_gone"
    outcome: EventOutcome


Notification = Annotated[RentedEvent | ReceiptFailedEvent | OutbidEvent | ReplacedEvent | ResumedEvent
                         | CapReachedEvent | InterruptedEvent | ProvenGoneEvent | NotProvenGoneEvent,
                         Field(discriminator="event")]
NOTIFICATION = TypeAdapter(Notification)


def notification_schema() -> dict[str, Any]:
    """The JSON Schema of every event (draft 2020-12), as docs/notification.schema.json holds it."""
    schema = NOTIFICATION.json_schema(mode="serialization")
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "vast-harness notification event",
            "description": "One JSON object POSTed to each --notify URL per milestone of a run (docs/notifications.md).",
            **schema}
