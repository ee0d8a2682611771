"""Everything decided before money is spent: the preflight (the credit, the paged search), each offer
re-checked client-side and its driver qualified, a profile's `[requires]`, the sourced GPU peaks, the worst-case
quote, and the ranking by dollars per training token.

Nothing here creates an instance: `--dry-run` and `vast-e2e offers` stop after it.
"""
