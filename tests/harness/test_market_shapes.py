"""The market's shapes and states its sources disagree on (issue 33), on the harness's side: the per-id read
in either shape (an object, a one-element list), ports from the v1 list when the per-id read has none, `error`
as terminal, Scheduling as the docs spell it, Vast's own failure patterns. Guarded runs are judged by the
simulator's record."""

from __future__ import annotations

import time

import httpx
import pytest
import respx

from tests.harness.test_client import INSTANCE_ROW
from tests.harness.test_market_behaviours import OK, execute, guarded, of_run
from tests.harness.test_runner import KEY, SCALE, make_spec
from vast_harness.errors import ApiStatusError
from vast_harness.instance.absence import _per_id_verdict
from vast_harness.instance.lifecycle import with_list_ports
from vast_harness.spec.profile import Step
from vast_harness.vast.client import RawExchange, VastClient
from vast_harness.vast.models import Instance

SIM_OPTIONS = dict(seed=7, rate_scale=SCALE, boot_seconds=0.1, num_offers=200)  # conftest.sim
pytestmark = pytest.mark.usefixtures("clean_sim")


# ------------------------------------------------------------------------------ the per-id read's shapes


def test_a_one_element_list_is_the_instance_and_an_empty_list_is_not_found(vast_api: respx.MockRouter,
                                                                           client: VastClient) -> None:
    route = vast_api.get("/api/v0/instances/7835610/")
    route.side_effect = [httpx.Response(200, json={"instances": [INSTANCE_ROW]}),
                         httpx.Response(200, json={"instances": []}),
                         httpx.Response(200, json={"instances": INSTANCE_ROW})]
    inst = client.get_instance(7835610)
    assert inst is not None and inst.direct_ssh == ("63.135.50.11", 41022)
    assert client.get_instance(7835610) is None
    assert client.get_instance(7835610) is not None
    assert client.read_shapes == {"list": 1, "empty_list": 1, "object": 1}


@pytest.mark.parametrize("rows", [[INSTANCE_ROW, INSTANCE_ROW], [dict(INSTANCE_ROW, id=5)], ["x"]],
                         ids=["two-rows", "another-id", "not-an-object"])
def test_a_list_that_is_not_this_one_instance_is_unreadable(vast_api: respx.MockRouter, client: VastClient,
                                                            rows: list) -> None:
    vast_api.get("/api/v0/instances/7835610/").mock(return_value=httpx.Response(200, json={"instances": rows}))
    with pytest.raises(ApiStatusError, match="invalid_response"):
        client.get_instance(7835610)


def _x(body: object) -> RawExchange:
    return RawExchange("GET", "/api/v0/instances/9/", {}, 200, "", body, None, 0.0, 0.0)


def test_the_proof_reads_both_shapes_and_never_calls_an_odd_list_gone() -> None:
    assert _per_id_verdict(_x({"instances": [{"id": 9, "actual_status": "running"}]}), 9) == "present"
    assert _per_id_verdict(_x({"instances": [{"id": 9, "intended_status": "destroyed"}]}), 9) == "going"
    assert _per_id_verdict(_x({"instances": []}), 9) == "gone"
    assert _per_id_verdict(_x({"instances": None}), 9) == "gone"
    assert _per_id_verdict(_x({"instances": [{"id": 8}]}), 9) == "unknown"
    assert _per_id_verdict(_x({"instances": [{"id": 9}, {"id": 9}]}), 9) == "unknown"


def test_ports_come_from_the_v1_list_when_the_per_id_read_has_none(sim) -> None:
    sim.set_faults("show_list;show_no_ports")
    with VastClient(KEY, base_url=sim.url, pacing_scale=SCALE) as client:
        offer = client.search_offers({"limit": 1})[0]
        iid = client.create_instance(offer.id, {"image": "x", "disk": 10, "label": "t-ports"}).new_contract
        try:
            deadline = time.monotonic() + 5
            while (inst := client.get_instance(iid)) is None or inst.actual_status != "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert inst.ports is None and inst.direct_ssh is None
            assert client.read_shapes.get("list")
            filled = with_list_ports(client, inst, within_s=5)
            assert filled.direct_ssh is not None and filled.direct_ssh[1] == next(
                i for i in sim.state()["instances"] if i["id"] == iid)["direct_port"]
        finally:
            client.destroy_instance(iid)


def test_a_run_against_the_list_shape_without_ports_passes_and_leaves_nothing(sim, tmp_path) -> None:
    sim.set_faults("show_list;show_no_ports")
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    result = execute(r)
    assert result.exit_code == 0, result.message
    assert r.teardowns[0].verdict == "gone" and not [i for i in of_run(sim, r) if i["live"]]
    assert r.tools.client.read_shapes.get("list")


# ------------------------------------------------------------------------------------------- states


@pytest.mark.parametrize(("row", "failed"), [
    ({"actual_status": "error"}, True),
    ({"actual_status": "stopped", "intended_status": "running"}, False),  # Scheduling, as the docs spell it
    ({"actual_status": "stopped", "intended_status": "stopped"}, True),
    ({"actual_status": "stopped"}, True),
    ({"actual_status": "loading", "status_msg": "unauthorized: authentication required"}, True),
    ({"actual_status": "loading", "status_msg": "no space left on device"}, True),
    ({"actual_status": "loading", "status_msg": "manifest unknown"}, True),
    ({"actual_status": "loading", "status_msg": "unexpected EOF"}, True),
    ({"actual_status": "loading", "status_msg": "Pulling image x"}, False),
], ids=lambda v: str(v) if isinstance(v, bool) else "-".join(str(x) for x in v.values()))
def test_failed_states_and_vasts_own_failure_patterns(row: dict, failed: bool) -> None:
    assert (Instance.model_validate({"id": 1, **row}).failed_reason is not None) == failed


def test_an_error_status_fails_fast_and_the_next_offer_runs(sim, tmp_path) -> None:
    sim.set_faults("error_status:1")
    r = guarded(sim, make_spec(sim, tmp_path, OK, boot_retries=1, profile={"boot_timeout_s": 30.0}))
    t0 = time.monotonic()
    result = execute(r)
    assert result.exit_code == 0, result.message
    assert time.monotonic() - t0 < 25  # not the boot deadline
    insts = of_run(sim, r)
    assert len(insts) == 2 and not [i for i in insts if i["live"]]
    assert [t.verdict for t in r.teardowns] == ["gone", "gone"]


@pytest.mark.slow  # the teardown's whole budget of DELETEs that delete nothing
def test_a_delete_that_deletes_nothing_ends_no_bill(sim, tmp_path) -> None:
    """Red team: every DELETE answers 200 "success" and deletes nothing; the run rightly exits 3, but its meter
    had stopped at the first answer, reporting a fourteenth of the bill. Unproven, it bills to the end."""
    sim.set_faults("delete_noop:*")
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    result = execute(r)
    assert result.exit_code == 3, result.message
    billed = sum(i["billed_usd"] for i in of_run(sim, r))
    assert r.tools.meter.accrued_usd() >= 0.95 * billed, (r.tools.meter.accrued_usd(), billed)


# ------------------------------------------------------------------------------------------ bandwidth


@pytest.mark.parametrize(("up", "down"), [(0.01, 0.05), (0.05, 0.01)], ids=["down-dearer", "up-dearer"])
def test_both_directions_are_quoted_at_the_higher_rate_whichever_it_is(up: float, down: float) -> None:
    from vast_harness.market.quote import quote_offer, worst_case_usd
    from vast_harness.vast.models import Offer

    offer = Offer.model_validate({"id": 1, "dph_base": 1.0, "storage_cost": 0.0, "inet_up_cost": up,
                                  "inet_down_cost": down})
    q = quote_offer(offer, max_minutes=60, disk_gb=10, upload_bytes=10**9, download_bytes=2 * 10**9)
    assert (q.upload_usd, q.download_usd) == (pytest.approx(0.05), pytest.approx(0.10))
    assert worst_case_usd(offer, max_minutes=60, disk_gb=10, upload_bytes=10**9,
                          download_bytes=2 * 10**9) == pytest.approx(q.worst_case_usd)


# ------------------------------------------------------------------------------------- the run's key


def test_the_run_key_is_attached_through_the_api_beside_the_onstart_line(sim, tmp_path) -> None:
    # Vast refreshes the instance's authorized keys (skypilot PR 10730): the attached key is in the set Vast keeps
    # (tests/sim/test_market_shapes.py shows it letting a new connection in after the reset, the onstart's not).
    sim.set_faults("key_reset:0.2")
    step = [Step(name="wait", run="sleep 1", timeout_s=20)]
    r = guarded(sim, make_spec(sim, tmp_path, step))
    result = execute(r)
    assert result.exit_code == 0, result.message
    inst = r.created[0]
    assert inst.key_attached is True and inst.key_attach_detail == ""
    backend_inst = sim.backend.instances[inst.instance_id]
    assert backend_inst.keys_reset  # the reset fired while the run was up; the run still passed
    assert [k["key"] for k in backend_inst.ssh_keys] == [r.state.key.public_openssh.strip()]
    assert not [i for i in of_run(sim, r) if i["live"]]


def test_an_attach_that_fails_is_said_and_recorded_never_fatal(sim, tmp_path) -> None:
    sim.set_faults("5xx:ssh:*:503")
    r = guarded(sim, make_spec(sim, tmp_path, OK))
    r.tools.client._max_retry_s = 0.5  # a short retry bound: the attach gives up fast
    result = execute(r)
    assert result.exit_code == 0, result.message
    assert r.created[0].key_attached is False and "503" in r.created[0].key_attach_detail
    assert not [i for i in of_run(sim, r) if i["live"]]
