"""Run a command under a CUDA MPS daemon we own, prove every CUDA process attached, stop what we own.

    python -m remote.mps [--manifest FILE] [--foreign refuse|use] [--thread-pct N] -- CMD ...

Single host only: one control daemon per host serves every rank and helper of the job (all GPUs the
host shows; clients choose theirs with CUDA_VISIBLE_DEVICES). Multi-host jobs run one wrapper per
host, each with its own manifest; nothing here spans hosts.

Start: a daemon we did not start (CUDA_MPS_PIPE_DIRECTORY already set, or one answering in
/tmp/nvidia-mps) is refused, or with `--foreign use` used as external and never stopped. Otherwise a
private 0700 pipe directory with a short path, `nvidia-cuda-mps-control -d`, a supervisor (see
remote.mps.supervisor) so that even a SIGKILLed wrapper leaves no daemon behind, readiness through
the pipe plus a live PID from the pid file, defaults before the first client, and only then the
child, with CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY, VH_MPS_MODE=on and VH_MPS_CLIENT_DIR
in its environment before any CUDA init.

Validate (fail closed): each CUDA process calls `attach_current_process` (remote.mps.attach), which
writes its record into VH_MPS_CLIENT_DIR; the wrapper cross-checks every PID against our
control.log and rejects mixed modes or a rank whose processes sit on different GPUs (by UUID). No
record, or any failed record, makes the exit code non-zero even when CMD succeeded.

Stop: see remote.mps.stop. SIGINT/SIGTERM/SIGHUP are forwarded to the child's process group (the
child leads its own group, so a terminal's Ctrl-C reaches it once, through us).

Exit codes: CMD's own code when it failed (128+N when killed by signal N); 1 when CMD succeeded but
attachment was not proven or the daemon did not stop; 2 when MPS could not be set up (foreign daemon
refused, binary missing, daemon not ready); nothing was run then.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remote import knobs
from remote.checks.mps import client_claim_errors
from remote.host.paths import ROOT
from remote.mps.control import (
    DEFAULT_PIPE_DIR,
    Daemon,
    ForeignDaemonError,
    MpsError,
    apply_defaults,
    daemon_answers,
    find_control_binary,
    launch_daemon,
    make_private_dirs,
    read_pid_file,
    wait_ready,
)
from remote.mps.manifest import (
    build_manifest,
    confirm_in_log,
    load_client_records,
    log_digests,
    server_record,
    write_manifest,
)
from remote.mps.stop import StopReport, StopTimeouts, drain_clients, stop_owned
from remote.mps.supervisor import start_ticks

__all__ = ["main", "owned_daemon", "parse_args", "run"]

EXIT_NOT_PROVEN = 1
EXIT_SETUP = 2
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _say(msg: str) -> None:
    print(f"remote.mps: {msg}", file=sys.stderr, flush=True)


@dataclass
class Options:
    command: list[str]
    manifest: Path | None
    foreign: str
    thread_pct: int | None
    base_dir: Path
    log_dir: Path | None
    default_pipe_dir: Path
    control_binary: str | None
    ready_timeout_s: float
    timeouts: StopTimeouts


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name} before the command started")
        self.signum = signum


class _Signals:
    """Forward signals to the child's group while it runs; before that, abort the start."""

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.received: list[str] = []
        self.first_at: float | None = None
        self.stopping = False

    def install(self) -> None:
        for sig in _FORWARDED:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: object) -> None:
        self.received.append(signal.Signals(signum).name)
        self.first_at = self.first_at or time.monotonic()
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)
            except ProcessLookupError:
                pass
        elif self.child is None and not self.stopping:
            raise _Interrupted(signum)


class _Supervisor:
    """Handle on remote.mps.supervisor: tell it the child's PID, release it on a clean stop."""

    def __init__(self, daemon: Daemon, t: StopTimeouts):
        read_fd, self._write_fd = os.pipe()
        path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        assert daemon.log_dir is not None
        with (daemon.log_dir / "supervisor.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "remote.mps.supervisor", "--fd", str(read_fd),
                 "--binary", str(daemon.binary), "--pipe-dir", str(daemon.pipe_dir),
                 "--log-dir", str(daemon.log_dir), "--client-grace-s", str(t.client_grace_s),
                 "--quit-timeout-s", str(t.quit_timeout_s), "--kill-wait-s", str(t.kill_wait_s)],
                pass_fds=(read_fd,), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=dict(os.environ, PYTHONPATH=path), start_new_session=True,
            )
        os.close(read_fd)

    def _send(self, line: str) -> None:
        try:
            os.write(self._write_fd, line.encode())
        except OSError:
            pass

    def announce_child(self, pid: int) -> None:
        self._send(f"child {pid} {start_ticks(pid)}\n")

    def release(self) -> None:
        self._send("released\n")
        os.close(self._write_fd)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _say(f"supervisor {self.proc.pid} did not exit after release")


def start_owned_daemon(binary: Path, base_dir: Path, log_dir: Path | None, thread_pct: int | None,
                       ready_timeout_s: float, timeouts: StopTimeouts, state: dict[str, Any]) -> Daemon:
    """Private dirs, `-d`, supervisor, readiness, defaults. Fills `state` as it goes so that the
    caller's cleanup can stop whatever was started even when a later step fails."""
    pipe_dir, log_dir = make_private_dirs(base_dir, log_dir)
    daemon = Daemon(binary, pipe_dir, log_dir, owned=True)
    state["daemon"] = daemon
    try:
        launch_daemon(binary, pipe_dir, log_dir)
    except MpsError:
        shutil.rmtree(pipe_dir, ignore_errors=True)
        state["daemon"] = None
        raise
    state["supervisor"] = _Supervisor(daemon, timeouts)  # before anything else can fail or be killed
    wait_ready(daemon, ready_timeout_s)
    state["thread_pct"] = apply_defaults(daemon, thread_pct)
    _say(f"MPS daemon {daemon.daemon_pid} ready; pipe {pipe_dir}, logs {log_dir}")
    return daemon


@contextlib.contextmanager
def owned_daemon(log_dir: Path | None = None, *, base_dir: Path = Path("/tmp"), thread_pct: int | None = None,
                 ready_timeout_s: float = 15.0, timeouts: StopTimeouts | None = None,
                 control_binary: str | None = None) -> Iterator[tuple[Daemon, dict[str, Any]]]:
    """A fresh daemon of ours for a block (the benchmark's per-repetition daemon). Yields the daemon
    and a dict that receives the stop report under "stop" once the block is left."""
    t = timeouts or StopTimeouts()
    state: dict[str, Any] = {}
    info: dict[str, Any] = {}
    try:
        yield start_owned_daemon(find_control_binary(control_binary), base_dir, log_dir, thread_pct,
                                 ready_timeout_s, t, state), info
    finally:
        if state.get("daemon") is not None:
            info["server_pids"] = state["daemon"].server_pids()
            info["stop"] = stop_owned(state["daemon"], by="wrapper", timeouts=t,
                                      server_pids=info["server_pids"]).to_dict()
        if state.get("supervisor"):
            state["supervisor"].release()


def _external(binary: Path, pipe_dir: Path, source: str, opts: Options) -> Daemon:
    if opts.thread_pct is not None:
        raise ForeignDaemonError("--thread-pct would change the defaults of a daemon we do not own")
    log_env = os.environ.get("CUDA_MPS_LOG_DIRECTORY")
    daemon = Daemon(binary, pipe_dir, Path(log_env) if log_env else None, owned=False, foreign_source=source)
    daemon.daemon_pid = read_pid_file(pipe_dir)
    daemon.readiness = [f"external daemon ({source}) answers get_server_list in {pipe_dir}"]
    _say(f"using the external MPS daemon in {pipe_dir} ({source}); it will not be stopped")
    return daemon


def _find_foreign(binary: Path, opts: Options) -> tuple[Daemon | None, str | None]:
    """An external daemon to use, or (None, note on a stale default dir); raise when refused."""
    env_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    if env_dir:
        live = daemon_answers(binary, Path(env_dir)) is not None
        state = "a daemon answers there" if live else "no daemon answers there (stale)"
        if opts.foreign == "refuse" or not live:
            raise ForeignDaemonError(
                f"CUDA_MPS_PIPE_DIRECTORY={env_dir} is already set and {state}; refusing "
                f"(--foreign use runs on a live one as external; or unset the variable)"
            )
        return _external(binary, Path(env_dir), "env", opts), None
    if daemon_answers(binary, opts.default_pipe_dir) is not None:
        if opts.foreign == "refuse":
            raise ForeignDaemonError(
                f"an MPS daemon already answers in {opts.default_pipe_dir} (host or another job); "
                "refusing (--foreign use runs on it as external)"
            )
        return _external(binary, opts.default_pipe_dir, "default", opts), None
    stale = None
    if opts.default_pipe_dir.exists():
        stale = f"{opts.default_pipe_dir} exists but no daemon answers there (stale); ignored"
    return None, stale


def _run_child(opts: Options, daemon: Daemon, client_dir: Path, sigs: _Signals, state: dict[str, Any]) -> int:
    env = dict(os.environ, **daemon.env(), **knobs.mps_client_env(str(client_dir)))
    child = subprocess.Popen(opts.command, env=env, process_group=0)
    sigs.child = child
    state["child"] = {"pid": child.pid, "signals_forwarded": sigs.received}
    if state.get("supervisor"):
        state["supervisor"].announce_child(child.pid)
    killed = False
    while (rc := child.poll()) is None:
        if sigs.first_at and not killed and time.monotonic() - sigs.first_at > opts.timeouts.client_grace_s:
            _say(f"child {child.pid} still running {opts.timeouts.client_grace_s:.0f} s after a signal: "
                 "terminating its MPS clients, then SIGKILL")
            if daemon.owned:
                stop_owned_clients(daemon, opts.timeouts)
            os.killpg(child.pid, signal.SIGKILL)
            killed = True
        time.sleep(0.05)
    return 128 - rc if rc < 0 else rc


def stop_owned_clients(daemon: Daemon, timeouts: StopTimeouts) -> None:
    """terminate_client + SIGKILL every live client of our servers (the stuck-child path)."""
    quick = StopTimeouts(client_grace_s=0.0, terminate_wait_s=timeouts.terminate_wait_s,
                         kill_wait_s=timeouts.kill_wait_s)
    drain_clients(daemon, daemon.server_pids(), quick, StopReport(by="wrapper"))


def _client_dir(daemon: Daemon, base_dir: Path) -> Path:
    """Where processes drop their attachment records: beside our daemon's logs (kept, and gone with
    them), or a temp dir for an external daemon (removed once the records are in the manifest)."""
    if daemon.owned and daemon.log_dir is not None:
        path = daemon.log_dir / "clients"
        path.mkdir(exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix="vhmps-clients-", dir=base_dir))


def _validate(daemon: Daemon, client_dir: Path, server: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    records, errors = load_client_records(client_dir)
    if daemon.owned:
        confirm_in_log(records, daemon.control_log_text())
    errors += client_claim_errors(records, server)
    return records, errors


def _finish(opts: Options, state: dict[str, Any], server_extra: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Record the servers, stop what we own, hash the logs; return the server record and errors."""
    daemon: Daemon | None = state.get("daemon")
    errors: list[str] = []
    server = server_record(daemon, state.get("binary"), **server_extra)
    if daemon is None:
        return server, errors
    server["server_pids"] = state.get("server_pids") or daemon.server_pids()
    server["default_active_thread_percentage"] = state.get("thread_pct")
    if daemon.owned:
        report = stop_owned(daemon, by="wrapper", timeouts=opts.timeouts, server_pids=server["server_pids"])
        server["stop"] = report.to_dict()
        if report.escalated:
            _say(f"quit was not enough; escalated by PID: {report.escalated}")
        if not (report.daemon_gone and report.servers_gone) or report.survivors:
            errors.append(f"MPS refusing to quit: processes left {report.survivors}")
    if state.get("supervisor"):
        state["supervisor"].release()
    server["logs"] = log_digests(daemon.log_dir if daemon.owned else None)
    return server, errors


def run(opts: Options) -> int:
    sigs = _Signals()
    state: dict[str, Any] = {"child": {}}
    errors: list[str] = []
    records: list[dict[str, Any]] = []
    exit_code = EXIT_SETUP
    client_dir: Path | None = None
    server_extra: dict[str, Any] = {"requested_thread_percentage": opts.thread_pct, "stale_default_pipe_dir": None}
    sigs.install()
    try:
        state["binary"] = find_control_binary(opts.control_binary)
        daemon, server_extra["stale_default_pipe_dir"] = _find_foreign(state["binary"], opts)
        if daemon is None:
            daemon = start_owned_daemon(state["binary"], opts.base_dir, opts.log_dir, opts.thread_pct,
                                        opts.ready_timeout_s, opts.timeouts, state)
        state["daemon"] = daemon
        client_dir = _client_dir(daemon, opts.base_dir)
        rc = _run_child(opts, daemon, client_dir, sigs, state)
        state["child"]["exit_code"] = rc
        sigs.stopping = True
        state["server_pids"] = daemon.server_pids()
        probe = {"server_pids": state["server_pids"], "ownership": "owned" if daemon.owned else "external"}
        records, errors = _validate(daemon, client_dir, probe)
        exit_code = rc if rc != 0 else (EXIT_NOT_PROVEN if errors else 0)
    except _Interrupted as exc:
        errors.append(str(exc))
        exit_code = 128 + exc.signum
    except MpsError as exc:
        errors.append(str(exc))
    except OSError as exc:  # the command itself could not be started
        errors.append(f"cannot run {opts.command[0]!r}: {exc}")
        exit_code = 127
    finally:
        sigs.stopping = True
        sigs.child = None
        server, stop_errors = _finish(opts, state, server_extra)
        if client_dir is not None and client_dir.name.startswith("vhmps-clients-"):
            shutil.rmtree(client_dir, ignore_errors=True)  # a temp dir; records in a log dir are kept
    errors += stop_errors
    if stop_errors and exit_code == 0:
        exit_code = EXIT_NOT_PROVEN
    for err in errors:
        _say(f"FAIL: {err}")
    if exit_code == EXIT_NOT_PROVEN and state["child"].get("exit_code") == 0:
        _say("the command succeeded, but MPS was requested and not proven: exit 1 (fail closed)")
    if opts.manifest:
        write_manifest(opts.manifest, build_manifest(
            command=opts.command, server=server, clients=records, child=state["child"],
            exit_code=exit_code, errors=errors))
        _say(f"manifest written to {opts.manifest}")
    return exit_code


def parse_args(argv: list[str]) -> Options:
    if "--" not in argv:
        raise SystemExit("usage: python -m remote.mps [options] -- CMD ...  (the -- is required)")
    split = argv.index("--")
    own, command = argv[:split], argv[split + 1:]
    p = argparse.ArgumentParser(prog="python -m remote.mps", description=__doc__.split("\n\n")[0])
    p.add_argument("--manifest", type=Path, help="write the MPS manifest JSON here")
    p.add_argument("--foreign", choices=("refuse", "use"), default="refuse",
                   help="a daemon we did not start: refuse (default) or use it as external, never stopped")
    p.add_argument("--thread-pct", type=int, help="set_default_active_thread_percentage before any client")
    p.add_argument("--log-dir", type=Path, help="daemon logs (kept); default a fresh dir under --base-dir")
    p.add_argument("--base-dir", type=Path, default=Path("/tmp"), help="where the private pipe dir goes")
    p.add_argument("--default-pipe-dir", type=Path, default=DEFAULT_PIPE_DIR,
                   help="where a host-wide daemon would listen (checked for a foreign daemon)")
    p.add_argument("--control-binary", help="path of nvidia-cuda-mps-control (default: PATH)")
    p.add_argument("--ready-timeout-s", type=float, default=15.0)
    p.add_argument("--client-grace-s", type=float, default=10.0,
                   help="how long clients get to exit (at stop, and after a forwarded signal)")
    p.add_argument("--quit-timeout-s", type=float, default=10.0)
    p.add_argument("--kill-wait-s", type=float, default=5.0)
    a = p.parse_args(own)
    if not command:
        p.error("no command after --")
    if a.thread_pct is not None and not 1 <= a.thread_pct <= 100:
        p.error("--thread-pct must be within 1..100")
    timeouts = StopTimeouts(client_grace_s=a.client_grace_s, terminate_wait_s=min(2.0, a.client_grace_s),
                            quit_timeout_s=a.quit_timeout_s, gone_wait_s=a.quit_timeout_s,
                            kill_wait_s=a.kill_wait_s)
    return Options(command, a.manifest, a.foreign, a.thread_pct, a.base_dir, a.log_dir,
                   a.default_pipe_dir, a.control_binary, a.ready_timeout_s, timeouts)


def main(argv: list[str] | None = None) -> int:
    try:
        opts = parse_args(sys.argv[1:] if argv is None else argv)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        return EXIT_SETUP if exc.code not in (0, None) else 0
    return run(opts)


if __name__ == "__main__":
    raise SystemExit(main())
