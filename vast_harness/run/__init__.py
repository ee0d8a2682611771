"""One guarded run, from plan to verdict: `runner.GuardedRun` reads top to bottom through its stages
(preflight and rent, the work on the host, teardown), keeps what it has sent, rented and proven gone in one
book, turns every read of its instance into facts, and decides the exit code once teardown is over.

Every command that rents goes through it (`vast-e2e run`, each run of a fleet, the canary), so the caps, the
ledger, the signals and the absence proof are never written twice.
"""
