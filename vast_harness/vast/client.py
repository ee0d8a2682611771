"""The Vast REST client: one paced, typed, key-safe door to `console.vast.ai`.

Three layers, each written once:
  * `_send`    one paced HTTP request; httpx errors become `TransportError` here and nowhere else.
  * `_call`    `_send` + body parsing + status mapping to the tree in `errors.py`; reads and DELETE go
               through the single tenacity policy; create only for a 429 (documented to create nothing,
               with a penalty to wait out), never on a transport error or 5xx (a blind re-PUT can rent twice).
               Any body it cannot read (not JSON, nested too deep, too large, wrong types) is an
               `ApiStatusError`, on every endpoint: callers see only the typed tree.
  * `exchange` `_send` without mapping or retries, recording the raw outcome for the absence proof.

The API key lives only in the `Authorization` header: a request hook refuses any URL that carries it,
and every error text and recorded body is scrubbed of it (docs/invariants.md, "The key never leaves").
"""

from __future__ import annotations

import json as jsonlib
import logging
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Literal, Self, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    wait_combine,
    wait_exponential_jitter,
    wait_fixed,
)

from vast_harness.clock import now_s
from vast_harness.errors import (
    RETRYABLE,
    ApiStatusError,
    AuthError,
    ConfigError,
    ConnectionRefused,
    EndpointDeprecated,
    NotFoundError,
    OfferUnavailable,
    RateLimitError,
    ServerError,
    TransportError,
    VastError,
    describe,
)
from vast_harness.timings import TeardownBudget
from vast_harness.vast.answer_bound import AnswerBound
from vast_harness.vast.endpoints import ENDPOINT_PATHS
from vast_harness.vast.models import (
    CopyEndpoint,
    CreateResult,
    Instance,
    InstancePage,
    Offer,
    PendingPriceIncrease,
    ReadShape,
    UnreadableShape,
    User,
    per_id_row,
)
from vast_harness.vast.pacing import Pacer, endpoint_key
from vast_harness.vast.server_clock import ServerClock
from vast_harness.vast.url import DEFAULT_API_URL, validate_api_url

log = logging.getLogger(__name__)

V1_PAGE_LIMIT_MAX = 25  # show_instances.yaml: "max 25"
MAX_LIST_PAGES = 100  # 2,500 instances: far above any account we drive; a bound against a looping token
MAX_RECORDED_TEXT_CHARS = 1_000_000
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # far above 8 pages of 1,000 offers; a bound against a flooding proxy
# create_instance.yaml documents threshold 4.5 s and "penalty: 12" for PUT /asks/: after a 429, wait at least this.
CREATE_429_PENALTY_S = 12.0
# A DELETE past its land-by deadline (the cap) is retried this often: the DELETE's own rate limit (3 s), no slower.
OVERDUE_RETRY_WAIT_S = 3.0
_SENSITIVE_FIELDS = frozenset({"api_key", "instance_api_key"})
_GONE_CODES = frozenset({"not_found", "no_such_instance"})
_OFFER_GONE_WORDS = ("unavailable", "no longer rentable", "already been rented", "already rented")
M = TypeVar("M", bound=BaseModel)


try:
    USER_AGENT = f"vast-harness/{metadata.version('vast-harness')}"
except metadata.PackageNotFoundError:  # a source tree that was never installed
    USER_AGENT = "vast-harness/0.0.0"


class Timeouts(BaseModel):
    """httpx's four timeout phases, in seconds, with named defaults (Vast reads can take ~10 s), and
    `total_s`: one request's whole answer (connect + headers + body) on the wall clock. The phases bound
    each socket operation only: a server that trickles a byte a second never trips them."""

    model_config = ConfigDict(frozen=True)

    connect_s: float = Field(default=10.0, gt=0)
    read_s: float = Field(default=30.0, gt=0)
    write_s: float = Field(default=30.0, gt=0)
    pool_s: float = Field(default=10.0, gt=0)
    total_s: float = Field(default=45.0, gt=0)

    def to_httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_s, read=self.read_s, write=self.write_s, pool=self.pool_s)


# ---------------------------------------------------------------------------------- records and stats


@dataclass
class RawExchange:
    """One request's raw outcome, for evidence: a non-200, timeout or bad body stays visible as such."""

    method: str
    path: str
    params: dict[str, Any]
    status: int | None
    text: str
    json: Any | None
    error: str | None
    t_start_unix: float
    t_end_unix: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CallStats:
    total: int = 0
    by_endpoint: dict[str, int] = field(default_factory=dict)
    rate_limited: int = 0  # responses with HTTP 429
    retries: int = 0  # sleeps taken by the retry policy


# -------------------------------------------------------------------------------------- body handling


def _redact(value: Any, secret: str) -> Any:
    """Replace the key anywhere in a parsed body, and blank fields that hold secrets by name."""
    if isinstance(value, str):
        return value.replace(secret, "***") if secret else value
    if isinstance(value, dict):
        return {k: "***" if k in _SENSITIVE_FIELDS else _redact(v, secret) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, secret) for v in value]
    return value


def _redact_text(text: str, parsed: Any, secret: str) -> str:
    text = text.replace(secret, "***") if secret else text
    if isinstance(parsed, dict):
        for name in _SENSITIVE_FIELDS & parsed.keys():
            if isinstance(parsed[name], str) and parsed[name]:
                text = text.replace(parsed[name], "***")
    return text


def _parse_json(text: str) -> Any | None:
    """The parsed body, or None for an empty or unreadable one (bad JSON, nested too deep for Python)."""
    if not text.strip():
        return None
    try:
        return jsonlib.loads(text)
    except (ValueError, RecursionError, MemoryError):
        return None


@dataclass
class _Reply:
    """What `_send` hands on: the status and the (size-bounded) decoded body."""

    status_code: int
    text: str


def _error_fields(data: Any, text: str) -> tuple[str | None, str | None]:
    """`(error, msg)` from any of Vast's shapes: error JSON, msg/message only, {"detail"}, plain text."""
    if isinstance(data, dict):
        error = data.get("error")
        msg = data.get("msg") or data.get("message") or data.get("detail")
        if msg is not None and not isinstance(msg, str):
            msg = jsonlib.dumps(msg)
        return (str(error) if error else None), msg
    snippet = " ".join(text.split())[:300]
    return None, (snippet or None)


def _is_offer_gone(status: int, error: str | None, msg: str | None) -> bool:
    text = f"{error or ''} {msg or ''}".lower()
    if status in (404, 410) and "no_such_ask" in text:
        return True
    return "offer" in text and any(word in text for word in _OFFER_GONE_WORDS)


def _status_class(path: str, status: int, error: str | None, msg: str | None) -> type[ApiStatusError]:
    """The one table from (status, error code, message) to the typed tree in errors.py."""
    if status in (401, 403) or error == "auth_error" or "invalid user key" in (msg or "").lower():
        return AuthError
    if status == 429 or error == "rate_limit_exceeded":
        return RateLimitError
    if status in (500, 502, 503, 504):
        return ServerError
    if error == "deprecated_endpoint" or (status == 410 and "deprecated" in (msg or "").lower()):
        return EndpointDeprecated  # never "gone": Vast retired the path (skypilot issue 10517, dstack PR 3969)
    if path.startswith("/api/v0/asks/") and _is_offer_gone(status, error, msg):
        return OfferUnavailable
    if error in _GONE_CODES:  # strict: a bare 404 (proxy, wrong path) is not proof of absence
        return NotFoundError
    return ApiStatusError


def _refused(exc: BaseException) -> bool:
    """Whether httpx's error comes from a refused connection (ECONNREFUSED somewhere down its chain)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ConnectionRefusedError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return isinstance(exc, httpx.ConnectError) and "refused" in str(exc).lower()


# ------------------------------------------------------------------------------------------ the client


class VastClient:
    """Sync client for the Vast endpoints the harness uses. Not a general SDK."""

    def __init__(
        self,
        api_key: str,
        *,
        base_url: str = DEFAULT_API_URL,
        timeouts: Timeouts | None = None,
        transport: httpx.BaseTransport | None = None,
        pacing_scale: float = 1.0,
        max_retry_s: float = 120.0,
        retry_wait_min_s: float = 1.0,
        retry_wait_max_s: float = 20.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = now_s,
        on_retry: Callable[[str], None] | None = None,
        refused_attempts: int | None = None,
    ) -> None:
        """`on_retry(line)`: told before each retry's wait (an interactive command shows it, so a minute of
        retrying an unreachable API is not a silent minute); a 429 is told once (the account's limits are shared
        with its other clients, a live run's included: each 429 after the first is retried without a word).
        `refused_attempts`: a refused connection (nothing listens) is tried this often, then raised at once
        (the read-only commands: 2); None: retried like any transport error (a run's DELETE must persevere)."""
        self._key = _validated_key(api_key)
        self.base_url = validate_api_url(base_url, "base_url")
        if pacing_scale < 0:
            raise ConfigError(f"pacing_scale must be >= 0 (0 disables pacing), got {pacing_scale}")
        if max_retry_s < 0 or retry_wait_min_s <= 0 or retry_wait_max_s < retry_wait_min_s:
            raise ConfigError(
                "retry bounds need max_retry_s >= 0 and 0 < retry_wait_min_s <= retry_wait_max_s, got "
                f"{max_retry_s}, {retry_wait_min_s}, {retry_wait_max_s}"
            )
        self._max_retry_s = max_retry_s
        self._wait = wait_exponential_jitter(
            multiplier=retry_wait_min_s, max=retry_wait_max_s, jitter=retry_wait_min_s
        )
        self._sleep = sleep
        self._clock = clock
        self._on_retry = on_retry
        self._refused_attempts = refused_attempts
        self._said_rate_limited = False
        self._pacer_scale = pacing_scale
        self._pacer = Pacer(scale=pacing_scale, clock=clock, sleep=sleep)
        self._stats = CallStats()
        self._stats_lock = threading.Lock()
        self.server_clock = ServerClock()  # the server's Date headers: ages that another process must judge
        self.read_shapes: dict[ReadShape, int] = {}  # per-id reads by the shape they came in (the canary reports it)
        timeouts = timeouts or Timeouts()
        self._total_s = timeouts.total_s
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {self._key}", "User-Agent": USER_AGENT},
            timeout=timeouts.to_httpx(),
            transport=transport,
            # No keep-alive: each request opens its own connection, so the answer bound's trace callback
            # always sees the connect and owns the socket it may cut (a reused connection emits no connect
            # event, and a socket shared across requests could be cut under a later one). Requests are paced
            # 1-4.5 s apart, so a fresh connection per request costs nothing that matters.
            limits=httpx.Limits(max_keepalive_connections=0),
            event_hooks={"request": [self._refuse_key_in_url]},
        )

    # ---- lifecycle
    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"VastClient(base_url={self.base_url!r}, api_key='***')"

    def serialize_endpoints(self) -> None:
        """From now on at most one request per endpoint in flight (`Pacer.serialize`): for a client that
        several threads share, each running its own lifecycle (a fleet's runs). Call it before sharing."""
        self._pacer.serialize()

    @property
    def stats(self) -> CallStats:
        """A snapshot; safe to read from another thread."""
        with self._stats_lock:
            s = self._stats
            return CallStats(s.total, dict(s.by_endpoint), s.rate_limited, s.retries)

    # ---- endpoints
    def search_offers(self, query: dict[str, Any], *, max_retry_s: float | None = None,
                      min_attempts: int = 1) -> list[Offer]:
        """`min_attempts`: a search rents nothing, so one that stalls for its whole answer bound (longer than
        a short retry bound) may still be tried again."""
        path = ENDPOINT_PATHS["search_offers"]
        data = self._call("POST", path, json=query, retry=True, max_retry_s=max_retry_s, min_attempts=min_attempts)
        return [self._model(Offer, row, "POST", path) for row in self._rows(data, "offers", "POST", path)]

    def create_instance(self, offer_id: int, body: dict[str, Any]) -> CreateResult:
        """Rent an offer. Retried only on 429 (nothing was created), waiting out the documented penalty;
        never on a transport error or 5xx: a lost answer may still have rented (list by label first)."""
        path = ENDPOINT_PATHS["create_instance"].format(id=int(offer_id))
        penalty_s = CREATE_429_PENALTY_S * self._pacer_scale
        data = self._call("PUT", path, json=body, retry=True, retry_on=(RateLimitError,),
                          min_wait_s=penalty_s)
        return self._model(CreateResult, data, "PUT", path)

    def get_instance(self, instance_id: int, *, max_retry_s: float | None = None,
                     within_s: float | None = None) -> Instance | None:
        """The instance, or None for 200 `{"instances": null}` (destroyed, or not yet visible). `within_s`:
        the whole read, retries and each answer included, ends within this many seconds (a phase's deadline:
        a read that starts just before it must not hold the phase past it)."""
        path = ENDPOINT_PATHS["get_instance"].format(id=int(instance_id))
        data = self._call("GET", path, retry=True, max_retry_s=max_retry_s, within_s=within_s)
        try:
            shape, row = per_id_row(data, int(instance_id))
        except UnreadableShape as exc:
            raise self._invalid("GET", path, str(exc), data) from None
        self.read_shapes[shape] = self.read_shapes.get(shape, 0) + 1
        return None if row is None else self._model(Instance, row, "GET", path)

    def read_instance_raw(self, instance_id: int, *, within_s: float | None = None) -> RawExchange:
        """The per-id read as one unretried exchange, recorded whole: a round of the absence proof."""
        return self.exchange("GET", ENDPOINT_PATHS["get_instance"].format(id=int(instance_id)), within_s=within_s)

    def list_instances_raw(self, *, label: str | None = None, instance_id: int | None = None,
                           within_s: float | None = None) -> RawExchange:
        """One page of the v1 list filtered by label or id, as one unretried exchange: a proof round's read."""
        params = _list_params(label=label, instance_id=instance_id, limit=V1_PAGE_LIMIT_MAX, after_token=None)
        return self.exchange("GET", ENDPOINT_PATHS["list_instances"], params=params, within_s=within_s)

    def list_instances_page(
        self,
        *,
        label: str | None = None,
        instance_id: int | None = None,
        limit: int = V1_PAGE_LIMIT_MAX,
        after_token: str | None = None,
        within_s: float | None = None,
    ) -> InstancePage:
        if not 1 <= limit <= V1_PAGE_LIMIT_MAX:
            raise ConfigError(f"limit must be within 1..{V1_PAGE_LIMIT_MAX}, got {limit}")
        params = _list_params(label=label, instance_id=instance_id, limit=limit, after_token=after_token)
        path = ENDPOINT_PATHS["list_instances"]
        data = self._call("GET", path, params=params, retry=True, within_s=within_s)
        self._rows(data, "instances", "GET", path)  # a missing list must not read as "no instances"
        return self._model(InstancePage, data, "GET", path)

    def list_instances(
        self, *, label: str | None = None, instance_id: int | None = None, page_limit: int = V1_PAGE_LIMIT_MAX,
        within_s: float | None = None,
    ) -> list[Instance]:
        """Every matching instance, following `next_token` until null (at most MAX_LIST_PAGES pages); all pages
        within `within_s` when given."""
        rows: list[Instance] = []
        token: str | None = None
        until = None if within_s is None else self._clock() + within_s
        for _ in range(MAX_LIST_PAGES):
            page = self.list_instances_page(
                label=label, instance_id=instance_id, limit=page_limit, after_token=token,
                within_s=None if until is None else max(0.0, until - self._clock()),
            )
            rows.extend(page.instances)
            token = page.next_token
            if not token:
                return rows
        raise VastError(f"GET {ENDPOINT_PATHS['list_instances']} still had a next_token after {MAX_LIST_PAGES} pages")

    def destroy_instance(
        self, instance_id: int, *, max_retry_s: float | None = None, land_within_s: float | None = None
    ) -> Literal["deleted", "already_gone", "already_gone_after_unanswered"]:
        """DELETE, retried on 429/5xx/transport (for at most `max_retry_s`, default the client's bound).
        A 404 not_found/no_such_instance is "already gone" as far as DELETE can tell: only a proof says gone
        ("already_gone_after_unanswered" when an earlier attempt of ours went unanswered).
        `land_within_s` (the cap's deadline): while two attempts fit before it, each gets half the time left, so
        one that stalls leaves room for a retry that lands before the cap; after it, attempts go on as usual."""
        path = ENDPOINT_PATHS["destroy_instance"].format(id=int(instance_id))
        failures: list[Exception] = []
        try:
            self._call("DELETE", path, json={}, retry=True, max_retry_s=max_retry_s, land_within_s=land_within_s,
                       failures=failures)
        except NotFoundError:
            # After an attempt of ours that was sent and never answered, that attempt may be what deleted it:
            # not evidence that someone else did.
            if any(isinstance(e, TransportError) for e in failures):
                return "already_gone_after_unanswered"
            return "already_gone"
        return "deleted"

    def attach_ssh_key(self, instance_id: int, public_key: str, *, within_s: float | None = None) -> None:
        """`POST /api/v0/instances/{id}/ssh/` (attach_ssh.yaml): register a public key with the instance, so Vast
        keeps it when it refreshes the instance's authorized keys (a key only appended by onstart stops working
        "between 9 and 18 hours in": skypilot PR 10730). Retried like a read: attaching a key twice is harmless."""
        path = ENDPOINT_PATHS["attach_ssh_key"].format(id=int(instance_id))
        self._call("POST", path, json={"ssh_key": public_key.strip()}, retry=True, within_s=within_s)

    def copy_to_local(self, instance_id: int, src_path: str, dst_path: str, *,
                      within_s: float | None = None) -> CopyEndpoint:
        """`PUT /api/v0/commands/rsync/` with the official CLI's body (vast-cli `vastai/api/storage.py::copy`, one
        side local): where rsync's daemon for `instance_id`'s disk listens (`src_addr`, `src_port`). It copies
        nothing itself; asking twice is harmless, so it is retried like a read."""
        path = ENDPOINT_PATHS["copy_to_local"]
        body = {"client_id": "me", "src_id": int(instance_id), "dst_id": None, "src_path": src_path,
                "dst_path": dst_path}
        data = self._call("PUT", path, json=body, retry=True, within_s=within_s)
        return self._model(CopyEndpoint, data, "PUT", path)

    def set_instance_state(self, instance_id: int, state: str, *, within_s: float | None = None) -> None:
        """`PUT /api/v0/instances/{id}/` with `{"state": "stopped"|"running"}` (manage_instance.yaml). Asking
        the same state twice is harmless, so it is retried like a read."""
        if state not in ("stopped", "running"):
            raise ValueError(f"state must be 'stopped' or 'running', got {state!r}")
        path = ENDPOINT_PATHS["set_instance_state"].format(id=int(instance_id))
        self._call("PUT", path, json={"state": state}, retry=True, within_s=within_s)

    def pending_price_increases(self, *, within_s: float | None = None) -> list[PendingPriceIncrease]:
        """The account's pending price increases (a host's raise on a running contract: it applies from the
        contract's end date if the renter accepts it). Read only: the harness never accepts one."""
        path = ENDPOINT_PATHS["pending_price_increases"]
        data = self._call("GET", path, retry=True, within_s=within_s)
        rows = self._rows(data, "pending_price_increases", "GET", path)
        return [self._model(PendingPriceIncrease, row, "GET", path) for row in rows]

    def current_user(self, *, max_retry_s: float | None = None, min_attempts: int = 1) -> User:
        path = ENDPOINT_PATHS["current_user"]
        data = self._call("GET", path, retry=True, max_retry_s=max_retry_s, min_attempts=min_attempts)
        return self._model(User, data, "GET", path)

    def exchange(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None,
        within_s: float | None = None,
    ) -> RawExchange:
        """One paced request, never retried, never raising: its raw outcome, key scrubbed. `within_s`: its
        answer is cut then (not sent at all when that has passed): a proof round must not outlive its budget."""
        t_start = time.time()
        status: int | None = None
        text, parsed, error = "", None, None
        until = None if within_s is None else self._clock() + within_s
        try:
            resp = self._send(method, path, params=params, json=json, until=until)
            status, text = resp.status_code, resp.text[:MAX_RECORDED_TEXT_CHARS]
            parsed = _parse_json(resp.text)
            text = _redact_text(text, parsed, self._key)
            parsed = _redact(parsed, self._key)
        except Exception as exc:  # noqa: BLE001 - the contract is to record, never to raise
            error = _redact(f"{type(exc).__name__}: {exc}", self._key)
        params = dict(params or {})
        return RawExchange(method.upper(), path, params, status, text, parsed, error, t_start, time.time())

    # ---- internals
    def _send(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None,
        until: float | None = None,
    ) -> _Reply:
        """One paced request, its body read up to MAX_RESPONSE_BYTES, its whole answer within the client's
        bound and by `until` (on the client's clock; past it, after the pacing wait, nothing is sent). The
        single place httpx exceptions become TransportError."""
        method = method.upper()
        if not path.startswith("/") or "?" in path:
            raise ConfigError(f"path must start with '/' and carry no query string, got {path!r}")
        if params and any(name.lower() == "api_key" for name in params):
            raise ConfigError("the API key goes in the Authorization header only, never in the URL")
        with self._pacer.slot(method, path):
            total_s = self._total_s
            if until is not None:
                total_s = min(total_s, until - self._clock())
                if total_s <= 0:
                    raise TransportError(f"{method} {path}: not sent, its phase's deadline has passed",
                                         method=method, path=path)
            self._count(endpoint_key(method, path))
            cut = TransportError(f"{method} {path}: no complete answer within {total_s:.3g} s (the server "
                                 "trickled or stalled)", method=method, path=path)
            try:
                with AnswerBound(total_s) as bound, self._http.stream(
                    method, path, params=params, json=json, extensions={"trace": bound.trace}
                ) as resp:
                    self.server_clock.observe(resp.headers.get("date"))
                    body = bytearray()
                    for chunk in resp.iter_bytes():  # decoded: the bound holds against a compression bomb too
                        body += chunk
                        if len(body) > MAX_RESPONSE_BYTES:
                            raise ApiStatusError(method=method, path=path, status=resp.status_code,
                                                 error="response_too_large",
                                                 msg=f"the body exceeds {MAX_RESPONSE_BYTES} bytes; not read further")
                        if bound.expired:  # also holds where no socket was seen (a custom transport)
                            raise cut
                    reply = _Reply(resp.status_code, bytes(body).decode(resp.encoding or "utf-8", errors="replace"))
            except (ApiStatusError, TransportError):
                raise
            except Exception as exc:
                if bound.expired:  # whatever the cut socket raised (httpx's error, or an OSError from TLS)
                    raise cut from exc
                if not isinstance(exc, httpx.RequestError):
                    raise
                detail = _redact(f"{type(exc).__name__}: {exc}", self._key)
                if _refused(exc):
                    raise ConnectionRefused(
                        f"{method} {path}: connection refused by {self.base_url} ({detail}): nothing listens there "
                        "(check --api-url / VAST_URL; the simulator on its own is `python -m vast_harness.sim`, "
                        "then --api-url with the URL it prints)", method=method, path=path) from exc
                raise TransportError(f"{method} {path}: {detail}", method=method, path=path) from exc
        if reply.status_code == 429:
            with self._stats_lock:
                self._stats.rate_limited += 1
        log.debug("%s %s -> %s", method, path, reply.status_code)
        return reply

    def _call(
        self, method: str, path: str, *, params: dict[str, Any] | None = None, json: Any = None, retry: bool,
        retry_on: tuple[type[Exception], ...] = RETRYABLE, min_wait_s: float = 0.0,
        max_retry_s: float | None = None, within_s: float | None = None, land_within_s: float | None = None,
        min_attempts: int = 1, failures: list[Exception] | None = None,
    ) -> Any:
        """`within_s`: every attempt's answer and the retries together end by then (see `get_instance`).
        `land_within_s`: the call should land by then, but may go on after (see `destroy_instance`).
        `min_attempts`: retried at least this often whatever `max_retry_s` says (see `search_offers`).
        `failures`: each failed attempt's error is appended to it (what the caller may need to judge the end)."""
        start = self._clock()
        until = None if within_s is None else start + within_s
        land_by = None if land_within_s is None else start + land_within_s
        if not retry:
            return self._call_once(method, path, params, json, until)
        if within_s is not None:
            max_retry_s = within_s if max_retry_s is None else min(max_retry_s, within_s)
        for attempt in self._retrying(retry_on, min_wait_s, max_retry_s, what=f"{method} {path}",
                                      min_attempts=min_attempts, land_by=land_by):
            with attempt:
                try:
                    return self._call_once(method, path, params, json, self._attempt_until(until, land_by))
                except Exception as exc:
                    if failures is not None:
                        failures.append(exc)
                    raise
        raise AssertionError("unreachable: tenacity re-raises the last error")  # pragma: no cover

    def _attempt_until(self, until: float | None, land_by: float | None) -> float | None:
        """One attempt's answer deadline: `until`, and while two attempts still fit before `land_by`, half the
        time left to it (a stalled attempt then leaves room for a retry that lands in time)."""
        if land_by is None:
            return until
        left_s = land_by - self._clock()
        if left_s < 2 * TeardownBudget.DELETE_ATTEMPT_MIN_S:
            return until  # no room for two: this attempt gets its full bound (landing late beats not landing)
        split = self._clock() + left_s / 2
        return split if until is None else min(until, split)

    def _call_once(self, method: str, path: str, params: dict[str, Any] | None, json: Any,
                   until: float | None = None) -> Any:
        """Send, parse, and raise the typed error for any non-2xx or `success: false` answer. `until` (on the
        client's clock): the answer is cut then (not sent at all when it has passed)."""
        resp = self._send(method, path, params=params, json=json, until=until)
        try:
            return self._interpret(method, path, resp)
        except ApiStatusError:
            raise
        except Exception as exc:  # noqa: BLE001 - any body we cannot read is a typed error, never a crash
            raise self._invalid(method, path, f"unreadable body ({type(exc).__name__})", None,
                                status=resp.status_code) from None

    def _interpret(self, method: str, path: str, resp: _Reply) -> Any:
        data = _parse_json(resp.text)
        status = resp.status_code
        failed = not 200 <= status < 300 or (isinstance(data, dict) and data.get("success") is False)
        if failed:  # the error travels into logs and evidence: scrub it (a success goes to typed models)
            text = _redact_text(resp.text, data, self._key)
            data = _redact(data, self._key)
            error, msg = _error_fields(data, text)
            cls = _status_class(path, status, error, msg)
            body = data if data is not None else (text[:2000] or None)
            raise cls(method=method, path=path, status=status, error=error, msg=msg, body=body)
        if data is None and resp.text.strip():
            raise self._invalid(method, path, "the body is not JSON (or nested too deep)", None, status=status)
        return data

    def _retrying(
        self, retry_on: tuple[type[Exception], ...] = RETRYABLE, min_wait_s: float = 0.0,
        max_retry_s: float | None = None, *, what: str = "the request", min_attempts: int = 1,
        land_by: float | None = None,
    ) -> Iterator[Any]:
        """The retry policy, defined once: `retry_on` errors (RETRYABLE by default), jittered exponential
        waits of at least `min_wait_s`, a total bound measured on the injected clock (so it includes pacing
        waits and holds under a fake sleep), and at least `min_attempts` attempts whatever the bound. Before
        `land_by` (a cap's deadline) a wait is at most a quarter of the time left to it: a backoff grown to
        20 s must not carry a DELETE's next attempt past the cap; after it, at most OVERDUE_RETRY_WAIT_S (red
        team r11: backed off to 16 s while the host billed 500x)."""
        start = self._clock()
        bound_s = self._max_retry_s if max_retry_s is None else min(self._max_retry_s, max_retry_s)
        backoff = self._wait if min_wait_s <= 0 else wait_combine(self._wait, wait_fixed(min_wait_s))

        def wait(state: RetryCallState) -> float:
            w = float(backoff(state))
            left_s = None if land_by is None else land_by - self._clock()
            if left_s is not None and left_s > 0:
                w = max(min_wait_s, min(w, left_s / 4))
            elif left_s is not None:  # past the cap every second bills: retried at the DELETE's own pace
                w = max(min_wait_s, min(w, OVERDUE_RETRY_WAIT_S * self._pacer_scale))
            return w

        def stop(state: RetryCallState) -> bool:
            failed = state.outcome.exception() if state.outcome else None
            if (isinstance(failed, ConnectionRefused) and self._refused_attempts is not None
                    and state.attempt_number >= self._refused_attempts):
                return True
            if state.attempt_number < min_attempts:
                return False
            return self._clock() - start + state.upcoming_sleep > bound_s

        def before_sleep(state: RetryCallState) -> None:
            with self._stats_lock:
                self._stats.retries += 1
            outcome = state.outcome.exception() if state.outcome else None
            log.info("retrying in %.1f s after %s", state.upcoming_sleep, type(outcome).__name__)
            if self._on_retry is not None and outcome is not None:
                left_s = max(0.0, bound_s - (self._clock() - start))
                why = describe(outcome)
                why = why if what in why else f"{what}: {why}"  # most typed errors already name the call
                if isinstance(outcome, RateLimitError):
                    if self._said_rate_limited:
                        return
                    self._said_rate_limited = True
                    why += (" (the account's rate limits are shared with its other clients, a live run's "
                            "included; further 429s are retried without a word)")
                if isinstance(outcome, ConnectionRefused) and self._refused_attempts is not None:
                    left_n = self._refused_attempts - state.attempt_number
                    self._on_retry(f"{why}; trying {left_n} more time(s) in {state.upcoming_sleep:.0f} s")
                    return
                self._on_retry(f"{why}; retrying in {state.upcoming_sleep:.0f} s (giving up in {left_s:.0f} s)")

        return iter(
            Retrying(
                retry=retry_if_exception_type(retry_on),
                wait=wait,
                stop=stop,
                sleep=self._sleep,
                before_sleep=before_sleep,
                reraise=True,  # callers see the typed error, not tenacity's RetryError
            )
        )

    def _model(self, model: type[M], data: Any, method: str, path: str) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise self._invalid(method, path, f"{model.__name__}: {where}: {first['msg']}", data) from None
        except Exception as exc:  # noqa: BLE001 - e.g. RecursionError on a pathological body
            raise self._invalid(method, path, f"{model.__name__}: unreadable ({type(exc).__name__})",
                                None) from None

    def _rows(self, data: Any, name: str, method: str, path: str) -> list[Any]:
        rows = data.get(name) if isinstance(data, dict) else None
        if not isinstance(rows, list):
            raise self._invalid(method, path, f"'{name}' is not a list", data)
        return rows

    def _invalid(self, method: str, path: str, why: str, data: Any, *, status: int = 200) -> ApiStatusError:
        """A 2xx whose body is not what the endpoint promises: surfaced (scrubbed), never guessed around."""
        try:
            body = _redact(data, self._key)
        except RecursionError:
            body = None
        return ApiStatusError(
            method=method, path=path, status=status, error="invalid_response", msg=why, body=body
        )

    def _count(self, endpoint: str) -> None:
        with self._stats_lock:
            self._stats.total += 1
            self._stats.by_endpoint[endpoint] = self._stats.by_endpoint.get(endpoint, 0) + 1

    def _refuse_key_in_url(self, request: httpx.Request) -> None:
        """Last line of defence for invariant 3: no request may carry the key in its URL."""
        url = request.url
        if _key_in_url(self._key, url) or "api_key" in url.params:
            where = _redact(f"{request.method} {request.url.path}", self._key)
            raise ConfigError(f"refusing to send the API key in a URL ({where})")


def _key_in_url(key: str, url: httpx.URL) -> bool:
    """Whether `key` appears in the URL's path or decoded query as a whole token (a run of letters, digits,
    `_` and `-`). A real key is one long token, so a token match finds it wherever it is sent; a substring match
    would also "find" a short test key such as "k" inside a label, a path segment or a base36 deadline."""
    if not key:
        return False
    text = f"{url.path}?{urllib.parse.unquote_plus(str(url.query, 'ascii', 'replace'))}"
    if len(key) >= _KEY_SUBSTRING_MIN:
        return key in text
    return key in _TOKEN.findall(text)


# A key at least this long is matched as a substring too (a real Vast key is 64 hex digits); shorter keys only
# as whole tokens, since a short one is a substring of ordinary text.
_KEY_SUBSTRING_MIN = 16
_TOKEN = re.compile(r"[A-Za-z0-9_\-]+")


_ORDER_BY = jsonlib.dumps([{"col": "id", "dir": "asc"}], separators=(",", ":"))


def _list_params(*, label: str | None, instance_id: int | None, limit: int, after_token: str | None) -> dict[str, Any]:
    """The v1 list's query: `select_filters` as a JSON string of `{column: {"eq": value}}` (show_instances.yaml)."""
    filters: dict[str, Any] = {}
    if label is not None:
        filters["label"] = {"eq": label}
    if instance_id is not None:
        filters["id"] = {"eq": int(instance_id)}
    # order_by as the official CLI sends it (vastai/api/instances.py): the keyset token then never rests on a
    # server default
    params: dict[str, Any] = {"limit": limit, "order_by": _ORDER_BY}
    if filters:
        params["select_filters"] = jsonlib.dumps(filters, separators=(",", ":"))
    if after_token is not None:
        params["after_token"] = after_token
    return params


def _validated_key(api_key: str) -> str:
    key = (api_key or "").strip()  # key files usually end with a newline
    if not key:
        raise ConfigError("the Vast API key is empty")
    if any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ConfigError("the Vast API key contains whitespace or control characters")
    return key
