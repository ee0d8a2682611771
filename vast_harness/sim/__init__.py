"""A simulated Vast.ai marketplace on loopback: the HTTP API, SSH hosts, billing, fault injection.

`SimServer` is the embeddable entry point (the harness's `--sim` uses it); `python -m vast_harness.sim`
runs it standalone. `FaultPlan`/`FaultRule` are the fault model (grammar in `faults.py`).
"""

from vast_harness.sim.faults import FaultPlan, FaultRule, FaultSpecError
from vast_harness.sim.server import SimServer

__all__ = ["FaultPlan", "FaultRule", "FaultSpecError", "SimServer"]
