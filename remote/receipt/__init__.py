"""The receipt: what the rented GPUs actually deliver, measured on the host before any of the user's work.

A host can match its offer by name, count, memory and driver and still be slow: a power- or thermally-throttled
GPU, a PCIe link trained at half its width, slow HBM, uncorrectable ECC errors. `python -m remote.receipt`
measures each GPU in steady state (dense bf16 matmul, HBM copy, pinned host<->device copies with the link read
under load, a sustained burn with the SM clock and the active clock-event reasons, the ECC and row-remap
counters), and with several GPUs the spread between them, P2P copies and an all-reduce. It writes one JSON
record; the control plane compares it with the offer and a sourced reference table and decides (the harness
never trusts the host's verdict, only its measurements). Standard library and PyTorch only, like all of remote/.
"""
