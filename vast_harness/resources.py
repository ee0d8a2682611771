"""Where the harness finds its data: the profiles and the host payload the bundle ships.

Two layouts, one answer. From a checkout (or an editable install) the data is the checkout itself:
`profiles/`, `remote/`, `scripts/`, `tests/remote/` beside `vast_harness/`. From an installed wheel it is
`vast_harness/_data/`, which the wheel build fills with the same relative layout (pyproject.toml,
`[tool.hatch.build.targets.wheel.force-include]`; `bundle.HOST_PAYLOAD` lists what the host needs).
Standard library only, and no harness imports: the simulator reads the qualified-driver list through it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

PACKAGED_DATA = "_data"


class DataMissing(RuntimeError):
    """Neither the packaged data nor a checkout was found: a broken install."""


def data_root() -> Path:
    """The directory holding `profiles/` and the host payload (`remote/`, the host scripts)."""
    package = resources.files("vast_harness")
    if not isinstance(package, Path):  # a zipped install: the bundle needs real files
        raise DataMissing(f"vast_harness is not installed as files ({package!r}); install the wheel unzipped")
    packaged = package / PACKAGED_DATA
    if (packaged / "profiles").is_dir():
        return packaged
    checkout = package.parent
    if (checkout / "profiles").is_dir() and (checkout / "remote").is_dir():
        return checkout
    raise DataMissing(f"no profiles/ in {packaged} nor in the checkout {checkout}: reinstall vast-harness")


def profiles_dir() -> Path:
    return data_root() / "profiles"
