"""vast_harness: a guarded Vast.ai GPU-rental harness (control plane). See README.md and docs/architecture.md.

The packages are the layers of a run, top to bottom (imports only go down; `lint-imports` checks it):
chaos -> cli -> api -> actions, fleet -> run, views -> market, reports -> instance, host, caps -> spec -> state
-> console, evidence -> vast -> errors -> records, timings, resources, clock, files. `sim` is the embedded
marketplace and knows none of them but `resources`.

The public names below are re-exported lazily (PEP 562): `import vast_harness` loads nothing else, so
`import vast_harness.sim` stays free of the control plane and `vast-e2e --version` starts without httpx.
The control plane never imports torch.
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

_EXPORTS: dict[str, str] = {
    "ApiStatusError": "vast_harness.errors",
    "AuthError": "vast_harness.errors",
    "Candidate": "vast_harness.market.offers",
    "CapReachedError": "vast_harness.errors",
    "choose": "vast_harness.market.offers",
    "ConfigError": "vast_harness.errors",
    "DEFAULT_API_URL": "vast_harness.vast.url",
    "DriverPolicy": "vast_harness.spec.profile",
    "ExitCode": "vast_harness.errors",
    "GuardedRun": "vast_harness.run.runner",
    "HarnessError": "vast_harness.errors",
    "HarnessProfile": "vast_harness.spec.profile",
    "HarnessResult": "vast_harness.run.runner",
    "Instance": "vast_harness.vast.models",
    "load_driver_policy": "vast_harness.spec.profile",
    "load_profile": "vast_harness.spec.profile",
    "NoOfferError": "vast_harness.errors",
    "NotFoundError": "vast_harness.errors",
    "Offer": "vast_harness.vast.models",
    "OfferChoice": "vast_harness.market.offers",
    "OfferCriteria": "vast_harness.market.offers",
    "OfferUnavailable": "vast_harness.errors",
    "Quote": "vast_harness.market.quote",
    "quote_offer": "vast_harness.market.quote",
    "RateLimitError": "vast_harness.errors",
    "RawExchange": "vast_harness.vast.client",
    "Rejection": "vast_harness.market.offers",
    "resolve": "vast_harness.spec.resolve",
    "run_guarded": "vast_harness.run.runner",
    "run_workload": "vast_harness.api",
    "RunOptions": "vast_harness.spec.resolve",
    "RunSpec": "vast_harness.spec.resolve",
    "search_ranked": "vast_harness.market.offers",
    "ServerError": "vast_harness.errors",
    "StepFailedError": "vast_harness.errors",
    "Timeouts": "vast_harness.vast.client",
    "TransportError": "vast_harness.errors",
    "User": "vast_harness.vast.models",
    "VastClient": "vast_harness.vast.client",
    "VastError": "vast_harness.errors",
    "WorkloadResult": "vast_harness.api",
}

__all__ = [
    "ApiStatusError",
    "AuthError",
    "Candidate",
    "CapReachedError",
    "ConfigError",
    "DEFAULT_API_URL",
    "DriverPolicy",
    "ExitCode",
    "GuardedRun",
    "HarnessError",
    "HarnessProfile",
    "HarnessResult",
    "Instance",
    "NoOfferError",
    "NotFoundError",
    "Offer",
    "OfferChoice",
    "OfferCriteria",
    "OfferUnavailable",
    "Quote",
    "RateLimitError",
    "RawExchange",
    "Rejection",
    "RunOptions",
    "RunSpec",
    "ServerError",
    "StepFailedError",
    "Timeouts",
    "TransportError",
    "User",
    "VastClient",
    "VastError",
    "WorkloadResult",
    "choose",
    "load_driver_policy",
    "load_profile",
    "quote_offer",
    "resolve",
    "run_guarded",
    "run_workload",
    "search_ranked",
]


def __getattr__(name: str) -> _Any:
    if name in _EXPORTS:
        value = getattr(_importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # once: later lookups do not come back here
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if _TYPE_CHECKING:  # the same names, for type checkers and editors
    from vast_harness.api import WorkloadResult, run_workload
    from vast_harness.errors import (
        ApiStatusError,
        AuthError,
        CapReachedError,
        ConfigError,
        ExitCode,
        HarnessError,
        NoOfferError,
        NotFoundError,
        OfferUnavailable,
        RateLimitError,
        ServerError,
        StepFailedError,
        TransportError,
        VastError,
    )
    from vast_harness.market.offers import Candidate, OfferChoice, OfferCriteria, Rejection, choose, search_ranked
    from vast_harness.market.quote import Quote, quote_offer
    from vast_harness.run.runner import GuardedRun, HarnessResult, run_guarded
    from vast_harness.spec.profile import DriverPolicy, HarnessProfile, load_driver_policy, load_profile
    from vast_harness.spec.resolve import RunOptions, RunSpec, resolve
    from vast_harness.vast.client import RawExchange, Timeouts, VastClient
    from vast_harness.vast.models import Instance, Offer, User
    from vast_harness.vast.url import DEFAULT_API_URL
