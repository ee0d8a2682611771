"""Command line of the standalone simulator (argparse: the simulator adds no dependencies)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from typing import Any

from vast_harness.sim import calibrate
from vast_harness.sim import faults as faults_module
from vast_harness.sim.backend import DEFAULT_LINGER_S, SHOW_SHAPES
from vast_harness.sim.faults import FaultPlan, FaultSpecError
from vast_harness.sim.hostpython import describe
from vast_harness.sim.server import SimServer


def build_parser() -> argparse.ArgumentParser:
    grammar = (faults_module.__doc__ or "").split("SPEC grammar", 1)[-1]
    parser = argparse.ArgumentParser(
        prog="python -m vast_harness.sim", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="A simulated Vast.ai marketplace on 127.0.0.1: HTTP API, SSH hosts, billing, faults.",
        epilog="GET /_sim/state shows every instance and the call log; PUT /_sim/faults replaces the plan."
               "\n\nFault SPEC grammar" + grammar)
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0 picks a free one)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the one RNG (market, ids, faults)")
    parser.add_argument("--faults", default=None, metavar="SPEC", help="fault plan, grammar below")
    parser.add_argument("--boot-seconds", type=float, default=None,
                        help="seconds from create to running (null, then loading, then running)")
    parser.add_argument("--api-key", action="append", dest="api_keys", metavar="KEY",
                        help="an accepted key (repeatable); without it any non-empty key is its own account")
    parser.add_argument("--offers", type=int, default=300, help="market size")
    parser.add_argument("--credit-usd", type=float, default=100.0, help="starting credit per account")
    parser.add_argument("--rate-scale", type=float, default=1.0,
                        help="multiplies every rate-limit interval and window; 0 disables limits")
    parser.add_argument("--linger-seconds", type=float, default=None,
                        help=f"seconds a destroyed instance stays readable as a destroyed/unloaded row "
                             f"(default {DEFAULT_LINGER_S:g})")
    parser.add_argument("--show-shape", choices=SHOW_SHAPES, default="object",
                        help="the per-id read: object (with ports: the docs, dstack) or list (without ports: "
                             "Vast's own QA tool)")
    parser.add_argument("--card-saved", action="store_true",
                        help="the account has a card on file: a negative balance stops instances, never destroys")
    parser.add_argument("--key-reset-seconds", type=float, default=None, metavar="S",
                        help="S after running, every host's authorized keys are refreshed: keys onstart appended "
                             "stop working, attached ones keep working (Vast: 9-18 h in)")
    parser.add_argument("--copy-bytes-per-s", type=float, default=None, metavar="B",
                        help="the copy off a stopped instance's rate (default: unthrottled)")
    parser.add_argument("--calibrate", default=None, metavar="CANARY_JSON",
                        help="boot time, read lag, linger and the copy's rate from `vast-e2e canary`'s canary.json "
                             "(flags win)")
    parser.add_argument("--host-root", default=None, help="where host sandboxes live (default a temp dir)")
    parser.add_argument("--exit-when-empty", type=float, default=None, metavar="S",
                        help="stop once an instance was created, and for S seconds none has been live and no "
                             "call came (a kept host's simulator: its last host is gone, no command runs)")
    parser.add_argument("--max-lifetime", type=float, default=None, metavar="S",
                        help="stop S seconds after starting, whatever is live (hosts' processes end with it)")
    parser.add_argument("--host-network", action="store_true",
                        help="let the hosts' pip download (off by default: pip installs from local files only)")
    return parser


def server_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """SimServer's arguments from the flags, with `--calibrate`'s measurements where no flag was given.
    Raises FaultSpecError / CalibrationError for bad input."""
    cal = calibrate.load(args.calibrate) if args.calibrate else None
    items = [args.faults] if args.faults else []
    if cal is not None:
        items += cal.fault_items()
    boot = args.boot_seconds if args.boot_seconds is not None else (cal.boot_seconds if cal else None)
    linger = args.linger_seconds if args.linger_seconds is not None else (cal.linger_seconds if cal else None)
    copy_rate = args.copy_bytes_per_s if args.copy_bytes_per_s is not None else (cal.copy_bytes_per_s if cal else None)
    spec = ";".join(items)
    return {"seed": args.seed, "boot_seconds": boot or 0.0, "faults": FaultPlan.parse(spec) if spec else None,
            "num_offers": args.offers, "rate_scale": args.rate_scale, "api_keys": args.api_keys,
            "credit_usd": args.credit_usd, "host_root": args.host_root, "port": args.port,
            "linger_seconds": DEFAULT_LINGER_S if linger is None else linger,
            "show_shape": args.show_shape, "card_saved": args.card_saved, "key_reset_s": args.key_reset_seconds,
            "host_network": args.host_network, "copy_bytes_per_s": copy_rate,
            "calibration": cal.describe() if cal else None}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        kwargs = server_kwargs(args)
    except FaultSpecError as exc:
        print(f"error: --faults: {exc}", file=sys.stderr)
        return 2
    except calibrate.CalibrationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not args.rate_scale >= 0 or args.offers < 1 or not 0 <= kwargs["linger_seconds"] < float("inf"):
        print("error: --rate-scale and --linger-seconds must be >= 0 (finite) and --offers >= 1", file=sys.stderr)
        return 2
    calibration = kwargs.pop("calibration")
    sim = SimServer(**kwargs)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    sim.start()
    if calibration:
        print(calibration, flush=True)
    print(f"vast sim listening on {sim.url}", flush=True)
    print(f"hosts: {describe(network=args.host_network)}", flush=True)
    try:
        _serve(sim, stop, exit_when_empty_s=args.exit_when_empty, max_lifetime_s=args.max_lifetime)
    finally:
        sim.stop()
    return 0


def _serve(sim: SimServer, stop: threading.Event, *, exit_when_empty_s: float | None,
           max_lifetime_s: float | None) -> None:
    """Until a signal, or `--exit-when-empty` / `--max-lifetime` says the simulator has served its purpose."""
    started = time.monotonic()
    empty_since: float | None = None
    while not stop.wait(0.5):
        now = time.monotonic()
        if max_lifetime_s is not None and now - started >= max_lifetime_s:
            print(f"vast sim: stopping after its --max-lifetime of {max_lifetime_s:g} s", flush=True)
            return
        if exit_when_empty_s is None:
            continue
        created, live, last_call = sim.backend.live_count()
        quiet = last_call is None or time.time() - last_call >= exit_when_empty_s
        empty_since = (empty_since or now) if created and not live else None
        if empty_since is not None and now - empty_since >= exit_when_empty_s and quiet:
            print(f"vast sim: stopping, no instance live for {exit_when_empty_s:g} s (--exit-when-empty)", flush=True)
            return
