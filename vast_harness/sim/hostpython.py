"""A simulated host's Python: one environment of the sandbox's own, as a container image has one.

Each sandbox gets a venv under `$HOME/.sim/python`, made from the interpreter that runs the simulator with the
system site-packages visible, plus a `.pth` line that adds the simulator's own site-packages (where PyTorch is
when it runs from the harness's venv): torch and the rest import as they would from an image, without being
copied. `python`, `python3`, `pip` and `pip3` on the host's PATH are that venv's, so a `pip install` writes into
the venv and `pip install --user` into `$HOME/.local` (PYTHONUSERBASE), both inside the sandbox. HOME, the XDG
directories, TMPDIR and pip's cache point inside it too, and no interpreter of the host writes bytecode next to
a module it imports (PYTHONDONTWRITEBYTECODE): an import of the simulator's own torch leaves its tree as it was.
pip reads no configuration file of the machine's.

Network: off unless the simulator is started with `--host-network`. pip's index and proxy are then a loopback
port the simulator holds open without listening, so every download is refused at once, with a URL that says
why (`/vast-sim-host-has-no-network/`); installing from a local directory or wheel still works. Only pip is
pointed there: the sandbox is a directory, not a network namespace, so another program that opens a socket is
not stopped.
"""

from __future__ import annotations

import contextlib
import ensurepip
import os
import platform
import site
import socket
import sys
import venv
from pathlib import Path

VENV_DIR = ".sim/python"  # under the sandbox's HOME
DESCRIPTION_FILE = ".sim/host.txt"
DESCRIPTION_VAR = "VAST_SIM_HOST"  # what the host offers, in one line (the env probe records it)
NO_NETWORK_PATH = "vast-sim-host-has-no-network"
PIP_NAMES = ("pip", "pip3", f"pip3.{sys.version_info.minor}")
_PTH_NAME = "_vast_sim_image.pth"


OFFLINE_NOTE = ("sim host: pip failed, and this simulated host has no network: pip installs from local files "
                "only (a directory or a wheel in the workdir); start the simulator with --host-network to allow "
                "downloads (docs/simulator.md)")
_PIP_SCRIPT = '#!/bin/sh\nexec "{python}" -m pip "$@"\n'
_OFFLINE_PIP_SCRIPT = '#!/bin/sh\n"{python}" -m pip "$@"\nrc=$?\n[ "$rc" -eq 0 ] || echo "{note}" >&2\nexit "$rc"\n'


class RefusingPort:
    """A loopback port bound and never listened on: a connection to it is refused at once, for as long as the
    simulator holds it (no other program can take the port meanwhile)."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self.port: int = self._sock.getsockname()[1]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()


def _image_site_dirs() -> list[str]:
    """The simulator interpreter's site-packages that the venv's own system site would not show: its venv's, and
    any another `.pth` put on its path (a venv that borrows its packages that way: a `.pth` line of ours adds a
    folder without reading the `.pth` files inside it). Source folders on the path (an editable install's
    checkout) are not an image's packages and stay out."""
    base = {os.path.realpath(p) for p in site.getsitepackages([sys.base_prefix])}
    found: list[str] = []
    for p in [*site.getsitepackages(), *sys.path]:
        real = os.path.realpath(p)
        if (os.path.basename(real) in ("site-packages", "dist-packages") and os.path.isdir(real)
                and real not in base and real not in found):
            found.append(real)
    return found


def _pip_visible(dirs: list[str]) -> bool:
    return any(os.path.isfile(os.path.join(d, "pip", "__init__.py")) for d in dirs)


def _bundled_pip_wheel() -> str | None:
    """The pip wheel the standard library ships for ensurepip: pip runs from it when no site-packages has pip."""
    bundled = Path(ensurepip.__file__).parent / "_bundled"
    return next((str(p) for p in sorted(bundled.glob("pip-*.whl"))), None)


def make_host_python(home: Path, *, network: bool, refusing_port: int) -> dict[str, str]:
    """Create the sandbox's venv and directories under `home`; return the variables that make them the host's
    (PATH first: the venv's python and pip). The venv costs milliseconds: no pip is copied into it."""
    env_dir = home / VENV_DIR
    venv.EnvBuilder(system_site_packages=True, with_pip=False, symlinks=os.name != "nt").create(env_dir)
    purelib = env_dir / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    image_dirs = _image_site_dirs()
    system = site.getsitepackages([sys.base_prefix])
    if not _pip_visible(image_dirs + system):
        wheel = _bundled_pip_wheel()
        image_dirs += [wheel] if wheel else []
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / _PTH_NAME).write_text("".join(f"{d}\n" for d in image_dirs))
    bin_dir = env_dir / "bin"
    for name in PIP_NAMES:
        script = bin_dir / name
        script.write_text(_PIP_SCRIPT.format(python=bin_dir / "python") if network else
                          _OFFLINE_PIP_SCRIPT.format(python=bin_dir / "python", note=OFFLINE_NOTE))
        script.chmod(0o755)
    dirs = {"TMPDIR": home / "tmp", "XDG_CACHE_HOME": home / ".cache", "XDG_CONFIG_HOME": home / ".config",
            "XDG_DATA_HOME": home / ".local" / "share", "XDG_STATE_HOME": home / ".local" / "state",
            "PYTHONUSERBASE": home / ".local", "PIP_CACHE_DIR": home / ".cache" / "pip"}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {name: str(path) for name, path in dirs.items()}
    env.update(PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
               VIRTUAL_ENV=str(env_dir), PYTHONDONTWRITEBYTECODE="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PIP_NO_INPUT="1")
    if not network:
        refused = f"http://127.0.0.1:{refusing_port}"
        env.update(PIP_CONFIG_FILE=os.devnull, PIP_INDEX_URL=f"{refused}/{NO_NETWORK_PATH}/simple/",
                   PIP_EXTRA_INDEX_URL=f"{refused}/{NO_NETWORK_PATH}/extra/", PIP_PROXY=refused,
                   PIP_RETRIES="0", PIP_TIMEOUT="5")
    env[DESCRIPTION_VAR] = describe(network=network)
    (home / DESCRIPTION_FILE).write_text(env[DESCRIPTION_VAR] + "\n")
    return env


def describe(*, network: bool) -> str:
    """What a simulated host offers, in one line: its Python, where installs go, the network."""
    net = ("network on (the simulator was started with --host-network)" if network else
           "network off: pip installs from local files only (start the simulator with --host-network to allow "
           "downloads)")
    return (f"simulated host: Python {platform.python_version()} in a venv of its own (~/{VENV_DIR}): python, pip "
            f"and pip --user write inside the sandbox only; {net}; no GPU (nvidia-smi answers from the offer)")
