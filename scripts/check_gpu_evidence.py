"""Validate GPU evidence files: python scripts/check_gpu_evidence.py --kind {mfu,proofs,mps,receipt} FILE...

Exit 0 when every file holds every claim; 1 naming the first failed claim; 2 on bad usage or a missing
checker module.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repo root, for `import remote`

from remote.checks import KINDS, CheckerMissing, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", required=True, choices=KINDS)
    ap.add_argument("files", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        results = run(args.kind, args.files)
    except CheckerMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    first = next(((p, f) for p, f in results if f), None)
    for path, failed in results:
        print(f"{'ok  ' if not failed else 'FAIL'} {path}" + (f": {len(failed)} failed claim(s)" if failed else ""))
        for claim in failed:
            print(f"     - {claim}")
    if first:
        print(f"first failed claim: {first[0]}: {first[1][0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
