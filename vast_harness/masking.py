"""The process's one masker: every account key and secret value this process has read, masked in all it writes.

Each value is added the moment it is read, by what reads it, and before anything can quote it: `spec.resolve`
(and so `run_workload`) tells it every key and secret the raw inputs hold before validating any of them, the
CLI's `main` does so from argv and the environment before the command line is even parsed. An error that quotes
an input (a URL, a path, a profile name, a `KEY=VALUE`) is therefore masked like a step's output. Everything that
writes goes through it: the console (`console/output.py`'s one sink and `console/terminal.py`'s sanitiser), the
evidence and state writers, the errors (`errors.HarnessError`), `vast.url.shown`; `MaskingStream` is the CLI's
last resort on stdout and stderr (a traceback, a warning, a thread's error). What is masked, and how: `redact.py`.
Standard library only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from vast_harness.redact import Redactor

ACCOUNT_KEY = "the account key"  # the name a warning gives the key (a secret is named by its variable)


def spoken(name: str) -> str:
    """A value's name as a sentence says it: `the secret HF_TOKEN`, `the account key`."""
    return name if name.startswith(("the ", "a ")) else f"the secret {name}"


class Masker:
    """The values to mask, each with the name a warning may give it (never the value)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, str] = {}  # value -> its name: the first name it was added under
        self._redactor = Redactor([])

    def add(self, value: str | None, name: str) -> None:
        """Mask `value` from now on (every line of it, in every form it is written in; redact.py)."""
        if not value or value in self._names:
            return
        with self._lock:
            if value not in self._names:
                self._names = self._names | {value: name}
                self._redactor = Redactor(self._names)

    @contextlib.contextmanager
    def scoped(self) -> Iterator[None]:
        """What is added inside is forgotten on the way out: one command (`main`), one `run_workload`, one
        test. Scopes nest; concurrent scopes in threads of one process are not what it is for."""
        with self._lock:
            saved = self._names
        try:
            yield
        finally:
            with self._lock:
                self._names = saved
                self._redactor = Redactor(saved)

    def forget(self) -> None:
        """Forget every value: a test's end (module fixtures run outside any test's scope)."""
        with self._lock:
            self._names = {}
            self._redactor = Redactor([])

    @property
    def redactor(self) -> Redactor:
        return self._redactor

    def __bool__(self) -> bool:
        return bool(self._names)

    def text(self, text: str) -> str:
        return self._redactor.text(text)

    def line(self, line: str) -> str:
        return self._redactor.line(line)

    def data(self, data: bytes) -> bytes:
        return self._redactor.data(data)

    def file(self, path: Path) -> bool:
        return self._redactor.file(path)

    def found(self, path: Path) -> list[str]:
        """The names of the values `path` holds (raw or in any written form), the file left as it is."""
        redactor, names = self._redactor, list(self._names.values())
        return sorted({names[i] for i in redactor.found(path)})

    def values(self, name: str) -> list[str]:
        """The values known under `name` (ACCOUNT_KEY: every account key read), for what must refuse them
        (a workdir file that holds one is never uploaded: spec/workdir.py)."""
        return [value for value, named in self._names.items() if named == name]

    def names_in(self, text: str) -> list[str]:
        """The names of the values `text` holds as they are (not in an escaped form)."""
        return sorted({name for value, name in self._names.items() if value in text})

    def json_value(self, value: Any) -> Any:
        """A JSON-like value with every string in it masked, keys included: masked before it is serialised,
        so a value that spans JSON's quoting can never leave a half-masked or broken document."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            return {self.json_value(k): self.json_value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self.json_value(v) for v in value]
        return value


MASKER = Masker()


def mask(text: str) -> str:
    """`text` with every key and secret this process knows masked as `***`."""
    return MASKER.text(text)


def clip(text: str, limit: int) -> str:
    """`text` masked, then cut to `limit` characters: cut first, a value would be left as a prefix no mask knows."""
    masked = mask(text)
    return masked if len(masked) <= limit else masked[: max(0, limit - 3)] + "..."


class MaskingStream:
    """stdout or stderr, masked: what is written is held until its line ends (print() writes its arguments one
    at a time, a traceback a frame at a time: a value written in pieces is whole when masked) or until a flush
    (the live view flushes each frame), then masked and passed on. Anything else is the wrapped stream's."""

    _MAX_PENDING = 1 << 16  # a line this long without an end is passed on anyway

    def __init__(self, stream: IO[str]) -> None:
        self.wrapped = stream
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            cut = self._pending.rfind("\n") + 1
            if not cut and len(self._pending) > self._MAX_PENDING:
                cut = len(self._pending)
            if cut:
                ready, self._pending = self._pending[:cut], self._pending[cut:]
                self.wrapped.write(mask(ready))
        return len(text)

    def flush(self) -> None:
        with self._lock:
            ready, self._pending = self._pending, ""
            if ready:
                self.wrapped.write(mask(ready))
        self.wrapped.flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding, ...: the wrapped stream's
        return getattr(self.wrapped, name)
