"""The user's durable state, one directory per user: the write-ahead ledger of every create and its
outcome, the registrations that say which runs are alive, which process a run is, and where each run's evidence
went.

It outlives the process, so `reap`, `status` or `costs`, from another terminal or after a `kill -9`, find what
a run left.
"""
