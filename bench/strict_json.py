"""CPU of homing's strict JSON parser (every HTTP body, session request and API input).

    .venv/bin/python bench/strict_json.py [--base REV] [--pairs 3]

Times ``homing._json.strict_loads`` (timeit, best of 5) on a 180-byte webhook body (the
pipeline's) and a 329 KB body of 5,000 small objects, next to plain ``json.loads``. With
``--base REV`` it runs REV's ``src`` (a temporary git worktree) and the working tree's
alternately, ``--pairs`` times, each in a subprocess.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import revision_tree  # noqa: E402

_TIMER = r"""
import json, sys, timeit
from homing._json import strict_loads
small = json.dumps({"event_id": 17, "subscriber_id": 123456, "channel": "webhook",
    "email": "user123456@example.com", "run": "abcdef123456",
    "notification_id": "01a214e5-b206-7140-965d-8bd0178bd795"}).encode()
big = json.dumps({"items": [{"id": i, "name": "x" * 20, "tags": ["a", "b"]}
    for i in range(5000)]}).encode()
def best(fn, number):
    return min(timeit.repeat(fn, number=number, repeat=5)) / number
print(json.dumps({
    "small_us": best(lambda: strict_loads(small), 20000) * 1e6,
    "big_ms": best(lambda: strict_loads(big), 10) * 1e3,
    "json_small_us": best(lambda: json.loads(small), 20000) * 1e6,
    "json_big_ms": best(lambda: json.loads(big), 10) * 1e3,
}))
"""


def measure(src: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", _TIMER],
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", help="a git revision to compare with the working tree")
    ap.add_argument("--pairs", type=int, default=3)
    args = ap.parse_args()
    with ExitStack() as stack:
        trees = [("working tree", ROOT / "src")]
        if args.base:
            trees.insert(0, (args.base, stack.enter_context(revision_tree(args.base)) / "src"))
        for i in range(args.pairs if args.base else 1):
            for name, src in trees:
                r = measure(src)
                print(
                    f"{i + 1} {name:>12}: strict_loads {r['small_us']:.2f} us (180 B), "
                    f"{r['big_ms']:.2f} ms (329 KB); json.loads {r['json_small_us']:.2f} us, "
                    f"{r['json_big_ms']:.2f} ms"
                )


if __name__ == "__main__":
    main()
