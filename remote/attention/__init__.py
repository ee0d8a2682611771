"""Causal attention for the model, through whichever path is fastest here and runs correctly.

`backend.py` probes the candidates once per device and head layout and pins the first that works (an input
none accepts stops the run, unless the slow math path is asked for); `python -m remote.attention.backend
--qualify` records which paths repeat bit for bit. Besides PyTorch's SDPA backends there are two custom
paths, each a pair of custom ops opaque to torch.compile: `fa4.py` (FlashAttention-4, fast and deterministic
on Hopper and Blackwell) and `cudnn_sdpa.py` (cuDNN's graph API with its deterministic backward, which
PyTorch's SDPA never asks for).
"""
