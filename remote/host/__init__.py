"""The machine the workload landed on, as the harness profiles' first steps see it.

`envprobe.py` (`python3 -m remote.host.envprobe`): GPUs, driver, package versions and the image check, with
the standard library and nvidia-smi only, so it reports even where PyTorch is broken. `paths.py`: where the
data is (`profiles/` always sits beside `remote/`, in a checkout, the unpacked bundle and the wheel alike).
`plan.py` (`python3 -m remote.host.plan`): the proofs profile's pytest node ids and the rule that a skipped
GPU test fails. `fit.py` (`python3 -m remote.host.fit`): how each 1B run fits this GPU, from the harness's
`HT_FIT` and nvidia-smi's memory (as asked, checkpointed, or not at all).
"""
