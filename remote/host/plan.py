"""Host-side helpers for a profile's plan: the pytest node ids to run, and the rule that a skip fails.

    python3 -m remote.host.plan pytest-ids PROFILE      print the profile's pytest node ids, one per line
    python3 -m remote.host.plan no-skips JUNIT.xml      exit 1 unless every test ran and passed (a skip fails)

Standard library only: it runs on the rented host before anything else is known about it.
"""

from __future__ import annotations

import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

from remote.host.paths import HARNESS_PROFILES_DIR


def pytest_ids(profile: str) -> list[str]:
    path = HARNESS_PROFILES_DIR / f"{profile}.toml"
    with path.open("rb") as fh:
        ids = tomllib.load(fh).get("pytest_node_ids", [])
    if not ids:
        raise SystemExit(f"profile {profile!r} lists no pytest_node_ids")
    return list(ids)


def junit_failures(path: Path) -> list[str]:
    """Every test that did not pass (skipped, failed, errored), and 'no tests ran' when none did."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))
    problems = []
    for case in cases:
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        for tag in ("skipped", "failure", "error"):
            node = case.find(tag)
            if node is not None:
                problems.append(f"{tag}: {name}: {(node.get('message') or '').strip()[:200]}")
    if not cases:
        problems.append("no tests ran")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "pytest-ids":
        print("\n".join(pytest_ids(argv[1])))
        return 0
    if len(argv) == 2 and argv[0] == "no-skips":
        problems = junit_failures(Path(argv[1]))
        for p in problems:
            print(f"FAIL (a skipped GPU test fails the proofs): {p}", file=sys.stderr)
        if not problems:
            print(f"all GPU tests ran and passed ({argv[1]})")
        return 1 if problems else 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
