"""Host-written JSON never crashes a report, a fleet or a ranking: the one tolerant reader (evidence/host_data.py), then
the same hostile files through a run's report, the fleet's report and `offers --rank-by usd-per-mtok`, and a
fleet on the simulator whose host writes them."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vast_harness.evidence.host_data import number, read_json, workload_figures
from vast_harness.market.token_rate import load_measurements
from vast_harness.reports.fleet import build_rows, write_fleet_report
from vast_harness.reports.run import load_run, write_run_report

DEEP = "[" * 100_000 + "]" * 100_000
BIG_INT = "1" + "0" * 400  # 10**400: a valid JSON int no float holds


@pytest.mark.parametrize(("raw", "value", "why"), [
    (0.5, 0.5, ""), (None, None, ""), ("abc", None, "not a number"), (True, None, "not a number"),
    (float("inf"), None, "not finite"), (float("nan"), None, "not finite"), (10**400, None, "too large"),
    (1.5, None, "out of range"), (-0.1, None, "out of range"), (0, None, "out of range"),
], ids=["ok", "absent", "string", "bool", "inf", "nan", "huge-int", "above", "below", "zero-excluded"])
def test_number_is_finite_and_in_range_or_invalid_with_the_reason(raw, value, why):
    n = number(raw, low=0.0, high=1.0)
    assert n.value == value
    assert why in n.invalid and (not why) == (not n.invalid)


def test_read_json_never_raises(tmp_path: Path):
    cases = {"deep.json": DEEP, "big.json": f'{{"a": {BIG_INT}}}', "inf.json": '{"a": Infinity}',
             "digits.json": "1" * 5000, "bad.json": "{", "bin.json": b"\xff\xfe".decode("latin-1")}
    for name, text in cases.items():
        (tmp_path / name).write_text(text, encoding="latin-1")
    assert read_json(tmp_path / "deep.json") == (None, "nested too deeply")
    assert read_json(tmp_path / "big.json")[0] == {"a": 10**400}
    assert read_json(tmp_path / "digits.json")[1].startswith("not JSON")  # over Python's int digit limit
    assert read_json(tmp_path / "bad.json")[1].startswith("not JSON")
    assert read_json(tmp_path / "bin.json")[1].startswith("unreadable")
    assert read_json(tmp_path / "missing.json")[1].startswith("unreadable")


def hostile_run(tmp_path: Path) -> Path:
    run = tmp_path / "run-1"
    remote = run / "remote"
    remote.mkdir(parents=True)
    base = {"schema": "vast-harness/mfu/1", "device": "cuda", "versions": {"gpu_name": "NVIDIA H100 80GB HBM3"},
            "world_size": 1, "micro_batch": 8}
    (remote / "mfu-str.json").write_text(json.dumps(base | {"mfu": "abc", "tokens_per_s": "fast"}))
    (remote / "mfu-big.json").write_text(json.dumps(base)[:-1] + f', "mfu": {BIG_INT}, "tokens_per_s": {BIG_INT}}}')
    (remote / "mfu-inf.json").write_text(json.dumps(base | {"mfu": float("inf"), "tokens_per_s": float("inf"),
                                                            "tokens_per_s_per_gpu": float("inf"),
                                                            "world_size": float("nan")}))
    (remote / "mfu-deep.json").write_text(DEEP)
    (run / "harness-result.json").write_text(json.dumps({"run_id": "run-1", "exit_code": 0, "offer": {
        "id": 1, "gpu_name": "H100 SXM", "num_gpus": 1, "dph_at_disk_usd": 2.0}, "steps": "not a list"}))
    return run


def test_a_run_report_from_hostile_host_json_says_invalid(tmp_path: Path):
    run = hostile_run(tmp_path)
    facts = load_run(run)
    assert facts.workload().mfu is None  # nothing invalid is ever a headline figure
    assert facts.unreadable == ["mfu-deep.json: nested too deeply"]
    invalid = {w.name: w.invalid for w in facts.workloads}
    assert any("not a number" in i for i in invalid["mfu-str.json"])
    assert any("too large" in i for i in invalid["mfu-big.json"])
    assert any("not finite" in i for i in invalid["mfu-inf.json"])
    html = write_run_report(run).read_text()
    assert "not finite" in html and "nested too deeply" in html


def test_the_fleet_report_and_a_later_ranking_survive_hostile_numbers(tmp_path: Path):
    run = hostile_run(tmp_path)
    outcome = SimpleNamespace(gpu="H100 SXM", exit_code=0, message="passed", run_id="run-1", evidence_dir=run,
                              accrued_usd=0.01)
    rows = build_rows([outcome])
    assert rows[0].usd_per_mtok is None and rows[0].mfu is None
    fleet_dir = tmp_path / "ev" / "fleet-x"
    fleet_dir.mkdir(parents=True)
    write_fleet_report(fleet_dir, "fleet-x", rows, {"exit_code": 0, "sim": False, "odd": float("inf")})
    text = (fleet_dir / "fleet-result.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    # a fleet-result.json written before this rule (or by hand) with Infinity: the ranking skips the row
    json.loads(text)
    (tmp_path / "ev" / "fleet-y").mkdir()
    (tmp_path / "ev" / "fleet-y" / "fleet-result.json").write_text(
        '{"sim": false, "rows": [{"gpu": "RTX 4090", "tokens_per_s": Infinity, "tokens_per_s_per_gpu": 1e999},'
        ' {"gpu": "RTX 5090", "tokens_per_s": 2000.0, "tokens_per_s_per_gpu": 1000.0, "mfu": "x"}, 7]}')
    (tmp_path / "ev" / "fleet-z").mkdir()
    (tmp_path / "ev" / "fleet-z" / "fleet-result.json").write_text(DEEP)
    found = load_measurements(tmp_path / "ev", root=tmp_path / "no-committed-evidence")
    assert [(m.gpu_name, m.world_size, m.mfu) for m in found] == [("RTX 5090", 2, None)]


def test_workload_figures_of_a_record_with_wrong_types_everywhere():
    w = workload_figures("x.json", {"schema": "vast-harness/mfu/1", "flags": [], "versions": 3, "ranks": [1],
                                    "replay_match": "yes", "world_size": 2.5, "micro_batch": -1})
    assert (w.world_size, w.micro_batch, w.replay_match, w.gpu_name, w.compiled) == (None, None, None, None, None)
    assert any("whole number" in i for i in w.invalid) and any("micro_batch" in i for i in w.invalid)


def test_the_run_report_calls_the_accrued_figure_an_upper_bound(tmp_path: Path):
    """The meter bills from the create's answer, Vast the GPU from running: the report says which way it errs."""
    run = tmp_path / "run-2"
    run.mkdir()
    (run / "harness-result.json").write_text(json.dumps({"run_id": "run-2", "exit_code": 0, "accrued_usd": 0.0128}))
    html = write_run_report(run).read_text()
    assert "$0.0128 (an upper bound: billed from the create, Vast from running)" in html
    (run / "harness-result.json").write_text(json.dumps({"run_id": "run-2", "exit_code": 0}))
    assert "upper bound" not in write_run_report(run).read_text()  # no figure, no claim about it
