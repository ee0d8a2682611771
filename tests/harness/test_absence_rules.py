"""The absence-proof rules one by one (absence.prove_absent, the per-id and list verdicts, lifecycle.teardown_instance):
respx answers in a scripted order, the fake clock for pacing, retries, spacing and deadlines, so every rule
runs in milliseconds and each test names the one rule it holds the code to."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx

from tests.harness.conftest import FakeClock
from vast_harness.clock import FreezeWatch
from vast_harness.instance.absence import UNSEEN_TRUST_AFTER_S, _list_verdict, _per_id_verdict, prove_absent
from vast_harness.instance.lifecycle import teardown_instance
from vast_harness.timings import Timings
from vast_harness.vast.client import RawExchange, VastClient

ID, LABEL = 42, "vh-run42"
LIVE = {"id": ID, "label": LABEL, "actual_status": "running", "intended_status": "running"}
LINGERING = {"id": ID, "label": LABEL, "actual_status": "exited", "intended_status": "destroyed"}
GONE_PER_ID = {"instances": None}
GONE_LIST = {"instances": [], "total_instances": 0, "next_token": None}
GONE = (GONE_PER_ID, GONE_LIST, GONE_LIST)  # one round: per id, list by id, list by label
NO_SUCH = {"success": False, "error": "no_such_instance", "msg": "Instance not found."}


def _raw(status: int | None, body: Any = None, *, text: str | None = None, error: str | None = None) -> RawExchange:
    text = json.dumps(body) if text is None else text
    return RawExchange("GET", "/", {}, status, text, body if text == json.dumps(body) else None, error, 0.0, 0.0)


def _answer(spec: Any) -> httpx.Response:
    """A scripted answer: a JSON body (200), a (status, body) pair, raw text, or an exception to raise."""
    if isinstance(spec, BaseException):
        raise spec
    if isinstance(spec, httpx.Response):
        return spec
    if isinstance(spec, tuple):
        return httpx.Response(spec[0], json=spec[1])
    return httpx.Response(200, json=spec)


class Script:
    """Per-round answers of the three proof reads, routed by the v1 list's select_filters; the last round
    repeats when the script runs out (a proof that outlives it keeps reading the same state)."""

    def __init__(self, router: respx.MockRouter, rounds: list[tuple[Any, Any, Any]],
                 deletes: list[Any] | None = None) -> None:
        self.rounds, self.deletes = rounds, list(deletes or [])
        self.reads = {"per_id": 0, "by_id": 0, "by_label": 0}
        self.delete_calls = 0
        router.get(f"/api/v0/instances/{ID}/").mock(side_effect=lambda req: self._read("per_id", 0))
        router.get("/api/v1/instances/").mock(side_effect=self._list)
        if deletes is not None:
            router.delete(f"/api/v0/instances/{ID}/").mock(side_effect=self._delete)

    def _read(self, which: str, column: int) -> httpx.Response:
        n = self.reads[which]
        self.reads[which] += 1
        return _answer(self.rounds[min(n, len(self.rounds) - 1)][column])

    def _list(self, request: httpx.Request) -> httpx.Response:
        filters = json.loads(request.url.params["select_filters"])
        return self._read("by_id", 1) if "id" in filters else self._read("by_label", 2)

    def _delete(self, request: httpx.Request) -> httpx.Response:
        self.delete_calls += 1
        return _answer(self.deletes[min(self.delete_calls - 1, len(self.deletes) - 1)])


@pytest.fixture
def api() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url="https://vast.test", assert_all_called=False, assert_all_mocked=True) as router:
        yield router


@pytest.fixture
def client(make_client) -> VastClient:
    """Unpaced (pacing has its own tests): the fake clock moves only for the proof's waits and retries."""
    return make_client(pacing_scale=0.0)


def _prove(client: VastClient, clock: FakeClock, *, budget_s: float = 30.0, interval_s: float = 2.0, **kw: Any):
    return prove_absent(client, ID, LABEL, interval_s=interval_s, deadline=clock() + budget_s, sleep=clock.sleep,
                        clock=clock, **kw)


# ----------------------------------------------------------------------------------- the per-id verdict


@pytest.mark.parametrize(("raw", "verdict"), [
    (_raw(200, {"instances": None}), "gone"),
    (_raw(200, {"instances": LIVE}), "present"),
    (_raw(200, {"instances": LINGERING}), "going"),
    (_raw(200, {"instances": {**LIVE, "intended_status": "running", "actual_status": "terminated"}}), "going"),
    (_raw(200, {"instances": {**LIVE, "id": 43}}), "unknown"),  # another instance's row is no answer about ours
    (_raw(200, {"instances": [LIVE]}), "present"),  # Vast's QA tool's shape: a one-element list (issue 33)
    (_raw(200, {"instances": [LIVE, LIVE]}), "unknown"),  # a list that is not this one instance
    (_raw(200, {"instances": [{**LIVE, "id": 43}]}), "unknown"),
    (_raw(200, {}), "unknown"),  # no "instances" key: never read as absence
    (_raw(200, None, text="<html>ok</html>"), "unknown"),  # unparsable body
    (_raw(404, {"instances": None}), "unknown"),  # a null body on an error status proves nothing
    (_raw(None, None, text="", error="ReadTimeout: timed out"), "unknown"),
])
def test_per_id_verdict(raw: RawExchange, verdict: str) -> None:
    assert _per_id_verdict(raw, ID) == verdict


# ------------------------------------------------------------------------------------- the list verdict


@pytest.mark.parametrize(("body", "verdict"), [
    (GONE_LIST, "gone"),
    ({"instances": []}, "gone"),  # no count, no token: an empty page
    ({"instances": [LIVE], "total_instances": 1}, "present"),
    ({"instances": [{**LIVE, "id": 999}], "total_instances": 1}, "present"),  # our label on another id: ours
    ({"instances": [{**LIVE, "label": "other"}], "total_instances": 1}, "present"),  # our id, relabelled
    ({"instances": [LINGERING, {**LINGERING, "id": 7}], "total_instances": 2}, "going"),
    ({"instances": [LINGERING, {**LIVE, "id": 7}], "total_instances": 2}, "present"),  # one live row of ours
    ({"instances": [{"id": 7, "label": "someone-else"}], "total_instances": 1}, "unknown"),  # unattributable
    ({"instances": [], "total_instances": 3}, "unknown"),  # the count disagrees with the page
    ({"instances": [], "total_instances": 0, "next_token": "abc"}, "unknown"),  # more pages
    ({"instances": None}, "unknown"),  # a list was promised
    ({"instances": {}}, "unknown"),
    ({}, "unknown"),
])
def test_list_verdict(body: dict, verdict: str) -> None:
    assert _list_verdict(_raw(200, body), ID, LABEL) == verdict


@pytest.mark.parametrize("raw", [_raw(500, GONE_LIST), _raw(429, GONE_LIST), _raw(200, None, text="[]x"),
                                 _raw(None, None, text="", error="ConnectError: refused")])
def test_list_verdict_without_a_usable_answer_is_unknown(raw: RawExchange) -> None:
    assert _list_verdict(raw, ID, LABEL) == "unknown"


# -------------------------------------------------------------------------------------- prove_absent


def test_two_all_gone_rounds_an_interval_apart_are_the_proof(api, client, fake_clock) -> None:
    script = Script(api, [GONE])
    proof = _prove(client, fake_clock, interval_s=2.0)
    assert proof.verdict == "gone" and len(proof.rounds) == 2
    assert fake_clock.sleeps_s == [2.0]  # exactly one interval between the two rounds
    assert script.reads == {"per_id": 2, "by_id": 2, "by_label": 2}  # every round reads all three


def test_the_pair_is_an_interval_apart_on_the_clock_not_one_sleep_apart(api, client, fake_clock) -> None:
    """A sleep that returns early (a signal, a coarse timer) does not shorten the proof: the second gone round
    must be interval_s after the first on the clock."""
    Script(api, [GONE])
    early = lambda s: fake_clock.sleep(s / 2)  # noqa: E731
    proof = prove_absent(client, ID, LABEL, interval_s=2.0, deadline=fake_clock() + 30, sleep=early, clock=fake_clock)
    assert proof.verdict == "gone" and len(proof.rounds) == 3  # t = 0, 1, 2


@pytest.mark.parametrize(("name", "bad"), [
    ("per-id 500", ((500, GONE_PER_ID), GONE_LIST, GONE_LIST)),
    ("list by id timed out", (GONE_PER_ID, httpx.ReadTimeout("t"), GONE_LIST)),
    ("list by label unparsable", (GONE_PER_ID, GONE_LIST, httpx.Response(200, text="<html>"))),
    ("list by label has more pages", (GONE_PER_ID, GONE_LIST, {**GONE_LIST, "next_token": "n"})),
    ("lingering row", (GONE_PER_ID, GONE_LIST, {"instances": [LINGERING], "total_instances": 1})),
])
def test_anything_but_gone_restarts_the_count(api, client, fake_clock, name: str, bad) -> None:
    Script(api, [GONE, bad, GONE, GONE])
    proof = _prove(client, fake_clock)
    assert proof.verdict == "gone", name
    assert [r.verdict for r in proof.rounds][:2] == ["gone", "going" if "lingering" in name else "unknown"]
    assert len(proof.rounds) == 4  # the gone before the bad round does not count towards the pair


def test_a_live_row_in_any_read_is_present_at_once(api, client, fake_clock) -> None:
    Script(api, [(GONE_PER_ID, GONE_LIST, {"instances": [LIVE], "total_instances": 1})])
    proof = _prove(client, fake_clock)
    assert proof.verdict == "present" and len(proof.rounds) == 1 and proof.seen_by_reads
    assert fake_clock.sleeps_s == []


def test_no_usable_answer_until_the_deadline_is_unknown_never_gone(api, client, fake_clock) -> None:
    Script(api, [((503, {}), (503, {}), (503, {}))])
    start = fake_clock()
    proof = _prove(client, fake_clock, budget_s=10.0, interval_s=2.0)
    assert proof.verdict == "unknown" and {r.verdict for r in proof.rounds} == {"unknown"}
    assert fake_clock() - start <= 10.0  # never sleeps past the deadline
    assert len(proof.rounds) == 6  # t = 0, 2, ..., 10: a round may land on the deadline, none after it


def test_a_row_that_lingers_to_the_deadline_is_going(api, client, fake_clock) -> None:
    Script(api, [(({"instances": LINGERING}), GONE_LIST, GONE_LIST)])
    proof = _prove(client, fake_clock, budget_s=6.0)
    assert proof.verdict == "going" and proof.seen_by_reads


def test_gone_inside_the_read_lag_window_proves_nothing(api, client, fake_clock) -> None:
    Script(api, [GONE])
    proof = _prove(client, fake_clock, budget_s=10.0, not_before_mono=fake_clock() + 3600)
    assert proof.verdict == "unknown"
    assert proof.rounds and all(r.in_lag_window and r.verdict == "gone" for r in proof.rounds)


def test_once_reads_show_it_the_shorter_window_applies(api, client, fake_clock) -> None:
    """Unseen: an hour's window. A round that shows the instance (lingering) proves reads see it, so the
    window shrinks to the seen one and the following null rounds count."""
    Script(api, [(GONE_PER_ID, GONE_LIST, {"instances": [LINGERING], "total_instances": 1}), GONE])
    proof = _prove(client, fake_clock, not_before_mono=fake_clock() + 3600, not_before_once_seen_mono=0.0)
    assert proof.seen_by_reads and proof.not_before_unix == 0.0
    assert proof.verdict == "gone" and [r.verdict for r in proof.rounds] == ["going", "gone", "gone"]


def test_without_the_once_seen_window_a_sighting_keeps_the_long_one(api, client, fake_clock) -> None:
    Script(api, [(GONE_PER_ID, GONE_LIST, {"instances": [LINGERING], "total_instances": 1}), GONE])
    proof = _prove(client, fake_clock, budget_s=10.0, not_before_mono=fake_clock() + 3600)
    assert proof.seen_by_reads and proof.verdict == "unknown"


# --------------------------------------------------------------------------------- teardown_instance


class Ledger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict]] = []

    def append(self, run_id: str, event: str, label: str, **fields: Any) -> None:
        self.lines.append((event, fields))

    def events(self) -> list[str]:
        return [e for e, _ in self.lines]


def _teardown(client: VastClient, clock: FakeClock, ledger: Ledger, *, budget_s: float = 60.0, **kw: Any):
    return teardown_instance(client, ledger, run_id="r1", label=LABEL, instance_id=ID, interval_s=2.0,
                             deadline=clock() + budget_s, sleep=clock.sleep, clock=clock,
                             lag_window_s=Timings.real().read_lag_window_s, **kw)


def test_delete_then_two_gone_rounds(api, client, fake_clock) -> None:
    script = Script(api, [GONE], deletes=[{"success": True}])
    ledger = Ledger()
    report = _teardown(client, fake_clock, ledger, created_mono=fake_clock() - 60)
    assert report.verdict == "gone" and report.seen and script.delete_calls == 1
    assert ledger.events() == ["delete_ack", "absence"]
    assert ledger.lines[0][1]["detail"] == "deleted" and ledger.lines[-1][1]["verdict"] == "gone"


def test_live_again_is_deleted_again_paced_by_the_interval(api, client, fake_clock) -> None:
    live = (GONE_PER_ID, GONE_LIST, {"instances": [LIVE], "total_instances": 1})
    script = Script(api, [live, GONE], deletes=[{"success": True}])
    ledger = Ledger()
    report = _teardown(client, fake_clock, ledger)
    assert script.delete_calls == 2 and len(report.deletes) == 2
    assert report.verdict == "gone"
    assert fake_clock.sleeps_s[0] == 2.0  # the pause before the second DELETE
    assert ledger.events() == ["delete_ack", "delete_ack", "absence"]


def test_still_live_at_the_deadline_is_present_in_the_ledger(api, client, fake_clock) -> None:
    live = ({"instances": LIVE}, GONE_LIST, GONE_LIST)
    script = Script(api, [live], deletes=[{"success": True}])
    ledger = Ledger()
    report = _teardown(client, fake_clock, ledger, budget_s=9.0)
    assert report.verdict == "present" and script.delete_calls >= 2
    assert ledger.lines[-1] == ("absence", {"instance_id": ID, "verdict": "present", "detail": None})


def test_an_unseen_instance_is_not_proven_gone_by_null_reads(api, client, fake_clock) -> None:
    """The create named it, no read showed it and DELETE says no such instance: inside the hour, its null reads
    may be a read lag (the instance may bill on), so the verdict is not gone and the ledger says why."""
    script = Script(api, [GONE], deletes=[(404, NO_SUCH)])
    ledger = Ledger()
    report = _teardown(client, fake_clock, ledger, budget_s=10.0, created_mono=fake_clock(), seen=False)
    assert script.delete_calls == 1 and report.deletes[0].outcome == "already_gone"
    assert report.verdict == "unknown" and not report.seen
    assert report.proof is not None and report.proof.not_before_unix >= time.time() + UNSEEN_TRUST_AFTER_S - 5
    event, fields = ledger.lines[-1]
    assert event == "absence" and "no read has shown this instance" in fields["detail"]


def test_a_delete_that_deletes_is_a_sighting(api, client, fake_clock) -> None:
    Script(api, [GONE], deletes=[{"success": True}])
    report = _teardown(client, fake_clock, Ledger(), created_mono=fake_clock() - 60, seen=False)
    assert report.seen and report.verdict == "gone"  # the seen window (30 s, long past) applied


def test_an_unseen_instance_a_round_shows_is_recorded_as_seen_once(api, client, fake_clock) -> None:
    lingering = (GONE_PER_ID, GONE_LIST, {"instances": [LINGERING], "total_instances": 1})
    Script(api, [lingering, lingering, GONE], deletes=[(404, NO_SUCH)])
    ledger = Ledger()
    report = _teardown(client, fake_clock, ledger, created_mono=fake_clock() - 60, seen=False)
    assert report.seen and report.verdict == "gone"
    assert ledger.events() == ["delete_ack", "seen", "absence"]


@pytest.mark.parametrize("stopped_in", ["delete", "proof"])
@pytest.mark.parametrize("watched", [False, True])
def test_a_process_stopped_in_its_teardown_proves_absence_on_resume(api, client, fake_clock, stopped_in: str,
                                                                    watched: bool) -> None:
    """Red team round 5: a run or reap SIGSTOPped 100 s (past the 60 s budget) with its DELETE on the wire, or
    in its proof, woke to a spent budget and said "unknown" (exit 3) for an instance the API had deleted. With
    the process's FreezeWatch the budget moves back by the seconds it did not run and a proof cut by them is
    made again, its earlier rounds kept; without one (the API's own slowness) the budget holds as before."""

    class Stopped(Script):
        def _delete(self, request: httpx.Request) -> httpx.Response:
            if stopped_in == "delete" and self.delete_calls == 0:
                fake_clock.now_s += 100.0
            return super()._delete(request)

        def _read(self, kind: str, index: int) -> httpx.Response:
            if stopped_in == "proof" and not any(self.reads.values()):
                fake_clock.now_s += 100.0
            return super()._read(kind, index)

    Stopped(api, [GONE], deletes=[{"success": True}])
    ledger = Ledger()
    with FreezeWatch(fake_clock) as freeze:
        time.sleep(2 * FreezeWatch.TICK_S)  # the watch has looked before the stop
        report = _teardown(client, fake_clock, ledger, created_mono=fake_clock() - 60,
                           freeze=freeze if watched else None)
    if not watched:
        assert report.verdict == "unknown"
        return
    assert report.verdict == "gone" and report.deletes[0].outcome == "deleted"
    assert ledger.lines[-1][1]["verdict"] == "gone"
    assert report.proof is not None
    if stopped_in == "proof":  # deleted again; the cut proof's round stays on record before the two that proved it
        assert len(report.deletes) == 2 and len(report.proof.rounds) >= 3


def test_a_delete_that_never_answers_is_not_acknowledged_and_the_proof_still_runs(api, client, fake_clock) -> None:
    """The DELETE's retries are bounded by the teardown's deadline; an unacknowledged DELETE writes no
    delete_ack line; the reads still decide the verdict, and its line is written."""
    script = Script(api, [GONE], deletes=[(503, {"error": "busy"})])
    ledger = Ledger()
    deadline = fake_clock() + 20.0
    report = _teardown(client, fake_clock, ledger, budget_s=20.0, created_mono=fake_clock() - 60)
    assert script.delete_calls > 1 and fake_clock() <= deadline + 1e-6
    assert len(report.deletes) == 1 and not report.deletes[0].acknowledged
    assert ledger.events() == ["absence"] and report.verdict == "gone"
