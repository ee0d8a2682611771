"""The arrival check: after SSH and before any workload minute, the host's GPUs, driver and CUDA are read
(host/gpu_probe.py) and compared with the offer and the profile's `[requires]` (host/gpu_match.py).

A host that differs, or whose answer cannot be read, raises GpuMismatch, a BootFailed: the rent loop deletes
it, proves it gone, excludes its machine and tries the next offer within --boot-retries (run/rent.py).
"""

from __future__ import annotations

from vast_harness.errors import BootFailed, GpuMismatch
from vast_harness.host.gpu_match import Offered, mismatches
from vast_harness.host.gpu_probe import READ_TIMEOUT_S, read_gpus
from vast_harness.host.ssh import HostSession
from vast_harness.records import CreatedInstance, HostGpus
from vast_harness.run.state import RunState
from vast_harness.run.tools import RunTools
from vast_harness.vast.models import Offer

MAX_SAID = 6  # differences named in the message (all of them are in the record's gpu_refused)


def offered(offer: Offer) -> Offered:
    return Offered(gpu_name=offer.gpu_name, num_gpus=offer.num_gpus, gpu_ram_mib=offer.gpu_ram_mb,
                   driver_version=offer.driver_version, cuda_max_good=offer.cuda_max_good,
                   compute_cap=offer.compute_cap)


def check_arrival(t: RunTools, s: RunState, inst: CreatedInstance, offer: Offer, session: HostSession, *,
                  deadline: float) -> HostGpus:
    """The host's GPUs if they are the offer's; else GpuMismatch naming both sides (and recorded in the run)."""
    start = t.clock()
    read = read_gpus(session, timeout_s=min(READ_TIMEOUT_S, max(1.0, deadline - t.clock())))
    s.timings["gpu_check_s"] = round(t.clock() - start, 3)  # within the boot phase: the host is not yet ours to use
    if not read.answered:  # a host that went away (or hung) while booting: a boot failure, not a lie
        raise BootFailed(f"instance {inst.instance_id} stopped answering while its GPUs were read: "
                         f"{'; '.join(read.problems)}")
    said = offered(offer)
    found = [*read.problems, *mismatches(said, read.gpus, read.cuda_version, requires=t.spec.profile.requires,
                                         image_cuda=t.spec.profile.image_cuda)]
    gpus = HostGpus(instance_id=inst.instance_id, offer_id=offer.id, gpus=read.gpus, cuda_version=read.cuda_version,
                    mismatches=found, simulated=t.spec.sim)
    if found:
        more = f"; and {len(found) - MAX_SAID} more" if len(found) > MAX_SAID else ""
        refusal = (f"instance {inst.instance_id} is not what offer {offer.id} said: offered {said.describe()}; "
                   f"the host has {gpus.describe()}: {'; '.join(found[:MAX_SAID])}{more}")
        s.gpu_refused.append(gpus)
        raise GpuMismatch(refusal)
    t.out.info(f"host GPUs as offered: {gpus.shown()}")
    return gpus
