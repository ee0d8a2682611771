"""Flag values and their parsers: the limits every number flag is checked against, `--remote-env` and
`--remote-secret` parsing, secret masking, path flags and the evidence directory check.

Each parser raises ConfigError naming the flag, before any network call.
"""

from __future__ import annotations

import errno
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from vast_harness.errors import ConfigError, UnwritableDirError
from vast_harness.vast.url import shown

ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


MAX_REMOTE_ENV_VALUE_CHARS = 4096


# Flag bounds: anything outside is a typo or an attack on the caps, refused before any network call.
MAX_USD_LIMIT = 10_000.0




MAX_PCIE_GBPS = 1_000.0


MAX_BOOT_RETRIES = 20


MAX_INTERVAL_S = 600.0


MAX_PACING_SCALE = 100.0


def env_value(flag: str, key: str, value: str) -> str:
    if "\x00" in value or len(value) > MAX_REMOTE_ENV_VALUE_CHARS:
        raise ConfigError(f"{flag} {key}: the value must be under {MAX_REMOTE_ENV_VALUE_CHARS} "
                          "characters and contain no NUL")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {key}: the value is not valid UTF-8") from None
    return value


def parse_remote_env(items: list[str], flag: str = "--remote-env",
                     environ: Mapping[str, str] | None = None, *, secret: bool = False) -> dict[str, str]:
    """`KEY=VALUE` pairs from a repeated flag. With `environ` (--remote-secret) a bare `KEY` takes the local
    environment's value, as SkyPilot's `--secret KEY` does. A malformed item is a ConfigError naming it; a
    `secret`'s value never appears in a message, nor a malformed key of one (it may be a pasted value), while
    a setting's malformed key is shown (quoted, escaped), so the user sees what was wrong with it."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not ENV_KEY_RE.match(key) or (not sep and environ is None):
            shown = key if ENV_KEY_RE.match(key) else "<malformed>" if secret else repr(key)
            raise ConfigError(f"{flag}: expected KEY=VALUE with KEY like [A-Za-z_][A-Za-z0-9_]*, got {shown}=...")
        if not sep:
            assert environ is not None
            if key not in environ:
                raise ConfigError(f"{flag} {key}: no value given and {key} is not set in this environment")
            value = environ[key]
        if secret and not value:  # masking nothing protects nothing: an empty secret is a mistake
            raise ConfigError(f"{flag} {key}: the value is empty; give the secret's value (or leave the name out)")
        env[key] = env_value(flag, key, value)
    return env


# A setting named like a credential is shown and stored as given: most likely it should be a secret.
_SECRET_LIKE_NAME = re.compile(r"(^|_)(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)


def secret_like_settings(names: list[str]) -> list[str]:
    """The `--remote-env` names that look like a credential (`*_TOKEN`, `*_KEY`, `*_SECRET`, `PASSWORD`), each
    with the hint to pass it as a secret instead."""
    return [f"--remote-env {name} looks like a secret: pass it as --remote-secret {name} to have it masked (a "
            "setting is shown and stored as given: console, record, report)"
            for name in names if _SECRET_LIKE_NAME.search(name)]


def read_secret_file(path: Path) -> dict[str, str]:
    """`--remote-secret-file`: KEY=VALUE lines (blank lines and `#` comments skipped), under the key file's
    rule: a regular file readable by its owner only. Values are never echoed in a message."""
    where = f"--remote-secret-file {shown(path)}"
    check_private_file(path.expanduser(), where)
    try:
        text = path.expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: cannot read ({type(exc).__name__})") from None
    items = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    for n, item in enumerate(items, 1):
        if "=" not in item:
            raise ConfigError(f"{where}: entry {n} is not KEY=VALUE")
    return parse_remote_env(items, flag=where, secret=True)


def mask_env(env: Mapping[str, object]) -> dict[str, str]:
    """Secrets are shown and stored as their names with `***` (invariant 3)."""
    return {k: "***" for k in env}


def path_flag(flag: str, raw: str | Path | None) -> Path | None:
    """A path given on the command line: never empty (which would silently mean the current directory)."""
    if raw is None:
        return None
    text = str(raw)
    if not text.strip():
        raise ConfigError(f"{flag} is empty: give a path")
    if "\x00" in text:
        raise ConfigError(f"{flag} {shown(text)} contains a NUL byte")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{flag} {shown(text)} is not valid UTF-8") from None
    return Path(text)


_SYSTEM_DIRS = ("/proc", "/sys", "/dev")


_NO_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, None}


def check_own_dir(path: Path, where: str) -> None:
    """A directory whose contents the harness trusts (the ledger, the registrations, the evidence) must be the
    user's own: owned by this user and not writable by group or others (a sticky directory such as /tmp is
    still refused unless it is ours). Else another local user could plant a ledger line that a `reap` then acts
    on, or read the evidence. A path that does not exist yet is created private, so it passes."""
    try:
        st = path.stat()
    except (OSError, ValueError):
        return  # not there yet (created private), or unusable: the directory checks that follow say why
    if not stat.S_ISDIR(st.st_mode):
        return
    if st.st_uid != os.getuid():
        raise ConfigError(f"{where} {shown(path)} belongs to another user (uid {st.st_uid}): its ledger and "
                          "evidence cannot be trusted; use a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ConfigError(f"{where} {shown(path)} is writable by group or others (mode "
                          f"{stat.S_IMODE(st.st_mode):o}): anyone could add lines reap would act on; run chmod go-w "
                          "on it, or use a private directory")


def check_evidence_dir(path: Path, flag: str = "--evidence-dir", consequence: str = "nothing was rented") -> None:
    """The evidence dir must be a writable directory with room, checked before anything is rented."""
    where = f"{flag} {shown(path)}"
    try:
        resolved = str(path.resolve())
    except (OSError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot resolve ({exc})") from None
    if any(resolved == d or resolved.startswith(d + "/") for d in _SYSTEM_DIRS):
        raise ConfigError(f"{where} is under a system directory ({resolved}); choose a normal directory")
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"{where} exists and is not a directory")
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, probe = tempfile.mkstemp(prefix=".vh-write-probe-", dir=path)
        try:
            data = b"\0" * 4096  # room for the ledger's first lines
            if os.write(fd, data) != len(data):
                raise OSError(28, "short write (disk full?)")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        # No room or no permission: the directory is right but takes no writes. Anything else (a name too long,
        # a file on the path) is a wrong path, whoever asked.
        if exc.errno in _NO_WRITES:
            raise UnwritableDirError(f"{where} is not writable ({exc.strerror or exc}); {consequence}") from None
        raise ConfigError(f"{where} cannot be used ({exc.strerror or exc}); choose another directory") from None


def check_number(flag: str, value: float | None, *, low: float, high: float, low_inclusive: bool = True,
                  what: str = "") -> None:
    """A finite number within [low, high] (or (low, high]); `not ... <=` also catches NaN."""
    if value is None:
        return
    lower = "positive" if low == 0 and not low_inclusive else f"at least {low:g}"
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{flag} must be {lower} and finite, got {value}")
    if not (low <= value if low_inclusive else low < value):
        raise ConfigError(f"{flag} must be {lower}{what}, got {value}")
    if not value <= high:
        raise ConfigError(f"{flag} must be at most {high:g}{what}, got {value}")


def check_private_file(path: Path, where: str, st: os.stat_result | None = None) -> None:
    """A file holding a secret: a regular file (a FIFO would block the run for ever) that only its owner can
    read (`chmod 600`), as ssh requires of a private key."""
    if st is None:
        try:
            st = path.stat()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
        except ValueError as exc:
            raise ConfigError(f"{where}: not a usable path ({exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{where} is not a regular file")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"{where} is readable by group or others (mode {stat.S_IMODE(st.st_mode):o}): run chmod 600 on it"
        )
