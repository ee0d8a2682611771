"""The README and docs/ as a reader uses them: a README that fits on a screen, links that lead somewhere, module
paths that exist, and a CLI reference that names every option the program takes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(m) for m in re.findall(r"^#+ (.+)$", page.read_text(), flags=re.M)}


def test_the_readme_fits_on_a_screen():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in _LINK.findall(page.read_text()):
        if re.match(r"^[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_module_path_named_is_a_file_of_the_package(page):
    """`vast_harness/...py` and package-relative paths like `caps/guard.py` name files that exist, so a module
    that moves cannot leave its old address in the docs."""
    text = page.read_text()
    named = set(re.findall(r"`(vast_harness/[\w/]+\.py)`", text))
    packages = {p.name for p in (ROOT / "vast_harness").iterdir() if p.is_dir() and not p.name.startswith("_")}
    named |= {f"vast_harness/{m}" for m in re.findall(r"`([a-z_]+/[a-z_]+\.py)`", text) if m.split("/")[0] in packages}
    missing = sorted(p for p in named if not (ROOT / p).is_file())
    assert not missing, f"{page.name}: {missing}"


def _help(*args: str) -> str:
    done = subprocess.run([str(Path(sys.executable).with_name("vast-e2e")), *args, "-h"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT, env=os.environ | {"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_the_cli_reference_names_every_command_and_option():
    cli_doc = (ROOT / "docs" / "cli.md").read_text()
    top = _help()
    commands = re.findall(r"^│? *([a-z]+) {2,}", top.split("Commands", 1)[1], flags=re.M)
    assert commands, top
    missing = {}
    for args in [(), *((c,) for c in commands)]:
        where = " ".join(args) or "vast-e2e"
        if args and f"`{args[0]}" not in cli_doc:
            missing.setdefault(where, []).append("(the command itself)")
        for option in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", _help(*args)))):
            if f"`{option}" not in cli_doc and f"{option} " not in cli_doc and f"{option}`" not in cli_doc:
                missing.setdefault(where, []).append(option)
    assert not missing, missing
