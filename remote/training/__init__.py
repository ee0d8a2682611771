"""One training round of the 1B decoder, as `scripts/run_mfu_dist.py` runs it, and the record it leaves.

`train.py` reads top to bottom (profile, determinism, process group, attention probe, model, data
parallelism, timed steps, Merkle root, MFU record); the other modules are its parts, one job each:
`profiles.py` (model/training profiles to typed configs), `model.py` (the decoder; no distributed code),
`parallel.py` (DDP and the zero2 reductions, applied in one fixed order), `data.py` (seeded synthetic
batches), `determinism.py` (every switch bitwise replay needs), `comm.py` (metadata collectives without
numpy) and `evidence.py` (the MFU record that `remote.checks.mfu` validates).
"""
