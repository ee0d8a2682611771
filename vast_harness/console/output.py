"""The one sink for what the CLI shows: rich tables for people, one JSON object for `--json`.

Human output goes to stdout; progress, warnings and errors to stderr, so `--json` stdout stays parseable.
Everything shown is plain text to rich (consoles without markup, values wrapped in `Text`): a profile name,
a path, a server message or a step's output containing `[/x]` prints as it is and can never raise, and nothing
a host or the API supplied reaches the terminal raw (console/terminal.py escapes it). The account key and every
secret are masked in all of it (masking.py): in each value before rich lays it out (a wrapped line would cut a
value in two), in the `--json` object before it is serialised, and in every write as a last resort. Writes never
raise either: a closed or broken stdout (`| head`) must not end a run or skip its teardown. `RunOutput` is a
fleet run's sink: several runs at once, so tagged lines on stderr only.
"""

from __future__ import annotations

import errno
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from rich.console import Console
from rich.table import Table

from vast_harness.clock import now_s
from vast_harness.console.carriage import LIVE_PROGRESS_EVERY_S, PROGRESS_LINE_EVERY_S
from vast_harness.console.live import HEARTBEAT_S, LiveView, Snapshot
from vast_harness.console.terminal import line as _line
from vast_harness.console.terminal import safe_text as _t
from vast_harness.errors import ExitCode
from vast_harness.masking import MASKER, mask

if TYPE_CHECKING:  # annotations only: output keeps importing nothing of the run machinery at runtime
    from vast_harness.records import InstanceTeardown, StepRecord


class LineBudget:
    """How many of a step's lines reach the console: a burst of `burst`, then `per_s` a second (a token bucket).

    A flood (`yes`, `seq 1 1000000`) printed line by line through rich costs ~0.4 ms a line: the harness then
    read the host's output at ~30 KB/s, held finished steps to their timeout and let the cap's cut wait behind
    the drain. The step log keeps every line; the console says how many it skipped and where they are."""

    def __init__(self, *, burst: int = 200, per_s: float = 50.0, clock: Callable[[], float] = now_s) -> None:
        self._burst, self._per_s, self._clock = float(burst), per_s, clock
        self._tokens, self._t = float(burst), clock()
        self.skipped = 0

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self._burst, self._tokens + (now - self._t) * self._per_s)
        self._t = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        self.skipped += 1
        return False

    def take_skipped(self) -> int:
        n, self.skipped = self.skipped, 0
        return n


class SafeStream:
    """A text stream whose writes never raise, and mask every key and secret.

    A closed stdout (`>&-`), a reader that went away (`| head -3`: EPIPE) or a closed file must not end a run
    early or skip its teardown: after the first failure the stream swallows writes, and the file descriptor is
    pointed at /dev/null so the interpreter's final flush cannot complain either.
    """

    def __init__(self, stream: IO[str] | None, fd: int | None = None) -> None:
        self._stream = stream
        self._fd = fd
        self.broken = stream is None

    def _break(self, exc: BaseException) -> None:
        self.broken = True
        if self._fd is not None and isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.EBADF):
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self._fd)
                os.close(devnull)
            except OSError:
                pass

    def write(self, text: str) -> int:
        if not self.broken and self._stream is not None:  # broken whenever there is no stream
            try:
                self._stream.write(mask(text))
                return len(text)
            except (OSError, ValueError) as exc:
                self._break(exc)
        return len(text)

    def flush(self) -> None:
        if not self.broken and self._stream is not None:
            try:
                self._stream.flush()
            except (OSError, ValueError) as exc:
                self._break(exc)

    def isatty(self) -> bool:
        try:
            return not self.broken and self._stream is not None and self._stream.isatty()
        except (OSError, ValueError):
            return False

    @property
    def encoding(self) -> str:
        return getattr(self._stream, "encoding", None) or "utf-8"

    def fileno(self) -> int:
        if self._fd is None:
            raise OSError(errno.EBADF, "no file descriptor")
        return self._fd


def _safe(stream: IO[str] | None) -> SafeStream:
    fd = None
    if stream is not None:
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            fd = None
    return SafeStream(stream, fd)


class Output:
    def __init__(self, *, json_mode: bool = False, quiet: bool = False, progress: bool = True) -> None:
        self.json_mode = json_mode
        self.progress = progress and not quiet  # the live view / heartbeat (off for a fleet's runs)
        self.view: LiveView | None = None
        self._out_saved: Console | None = None
        self.stdout = _safe(sys.stdout)
        self.stderr = _safe(sys.stderr)
        # markup=False: a string that reaches rich by any path prints as it is; styles come only from Text.
        # rich wants an IO[str]; it only calls write, flush, isatty, fileno and encoding, all of which SafeStream has.
        self.out = Console(file=cast(IO[str], self.stdout), highlight=False, soft_wrap=False, width=160, markup=False,
                           emoji=False)
        self.err = Console(file=cast(IO[str], self.stderr), highlight=False, soft_wrap=False, width=160, markup=False,
                           emoji=False)
        self.quiet = quiet
        self.emitted = False  # --json promises exactly one object on stdout
        self.rejected_rows: list[dict[str, Any]] = []  # with --json, rejections ride along in that one object

    # -- generic -------------------------------------------------------------------------------
    def info(self, message: str) -> None:
        if not self.quiet:
            self.err.print(_t(message))

    def warn(self, message: str) -> None:
        self.err.print(_line(("warning:", "yellow"), " ", message))

    def failure(self, message: str, exit_code: int) -> None:
        """An error that ends the command: one line on stderr, and with --json the one stdout object."""
        self.error(message)
        if self.json_mode and not self.emitted:
            self.emit_json({"error": message, "exit_code": exit_code})

    def error(self, message: str, hint: str | None = None) -> None:
        self.err.print(_line(("error:", "bold red"), " ", message))
        if hint:
            self.err.print(_t(hint, "dim"))

    def emit_json(self, payload: dict[str, Any]) -> None:
        if self.rejected_rows and "rejected" not in payload:
            payload = payload | {"rejected": self.rejected_rows}
        self.emitted = True
        plain = json.loads(json.dumps(payload, default=str))  # paths, enums and models as the object shows them
        self.stdout.write(json.dumps(MASKER.json_value(plain), indent=2, sort_keys=False) + "\n")
        self.stdout.flush()

    # -- a run -----------------------------------------------------------------------------------
    def start_view(self, snapshot: Callable[[], Snapshot]) -> None:
        """The live view on stderr (a terminal) or heartbeat lines (not a terminal); live.py."""
        if not self.progress or self.view is not None:
            return
        live = self.stderr.isatty()
        beat = float(os.environ.get("VH_HEARTBEAT_S") or HEARTBEAT_S)  # a test knob: seconds of silence per line
        self.view = LiveView(self.err, snapshot, live=live, heartbeat_s=beat, plain=self.info)
        if live and self.stdout.isatty():  # one terminal: print above the live region, through its console
            self._out_saved, self.out = self.out, self.err
        self.view.start()

    def stop_view(self) -> None:
        if self.view is not None:
            self.view.stop()
            self.view = None
        if self._out_saved is not None:
            self.out, self._out_saved = self._out_saved, None

    def step_output_seen(self) -> None:
        """A line arrived that is not shown (past the console's budget or the log's head): not "quiet"."""
        if self.view is not None:
            self.view.line_printed()

    def step_line(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, line: str) -> None:
        """One line of a step's output, live: the step, its elapsed time and the dollars accrued so far."""
        if self.view is not None:
            self.view.line_printed()
            self.view.progress = ""  # the bar's line ended: it is printed as a line now
        if self.quiet:
            return
        console = self.err if self.json_mode else self.out
        prefix = f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]"
        console.print(_line((prefix, "red" if stream == "stderr" else "dim"), " ", line))

    @property
    def progress_interval_s(self) -> float:
        """How often a progress bar's latest drawing is shown (carriage.py): in the live region 4 times a
        second (its refresh rate), as a printed line (a log, a pipe) once per PROGRESS_LINE_EVERY_S."""
        return LIVE_PROGRESS_EVERY_S if self.view is not None and self.view.is_live else PROGRESS_LINE_EVERY_S

    def step_progress(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, segment: str) -> None:
        """A progress bar's latest drawing (a line the step redraws with `\\r`, not ended yet): in the live
        region under the step's status when there is one, else printed as a step line marked "…"."""
        if self.view is not None:
            self.view.line_printed()  # a bar moving is output: the step is not quiet
            if self.view.is_live:
                self.view.progress = segment
                return
        if not self.quiet:
            console = self.err if self.json_mode else self.out
            console.print(_line((f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]", "dim"), " … ", segment))

    def step_done(self, step: StepRecord, accrued_usd: float) -> None:
        """One line per finished step (stderr): its outcome, seconds and the run's dollars so far."""
        if self.view is not None:
            self.view.line_printed()
        how = ("interrupted" if step.interrupted else "timed out" if step.timed_out else
               "connection lost" if step.connection_lost else f"rc {step.rc}")
        ok = step.rc == 0 and not step.interrupted
        if not self.quiet:
            self.err.print(_line(("✓ " if ok else "✗ ", "green" if ok else "red"),
                                 f"step {step.name}: {how} in {step.seconds:.1f} s; accrued ${accrued_usd:.4f}"))

    def result(self, run_id: str, code: int, message: str, evidence_dir: Path, steps: Sequence[StepRecord],
               teardowns: Sequence[InstanceTeardown], accrued_usd: float, report: Path | None = None,
               gpu: str | None = None, hosts: Sequence[str] = ()) -> None:
        """`hosts`: an interruptible run's hosts, a line each, and its total against the caps."""
        if self.json_mode:
            self.emit_json({"run_id": run_id, "exit_code": code, "message": message,
                            "evidence_dir": str(evidence_dir), "accrued_usd": round(accrued_usd, 6),
                            "report": str(report) if report else None,
                            "steps": [s.model_dump() for s in steps], "gpu": gpu,
                            "absence": {t.instance_id: t.verdict for t in teardowns}}
                           | ({"hosts": list(hosts)} if hosts else {}))
            return
        t = Table(title=_t(f"Run {run_id}"), header_style="bold")
        for col in ("step", "rc", "seconds", "note"):
            t.add_column(col)
        for s in steps:
            note = ("interrupted" if s.interrupted else "timed out" if s.timed_out else
                    "connection lost" if s.connection_lost else "")
            t.add_row(_t(s.name), _t("NA" if s.rc is None else s.rc), _t(f"{s.seconds:.1f}"), _t(note))
        self.out.print(t)
        for td in teardowns:
            color = "green" if td.verdict == "gone" else "bold red"
            self.out.print(_line(f"instance {td.instance_id}: ", (str(td.verdict), color),
                                 f" ({len(td.proof.rounds) if td.proof else 0} proof rounds)"))
        for host in hosts:
            self.out.print(_t(host))
        if gpu is not None:  # the GPUs the host reported after SSH, matched with its offer (run/arrival.py)
            self.out.print(_line(("ran on", "bold"), f" {gpu}"))
        color = "green" if code in (0, 4) else "red"
        self.out.print(_line((f"exit {code}", color), f": {message}  accrued ${accrued_usd:.4f}  "
                                                       f"evidence {evidence_dir}"))
        if report is not None:
            self.out.print(_line(("report", "bold"), f" {report}"))

    def refused(self, run_id: str, code: int, message: str) -> None:
        """A run refused before it rented anything: its verdict line only (no steps, no evidence, no report)."""
        if self.json_mode:
            self.emit_json({"run_id": run_id, "exit_code": code, "message": message, "evidence_dir": None,
                            "accrued_usd": 0.0, "report": None, "steps": [], "absence": {}})
            return
        said = "" if "nothing rented" in message else "; nothing rented"
        self.out.print(_line((f"exit {code}", "red"), f": {message}{said} (no evidence kept)"))

    def reap_report(self, rows: Sequence[tuple[int, str, int, str]], lines: Sequence[str], *, ok: bool) -> None:
        """`reap`'s table (instance, label, deletes, verdict) and what it could not prove, one line each."""
        t = Table(title=_t(f"reap: {len(rows)} instance(s)"), header_style="bold")
        for col in ("instance", "label", "deletes", "verdict"):
            t.add_column(col)
        for instance_id, label, deletes, verdict in rows:
            t.add_row(_t(instance_id), _t(label), _t(deletes), _t(verdict, "" if verdict == "gone" else "red"))
        self.out.print(t)
        for line in lines:
            self.out.print(_t(line, "red"))
        self.out.print(_t("all proven absent", "green") if ok else _t("NOT all proven absent", "bold red"))

    def rejections(self, rows: Sequence[dict[str, Any]], *, title: str) -> None:
        """The closest rejected offers as a table (`Rejection.row()` each), or with --json riding along in the
        one JSON object the command prints."""
        if self.json_mode:
            self.rejected_rows = list(rows)
            return
        t = Table(title=_t(title), header_style="bold")
        for col in ("id", "GPU", "n", "driver", "worst $", "why rejected"):
            t.add_column(col, overflow="fold")
        for row in rows:
            t.add_row(_t(row["id"]), _t(row["gpu"]), _t(row["n"]), _t(row["driver"]), _t(row["worst_case_usd"]),
                      _t("; ".join(row["reasons"])))
        self.out.print(t)


class RunOutput(Output):
    """A fleet run's progress: every line tagged with its GPU type, all on stderr (stdout is the fleet's)."""

    def __init__(self, tag: str, *, quiet: bool = False) -> None:
        super().__init__(json_mode=True, quiet=quiet, progress=False)  # several runs at once: tagged lines only
        self.tag = f"[{tag}]"

    def info(self, message: str) -> None:
        if not self.quiet:
            self.err.print(_line((self.tag, "cyan"), " ", message))

    def warn(self, message: str) -> None:
        self.err.print(_line((self.tag, "cyan"), " ", ("warning:", "yellow"), " ", message))

    def step_line(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, text: str) -> None:
        if not self.quiet:
            prefix = f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]"
            self.err.print(_line((self.tag, "cyan"), (prefix, "dim"), " ", text))

    def result(self, run_id: str, code: int, message: str, evidence_dir: Path, steps: Sequence[StepRecord],
               teardowns: Sequence[InstanceTeardown], accrued_usd: float, report: Path | None = None,
               gpu: str | None = None, hosts: Sequence[str] = ()) -> None:
        for host in hosts:  # a fleet's run: its hosts, tagged like its other lines
            self.err.print(_line((self.tag, "cyan"), " ", host))
        # exit 3 with no teardown: a create of unknown outcome, so "nothing rented" would be a claim it cannot make
        verdicts = ", ".join(f"{t.instance_id} {t.verdict}" for t in teardowns) or (
            "no instance seen yet" if code == ExitCode.NOT_PROVEN_GONE else "nothing rented")
        color = "green" if code in (ExitCode.PASSED, ExitCode.UNQUALIFIED_DRIVER) else "red"
        self.err.print(_line((self.tag, "cyan"), " ", (f"exit {code}", color),
                             f": {message}; {verdicts}; accrued ${accrued_usd:.4f}"
                             + (f"; ran on {gpu}" if gpu else "") + (f"; report {report}" if report else "")))

    def step_progress(self, step: str, elapsed_s: float, accrued_usd: float, stream: str, segment: str) -> None:
        if not self.quiet:
            self.err.print(_line((self.tag, "cyan"), (f"[{step} {elapsed_s:6.1f}s ${accrued_usd:.4f}]", "dim"), " … ",
                                 segment))

    def step_done(self, step: StepRecord, accrued_usd: float) -> None:
        how = "interrupted" if step.interrupted else "timed out" if step.timed_out else f"rc {step.rc}"
        if not self.quiet:
            self.err.print(_line((self.tag, "cyan"), f" step {step.name}: {how} in {step.seconds:.1f} s; "
                                                     f"accrued ${accrued_usd:.4f}"))

    def rejections(self, rows: Sequence[dict[str, Any]], *, title: str) -> None:
        self.err.print(_line((self.tag, "cyan"), f" {title}: {len(rows)} offer(s)"))

