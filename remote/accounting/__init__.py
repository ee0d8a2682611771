"""How a run's numbers are counted, so that a figure can be re-derived rather than trusted.

`mfu.py`: MFU from tokens/s, FLOPs per token and the GPU's dense bf16 peak (sourced rows of `peaks.json`; an
unknown GPU is refused, never guessed). `merkle.py`: the sha256 root over every parameter and optimizer
tensor, which makes "the replay gave the same bits" checkable. `steptrace.py`: a profiler trace split by step,
to see where a slow step lost its time.
"""
