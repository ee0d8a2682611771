"""`python -m remote.mps [options] -- CMD ...`: see remote.mps.wrapper."""

from remote.mps.wrapper import main

raise SystemExit(main())
