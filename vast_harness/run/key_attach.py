"""Register the run's one-time SSH key with its instance through the API, beside the onstart's line.

Vast owns an instance's authorized keys and refreshes them: a key the onstart appended stops working "between 9
and 18 hours in" (skypilot PR 10730), while a run may last days. A key attached with `POST
/api/v0/instances/{id}/ssh/` (attach_ssh.yaml) is part of the set Vast keeps. The onstart line stays as the
fallback: an attach that fails is said and recorded (`key_attached: false` in the record), never fatal, since the
first hours work either way.
"""

from __future__ import annotations

from vast_harness.console.output import Output
from vast_harness.errors import VastError
from vast_harness.records import CreatedInstance
from vast_harness.vast.client import VastClient


def attach_run_key(client: VastClient, inst: CreatedInstance, public_key: str, *, within_s: float,
                   out: Output) -> None:
    """Attach `public_key` to `inst`, within `within_s` (the boot's deadline); the outcome goes on `inst`."""
    if within_s <= 0:
        inst.key_attached, inst.key_attach_detail = False, "no time left before the boot's deadline"
        return
    try:
        client.attach_ssh_key(inst.instance_id, public_key, within_s=within_s)
    except VastError as exc:
        inst.key_attached, inst.key_attach_detail = False, str(exc)[:300]
        out.warn(f"could not attach the run's SSH key to instance {inst.instance_id} through the API ({exc}); "
                 "it works through the onstart's authorized_keys line, which Vast may reset on a run longer than "
                 "about 9 hours")
        return
    inst.key_attached, inst.key_attach_detail = True, ""
