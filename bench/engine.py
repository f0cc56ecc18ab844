"""Queue engine (seed 001) throughput: runs examples/engine_bench.py (same options).

The line for batched publishes on PostgreSQL is ``chain_publish_many100_per_s`` (a 3-queue
MOVE chain, ``publish_many`` of 100); ``ack_ms_with_3000_waiting_for_a_busy_selector`` is the
cost of a payment while many messages wait for another selector.
"""

import runpy
from pathlib import Path

if __name__ == "__main__":
    target = Path(__file__).resolve().parent.parent / "examples" / "engine_bench.py"
    runpy.run_path(str(target), run_name="__main__")
