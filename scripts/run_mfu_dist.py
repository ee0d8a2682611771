"""Entry point: torchrun --standalone --nproc-per-node N scripts/run_mfu_dist.py --profile ... --out F.json"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `import remote`

from remote.training.train import main

if __name__ == "__main__":
    sys.exit(main())
