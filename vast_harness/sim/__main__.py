"""`python -m vast_harness.sim --port P [--seed N] [--faults SPEC] [--boot-seconds S] ...`"""

from vast_harness.sim.cli import main

raise SystemExit(main())
