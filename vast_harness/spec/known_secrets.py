"""Every key and secret value the raw inputs hold, told to the process's masker before any input is validated.

An error may quote any input (a URL, a path, a profile name, a `KEY=VALUE`), and a key or a secret may have been
pasted into any of them; validation runs in an order of its own. So the values are found first, raw and
unchecked, wherever they can come from: the account key from `--key-file`, `VAST_API_KEY`, the config file's
`key_file` and the official CLI's key file; secrets from `--remote-secret` (`KEY=VALUE`, or `KEY` taking the
environment's value) and `--remote-secret-file`; every `--notify` URL (the flag's and the config file's: a
webhook's URL is its token). Finding them never raises and never refuses anything (a file
that cannot be read teaches nothing): refusing is `resolve`'s job, later, in its own words. Reading a key file
here only masks it: with `--sim` it is still not used.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

from vast_harness.console.notify import teach_notify_urls
from vast_harness.files import read_regular_file
from vast_harness.masking import ACCOUNT_KEY, MASKER
from vast_harness.spec.user import MAX_KEY_FILE_BYTES, OFFICIAL_CLI_KEY_FILE, UserConfig, config_home
from vast_harness.spec.values import ENV_KEY_RE

MAX_SECRET_FILE_BYTES = 1 << 20  # far past any real file of KEY=VALUE lines


def _text_of(path: Path | str | None, max_bytes: int) -> str:
    if path is None or not str(path).strip():
        return ""
    try:
        return read_regular_file(Path(path).expanduser(), max_bytes=max_bytes).decode("utf-8", "replace")
    except (OSError, ValueError):
        return ""


def key_file_text(path: Path | str | None) -> str:
    """The key a key file holds, "" for a file that is gone or unreadable."""
    return _text_of(path, MAX_KEY_FILE_BYTES).strip()


def key_sha256(key: str) -> str:
    """How a record names a key without holding it."""
    return hashlib.sha256(key.encode()).hexdigest()


def teach_key_file(path: Path | str | None) -> None:
    """The account key a key file holds (nothing for a file that is gone or unreadable)."""
    MASKER.add(key_file_text(path), ACCOUNT_KEY)


def teach_secret_items(items: Iterable[str], environ: Mapping[str, str], name: str = "a --remote-secret") -> None:
    """`--remote-secret` items (and a secret file's lines): `KEY=VALUE`'s value under the name KEY, a bare `KEY`'s
    value from `environ`; an item whose KEY is malformed may be a pasted value, and is masked whole."""
    for item in items:
        key, sep, value = item.partition("=")
        valid = bool(ENV_KEY_RE.match(key))
        if not valid:
            MASKER.add(item, name)
        if sep:
            MASKER.add(value, key if valid else name)
        elif valid:
            MASKER.add(environ.get(key), key)


def teach_inputs(*, environ: Mapping[str, str], key_file: Path | str | None = None,
                 secret_items: Iterable[str] = (), secret_file: Path | str | None = None,
                 notify_urls: Iterable[str] = ()) -> None:
    """Tell the masker every key and secret these inputs and `environ` hold (the module's docstring)."""
    MASKER.add(environ.get("VAST_API_KEY", "").strip(), ACCOUNT_KEY)
    key_files: list[Path | str | None] = [key_file]
    teach_notify_urls(notify_urls)
    with contextlib.suppress(Exception):  # a config file that does not parse is refused later, by resolve
        user = UserConfig.load(environ)[0]
        key_files.append(user.key_file)
        teach_notify_urls(user.notify or [])
    home = config_home(environ)
    if home is not None:
        key_files.append(home / OFFICIAL_CLI_KEY_FILE)
    for path in key_files:
        teach_key_file(path)
    teach_secret_items(secret_items, environ)
    lines = _text_of(secret_file, MAX_SECRET_FILE_BYTES).splitlines()
    teach_secret_items((s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")), environ,
                       "a --remote-secret-file line")
