"""The live view and progress bars, as a user watches a run: "step k of n", the time left to the cap in minutes
and seconds, an expected teardown length and no "quiet N s" in a teardown; the dollars stop rising at the
DELETE's acknowledgement (not after the absence proof); a step's `\\r`-redrawn progress bar shows its latest
drawing while it runs, rate-limited and escaped, colour codes dropped, and its step log keeps the bytes."""

from __future__ import annotations

import io
import time

import pytest
from pydantic import SecretStr
from rich.console import Console

from vast_harness.console.carriage import CarriageLine, shown_segment
from vast_harness.console.live import LiveView, Snapshot
from vast_harness.console.output import Output
from vast_harness.run.runner import GuardedRun
from vast_harness.sim import SimServer
from vast_harness.spec.profile import Step, load_driver_policy
from vast_harness.spec.resolve import RunOptions, resolve
from vast_harness.vast.client import VastClient

SCALE = 0.01
KEY = "sim-live-key"


def rendered(view: LiveView) -> str:
    buf = io.StringIO()
    Console(file=buf, width=160, color_system=None).print(view.render())
    return buf.getvalue()


def snap(**kw: object) -> Snapshot:
    base: dict[str, object] = {"phase": "step sweep", "phase_elapsed_s": 3.0, "accrued_usd": 0.0123,
                               "max_usd": 0.5, "elapsed_s": 61.0, "max_s": 900.0, "step_number": 2, "step_count": 3}
    return Snapshot(**(base | kw))  # type: ignore[arg-type]


def test_the_live_view_says_step_k_of_n_and_the_time_left_in_minutes_and_seconds():
    view = LiveView(Console(file=io.StringIO()), lambda: snap(), live=True)
    text = rendered(view)
    assert "step 2 of 3: sweep" in text
    assert "13 m 59 s left" in text  # 900 s cap, 61 s used


def test_a_teardown_shows_its_expected_length_and_never_quiet():
    s = snap(phase="teardown", step_number=None, tearing_down=True, teardown_expected_s=14.0)
    view = LiveView(Console(file=io.StringIO()), lambda: s, live=True)
    view._last_line -= 60  # a minute without output: expected in a teardown
    text = rendered(view)
    assert "teardown" in text and "usually takes ~14 s" in text and "quiet" not in text
    beat = view.heartbeat_text()
    assert "tearing down" in beat and "no output" not in beat and "14 m 59 s left" not in beat
    # the cap guard's DELETE mid-step: the phase still names the step, and silence is still expected
    guarded = snap(phase="step sweep: cap guard sent the DELETE", tearing_down=True, teardown_expected_s=14.0)
    view = LiveView(Console(file=io.StringIO()), lambda: guarded, live=True)
    view._last_line -= 60
    assert "quiet" not in rendered(view)


def test_a_quiet_step_still_says_quiet():
    view = LiveView(Console(file=io.StringIO()), lambda: snap(), live=True)
    view._last_line -= 10
    assert "quiet 10 s" in rendered(view)
    assert "still running, no output for 10 s" in view.heartbeat_text()


def test_the_progress_drawing_is_shown_escaped_under_the_step():
    view = LiveView(Console(file=io.StringIO()), lambda: snap(), live=True)
    view.progress = " 40%|████      | 4/10 \x1b]52;c;aGk=\x07"
    text = rendered(view)
    assert " 40%|████      | 4/10 \\x1b]52;c;aGk=\\x07" in text and "\x1b]" not in text


@pytest.mark.parametrize(("line", "shown"), [
    ("\r 10%|#   |\r 20%|##  |", " 20%|##  |"),
    ("\x1b[32m 99%\x1b[0m\r\x1b[32m100%\x1b[0m\r", "100%"),  # a bar that ends with \r keeps its last drawing
    ("\x1b[2K\rdone \x1b[1A", "done \x1b[1A"),  # erase-in-line dropped; the cursor move stays, to be escaped
    ("\x1b\x1b[31m[31mx", "\x1b[31mx"),  # a code rebuilt by the dropping is still an ESC, escaped when printed
    ("plain", "plain"),
])
def test_shown_segment_is_what_a_terminal_leaves(line, shown):
    assert shown_segment(line) == shown


def test_carriage_line_shows_only_finished_drawings_and_is_rate_limited():
    now = [0.0]
    c = CarriageLine(min_interval_s=1.0, clock=lambda: now[0])
    assert c.update("no carriage return yet") is None
    assert c.update("\r 10%") is None  # being drawn: it may stop inside a secret
    assert c.update("\r 10%\r 2") == " 10%"
    now[0] = 0.5
    assert c.update("\r 10%\r 20%\r 3") is None  # too soon
    now[0] = 1.2
    assert c.update("\r 10%\r 20%\r 30%\r") == " 30%"
    now[0] = 5.0
    assert c.update("\r 10%\r 20%\r 30%\r") is None  # nothing new


class Recording(Output):
    """A plain Output (no terminal) that shows a bar's drawing every 0.2 s and remembers what it showed."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: list[tuple[str, str]] = []

    @property
    def progress_interval_s(self) -> float:
        return 0.2

    def step_progress(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, segment: str) -> None:
        self.shown.append(("progress", segment))
        super().step_progress(step, elapsed_s, accrued_usd, stream, segment)

    def step_line(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, line: str) -> None:
        self.shown.append(("line", line))
        super().step_line(step, elapsed_s, accrued_usd, stream, line)


@pytest.fixture(scope="module")
def sim():
    with SimServer(seed=34, rate_scale=SCALE, boot_seconds=0.1, num_offers=200) as server:
        yield server


def _run(sim: SimServer, tmp_path, steps: list[Step], out: Output, **opts: float) -> GuardedRun:
    spec = resolve(RunOptions(profile="smoke", sim=True, evidence_dir=tmp_path / "ev",
                              proof_interval_s=opts.get("proof_interval_s", 0.05)), environ={})
    prof = spec.profile.model_copy(update={"steps": steps})
    spec = spec.model_copy(update={"profile": prof, "api_url": sim.url, "api_key": SecretStr(KEY)}
                           ).with_timings(teardown_margin_s=5.0)
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        run = GuardedRun(spec, client, load_driver_policy(), out)
        result = run.execute()
    assert result.exit_code in (0, 4), result.message
    return run


def test_a_progress_bar_shows_its_latest_drawing_while_it_runs_and_the_log_keeps_the_bytes(sim, tmp_path, capsys):
    bar = ("for i in 1 2 3 4; do printf '\\r\\033[32mtrain %s/4\\033[0m \\033]52;c;aGk=\\007' $i; sleep 0.6; done; "
           "printf '\\r\\033[32mtrain done\\033[0m\\n'")
    out = Recording()
    run = _run(sim, tmp_path, [Step(name="train", run=bar, timeout_s=30)], out)
    drawings = [text for kind, text in out.shown if kind == "progress"]
    # shown while the line was still being drawn (before its one line ended), colour codes dropped, latest first
    assert len(drawings) >= 2 and drawings[0].startswith("train 1/4"), out.shown
    assert out.shown.index(("progress", drawings[-1])) < next(i for i, (k, _) in enumerate(out.shown) if k == "line")
    assert ("line", "train done") in out.shown  # the finished line: its last drawing, not 4 drawings of escapes
    console = capsys.readouterr().out
    assert "… train 1/4 \\x1b]52;c;aGk=\\x07" in console  # the OSC 52 a host slipped in: shown escaped
    assert "\x1b]52" not in console and "\\x0d" not in console
    log = (run.ev.dir / "steps" / "train.log").read_bytes()
    assert b"\r\x1b[32mtrain 1/4\x1b[0m \x1b]52;c;aGk=\x07\r" in log and b"\r\x1b[32mtrain done\x1b[0m" in log


def test_the_dollars_stop_rising_at_the_delete_acknowledgement(sim, tmp_path, monkeypatch):
    """A long absence proof after the DELETE's answer: the live figure is the same at its start and end."""
    import vast_harness.instance.lifecycle as lifecycle
    from vast_harness.run.tools import snapshot

    seen: list[tuple[float, float]] = []
    holder: dict[str, GuardedRun] = {}
    real = lifecycle.prove_absent

    def slow_proof(*args, **kwargs):
        before = snapshot(holder["run"].tools).accrued_usd
        time.sleep(1.0)
        proof = real(*args, **kwargs)
        seen.append((before, snapshot(holder["run"].tools).accrued_usd))
        return proof

    monkeypatch.setattr(lifecycle, "prove_absent", slow_proof)
    out = Output(quiet=True)
    original = GuardedRun.__init__

    def keep(self, *a, **k):
        original(self, *a, **k)
        holder["run"] = self

    monkeypatch.setattr(GuardedRun, "__init__", keep)
    run = _run(sim, tmp_path, [Step(name="one", run="echo hi", timeout_s=20)], out)
    assert seen and all(before == after and before > 0 for before, after in seen), seen
    assert snapshot(run.tools).accrued_usd == pytest.approx(seen[-1][1])
