"""The receipt's reference table (profiles/receipt-references.toml): every number has a source, every number that
cites our evidence is what that evidence file says, and a reference is the lowest run it cites."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vast_harness.errors import ConfigError
from vast_harness.spec.references import EvidencePoint, MeasureRef, load_references

ROOT = Path(__file__).resolve().parents[2]
REFS = load_references()


def _all_measures() -> list[tuple[str, MeasureRef]]:
    found = []
    for gpu, row in REFS.gpu.items():
        for name in ("matmul", "burn", "hbm_copy"):
            if (ref := row.measure(name)) is not None:
                found.append((f"{gpu}.{name}", ref))
    for link, links in REFS.pcie.items():
        for name in ("h2d", "d2h"):
            if (ref := links.measure(name)) is not None:
                found.append((f"pcie {link}.{name}", ref))
    return found


def _points() -> list[tuple[str, EvidencePoint]]:
    return [(f"{where} {p.path}", p) for where, ref in _all_measures() for p in ref.evidence]


def _at(doc: Any, field: str) -> Any:
    for part in field.split("/"):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


@pytest.mark.parametrize(("where", "point"), _points(), ids=[w for w, _ in _points()])
def test_every_number_citing_our_evidence_is_what_that_file_says(where, point):
    doc = json.loads((ROOT / point.path).read_text())
    assert _at(doc, point.field) == point.value, f"{where}: {point.field}"


def test_the_h100_and_h200_references_are_ours_and_every_number_has_a_source():
    for gpu in ("H100 SXM", "H200"):
        for name in ("matmul", "burn", "hbm_copy"):
            ref = REFS.for_gpu(gpu).measure(name)
            assert ref is not None and ref.value is not None and len(ref.evidence) >= 2, (gpu, name)
    assert all((ref.value is None or ref.source) and (ref.public is None or ref.public_source)
               for _, ref in _all_measures())


def test_the_like_for_like_figure_is_below_the_public_burst_figure():
    """The public matmul figure is a burst; ours is what this receipt's method reaches: a gate compares with ours."""
    for gpu in ("H100 SXM", "H200"):
        ref = REFS.for_gpu(gpu).matmul
        assert ref.public is not None and ref.value < 0.9 * ref.public


def test_consumer_gpus_are_recorded_only_and_report_no_ecc():
    for gpu in ("RTX 3090", "RTX 4090", "RTX 5090"):
        row = REFS.for_gpu(gpu)
        assert row is not None and not row.ecc and all(row.measure(m) is None for m in ("matmul", "burn", "hbm_copy"))


@pytest.mark.parametrize(("body", "says"), [
    ('schema = 1\n[gpu."X".matmul]\nunit = "TFLOP/s"\nvalue = 1.0\n', "ecc"),
    ('schema = 1\n[gpu."X"]\necc = true\n[gpu."X".matmul]\nunit = "TFLOP/s"\nvalue = 1.0\n', "needs its source"),
    ('schema = 1\n[gpu."X"]\necc = true\n[gpu."X".matmul]\nunit = "TFLOP/s"\npublic = 9.0\n', "public_source"),
    ('schema = 1\n[gpu."X"]\necc = true\n[gpu."X".matmul]\nunit = "TFLOP/s"\nvalue = 5.0\nsource = "s"\n'
     'evidence = [{ path = "a", field = "b", value = 4.0 }]\n', "not the lowest"),
    ('schema = 1\n[gpu."X"]\necc = true\n[gpu."X".matmul]\nunit = "TFLOP/s"\nvalue = -1.0\nsource = "s"\n',
     "greater than 0"),
])
def test_a_reference_without_its_source_or_off_its_evidence_is_refused(tmp_path, body, says):
    (tmp_path / "receipt-references.toml").write_text(body)
    with pytest.raises(ConfigError, match=says):
        load_references(tmp_path)


def test_gpu_names_match_vasts_spelling_but_not_another_product():
    assert REFS.for_gpu("h100  sxm") is REFS.for_gpu("H100 SXM")
    assert REFS.for_gpu("H100 NVL") is None and REFS.gpu_value("H100 PCIE", "matmul") is None
    assert REFS.for_link(5, 16).h2d.value == 54.951 and REFS.for_link(3, 8) is None
