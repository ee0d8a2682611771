"""Typed errors of the control plane, and the one exit code each maps to.

    HarnessError
    ├── ConfigError                 bad input or configuration; nothing rented            exit 2
    │   └── LedgerWriteError        the write-ahead intent could not be made durable: no PUT  exit 2
    ├── VastError                   anything the Vast API path raised
    │   ├── TransportError          nothing usable came back (timeout, connect, read): retryable
    │   └── ApiStatusError          the server answered with an error status or body
    │       ├── AuthError           401/403, or 404 with auth_error: fatal configuration   exit 2
    │       ├── RateLimitError      429 (Vast sends no Retry-After): retryable
    │       ├── ServerError         502/503/504: retryable
    │       ├── NotFoundError       404 not_found / no_such_instance
    │       └── OfferUnavailable    the offer left the market between search and create
    ├── NoOfferError                no offer satisfies the filters and caps                exit 5
    ├── CapReachedError             the time or cost cap stopped the run                   exit 6
    ├── StepFailedError             a step of the plan failed                              exit 1
    └── TeardownUnprovenError       an instance may still bill; names the ids              exit 3

Errors never carry the API key: they hold method, path (no query string) and the parsed body fields.
"""

from __future__ import annotations

from typing import Any


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""

    exit_code: int = 1


class ConfigError(HarnessError):
    """Bad input or configuration, found before anything was rented."""

    exit_code = 2


class LedgerWriteError(ConfigError):
    """The ledger could not be written whole and durably (disk full, read-only, short write).

    Raised for the create intent, so no PUT is ever sent without it on disk: nothing was rented.
    """


class VastError(HarnessError):
    """Something on the path to the Vast API went wrong."""


class TransportError(VastError):
    """No usable response: connect/read/write timeout, connection reset, unparsable transport."""

    def __init__(self, message: str, *, method: str = "", path: str = "") -> None:
        super().__init__(message)
        self.method = method
        self.path = path


class ApiStatusError(VastError):
    """The API answered with a non-success status or a `success: false` body."""

    def __init__(
        self,
        *,
        method: str,
        path: str,
        status: int,
        error: str | None = None,
        msg: str | None = None,
        body: Any = None,
    ) -> None:
        self.method = method
        self.path = path
        self.status = status
        self.error = error
        self.msg = msg
        self.body = body
        detail = f"{error}: {msg}" if error and msg else (error or msg or "no message")
        super().__init__(f"{method} {path} -> HTTP {status} ({detail})")

    @property
    def new_contract(self) -> int | None:
        """The instance id an error response may still carry (bid too low: created stopped)."""
        if isinstance(self.body, dict):
            value = self.body.get("new_contract")
            # a real contract id is positive: 0, negatives or an emptied field are no instance to act on
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None


class AuthError(ApiStatusError):
    """The key is wrong, expired or lacks a scope. Fatal: retrying cannot help."""

    exit_code = 2


class RateLimitError(ApiStatusError):
    """HTTP 429. Vast sends no Retry-After; the client backs off and paces."""


class ServerError(ApiStatusError):
    """HTTP 502, 503 or 504: the gateway or the API is struggling; retryable."""


class NotFoundError(ApiStatusError):
    """HTTP 404 with not_found / no_such_instance (for DELETE: already gone)."""


class OfferUnavailable(ApiStatusError):
    """The offer was rented by someone else or withdrawn between search and create."""


class NoOfferError(HarnessError):
    """No offer satisfies the filters and caps. Carries the closest rejects and why."""

    exit_code = 5

    def __init__(self, message: str, *, rejected: list[Any] | None = None) -> None:
        super().__init__(message)
        self.rejected = rejected or []


class CapReachedError(HarnessError):
    """The watchdog stopped the run: the time or cost cap (less the teardown margin) was reached."""

    exit_code = 6


class StepFailedError(HarnessError):
    """A step of the plan exited non-zero, timed out, or lost its connection."""

    exit_code = 1

    def __init__(self, message: str, *, step: str = "", rc: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.rc = rc


class TeardownUnprovenError(HarnessError):
    """An instance this run created could not be proven absent: it may still bill."""

    exit_code = 3

    def __init__(self, message: str, *, instance_ids: list[int]) -> None:
        super().__init__(message)
        self.instance_ids = instance_ids


RETRYABLE = (TransportError, RateLimitError, ServerError)
