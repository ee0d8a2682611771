"""Benchmark the simulator: start-up time, search latency over 5,000 offers, SSH round trip.

    uv run python scripts/bench/bench_sim.py   (or: python -m vast_harness.sim.bench) [--offers 5000] [--rounds 20]

Targets: start-up < 1 s (default market), search < 100 ms over 5,000 offers, a trivial SSH command in
tens of milliseconds. Runs in well under 30 s.
"""

from __future__ import annotations

import argparse
import statistics
import time

import httpx
import paramiko

from vast_harness.sim import SimServer


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def bench_startup(rounds: int) -> list[float]:
    times = []
    for seed in range(rounds):
        started = time.perf_counter()
        sim = SimServer(seed=seed).start()
        httpx.get(f"{sim.url}/_sim/state", timeout=5).raise_for_status()  # ready means answering
        times.append(time.perf_counter() - started)
        sim.stop()
    return times


def bench_search(api: httpx.Client, rounds: int, limit: int) -> list[float]:
    body = {"gpu_name": {"in": ["RTX 4090", "H100 SXM"]}, "num_gpus": {"gte": 1}, "cuda_max_good": {"gte": 12.4},
            "reliability2": {"gte": 0.95}, "direct_port_count": {"gte": 1}, "order": [["dph_total", "asc"]],
            "allocated_storage": 50, "limit": limit}
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        api.post("/api/v0/bundles/", json=body).raise_for_status()
        times.append(time.perf_counter() - started)
    return times


def bench_ssh(api: httpx.Client, rounds: int) -> tuple[float, list[float]]:
    key = paramiko.ECDSAKey.generate()
    api.post("/api/v0/ssh/", json={"ssh_key": f"{key.get_name()} {key.get_base64()} bench"}).raise_for_status()
    offer = api.post("/api/v0/bundles/", json={"limit": 1}).json()["offers"][0]
    instance_id = api.put(f"/api/v0/asks/{offer['id']}/", json={"image": "bench", "disk": 10}).json()["new_contract"]
    instance = api.get(f"/api/v0/instances/{instance_id}/").json()["instances"]
    port = int(instance["ports"]["22/tcp"][0]["HostPort"])
    started = time.perf_counter()
    client = paramiko.SSHClient()
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
    client.connect("127.0.0.1", port=port, username="root", pkey=key, look_for_keys=False, allow_agent=False)
    connect_s = time.perf_counter() - started
    times = []
    try:
        for _ in range(rounds):
            started = time.perf_counter()
            _, out, _ = client.exec_command("true")
            out.channel.recv_exit_status()
            times.append(time.perf_counter() - started)
    finally:
        client.close()
        api.delete(f"/api/v0/instances/{instance_id}/")
    return connect_s, times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    startup = bench_startup(5)
    print(f"start-up (300 offers, until the API answers): median {_ms(statistics.median(startup))}, "
          f"max {_ms(max(startup))}  [target < 1000 ms]")
    started = time.perf_counter()
    with SimServer(seed=1, num_offers=args.offers, rate_scale=0) as sim, \
            httpx.Client(base_url=sim.url, headers={"Authorization": "Bearer bench"}) as api:
        print(f"start-up ({args.offers} offers): {_ms(time.perf_counter() - started)}")
        for limit in (64, 1000):
            times = bench_search(api, args.rounds, limit)
            print(f"search over {args.offers} offers, limit {limit}: median {_ms(statistics.median(times))}, "
                  f"p95 {_ms(sorted(times)[int(0.95 * (len(times) - 1))])}  [target < 100 ms]")
        connect_s, times = bench_ssh(api, args.rounds)
        print(f"ssh connect + auth: {_ms(connect_s)}; exec 'true' round trip: median "
              f"{_ms(statistics.median(times))}, max {_ms(max(times))}")
        leaked = [i["id"] for i in sim.state()["instances"] if i["live"]]
        print(f"instances left live: {leaked or 'none'}")


if __name__ == "__main__":
    main()
