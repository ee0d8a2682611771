"""vast_harness: a guarded Vast.ai GPU-rental harness (control plane). See README.md and docs/.

The public surface is re-exported here; the modules behind it are the parts of a run, in flow order:
config (spec) -> client (API) -> offers/quote/plan (choice) -> lifecycle/ssh/runner (the guarded run)
-> evidence -> reap. The control plane never imports torch.
"""

import os as _os
import signal as _signal
import sys as _sys

if _os.path.basename(_sys.argv[0] if _sys.argv else "") in ("vast-e2e", "vast_e2e.py"):
    # The CLI takes ~1 s to import; a Ctrl-C meanwhile is a clean exit 130, not a traceback (nothing is
    # rented yet). `cli.main` puts the default handler back before doing anything.
    def _interrupted_while_starting(signum: int, frame: object) -> None:
        _os.write(2, b"error: interrupted before anything was rented\n")
        _os._exit(130)

    _signal.signal(_signal.SIGINT, _interrupted_while_starting)

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
from vast_harness.spec.resolve import RunSpec, resolve
from vast_harness.vast.client import RawExchange, Timeouts, VastClient
from vast_harness.vast.models import Instance, Offer, User
from vast_harness.vast.url import DEFAULT_API_URL

__all__ = [
    "DEFAULT_API_URL",
    "ApiStatusError",
    "AuthError",
    "Candidate",
    "CapReachedError",
    "ConfigError",
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
    "RunSpec",
    "ServerError",
    "StepFailedError",
    "Timeouts",
    "TransportError",
    "User",
    "VastClient",
    "VastError",
    "choose",
    "load_driver_policy",
    "load_profile",
    "quote_offer",
    "resolve",
    "run_guarded",
    "search_ranked",
]
