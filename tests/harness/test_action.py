"""The GitHub Action (`.github/actions/run/action.yml`): its inputs and outputs are the ones docs/ci.md documents,
actionlint finds nothing in it or in the example that uses it, no expression is pasted into a script, bad input
stops it before anything is rented, and its steps, run as GitHub's runner runs them (tests/harness/actionrun.py),
rent on the simulator, write the outputs and the job summary, reap, and hand the evidence to the upload.
The cancellation at each phase: tests/harness/test_action_cancel.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.harness.actionrun import BASH, run_action
from tests.harness.receiver import Receiver
from tests.harness.test_workflows import _lint, actionlint  # noqa: F401 - the fixture
from vast_harness.sim import SimServer

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / ".github" / "actions" / "run" / "action.yml"
EXAMPLE = ROOT / "examples" / "github-workflow.yml"
DOC = ROOT / "docs" / "ci.md"
VENV_BIN = Path(sys.executable).parent
KEY = "vhkey-ACTION-5e6f7a8b9c"
SIM_OPTIONS = dict(seed=46, rate_scale=0.01, boot_seconds=0.2, num_offers=200)  # conftest.sim
FAST = "--pacing-scale\n0.01\n--poll-interval\n0.2\n--proof-interval\n0.5"  # the simulator's clocks
FAST_REAP = "--pacing-scale\n0.01\n--proof-interval\n0.5"


def _action() -> dict[str, Any]:
    return yaml.safe_load(ACTION.read_text())


def _doc_table(heading: str) -> dict[str, str]:
    """docs/ci.md's table under `heading`: the first column's `name` -> the row."""
    section = DOC.read_text().split(heading, 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z-]+)` \|(.*)\|$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def action_env(tmp_path: Path) -> dict[str, str]:
    """The runner's environment for the action: the session's (a temp home), the harness on PATH (install:
    false), no key of the user's."""
    env = {k: v for k, v in os.environ.items() if k not in ("VAST_API_KEY", "VAST_URL", "VAST_HARNESS_HOME")}
    return env | {"PATH": f"{VENV_BIN}{os.pathsep}{env['PATH']}", "HOME": str(tmp_path / "home")}


def inputs(server: SimServer | None, **given: str) -> dict[str, str]:
    """The action's inputs against `server` (None: the embedded simulator, `sim: true`), `given` laid over."""
    base = {"max-usd": "1", "max-minutes": "10", "install": "false", "options": FAST, "reap-options": FAST_REAP}
    base |= {"api-url": server.url, "api-key": KEY} if server is not None else {"sim": "true", "options": ""}
    return base | given


def project(tmp_path: Path) -> Path:
    work = tmp_path / "ws"
    work.mkdir()
    (work / "train.py").write_text("import json, os\nos.makedirs('out', exist_ok=True)\n"
                                   "json.dump({'loss': 0.1}, open('out/metrics.json', 'w'))\nprint('trained')\n")
    return work


def every_text(path: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in path.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ its shape
def test_every_input_and_output_is_the_one_docs_ci_md_documents():
    action = _action()
    documented_inputs, documented_outputs = _doc_table("### Inputs"), _doc_table("### Outputs")
    assert set(action["inputs"]) == set(documented_inputs)
    assert set(action["outputs"]) == set(documented_outputs)
    for name, spec in action["inputs"].items():
        row = documented_inputs[name]
        assert spec["description"], name
        if spec.get("required"):
            assert "required" in row.lower(), name
            assert "default" not in spec, name  # a required cap has no default to fall back on
        else:
            default = str(spec.get("default", ""))
            assert (f"`{default}`" in row) if default else ("empty" in row or "–" in row), (name, row)
    for name, spec in action["outputs"].items():
        assert spec["value"] == f"${{{{ steps.summary.outputs.{name} }}}}", name
    summary = next(s for s in action["runs"]["steps"] if s.get("id") == "summary")
    from vast_harness.reports.markdown import outputs

    assert set(outputs(None, None)) == set(action["outputs"]), "the summary step writes every output"
    assert "--outputs" in summary["run"]


def test_no_expression_is_pasted_into_a_script_and_each_step_says_its_shell():
    for path in (ACTION, EXAMPLE):
        doc = yaml.safe_load(path.read_text())
        steps = doc["runs"]["steps"] if "runs" in doc else [s for j in doc["jobs"].values() for s in j["steps"]]
        for step in steps:
            assert "${{" not in step.get("run", ""), (path.name, step.get("name"))
            if "run" in step and "runs" in doc:
                assert step["shell"] == "bash", step.get("name")


def test_the_key_is_only_in_the_setup_steps_env_and_only_written_to_a_0600_file():
    steps = _action()["runs"]["steps"]
    holders = [s for s in steps if "inputs.api-key" in str(s.get("env", {}))]
    assert [s["id"] for s in holders] == ["setup"]
    script = holders[0]["run"]
    uses = [line.strip() for line in script.splitlines() if "VH_API_KEY" in line]
    assert uses == ['if [ "$VH_SIM" != true ] && [ -z "$VH_API_KEY" ]; then',
                    "(umask 077; printf '%s' \"$VH_API_KEY\" > \"$key_file\")"], uses
    assert "set -x" not in script and "add-mask" not in script  # never echoed, not even to be masked


def test_the_run_step_execs_vast_e2e_and_the_follow_up_steps_run_after_a_cancel():
    steps = {s.get("id"): s for s in _action()["runs"]["steps"]}
    last = [line.strip() for line in steps["run"]["run"].splitlines() if line.strip()][-1]
    assert last.startswith('exec "$VH_BIN" "${args[@]}"'), last
    assert "if" not in steps["run"]  # success(): a cancel re-evaluates it false, so the runner signals it
    for step_id in ("reap", "summary"):
        assert steps[step_id]["if"].startswith("always()"), step_id
    upload = next(s for s in steps.values() if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert upload["if"].startswith("always()") and upload["with"]["include-hidden-files"] is True


def _signal_child(tmp_path: Path, line: str) -> tuple[str, int]:
    """A step script that runs a Python child as `line` says (`exec` or not), cancelled as the runner cancels:
    whether the child saw the SIGINT, and the step's exit status."""
    marker = tmp_path / f"saw-{len(line)}"
    child = (f"{sys.executable} -c \"import os, signal, sys, time; signal.signal(signal.SIGINT, lambda *a: "
             f"(open('{marker}', 'w').write('SIGINT'), sys.exit(130))); print('ready', os.getpid(), flush=True); "
             f"time.sleep(60)\"")
    script = tmp_path / "step.sh"
    script.write_text(line.format(child=child) + "\n")
    proc = subprocess.Popen([*BASH, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    with proc.stdout:
        word, pid = proc.stdout.readline().split()
        assert word == "ready"
        proc.send_signal(signal.SIGINT)  # the runner: kill(pid, SIGINT), that pid only
        try:
            rc = proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.terminate()  # as the runner goes on: SIGTERM (the child is then orphaned, still running)
            rc = proc.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(pid), signal.SIGKILL)  # the orphan this test made, by its pid
    return (marker.read_text() if marker.exists() else ""), rc


def test_only_an_execd_command_gets_the_runners_sigint(tmp_path):
    """Why the run step ends in `exec`: GitHub signals the step's process alone, and bash waiting for a
    foreground child defers the SIGINT, which the child never gets."""
    assert _signal_child(tmp_path, "exec {child}") == ("SIGINT", 130)
    saw, _ = _signal_child(tmp_path, "{child}")
    assert saw == ""


@pytest.mark.parametrize("path", [ACTION, EXAMPLE], ids=lambda p: p.name)
def test_actionlint_finds_nothing(actionlint, path, tmp_path):  # noqa: F811 - the fixture
    """The example as it is; the action's steps as a reusable workflow's job (actionlint lints workflows), its
    inputs declared as that workflow's, so each expression and each step's keys are checked."""
    target = path
    if path == ACTION:
        action = _action()
        steps = [{k: v for k, v in step.items()} for step in action["runs"]["steps"]]
        workflow = {"on": {"workflow_call": {"inputs": {n: {"type": "string", "required": False}
                                                        for n in action["inputs"]}}},
                    "jobs": {"run": {"runs-on": "ubuntu-latest", "steps": steps}}}
        target = tmp_path / "action-as-workflow.yml"
        target.write_text(yaml.safe_dump(workflow, sort_keys=False))
    result = _lint(actionlint, target)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr
    broken = tmp_path / "broken.yml"  # and it does read these steps: one wrong name is found
    broken.write_text(target.read_text().replace("steps.setup.outputs.bin", "steps.setpu.outputs.bin", 1)
                      .replace("inputs.max_usd", "inputs.max_usdd", 1))
    assert _lint(actionlint, broken).returncode == 1


def test_the_example_uses_this_action_with_the_key_from_the_secret_and_its_caps_from_the_inputs():
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))
    steps = [s for j in doc["jobs"].values() for s in j["steps"]]
    uses = [s for s in steps if re.fullmatch(r"[\w-]+/vast-harness/\.github/actions/run@\w+", str(s.get("uses", "")))]
    assert len(uses) == 1, [s.get("uses") for s in steps]
    given = uses[0]["with"]
    assert given["api-key"] == "${{ secrets.VAST_API_KEY }}"
    assert given["max-usd"] == "${{ inputs.max_usd }}" and given["max-minutes"] == "${{ inputs.max_minutes }}"
    assert set(given) <= set(_action()["inputs"])
    assert doc["concurrency"]["cancel-in-progress"] is False  # never cancel a paid run to start another
    assert EXAMPLE.read_text().count("secrets.VAST_API_KEY") == 1


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("given", "names", "says"), [
    ({"max-usd": "abc"}, "max-usd", "must be a number of dollars"),
    ({"max-usd": ""}, "max-usd", "max-usd is required"),
    ({"max-minutes": "30m"}, "max-minutes", "must be a number of minutes"),
    ({"num-gpus": "2.5"}, "num-gpus", "whole number"),
    ({"api-key": ""}, "api-key", "api-key is empty"),
    ({"notify": "https://ok.example.com/a\nhttp://hooks.example.com/b"}, "notify", "must be https"),
    ({"profile": "smoke"}, "command", "not both"),
    ({"command": ""}, "command", "give command"),
    ({"sim": "yes"}, "sim", "true or false"),
], ids=lambda v: v if isinstance(v, str) and " " not in v else None)
def test_bad_input_stops_the_action_before_anything_is_rented(sim, tmp_path, given, names, says):
    before = len(sim.state()["instances"])
    done = run_action(ACTION, inputs(sim, command="python train.py") | given, workspace=project(tmp_path),
                      env=action_env(tmp_path))
    setup = done.step("setup")
    assert setup.outcome == "failure" and setup.rc == 2, setup.log
    assert f"::error title=vast-harness input {names}::" in setup.log and says in setup.log, setup.log
    assert "nothing was rented" in done.summary and f"`{names}`" in done.summary
    assert [s.outcome for s in done.steps[1:]] == ["skipped"] * (len(done.steps) - 1)
    assert done.outputs == dict.fromkeys(_action()["outputs"], "")
    assert len(sim.state()["instances"]) == before
    assert KEY not in setup.log


# ------------------------------------------------------------------------------------------ a whole run
def test_the_action_runs_a_command_and_reports_it(tmp_path):
    """On the embedded simulator (`sim: true`, no key): the steps, the outputs, the summary, the upload."""
    with Receiver() as rx:
        done = run_action(ACTION, inputs(None, command="python train.py",
                                         artifacts="out/**", notify=rx.url("/ok/hook-tok-31"),
                                         **{"remote-env": "EPOCHS=2"}),
                          workspace=project(tmp_path), env=action_env(tmp_path))
    assert [(s.id, s.outcome) for s in done.steps] == [
        ("setup", "success"), ("run", "success"), ("reap", "skipped"), ("summary", "success"),
        ("__4", "not run")], [(s.id, s.outcome, s.log[-2000:]) for s in done.steps]
    out = done.outputs
    assert out["exit-code"] == "0" and out["absence"] == "gone" and re.fullmatch(r"\d{8}T\d{6}Z-\w+", out["run-id"])
    assert 0 < float(out["accrued-usd"]) <= 1.0
    evidence = Path(out["evidence-dir"])
    record = json.loads((evidence / "harness-result.json").read_text())
    assert record["run_id"] == out["run-id"] and record["exit_code"] == 0 and record["remote_env"]["EPOCHS"] == "2"
    assert (evidence / "artifacts" / "out" / "metrics.json").is_file()
    # the job summary: verdict, cost against the cap, the GPU, the step, the absence proof, what was sent
    for said in ("**exit 0 PASSED**", "of the $1.00 cap", "GPUs that ran", "| run | 0 |", "#### Absence proof",
                 "#### Notifications", "#### Artifacts", "the simulator: no money moved"):
        assert said in done.summary, (said, done.summary)
    # the upload gets this use's folder: the evidence and the result, never the key file
    upload = done.step("__4")
    work = evidence.parent.parent
    assert upload.uses == "actions/upload-artifact@v4" and Path(upload.with_["path"]) == work
    assert upload.with_["name"] == "vast-harness-gpu-4242-1" and (work / "result.json").is_file()
    assert "hook-tok-31" not in every_text(work) + "".join(s.log for s in done.steps) + done.summary
    assert [b["event"] for b in rx.bodies()] == ["rented", "proven_gone"]
    assert rx.bodies()[0]["ci"]["run_url"] == "https://github.com/octo/gpu-project/actions/runs/4242"


def test_a_failed_command_fails_the_action_and_still_reports(tmp_path):
    done = run_action(ACTION, inputs(None, command="echo about to fail; exit 7"),
                      workspace=project(tmp_path), env=action_env(tmp_path))
    assert [(s.id, s.outcome) for s in done.steps][:4] == [
        ("setup", "success"), ("run", "failure"), ("reap", "skipped"), ("summary", "success")]
    assert done.step("run").rc == 1 and done.outputs["exit-code"] == "1" and done.outputs["absence"] == "gone"
    assert "**exit 1 FAILED**" in done.summary and "| run | **7** |" in done.summary  # the step's rc, in bold


@pytest.mark.slow  # Vast's timings: a proof counts only 30 s after the create
def test_against_an_api_the_reap_step_follows_the_run_and_the_key_stays_in_its_file(sim, tmp_path):
    done = run_action(ACTION, inputs(sim, command="python train.py"), workspace=project(tmp_path),
                      env=action_env(tmp_path))
    assert [(s.id, s.outcome) for s in done.steps][:4] == [
        ("setup", "success"), ("run", "success"), ("reap", "success"), ("summary", "success")]
    out = done.outputs
    mine = [i for i in sim.state()["instances"] if out["run-id"] in (i["label"] or "")]
    assert mine and not [i for i in mine if i["live"]] and sum(i["billed_usd"] for i in mine) <= 1.0
    assert "#### Follow-up reap" in done.summary and "nothing was left to reap" in done.summary
    key_file = Path(out["evidence-dir"]).parent.parent.with_suffix(".key")
    assert key_file.read_text() == KEY and key_file.stat().st_mode & 0o777 == 0o600
    work = key_file.with_suffix("")
    assert KEY not in every_text(work) + "".join(s.log for s in done.steps) + done.summary
