"""The commands that act on the account and may spend or delete: `reap` deletes and proves absent what dead
runs left billing; `canary` rents one cheap instance to measure what the harness assumes about Vast.

Both go through the run's own guards (the ledger, the teardown and its absence proof), never a second
lifecycle. Everything that only reads lives in `views`.
"""
