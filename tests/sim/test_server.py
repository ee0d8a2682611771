"""The embeddable server and the command line: start-up, ports, stop, /_sim/ routes, --help."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest

from tests.sim.conftest import create
from vast_harness.sim import SimServer
from vast_harness.sim.cli import build_parser, main


def test_start_is_fast_and_picks_a_port() -> None:
    started = time.monotonic()
    with SimServer() as sim:
        elapsed = time.monotonic() - started
        assert sim.url.startswith("http://127.0.0.1:") and sim.port > 0
        assert httpx.post(f"{sim.url}/api/v0/bundles/", json={"limit": 1}).status_code == 200
    assert elapsed < 1.0


def test_state_never_shows_keys(api: httpx.Client, fresh: SimServer) -> None:
    body = create(api)
    state = httpx.get(f"{fresh.url}/_sim/state").json()
    text = json.dumps(state)
    assert "test-key-a" not in text and body["instance_api_key"] not in text
    assert state["instances"][0]["account"] == 0 and state["accounts"][0]["index"] == 0
    assert {"method", "path", "status", "time", "key_in_url"} <= set(state["calls"][0])


def test_reset_route(api: httpx.Client, fresh: SimServer) -> None:
    create(api)
    assert httpx.post(f"{fresh.url}/_sim/reset").json() == {"success": True}
    state = fresh.state()
    assert state["instances"] == [] and state["calls"] == [] and state["rented_offers"] == []


def test_unknown_routes(api: httpx.Client, fresh: SimServer) -> None:
    assert api.get("/api/v0/nothing/").status_code == 404
    assert httpx.get(f"{fresh.url}/_sim/nothing").status_code == 404


def test_help_documents_the_fault_grammar() -> None:
    text = build_parser().format_help()
    for needle in ("--api-key", "--rate-scale", "--host-root", "429:ENDPOINT", "ssh_refuse:K", "seed="):
        assert needle in text


def test_bad_fault_spec_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--faults", "teleport"]) == 2
    assert "teleport" in capsys.readouterr().err


def test_module_runs_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "vast_harness.sim", "--port", "0", "--seed", "3",
                             "--offers", "20", "--faults", "429:search:1"], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        url = line.strip().rsplit(" ", 1)[-1]
        assert url.startswith("http://127.0.0.1:")
        request = urllib.request.Request(f"{url}/_sim/state")
        with urllib.request.urlopen(request, timeout=5) as response:
            assert json.load(response)["seed"] == 3
        assert httpx.post(f"{url}/api/v0/bundles/", json={}).status_code == 429
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        if proc.stdout:
            proc.stdout.close()


def test_a_client_that_hangs_up_mid_answer_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    # The embedded simulator shares the user's stderr (`--sim`): a Ctrl-C'd client used to leave a
    # BrokenPipeError traceback there. A big answer to a socket closed right after the request.
    import socket

    with SimServer(num_offers=300) as sim:
        body = json.dumps({"limit": 1000}).encode()
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", sim.port))
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST on close
            s.sendall(b"POST /api/v0/bundles/ HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            s.close()
        time.sleep(0.5)
        assert sim.state()["server_errors"] == []
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "Exception occurred" not in err, err


def test_a_simulator_bug_is_kept_in_state_not_printed(monkeypatch: pytest.MonkeyPatch,
                                                      capfd: pytest.CaptureFixture[str]) -> None:
    import vast_harness.sim.server as server_mod

    def broken(backend: object, req: object) -> None:
        raise KeyError("a bug in a route")

    monkeypatch.setattr(server_mod, "dispatch", broken)
    with SimServer() as sim:
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"{sim.url}/api/v0/users/current/", timeout=5)
        errors = sim.state()["server_errors"]
    assert len(errors) == 1 and "KeyError" in errors[0] and "a bug in a route" in errors[0]
    assert "Traceback" not in capfd.readouterr().err
