"""What the user keeps on disk: the config file (`$XDG_CONFIG_HOME/vast-harness/config.toml`) and the API
key (`--key-file`, `VAST_API_KEY`, the official CLI's key file), each checked for private permissions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, SecretStr, ValidationError

from vast_harness.errors import ConfigError
from vast_harness.spec.profile import StrictModel, load_toml, validation_message
from vast_harness.spec.values import MAX_USD_LIMIT, check_private_file
from vast_harness.timings import MAX_MINUTES_LIMIT
from vast_harness.vast.url import shown

MAX_KEY_FILE_BYTES = 4096  # a Vast key is 64 hex characters; anything this large is not a key file


def _checked_key(key: str, source: str) -> SecretStr:
    if not key:
        raise ConfigError(f"{source} is empty")
    if len(key) > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{source}: the key is {len(key)} characters long; a Vast API key is 64")
    if not key.isascii() or any(ch.isspace() or not ch.isprintable() for ch in key):
        raise ConfigError(f"{source}: the key must be printable ASCII without spaces (is this the right file?)")
    return SecretStr(key)


CONFIG_FILE = Path("vast-harness") / "config.toml"  # under the XDG config directory


OFFICIAL_CLI_KEY_FILE = Path("vastai") / "vast_api_key"  # where `vastai set api-key` writes it


def config_home(environ: Mapping[str, str]) -> Path | None:
    """$XDG_CONFIG_HOME, else $HOME/.config, from the given environment only (tests pass their own).

    The same on every platform, macOS included (no platformdirs here): the official CLI keeps its key file
    there everywhere (its `xdg_config_home()`), and the harness's config file sits beside it."""
    if environ.get("XDG_CONFIG_HOME"):
        return Path(environ["XDG_CONFIG_HOME"])
    return Path(environ["HOME"]) / ".config" if environ.get("HOME") else None


class UserConfig(StrictModel):
    """`$XDG_CONFIG_HOME/vast-harness/config.toml`: a user's defaults, below flags and the environment and
    above the profile. Every key optional; an unknown key is refused (exit 2 naming it)."""

    key_file: str | None = None
    evidence_dir: str | None = None
    max_usd: float | None = Field(default=None, gt=0, le=MAX_USD_LIMIT)
    max_minutes: float | None = Field(default=None, gt=0, le=MAX_MINUTES_LIMIT)
    notify: list[str] | None = None  # receivers of every run's events (--notify replaces the list)

    @classmethod
    def load(cls, environ: Mapping[str, str]) -> tuple[UserConfig, Path | None]:
        home = config_home(environ)
        path = home / CONFIG_FILE if home is not None else None
        # Only a path with nothing at it means "no config". A directory, a FIFO, a device or a dangling link in its
        # place is refused (exit 2 naming it): ignoring it would silently drop the user's own caps.
        if path is None or not os.path.lexists(path):
            return cls(), None
        try:
            return cls.model_validate(load_toml(path)), path
        except ValidationError as exc:
            raise ConfigError(validation_message(str(path), exc)) from None


# What a missing key's message suggests besides a key: --sim for the commands that take it (spec.resolve is told
# otherwise by those that do not, so no hint names a flag its command refuses).
NO_KEY_HINT = "or use --sim"


def read_api_key(key_file: Path | None, environ: Mapping[str, str] | None = None,
                 config_key_file: Path | None = None, *, hint: str = NO_KEY_HINT) -> SecretStr:
    """The key from --key-file, VAST_API_KEY, the config file's key_file, or the official CLI's key file
    (in that order); every file is refused when group/world readable. `hint`: the message's last words when
    there is none."""
    environ = os.environ if environ is None else environ
    if key_file is None and not environ.get("VAST_API_KEY", "").strip():
        home = config_home(environ)
        official = home / OFFICIAL_CLI_KEY_FILE if home is not None else None
        if config_key_file is not None:
            return _read_key_file(config_key_file.expanduser(), f"key_file {shown(config_key_file)} (config file)")
        if official is not None and official.exists():
            return _read_key_file(official, f"the official CLI's key file {shown(official)}")
    if key_file is not None:
        return _read_key_file(key_file.expanduser(), f"--key-file {shown(key_file.expanduser())}")
    key = environ.get("VAST_API_KEY", "").strip()
    if not key:
        raise ConfigError("no API key: pass --key-file PATH (chmod 600), set VAST_API_KEY, or run `vastai set "
                          f"api-key` (read from ~/.config/vastai/vast_api_key) ({hint})")
    return _checked_key(key, "VAST_API_KEY")


def _read_key_file(path: Path, where: str) -> SecretStr:
    """A key file: regular, owner-only (`chmod 600`), small, one printable ASCII key."""
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    except ValueError as exc:  # an embedded NUL
        raise ConfigError(f"{where}: not a usable path ({exc})") from None
    check_private_file(path, where, st)
    if st.st_size > MAX_KEY_FILE_BYTES:
        raise ConfigError(f"{where} is {st.st_size} bytes; a Vast API key file is under {MAX_KEY_FILE_BYTES}")
    try:
        raw = path.read_bytes()[: MAX_KEY_FILE_BYTES + 1]
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read ({exc.strerror})") from None
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise ConfigError(f"{where} is not ASCII text: a Vast API key is 64 hex characters") from None
    return _checked_key(text.strip(), where)
