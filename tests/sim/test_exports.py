"""The package's public surface is exactly `__all__` (httpx's test_exported_members, in small)."""

from vast_harness import sim


def test_exported_members() -> None:
    public = {name for name in dir(sim) if not name.startswith("_")} - {
        "faults", "server", "backend", "market", "routes", "errors", "instances", "ratelimit", "sandbox",
        "sftp", "sshhost", "transitions", "cli", "bench", "calibrate", "gpus", "host_receipt", "hostpython", "copyd", "sshserve"}
    assert public == set(sim.__all__)
    assert callable(sim.SimServer) and sim.FaultPlan.parse("429:search").rules[0].count == 1
