"""The onstart script: within Vast's limit, installs the run key, and its dead-man switch really deletes the
instance (with CONTAINER_API_KEY, never the account key) when the harness is gone."""

from __future__ import annotations

import time

import pytest

from vast_harness.client import VastClient
from vast_harness.lifecycle import is_lingering
from vast_harness.errors import ConfigError
from vast_harness.onstart import ONSTART_LIMIT_CHARS, build_onstart
from vast_harness.sim import SimServer

PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOf5m0example vh-run"


def test_onstart_fits_vasts_limit_and_carries_no_account_key():
    script = build_onstart(public_key=PUB, api_url="https://console.vast.ai", deadman_after_s=3600 + 600)
    assert len(script) < ONSTART_LIMIT_CHARS
    assert "no_auto_tmux" in script and "authorized_keys" in script and "CONTAINER_API_KEY" in script
    assert "sleep 4200" in script
    assert "VAST_API_KEY" not in script


def test_a_huge_key_is_refused_not_truncated():
    with pytest.raises(ConfigError, match="4096"):
        build_onstart(public_key="ssh-ed25519 " + "A" * 5000, api_url="https://x", deadman_after_s=10)


def test_dead_man_switch_deletes_its_own_instance():
    with SimServer(seed=2, rate_scale=0.0, boot_seconds=0.05) as sim, \
            VastClient("account-key-abc", base_url=sim.url, pacing_scale=0) as client:
        offer = client.search_offers({"num_gpus": {"eq": 1}, "limit": 1})[0]
        script = build_onstart(public_key=PUB, api_url=sim.url, deadman_after_s=1)
        created = client.create_instance(offer.id, {"client_id": "me", "image": "x@sha256:" + "0" * 64,
                                                    "disk": 10, "label": "vh-deadman-test", "onstart": script})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            inst = next(i for i in sim.state()["instances"] if i["id"] == created.new_contract)
            if not inst["live"]:
                break
            time.sleep(0.2)
        assert not inst["live"], "the dead-man switch did not delete the instance"
        deletes = [c for c in sim.state()["calls"] if c["method"] == "DELETE"]
        assert deletes and deletes[-1]["status"] == 200  # the host's own DELETE, not the harness's
        row = client.get_instance(created.new_contract)
        assert row is None or is_lingering(row)  # Vast shows a destroyed row for a while
