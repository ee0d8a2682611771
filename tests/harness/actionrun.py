"""A composite action's steps run here as GitHub's runner runs them, for the tests of `.github/actions/run`.

What it reproduces, from the runner's own sources (actions/runner): each `run` step as
`bash --noprofile --norc -e -o pipefail SCRIPT` (ScriptHandlerHelpers.cs) with the step's `env` evaluated and the
file commands' files (`GITHUB_OUTPUT`, `GITHUB_STEP_SUMMARY`, `GITHUB_ENV`) fresh for the step; `${{ }}`
expressions over `inputs`, `steps.<id>.outputs|outcome|conclusion`, `github` and `runner`, with `==`/`!=`
(strings compared case-insensitively), `&&`, `||`, `!` and the status functions; an `if` without a status
function means `success() && (...)`; a step skipped by its `if`; and a cancel as ProcessInvoker.cs plays it on
Linux: SIGINT to the step's process (that pid only, not its group), then SIGTERM if it has not exited after
7.5 s, then SIGKILL after 2.5 s more; the steps after it run or not by their `if`, re-evaluated with the job
cancelled (CompositeActionHandler.cs). A `uses` step is not run: its evaluated `with` is kept for the test.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

SIGINT_WAIT_S = 7.5  # ProcessInvoker._sigintTimeout
SIGTERM_WAIT_S = 2.5  # ProcessInvoker._sigtermTimeout
BASH = ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail"]


# ----------------------------------------------------------------------------------------------- expressions
_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||!|\(|\))|(?P<num>\d+(?:\.\d+)?)"
                    r"|(?P<name>[A-Za-z_][\w.\-]*(?:\(\))?))")


class Expression:
    """One expression of the subset the action uses, evaluated against `context`."""

    def __init__(self, text: str, context: Mapping[str, Any], status: Mapping[str, bool]) -> None:
        self.tokens: list[tuple[str, str]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            m = _TOKEN.match(text, pos)
            if m is None:
                raise ValueError(f"cannot read the expression at: {text[pos:]!r}")
            kind = m.lastgroup or ""
            self.tokens.append((kind, m.group(kind)))
            pos = m.end()
        self.i, self.context, self.status = 0, context, status

    def value(self) -> Any:
        result = self._or()
        if self.i != len(self.tokens):
            raise ValueError(f"unexpected {self.tokens[self.i]}")
        return result

    def _peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def _or(self) -> Any:
        left = self._and()
        while self._peek() == "||":
            self.i += 1
            right = self._and()
            left = left if truthy(left) else right
        return left

    def _and(self) -> Any:
        left = self._unary()
        while self._peek() == "&&":
            self.i += 1
            right = self._unary()
            left = right if truthy(left) else left
        return left

    def _unary(self) -> Any:
        if self._peek() == "!":
            self.i += 1
            return not truthy(self._unary())
        return self._compare()

    def _compare(self) -> Any:
        left = self._primary()
        if self._peek() in ("==", "!="):
            op = self.tokens[self.i][1]
            self.i += 1
            right = self._primary()
            same = _loose(left) == _loose(right)
            return same if op == "==" else not same
        return left

    def _primary(self) -> Any:
        kind, text = self.tokens[self.i]
        self.i += 1
        if text == "(":
            inner = self._or()
            assert self._peek() == ")"
            self.i += 1
            return inner
        if kind == "str":
            return text[1:-1].replace("''", "'")
        if kind == "num":
            return float(text)
        if text.endswith("()"):
            return self.status[text[:-2]]
        if text in ("true", "false"):
            return text == "true"
        node: Any = self.context
        for part in text.split("."):
            node = node.get(part, "") if isinstance(node, Mapping) else ""
        return node


def truthy(value: Any) -> bool:
    return bool(value) and value != "0"


def _loose(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value


def evaluate(text: str, context: Mapping[str, Any], status: Mapping[str, bool]) -> Any:
    return Expression(text, context, status).value()


def substitute(text: str, context: Mapping[str, Any], status: Mapping[str, bool]) -> str:
    """Every `${{ expr }}` in `text` replaced by its value as a string."""
    def one(m: re.Match[str]) -> str:
        value = evaluate(m.group(1), context, status)
        return ("true" if value else "false") if isinstance(value, bool) else str(value)

    return re.sub(r"\$\{\{(.*?)\}\}", one, text)


# ----------------------------------------------------------------------------------------------- the runner
@dataclass
class StepRun:
    id: str
    name: str
    outcome: str  # success | failure | cancelled | skipped | not run (a `uses` step)
    rc: int | None = None
    log: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    signals: list[tuple[str, float]] = field(default_factory=list)  # (signal, seconds after SIGINT)
    exited_after_sigint_s: float | None = None
    sigint_unix: float | None = None  # when the cancel's SIGINT was sent (the simulator's call log is in unix time)
    with_: dict[str, str] = field(default_factory=dict)  # a `uses` step's inputs, evaluated
    uses: str = ""


@dataclass
class ActionRun:
    steps: list[StepRun]
    outputs: dict[str, str]
    summary: str

    def step(self, step_id: str) -> StepRun:
        return next(s for s in self.steps if s.id == step_id)


# Told a step's process and its log so far, every 0.1 s; True starts the cancel.
CancelWhen = Callable[[subprocess.Popen[bytes], str], bool]


def _read_outputs(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT's two forms: `name=value`, and `name<<DELIM` ... `DELIM`."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, delim = line.split("<<", 1)
            body = []
            i += 1
            while i < len(lines) and lines[i] != delim:
                body.append(lines[i])
                i += 1
            out[name] = "\n".join(body)
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
        i += 1
    return out


def run_action(action_yml: Path, inputs: Mapping[str, str], *, workspace: Path, env: Mapping[str, str],
               cancel_step: str | None = None, cancel_when: CancelWhen | None = None,
               between_steps: Callable[[str], None] | None = None, timeout_s: float = 300) -> ActionRun:
    """The action's steps in order, as the runner runs them (the module's docstring). `cancel_step`: the step
    whose process gets the cancel sequence once `cancel_when` says so; the job is cancelled from then on.
    `between_steps(id)`: told before each step after the cancelled one (a test heals the API there)."""
    action = yaml.safe_load(action_yml.read_text())
    defaults = {k: str(v.get("default", "")) for k, v in action.get("inputs", {}).items()}
    unknown = set(inputs) - set(defaults)
    assert not unknown, f"inputs the action does not declare: {unknown}"
    temp = workspace.parent / "_runner_temp"  # beside the checkout, as the runner's _work/_temp is
    temp.mkdir(parents=True, exist_ok=True)
    context: dict[str, Any] = {
        "inputs": defaults | dict(inputs), "steps": {},
        "github": {"action_path": str(action_yml.parent), "job": "gpu", "run_id": "4242", "run_attempt": "1",
                   "workspace": str(workspace)},
        "runner": {"temp": str(temp), "os": "Linux"},
    }
    failed = cancelled = False
    runs: list[StepRun] = []
    summary: list[str] = []
    for number, step in enumerate(action["runs"]["steps"]):
        step_id = step.get("id", f"__{number}")
        status = {"success": not failed and not cancelled, "failure": failed, "cancelled": cancelled,
                  "always": True}
        condition = str(step.get("if", "success()"))
        if not re.search(r"\b(success|failure|cancelled|always)\(\)", condition):
            condition = f"success() && ({condition})"
        if cancelled and between_steps is not None:
            between_steps(step_id)
        if not truthy(evaluate(condition, context, status)):
            runs.append(StepRun(step_id, step.get("name", ""), "skipped"))
            context["steps"][step_id] = {"outputs": {}, "outcome": "skipped", "conclusion": "skipped"}
            continue
        if "uses" in step:
            with_ = {k: substitute(str(v), context, status) for k, v in (step.get("with") or {}).items()}
            runs.append(StepRun(step_id, step.get("name", ""), "not run", with_=with_, uses=step["uses"]))
            context["steps"][step_id] = {"outputs": {}, "outcome": "success", "conclusion": "success"}
            continue
        files = {name: temp / f"{name.lower()}_{number}" for name in ("GITHUB_OUTPUT", "GITHUB_STEP_SUMMARY",
                                                                      "GITHUB_ENV")}
        for path in files.values():
            path.write_text("")
        script = temp / f"step_{number}.sh"
        script.write_text(step["run"])
        step_env = {k: substitute(str(v), context, status) for k, v in (step.get("env") or {}).items()}
        proc_env = dict(env) | {k: str(v) for k, v in files.items()} | {
            "GITHUB_ACTIONS": "true", "CI": "true", "RUNNER_TEMP": str(temp), "GITHUB_WORKSPACE": str(workspace),
            "GITHUB_ACTION_PATH": str(action_yml.parent), "GITHUB_JOB": "gpu", "GITHUB_RUN_ID": "4242",
            "GITHUB_RUN_ATTEMPT": "1", "GITHUB_REPOSITORY": "octo/gpu-project",
            "GITHUB_SERVER_URL": "https://github.com", "GITHUB_WORKFLOW": "gpu-tests"} | step_env
        run = _run_step(step_id, step.get("name", ""), script, proc_env, workspace,
                        cancel_when if step_id == cancel_step else None, timeout_s)
        run.outputs = _read_outputs(files["GITHUB_OUTPUT"])
        summary.append(files["GITHUB_STEP_SUMMARY"].read_text())
        runs.append(run)
        if run.outcome == "cancelled":
            cancelled = True
        elif run.outcome == "failure":
            failed = True
        context["steps"][step_id] = {"outputs": run.outputs, "outcome": run.outcome, "conclusion": run.outcome}
    status = {"success": not failed and not cancelled, "failure": failed, "cancelled": cancelled, "always": True}
    outputs = {k: substitute(str(v["value"]), context, status) for k, v in (action.get("outputs") or {}).items()}
    return ActionRun(runs, outputs, "".join(summary))


def _run_step(step_id: str, name: str, script: Path, env: Mapping[str, str], cwd: Path,
              cancel_when: CancelWhen | None, timeout_s: float) -> StepRun:
    log_path = script.with_suffix(".log")
    with log_path.open("wb") as log:
        proc = subprocess.Popen([*BASH, str(script)], env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        run = StepRun(step_id, name, "success")
        end = time.monotonic() + timeout_s
        cancelling = False
        while proc.poll() is None and time.monotonic() < end:
            if cancel_when is not None and not cancelling and cancel_when(proc, log_path.read_text(errors="replace")):
                cancelling = True
                _cancel(proc, run)
                break
            time.sleep(0.1)
        if proc.poll() is None and not cancelling:
            proc.kill()
            raise AssertionError(f"step {step_id} still running after {timeout_s} s:\n"
                                 f"{log_path.read_text(errors='replace')[-4000:]}")
        run.rc = proc.wait(timeout=30)
    run.log = log_path.read_text(errors="replace")
    if cancelling:
        run.outcome = "cancelled"
    elif run.rc != 0:
        run.outcome = "failure"
    return run


def _cancel(proc: subprocess.Popen[bytes], run: StepRun) -> None:
    """ProcessInvoker's CancelAndKillProcessTree on Linux: kill(pid, SIGINT), wait 7.5 s; kill(pid, SIGTERM),
    wait 2.5 s; then Process.Kill() (SIGKILL to that pid)."""
    start = time.monotonic()
    for sig, wait_s in ((signal.SIGINT, SIGINT_WAIT_S), (signal.SIGTERM, SIGTERM_WAIT_S), (signal.SIGKILL, 0.0)):
        if proc.poll() is not None:
            break
        if sig == signal.SIGINT:
            run.sigint_unix = time.time()
        os.kill(proc.pid, sig)
        run.signals.append((sig.name, round(time.monotonic() - start, 2)))
        try:
            proc.wait(timeout=wait_s) if wait_s else proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            continue
    run.exited_after_sigint_s = round(time.monotonic() - start, 2)


def stderr_has(text: str) -> CancelWhen:
    """Cancel once the step's log holds `text`."""
    return lambda _proc, log: text in log


def after(seconds: float, inner: CancelWhen) -> CancelWhen:
    """Cancel `seconds` after `inner` first said so."""
    seen: list[float] = []
    lock = threading.Lock()

    def when(proc: subprocess.Popen[bytes], log: str) -> bool:
        with lock:
            if not seen and inner(proc, log):
                seen.append(time.monotonic())
            return bool(seen) and time.monotonic() - seen[0] >= seconds

    return when
