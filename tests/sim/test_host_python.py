"""A simulated host's Python is one environment of its sandbox's own (vast_harness/sim/hostpython.py): `python`,
`pip` and `pip --user` write inside the sandbox only, the simulator's own packages (torch) import as from an
image, pip is offline unless the simulator allows the network, and the host says what it offers. Issue 43
item 3: `pip install -r requirements.txt` on a host ran the machine's global pip with the harness's venv as
`python`, and wrote 3 GB into the global Python."""

from __future__ import annotations

import os
import site
import sys
import time
from pathlib import Path

import httpx
import paramiko

from tests.sim.conftest import KEY, direct_port, rented_host, run, ssh_connect
from tests.sim.localpkg import write_local_package
from vast_harness.sim import SimServer
from vast_harness.sim.hostpython import DESCRIPTION_VAR, NO_NETWORK_PATH, OFFLINE_NOTE, VENV_DIR


def _home(client: paramiko.SSHClient) -> Path:
    return Path(run(client, "echo $HOME")[1].strip())


def test_python_and_pip_are_the_sandboxs_own_and_the_image_packages_import(api: httpx.Client,
                                                                           ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        home = _home(client)
        rc, out, err = run(client, "command -v python python3 pip pip3; python -c 'import sys; print(sys.prefix)';"
                                   " python -c 'import importlib.util as u; print(u.find_spec(\"torch\") is not None)';"
                                   " echo $TMPDIR $PYTHONUSERBASE $XDG_CACHE_HOME $PIP_CACHE_DIR")
    assert rc == 0, err
    lines = out.splitlines()
    env_dir = home / VENV_DIR
    assert lines[:4] == [str(env_dir / "bin" / n) for n in ("python", "python3", "pip", "pip3")]
    assert lines[4] == str(env_dir) != sys.prefix  # not the simulator's interpreter: a venv in the sandbox
    assert lines[5] == "True"  # the simulator's torch, as an image's: visible, not copied
    assert all(Path(p).is_relative_to(home) for p in lines[6].split()), lines[6]


def test_pip_and_pip_user_install_into_the_sandbox_and_nothing_outside_changes(api: httpx.Client,
                                                                                ssh_key: paramiko.PKey) -> None:
    # every directory this interpreter imports from outside the checkout: its venv's and the base's site-packages,
    # the standard library, the user's site
    outside = [Path(p) for p in {*sys.path, site.getusersitepackages()}
               if p and Path(p).is_dir() and ("site-packages" in p or p.startswith(sys.base_prefix))]
    before = {p: sorted(os.listdir(p)) for p in outside}
    _, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        home = _home(client)
        write_local_package(home, "vhlocalpkg", 42)
        write_local_package(home, "vhuserpkg", 7)
        assert run(client, "pip install ./vhlocalpkg")[0] == 0
        assert run(client, "python -m pip install --user ./vhuserpkg")[0] == 0
        rc, out, err = run(client, "python -c 'import vhlocalpkg, vhuserpkg; print(vhlocalpkg.__file__);"
                                   " print(vhuserpkg.__file__); print(vhlocalpkg.VALUE + vhuserpkg.VALUE)'")
    assert rc == 0, err
    local, user, total = out.splitlines()
    assert Path(local).is_relative_to(home / VENV_DIR) and Path(user).is_relative_to(home / ".local")
    assert total == "49"
    assert {p: sorted(os.listdir(p)) for p in outside} == before  # no package, no __pycache__ landed outside


def test_pip_is_offline_at_once_and_says_so(api: httpx.Client, ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        for command in ("pip install vh-no-such-package-anywhere", "pip install https://example.com/a-1.0-py3-none-any.whl"):
            started = time.monotonic()
            rc, out, err = run(client, command)
            assert rc != 0 and time.monotonic() - started < 15, (command, out, err)
            assert OFFLINE_NOTE in err and (NO_NETWORK_PATH in out + err or "refused" in out + err), (out, err)
        rc, out, err = run(client, "python -m pip download vh-no-such-package-anywhere")
        assert rc != 0 and NO_NETWORK_PATH in out + err  # `python -m pip` too: its index says why


def test_the_host_says_what_it_offers(api: httpx.Client, ssh_key: paramiko.PKey) -> None:
    _, instance = rented_host(api, ssh_key)
    with ssh_connect(direct_port(instance), ssh_key) as client:
        said = run(client, f"echo ${DESCRIPTION_VAR}")[1].strip()
        assert run(client, "cat .sim/host.txt")[1].strip() == said
    version = ".".join(map(str, sys.version_info[:3]))
    assert f"Python {version}" in said and "network off" in said and "pip --user" in said


def test_with_the_network_allowed_pip_is_not_pointed_at_nothing(tmp_path: Path, ssh_key: paramiko.PKey) -> None:
    with SimServer(seed=11, rate_scale=0.0, num_offers=20, host_network=True) as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10) as api:
        _, instance = rented_host(api, ssh_key)
        with ssh_connect(direct_port(instance), ssh_key) as client:
            out = run(client, f"env | grep ^PIP_ ; echo ${DESCRIPTION_VAR}")[1]
    assert NO_NETWORK_PATH not in out and "PIP_INDEX_URL" not in out and "network on" in out, out


def test_packages_a_pth_file_borrowed_are_the_images_too_but_a_source_checkout_is_not(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """An installed wheel's venv that takes its packages from another venv through a `.pth` line (as the wheel
    test's does): torch lives only there, so the host must see that folder; an editable install's checkout on
    the path is source, not the image's packages."""
    from vast_harness.sim import hostpython

    borrowed = tmp_path / "other-venv" / "lib" / "python3" / "site-packages"
    checkout = tmp_path / "checkout"
    borrowed.mkdir(parents=True)
    checkout.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(borrowed), str(checkout)])
    dirs = hostpython._image_site_dirs()
    assert os.path.realpath(borrowed) in dirs and os.path.realpath(checkout) not in dirs
    assert not set(dirs) & {os.path.realpath(p) for p in site.getsitepackages([sys.base_prefix])}
