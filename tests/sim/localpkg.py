"""A local Python package that pip installs with no network: a source directory whose build backend is in the
tree (PEP 517 `backend-path`, no build requirements), so pip's isolated build downloads nothing."""

from __future__ import annotations

from pathlib import Path

_PYPROJECT = """[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""

_BACKEND = '''"""An in-tree PEP 517 backend: builds one pure-Python wheel from the package next to it."""
import base64, hashlib, os, zipfile

NAME, VERSION = {name!r}, "1.0"
DIST = f"{{NAME}}-{{VERSION}}.dist-info"


def _files():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, NAME, "__init__.py"), "rb") as fh:
        init = fh.read()
    return {{f"{{NAME}}/__init__.py": init,
            f"{{DIST}}/METADATA": f"Metadata-Version: 2.1\\nName: {{NAME}}\\nVersion: {{VERSION}}\\n".encode(),
            f"{{DIST}}/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}}


def get_requires_for_build_wheel(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = f"{{NAME}}-{{VERSION}}-py3-none-any.whl"
    files = _files()
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{{path}},sha256={{digest}},{{len(data)}}")
    record.append(f"{{DIST}}/RECORD,,")
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as whl:
        for path, data in files.items():
            whl.writestr(path, data)
        whl.writestr(f"{{DIST}}/RECORD", "\\n".join(record) + "\\n")
    return name
'''


def write_local_package(parent: Path, name: str, value: int) -> Path:
    """`parent/name/`: a package `name` whose `VALUE` is `value`, installable with `pip install ./name`."""
    root = parent / name
    (root / name).mkdir(parents=True)
    (root / "pyproject.toml").write_text(_PYPROJECT)
    (root / "backend.py").write_text(_BACKEND.format(name=name))
    (root / name / "__init__.py").write_text(f"VALUE = {value}\n")
    return root
