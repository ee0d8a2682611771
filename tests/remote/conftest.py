"""Each test reads the workload's knobs (`remote.knobs`, parsed once per process) from its own environment."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from remote import knobs


@pytest.fixture(autouse=True)
def fresh_knobs() -> Iterator[None]:
    knobs.reload()
    yield
    knobs.reload()  # after monkeypatch's teardown restored the environment (set up later, torn down first)


@pytest.fixture
def knob_env(monkeypatch: pytest.MonkeyPatch) -> Callable[[str, str | None], None]:
    """set(NAME, VALUE) or set(NAME, None): change one variable and have the next read see it."""

    def set_(name: str, value: str | None) -> None:
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
        knobs.reload()

    return set_
