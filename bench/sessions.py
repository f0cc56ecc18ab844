"""Sessions round trips/s: python bench/sessions.py [--seconds 5] [--json bench/results/sessions.json]"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

# run as a script: keep bench/ off sys.path so `homing.sessions.bench` is not shadowed
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

from homing.sessions.bench import main

if __name__ == "__main__":
    main()
