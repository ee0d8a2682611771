"""The suite's size and time as docs/development.md states them are the measured ones: the sentence there is built
from `.evidence/cpu/test-suite.json` (written by scripts/bench/suite_time.py), and a run of the whole suite finds
as many tests as were measured, within a few percent (a test or two added since is no reason to re-measure)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import COLLECTION

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / ".evidence" / "cpu" / "test-suite.json"
DOC = ROOT / "docs" / "development.md"
COUNT_TOLERANCE = 0.03
pytestmark = pytest.mark.skipif(os.environ.get("VH_MEASURING_SUITE") == "1",
                                reason="scripts/bench/suite_time.py is measuring the suite these figures come from")


def measured(which: str, load: int) -> dict[str, Any]:
    entries = json.loads(MEASURED.read_text())
    found = [e for e in entries if (e["set"], e["added_load"]) == (which, load)]
    assert len(found) == 1, f"{MEASURED.name} has no single {which} set at added load {load}: run " \
                            f"scripts/bench/suite_time.py --set {which} --load {load}"
    entry = found[0]
    assert entry["exit_code"] == 0 and entry["failed"] == 0, entry
    return entry


def duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs} s"


def stated_figures() -> str:
    rest, loaded, slow = measured("default", 0), measured("default", 2), measured("slow", 0)
    return (f"the default set, {rest['tests']:,} tests, {duration(rest['wall_s'])} on a {rest['cores']}-core machine "
            f"with no load added and {duration(loaded['wall_s'])} beside an added load of 2, using "
            f"{duration(rest['cpu_s'])} of CPU; the slow set, {slow['tests']:,} tests, {duration(slow['wall_s'])}")


def test_the_durations_read_as_the_docs_write_them():
    assert duration(59.6) == "1 min 0 s" and duration(151.2) == "2 min 31 s" and duration(3) == "0 min 3 s"


def test_the_docs_state_the_measured_figures():
    doc = " ".join(DOC.read_text().split())
    expected = stated_figures()
    assert expected in doc, f"docs/development.md should say, as measured: {expected}"
    assert "scripts/bench/suite_time.py" in doc and ".evidence/cpu/test-suite.json" in doc


def test_the_measurements_are_of_one_machine():
    rest, loaded, slow = measured("default", 0), measured("default", 2), measured("slow", 0)
    assert rest["cores"] == loaded["cores"] == slow["cores"]
    assert rest["cpu_model"] == loaded["cpu_model"] == slow["cpu_model"]


def test_the_whole_suite_is_the_size_that_was_measured(pytestconfig: pytest.Config):
    collection = pytestconfig.stash.get(COLLECTION, None)
    on_disk = frozenset((ROOT / "tests").rglob("test_*.py"))
    if collection is None or collection.files != on_disk or collection.keyword:
        pytest.skip("only a session that collected the whole suite knows its size")
    default, slow = measured("default", 0)["tests"], measured("slow", 0)["tests"]
    expected = {"not slow": (default, slow), "slow": (slow, default), "": (default + slow, 0)}.get(collection.markexpr)
    if expected is None:
        pytest.skip(f"-m {collection.markexpr!r} selects neither set")
    found = (collection.selected, collection.deselected)
    for got, want in zip(found, expected, strict=True):
        assert abs(got - want) <= COUNT_TOLERANCE * max(want, 1), (
            f"collected {found} (run, deselected); measured {expected}: re-measure with scripts/bench/suite_time.py")
