"""The Vast API base URL: its default, its one validation (for a flag, VAST_URL, or `VastClient(base_url=)`),
and whether it is the simulator on this machine. A leaf: config and client both import it, neither is imported.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from urllib.parse import urlparse

from vast_harness.errors import ConfigError
from vast_harness.masking import ACCOUNT_KEY, MASKER, mask

DEFAULT_API_URL = "https://console.vast.ai"
# Plain http sends the account key (`Authorization: Bearer`) in clear. Allowed to a loopback API (the simulator)
# and, anywhere else, only when this variable is set to 1: a typo, a stale VAST_URL or a proxy must not do it.
PLAIN_HTTP_ENV = "VAST_HARNESS_ALLOW_PLAIN_HTTP"


def shown(value: object, limit: int = 60) -> str:
    """A user-supplied value as it may appear in a message: a key or a secret in it masked (before it is
    escaped and cut: a cut value would be a prefix no mask knows), printable ASCII, quoted, bounded."""
    text = ascii(mask(str(value)))
    return text if len(text) <= limit else text[: limit - 4] + "...'"


def validate_api_url(url: str, flag: str = "--api-url", environ: Mapping[str, str] | None = None) -> str:
    """`url` without a trailing slash, or a ConfigError naming `flag`: an http(s) URL with a host and nothing
    that could carry a secret (query, fragment, credentials, the account key itself), and https unless the API is
    on this machine or `VAST_HARNESS_ALLOW_PLAIN_HTTP=1` says plain http is meant."""
    if not url or not url.strip():
        raise ConfigError(f"{flag} is empty: give the API base URL (default {DEFAULT_API_URL})")
    if not url.isascii() or any(not ch.isprintable() or ch.isspace() for ch in url):
        raise ConfigError(f"{flag} {shown(url)} must be printable ASCII without spaces")
    try:
        parsed = urlparse(url)
        port = parsed.port  # raises on a port out of range
    except ValueError as exc:
        raise ConfigError(f"{flag} {shown(url)} is not a valid URL ({exc})") from None
    if len(url) > 2048 or len(parsed.hostname or "") > 253:
        raise ConfigError(f"{flag} is too long ({len(url)} characters) to be an API base URL")
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ConfigError(f"{flag} {shown(url)} is not an http(s) URL")
    if port == 0:
        raise ConfigError(f"{flag} {shown(url)}: port 0 is not a port")
    if parsed.query or parsed.fragment or parsed.username or parsed.password or "api_key" in url:
        raise ConfigError(f"{flag} must not carry a query string, fragment or credentials (the key goes in a header only)")
    env = os.environ if environ is None else environ
    if parsed.scheme == "http" and not is_loopback_url(url) and env.get(PLAIN_HTTP_ENV) != "1":
        raise ConfigError(f"{flag} {shown(url)} is plain http to another machine: the account key would travel in "
                          f"clear. Use https, or set {PLAIN_HTTP_ENV}=1 if plain http is really meant. Nothing was sent")
    if ACCOUNT_KEY in MASKER.names_in(url):  # it would reach the host's onstart, the server's logs, the evidence
        raise ConfigError(f"{flag} {shown(url)} holds the account key: the key goes in a header only")
    return url.rstrip("/")


def is_loopback_url(url: str) -> bool:
    """True for an API on this machine (the simulator): the only place where the safety floors may be lowered."""
    host = (urlparse(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
