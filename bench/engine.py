"""Queue engine (seed 001) throughput: runs examples/engine_bench.py (same options)."""

import runpy
from pathlib import Path

if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "examples" / "engine_bench.py"
    runpy.run_path(str(target), run_name="__main__")
