"""What to run, settled before anything is rented: flag values and their bounds, harness profiles and
their `[requires]`, the user's config and key, `vast-e2e run -- CMD` as a profile with its workdir, all resolved
into one frozen `RunSpec` (flag > environment > config file > profile).

A mistake stops here with exit 2, naming the flag or the field.
"""
