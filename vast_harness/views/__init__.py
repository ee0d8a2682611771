"""The read-only commands: views of the account (`status`, `check`) and of the evidence a run left (`costs`,
`logs` and following a live run's, `report`). None creates or deletes an instance.

`orphans` is the judgement `status` shows and `reap` (in `actions`) acts on, so the two always agree; nothing
here imports the runner.
"""
