"""Benchmark the simulator: start-up, search latency over 5,000 offers, SSH round trip (< 30 s)."""

from vast_harness.sim.bench import main

if __name__ == "__main__":
    main()
