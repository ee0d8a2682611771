"""Kept hosts: `vast-e2e up NAME` rents a host and keeps it; `exec`, `keep`, `ssh` and `down` work on it later,
each a process of its own, under the hold's one pair of caps, with the host's dead-man switch as the autostop
(docs/kept-host.md). The commands' stages are `run/hold.py`'s; the record is `state/held.py`'s."""
