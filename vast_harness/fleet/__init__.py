"""`vast-e2e fleet`: one guarded run per GPU type, under one total dollar cap.

`plan` is its preflight (the offer each run would pick, and whether all of them fit the caps before anything is
rented); `run` is the orchestration: the workers, one `GuardedRun` each, and the monitor that holds the total cap
and the signals.
"""
