"""Typed errors of the control plane, the exit codes, and the one mapping from an error to its exit code.

Every way a command ends is an `ExitCode` (the README's table is tested against it). An error declares its
code on its class; `exit_code_for` is the only function that turns an exception into a code, and `worst`
the only place that ranks codes (a fleet's runs, a run's outcome against its teardown).

    BaseException
    ├── Interrupted                 SIGINT/SIGTERM/SIGHUP during a run                     exit 130
    └── HarnessError                anything the harness raises on purpose                 exit 1
        ├── ConfigError             bad input or configuration; nothing rented             exit 2
        │   ├── UnwritableDirError  a right path that takes no writes (full, read-only); reap goes on  exit 2
        │   └── LedgerWriteError    the write-ahead intent could not be made durable: no PUT  exit 2
        ├── VastError               anything the Vast API path raised
        │   ├── TransportError      nothing usable came back (timeout, connect, read): retryable
        │   │   └── ConnectionRefused  nothing listens at the URL: the read-only commands stop after one retry
        │   └── ApiStatusError      the server answered with an error status or body
        │       ├── AuthError       401/403, or 404 with auth_error: fatal configuration   exit 2
        │       ├── RateLimitError  429 (Vast sends no Retry-After): retryable
        │       ├── ServerError     502/503/504: retryable
        │       ├── NotFoundError   404 not_found / no_such_instance
        │       ├── EndpointDeprecated  410 deprecated_endpoint: Vast retired the path; never "gone"
        │       └── OfferUnavailable  the offer left the market between search and create
        ├── NoOfferError            no offer satisfies the filters and caps                exit 5
        ├── CapReachedError         the time or cost cap stopped the run                   exit 6
        ├── RunCancelled            a fleet's total cap (6) or a signal the fleet got (130)   exit 6 | 130
        ├── StepFailedError         a step of the plan failed                              exit 1
        ├── BootFailed              the instance never became ready                        exit 1
        │   ├── GpuMismatch         the host's GPUs are not the offer's: deleted, next offer  exit 1
        │   └── ReceiptFailed       the host delivers less than it must: deleted, next offer  exit 1
        ├── SshConnectError         no SSH endpoint accepted the run's key in time          exit 1
        ├── SshTransferError        an SFTP transfer broke off                              exit 1
        │   ├── TransferAbandoned   ... or ran past its deadline and was cut                exit 1
        │   └── LocalDiskRefused    ... or this machine's disk refused the download (full)  exit 1
        ├── CreateUnresolved        a create of unknown outcome no read has settled        exit 3
        └── TeardownUnproven        a failed host not proven gone: no further create         exit 3

Errors never carry the API key or a secret: they hold method, path (no query string) and the parsed body fields,
and every text a `HarnessError` holds is masked (masking.py) when it is made and again when it is read, so a
message that quotes an input (a URL, a path) carries `***` where a key or a secret was.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from enum import IntEnum
from typing import TYPE_CHECKING, Any, ClassVar

from vast_harness.masking import mask

if TYPE_CHECKING:
    from vast_harness.records import ConnectAttempt


class ExitCode(IntEnum):
    """How a run (or a fleet, or a reap) ended: the process's exit status."""

    PASSED = 0  # passed on a qualified driver
    FAILED = 1  # a step failed, no host booted, the API gave no usable answer, or the evidence is incomplete
    BAD_INPUT = 2  # bad input or configuration (a rejected key included); nothing rented
    NOT_PROVEN_GONE = 3  # an instance may still bill: the ledger names it; `vast-e2e reap`
    UNQUALIFIED_DRIVER = 4  # passed on a driver outside the qualified list (no bitwise claim)
    NO_OFFER = 5  # no offer satisfies the filters and caps
    CAP_REACHED = 6  # a cap stopped the run, or the run went over one (never 0)
    INTERRUPTED = 130  # a signal stopped the run; deleted and proven absent


# Worst first: an instance that may still bill, an interrupted run, a rejected input, a failure, a cap, no
# offer, a pass on an unqualified driver, a pass. A fleet exits with its worst run's code.
PRECEDENCE: tuple[ExitCode, ...] = (
    ExitCode.NOT_PROVEN_GONE, ExitCode.INTERRUPTED, ExitCode.BAD_INPUT, ExitCode.FAILED, ExitCode.CAP_REACHED,
    ExitCode.NO_OFFER, ExitCode.UNQUALIFIED_DRIVER, ExitCode.PASSED,
)
_RANK = {code: i for i, code in enumerate(PRECEDENCE)}


def worst(codes: Iterable[int]) -> ExitCode:
    """The worst of `codes` by PRECEDENCE (PASSED for none). A code outside the table counts as FAILED."""
    known = [ExitCode(c) if c in ExitCode._value2member_map_ else ExitCode.FAILED for c in codes]
    return min(known, key=_RANK.__getitem__, default=ExitCode.PASSED)


def exit_code_for(exc: BaseException) -> ExitCode:
    """The exit code an exception ends a command with: its own for the harness's errors, 130 for a signal,
    FAILED for anything else (a bug still ends in teardown and a code, never past them)."""
    if isinstance(exc, (HarnessError, Interrupted)):
        return exc.exit_code
    if isinstance(exc, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    return ExitCode.FAILED


def describe(exc: BaseException) -> str:
    """The one line a user reads for `exc`: its message, with the type for what the harness did not expect."""
    if isinstance(exc, Interrupted):
        return f"interrupted by {exc}"
    if isinstance(exc, HarnessError):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {mask(str(exc))}"


class Interrupted(BaseException):
    """SIGINT/SIGTERM/SIGHUP during the run. A BaseException so no `except Exception` can swallow it."""

    exit_code: ClassVar[ExitCode] = ExitCode.INTERRUPTED

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class HarnessError(Exception):
    """Base of every error the harness raises on purpose. Its text is masked as it is made (what `args` and
    `repr` show) and as it is read (a value learnt since is masked too)."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, *args: object) -> None:
        super().__init__(*(mask(a) if isinstance(a, str) else a for a in args))

    def __str__(self) -> str:
        return mask(super().__str__())


class ConfigError(HarnessError):
    """Bad input or configuration, found before anything was rented."""

    exit_code = ExitCode.BAD_INPUT


class UnwritableDirError(ConfigError):
    """An evidence or state directory that is fine as a path but takes no writes (full, read-only): a run
    refuses it before renting; a reap warns and goes on deleting."""


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


class ConnectionRefused(TransportError):
    """Nothing listens at the API's address (ECONNREFUSED): a wrong --api-url or VAST_URL, or a simulator that is
    not running. The read-only commands give up on it after one short retry (`VastClient(refused_attempts=)`)."""


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

    exit_code = ExitCode.BAD_INPUT


class RateLimitError(ApiStatusError):
    """HTTP 429. Vast sends no Retry-After; the client backs off and paces."""


class ServerError(ApiStatusError):
    """HTTP 502, 503 or 504: the gateway or the API is struggling; retryable."""


class NotFoundError(ApiStatusError):
    """HTTP 404 with not_found / no_such_instance (for DELETE: already gone)."""


class EndpointDeprecated(ApiStatusError):
    """410 `deprecated_endpoint`: Vast retired this path (it did so for `GET /api/v0/instances/`, skypilot issue
    10517; dstack PR 3969 calls it "the /api/v0/instances/ path family"). Never read as "gone"."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.args = (f"VAST RETIRED THIS ENDPOINT: {self.args[0]}; the harness (and the dead-man switch) need "
                     "an update before they can act on instances",)


class OfferUnavailable(ApiStatusError):
    """The offer was rented by someone else or withdrawn between search and create."""


class NoOfferError(HarnessError):
    """No offer satisfies the filters and caps. Carries the closest rejects and why."""

    exit_code = ExitCode.NO_OFFER

    def __init__(self, message: str, *, rejected: list[Any] | None = None) -> None:
        super().__init__(message)
        self.rejected = rejected or []


class CapReachedError(HarnessError):
    """The watchdog stopped the run: the time or cost cap (less the teardown margin) was reached."""

    exit_code = ExitCode.CAP_REACHED


class StepFailedError(HarnessError):
    """A step of the plan exited non-zero, timed out, or lost its connection."""

    def __init__(self, message: str, *, step: str = "", rc: int | None = None) -> None:
        super().__init__(message)
        self.step = step
        self.rc = rc


class RunCancelled(HarnessError):
    """`GuardedRun.cancel` was called (a fleet's total cap, or a signal the fleet received): stop and tear down."""

    def __init__(self, reason: str, exit_code: ExitCode) -> None:
        super().__init__(reason)
        self.exit_code = exit_code


class BootFailed(HarnessError):
    """The instance will not become ready (failed state, status_msg error, deadline, SSH never answered)."""


class GpuMismatch(BootFailed):
    """The host that arrived is not the one offered (GPU name, count, memory, driver, CUDA) or cannot run the
    profile's [requires]: deleted and proven gone like a host that did not boot, its machine excluded."""


class ReceiptFailed(BootFailed):
    """The host's receipt (what its GPUs deliver, measured before any work) failed a gate of the profile's
    `[receipt]`: deleted and proven gone like a host that did not boot, its machine excluded and remembered
    (`vast-e2e machines`). The message names each measure, the measured and the expected value."""


class CreateUnresolved(HarnessError):
    """A create whose outcome is unknown and whose instance no read has shown: it may exist and bill."""

    exit_code = ExitCode.NOT_PROVEN_GONE

    def __init__(self, message: str, *, label: str) -> None:
        super().__init__(message)
        self.label = label


class TeardownUnproven(HarnessError):
    """A host that failed to boot was deleted but not proven absent: renting the next offer could bill two
    instances at once, so the run stops (the ledger names it)."""

    exit_code = ExitCode.NOT_PROVEN_GONE


class SshConnectError(HarnessError):
    """No endpoint accepted our key before the deadline. `attempts` holds every try, in order."""

    _MAX_LISTED = 30

    def __init__(self, message: str, *, attempts: list[ConnectAttempt]) -> None:
        self.attempts = attempts
        lines = [f"  #{a.number} {a.endpoint}: {a.outcome} ({a.seconds:.1f} s)" for a in attempts]
        if len(lines) > self._MAX_LISTED:
            skipped = len(lines) - self._MAX_LISTED
            lines = lines[:5] + [f"  ... {skipped} more ..."] + lines[-(self._MAX_LISTED - 5) :]
        super().__init__("\n".join([message, *lines]))


class SshTransferError(HarnessError):
    """An SFTP transfer broke off (the host dropped, or the file system refused)."""


class TransferAbandoned(SshTransferError):
    """A transfer ran past its deadline or was abandoned: the link was closed under it (the session is dead)."""


class LocalDiskRefused(SshTransferError):
    """A download's bytes could not be written here (no space, quota, read-only): not the host's fault, and
    every further file of the pull would meet the same disk."""


RETRYABLE = (TransportError, RateLimitError, ServerError)
