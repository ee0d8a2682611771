"""Offer filtering, driver qualification, ranking and the worst-case quote: pure functions, exact arithmetic."""

from __future__ import annotations

import pytest

from vast_harness.market.offers import OfferCriteria, build_query, check_offer, choose, search_ranked
from vast_harness.market.quote import quote_offer
from vast_harness.spec.profile import DriverPolicy, Filters, QualifiedDriver
from vast_harness.vast.models import Offer

DRIVERS = DriverPolicy(
    drivers=[
        QualifiedDriver(branch=570, min_version="570.86.15"),
        QualifiedDriver(branch=580, min_version="580.65.06"),
    ]
)


def offer(**kw) -> Offer:
    base = dict(
        id=1,
        machine_id=10,
        gpu_name="H100 SXM",
        num_gpus=2,
        cuda_max_good=12.8,
        driver_version="570.133.07",
        pcie_bw=25.0,
        dph_base=4.0,
        dph_total=4.01,
        storage_cost=0.144,
        inet_up_cost=0.01,
        inet_down_cost=0.02,
        reliability2=0.995,
        verified=True,
        rentable=True,
        rented=False,
        direct_port_count=10,
        disk_space=200.0,
        duration=86400.0 * 7,
        inet_down=900.0,
        geolocation=" Texas, US ",
    )
    base.update(kw)
    return Offer.model_validate(base)


def criteria(**kw) -> OfferCriteria:
    base = dict(
        filters=Filters(num_gpus=2, min_pcie_bw_gbps=20, min_reliability=0.98),
        image_cuda=12.8,
        disk_gb=60,
        min_duration_s=3000,
        max_minutes=50,
        max_usd=10.0,
        credit_usd=100.0,
        upload_bytes=10**8,
        download_bytes=2 * 10**7,
    )
    base.update(kw)
    return OfferCriteria(**base)


def test_quote_arithmetic_is_exact():
    q = quote_offer(offer(), max_minutes=50, disk_gb=60, upload_bytes=10**8, download_bytes=2 * 10**7)
    dph = 4.0 + 60 * 0.144 / 720  # storage_cost is $/GB/month
    assert q.dph_at_disk_usd == pytest.approx(dph)
    assert q.compute_usd == pytest.approx(50 / 60 * dph)
    # both directions at the higher of inet_up_cost (0.01) and inet_down_cost (0.02): whose "up" is unsourced
    assert q.upload_usd == pytest.approx(0.1 * 0.02)
    assert q.download_usd == pytest.approx(0.02 * 0.02)
    assert q.worst_case_usd == pytest.approx(50 / 60 * dph + 0.002 + 0.0004)
    assert "worst case $" in q.arithmetic


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"num_gpus": 1}, "num_gpus"),
        ({"pcie_bw": 12.0}, "pcie_bw"),
        ({"cuda_max_good": 12.4}, "cuda_max_good"),
        ({"reliability2": 0.9}, "reliability"),
        ({"direct_port_count": 0}, "direct ports"),
        ({"disk_space": 20.0}, "disk"),
        ({"duration": 600.0}, "duration"),
        ({"verified": False}, "not verified"),
        ({"rented": True}, "not rentable"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_client_side_recheck_names_each_failed_filter(change, reason):
    reasons = check_offer(offer(**change), criteria())
    assert any(reason in r for r in reasons), reasons


def test_gpu_name_filter_when_given():
    c = criteria(filters=Filters(num_gpus=2, gpu_names=["H200"]))
    assert any("gpu" in r for r in check_offer(offer(), c))


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("570.133.07", True),
        ("570.86.15", True),
        ("570.86.10", False),
        ("580.159.03", True),
        ("550.127.05", False),
        ("", False),
        (None, False),
        ("garbage", False),
    ],
)
def test_driver_qualification(version, ok):
    assert DRIVERS.qualifies(version) is ok


def test_unqualified_driver_rejected_unless_any_driver():
    o = offer(driver_version="535.104.05")
    assert choose([o], criteria(), DRIVERS).ranked == []
    widened = choose([o], criteria(any_driver=True), DRIVERS)
    assert widened.ranked[0].driver_qualified is False


def test_ranking_by_worst_case_then_reliability():
    cheap = offer(id=1, dph_base=3.0, reliability2=0.981)
    same_price_more_reliable = offer(id=2, dph_base=3.0, reliability2=0.999)
    dear = offer(id=3, dph_base=5.0)
    choice = choose([dear, cheap, same_price_more_reliable], criteria(), DRIVERS)
    assert [c.offer.id for c in choice.ranked] == [2, 1, 3]


def test_cap_and_credit_reject_with_reasons():
    choice = choose([offer()], criteria(max_usd=1.0), DRIVERS)
    assert not choice.ranked
    assert any("--max-usd" in r for r in choice.rejected[0].reasons)
    choice = choose([offer()], criteria(credit_usd=0.5), DRIVERS)
    assert any("credit" in r for r in choice.rejected[0].reasons)


def test_an_unverified_profile_omits_verified_as_the_cli_does_for_verified_any():
    # vast-cli parse_query: `verified=any` deletes the field; `verified=False` would send {"eq": false}, i.e.
    # unverified machines only, which is not what a profile with verified = false means
    assert "verified" not in build_query(criteria(filters=Filters(verified=False)))
    assert build_query(criteria())["verified"] == {"eq": True}


def test_query_carries_every_filter_and_excludes_seen_ids():
    q = build_query(
        criteria(filters=Filters(num_gpus=2, gpu_names=["H200"], min_pcie_bw_gbps=20)), exclude_ids=[5, 3]
    )
    assert q["num_gpus"] == {"eq": 2}
    assert q["cuda_max_good"] == {"gte": 12.8}
    assert q["pcie_bw"] == {"gte": 20}
    assert q["gpu_name"] == {"in": ["H200"]}
    assert q["duration"] == {"gte": 3000}
    assert q["id"] == {"notin": [3, 5]}
    assert q["allocated_storage"] == 60
    assert q["verified"] == {"eq": True} and q["rentable"] == {"eq": True} and q["rented"] == {"eq": False}


def test_paging_excludes_seen_and_stops_at_eight_pages():
    calls = []

    def search(query):
        calls.append(query)
        start = len(calls) * 100
        # every offer fails the driver check, so paging continues to the bound
        return [offer(id=start + i, driver_version="535.1.1") for i in range(64)]

    choice = search_ranked(search, criteria(), DRIVERS)
    assert len(calls) == 8 and choice.pages == 8
    assert len(calls[-1]["id"]["notin"]) == 7 * 64
    assert choice.offers_seen == 8 * 64


def test_paging_stops_on_short_page():
    calls = []

    def search(query):
        calls.append(query)
        return [offer(id=1)]

    choice = search_ranked(search, criteria(), DRIVERS)
    assert len(calls) == 1 and len(choice.ranked) == 1


def test_models_absorb_vast_quirks():
    from vast_harness.vast.models import Instance

    inst = Instance.model_validate(
        {
            "id": 7,
            "public_ipaddr": "63.1.2.3\n",
            "actual_status": "running",
            "ports": {"22/tcp": [{"HostIp": "0.0.0.0", "HostPort": "41022"}], "8080/tcp": None},
            "ssh_host": "ssh2.vast.ai",
            "ssh_port": 10882,
            "image_runtype": "jupyter",
        }
    )
    assert inst.direct_ssh == ("63.1.2.3", 41022)
    assert inst.proxy_ssh == ("ssh2.vast.ai", 10883)  # +1 for jupyter images (vast-cli ssh-url)
    assert inst.is_ready
    assert Instance.model_validate({"id": 8, "actual_status": "exited"}).failed_reason
    assert Instance.model_validate({"id": 9, "status_msg": "Error: OCI runtime create failed"}).failed_reason
    assert Instance.model_validate({"id": 9, "status_msg": "success, running"}).failed_reason is None
    assert offer(geolocation=" Texas, US ").geolocation == "Texas, US"


BAD_NUMBERS = [float("nan"), float("inf"), float("-inf"), -1.0, 0.0]


@pytest.mark.parametrize("field", ["dph_total", "dph_base"])
@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
def test_non_finite_or_non_positive_price_is_rejected_with_a_reason(field, value):
    # A search answer with NaN in the price was rented at "$nan/h": every comparison with NaN is false.
    bad = offer(id=7, **{field: value})
    choice = choose([bad, offer(id=8)], criteria(), DRIVERS)
    assert [c.offer.id for c in choice.ranked] == [8]
    (rej,) = choice.rejected
    assert rej.offer.id == 7 and any(field in r and "price" in r for r in rej.reasons), rej.reasons


@pytest.mark.parametrize("field", ["storage_cost", "inet_up_cost", "inet_down_cost"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -0.5], ids=repr)
def test_non_finite_or_negative_cost_terms_are_rejected(field, value):
    choice = choose([offer(id=7, **{field: value})], criteria(), DRIVERS)
    assert not choice.ranked
    assert any(field in r for r in choice.rejected[0].reasons), choice.rejected[0].reasons


def test_nan_price_from_json_never_ranks_first():
    # Python's json (and so httpx) reads the bare NaN literal a broken server may send.
    import json

    rows = json.loads('[{"id": 1, "dph_base": NaN, "dph_total": NaN}, {"id": 2, "dph_base": Infinity}]')
    offers = [offer(**row) for row in rows] + [offer(id=3)]
    choice = choose(offers, criteria(), DRIVERS)
    assert [c.offer.id for c in choice.ranked] == [3]
    assert all(r.worst_case_usd is None or r.worst_case_usd == r.worst_case_usd for r in choice.rejected)


@pytest.mark.parametrize("field", ["reliability2", "reliability", "pcie_bw", "cuda_max_good", "disk_space",
                                   "duration", "inet_down", "gpu_ram"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=repr)
def test_a_non_finite_filtered_field_is_rejected_with_its_reason(field, value):
    # reliability2 NaN passed min_reliability 0.95: every comparison with NaN is false
    choice = choose([offer(id=7, **{field: value}), offer(id=8)], criteria(), DRIVERS)
    assert [c.offer.id for c in choice.ranked] == [8]
    assert any(field in r and "finite" in r for r in choice.rejected[0].reasons), choice.rejected[0].reasons
