"""The vast_harness control plane."""
