"""Before / after in one window: the same cells run alternately on two versions of the code.

``python -m bench.ab --base REV`` checks ``REV`` out in a temporary git worktree and runs
each cell (``python -m bench.drivers SPEC``, a fresh store each time) on REV and on the
working tree in turn, ``--reps`` times, so that the machine's drift hits both alike. It
prints the medians and the median of the per-pair ratios (working tree / REV).

Run it on a quiet machine: the cells share the PostgreSQL server with everything else.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import run as bench_run
from bench.common import revision_tree

ROOT = Path(__file__).resolve().parent.parent

CELLS: dict[str, dict[str, Any]] = {
    "cycle-1-worker-pg": {"system": "homing-worker-pg", "workload": "cycle", "batch": 1},
    "cycle-1-api-pg": {"system": "homing-pg", "workload": "cycle", "batch": 1},
    "cycle-100-api-pg": {"system": "homing-pg", "workload": "cycle", "batch": 100},
    "cycle-1-sqlite": {"system": "homing-sqlite", "workload": "cycle", "batch": 1},
    "cycle-1-worker-sqlite": {"system": "homing-worker-sqlite", "workload": "cycle", "batch": 1},
    "cycle-100-sqlite": {"system": "homing-sqlite", "workload": "cycle", "batch": 100},
    "drain-1-worker-pg": {"system": "homing-worker-pg", "workload": "drain", "consumers": 1},
    "drain-4-worker-pg": {"system": "homing-worker-pg", "workload": "drain", "consumers": 4},
    "drain-1-worker-sqlite": {
        "system": "homing-worker-sqlite",
        "workload": "drain",
        "consumers": 1,
    },
}
# The HTTP receiver alone (bench/http.py's Option 2 cell): always the working tree's
# script, run on each version's homing (its ``src`` first on the path, the server too).
HTTP_CELLS = {"http-receiver-sqlite": "sqlite", "http-receiver-pg": "postgres"}
# The whole reliable send (bench/http.py's "homing send (Option 2)" row: AsyncSender.send
# to the receiver and back, 32 at a time, outbox commit, dispatcher, request, tombstone).
SEND_CELLS = {"http-send-sqlite": "sqlite", "http-send-pg": "postgres"}
_DEFAULTS = {
    "cycle": {"batch": 1, "consumers": 2, "seconds": 3.0, "warmup_s": 0.3},
    "drain": {"batch": 1, "consumers": 1, "jobs": 6000, "preload_s": 5.0, "seconds": 5.0},
}


def spec_of(name: str) -> dict[str, Any]:
    if name in HTTP_CELLS:
        return {"http": HTTP_CELLS[name]}
    if name in SEND_CELLS:
        return {"http": SEND_CELLS[name], "only": "send", "row": "homing send (Option 2)"}
    cell = CELLS[name]
    return {**_DEFAULTS[cell["workload"]], **cell}


def run_cell(tree: Path, spec: dict[str, Any], timeout: float = 300.0) -> float | None:
    """The cell's rate on the code in ``tree`` (None when it failed): the harness's own
    cell runner (``bench.run.run_cell``), pointed at ``tree``."""
    if "http" in spec:
        return run_http_cell(
            tree,
            spec["http"],
            timeout,
            only=spec.get("only", "none"),
            row_name=spec.get("row", "homing receiver (Option 2)"),
        )
    result = bench_run.run_cell(spec, io.StringIO(), timeout, root=tree)
    return float(result["rate"]) if result.get("ok") and "rate" in result else None


def run_http_cell(
    tree: Path,
    backend: str,
    timeout: float,
    *,
    only: str = "none",
    row_name: str = "homing receiver (Option 2)",
) -> float | None:
    """Messages/s of one row of ``bench/http.py`` (by default the receiver alone: 1,000
    Option 2 messages, one round)."""
    env = bench_run.cell_env("http", tree)
    with tempfile.TemporaryDirectory(prefix="homing-ab-http-") as tmp:
        out = Path(tmp) / "http.json"
        cmd = [sys.executable, str(ROOT / "bench" / "http.py"), "--backend", backend]
        cmd += ["--only", only, "--rounds", "1", "--n", "1000", "--out", str(out)]
        try:
            subprocess.run(cmd, cwd=tree, env=env, capture_output=True, timeout=timeout)
            doc = json.loads(out.read_text())
        except (subprocess.TimeoutExpired, OSError, ValueError):
            return None
    rows = {r["name"]: r for r in doc["runs"][backend]["results"]}
    row = rows.get(row_name)
    return float(row["msgs_per_s"]) if row else None


def compare(base: Path, names: list[str], reps: int) -> dict[str, dict[str, list[float]]]:
    runs: dict[str, dict[str, list[float]]] = {n: {"base": [], "head": []} for n in names}
    for rep in range(reps):
        for name in names:
            for side, tree in (("base", base), ("head", ROOT)):
                rate = run_cell(tree, spec_of(name))
                print(f"rep {rep + 1}/{reps}  {name:24} {side}  {rate or 0:10,.0f}/s", flush=True)
                runs[name][side].append(rate or 0.0)
    return runs


def table(runs: dict[str, dict[str, list[float]]], base_rev: str) -> str:
    lines = [
        f"| cell | {base_rev} (median /s) | working tree (median /s) | ratio (median of pairs) |",
        "|---|---|---|---|",
    ]
    for name, sides in runs.items():
        pairs = [h / b for b, h in zip(sides["base"], sides["head"], strict=True) if b and h]
        ratio = f"{statistics.median(pairs):.2f}x" if pairs else "-"
        lines.append(
            f"| {name} | {statistics.median(sides['base']):,.0f} | "
            f"{statistics.median(sides['head']):,.0f} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare with")
    parser.add_argument("--reps", type=int, default=3, help="pairs per cell (default 3)")
    parser.add_argument(
        "--cells",
        nargs="+",
        choices=sorted([*CELLS, *HTTP_CELLS, *SEND_CELLS]),
        default=list(CELLS),
        help="cells to run (the http-receiver and http-send ones only when named)",
    )
    parser.add_argument(
        "--out", type=Path, help="also write the table, with the command, to this file"
    )
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error("--reps must be at least 1")
    started = datetime.datetime.now(datetime.UTC)
    load = os.getloadavg()
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    with revision_tree(args.base) as tree:
        runs = compare(tree, args.cells, args.reps)
    result = table(runs, args.base)
    print()
    print(result)
    if args.out is not None:
        ended = datetime.datetime.now(datetime.UTC)
        command = "python -m bench.ab " + " ".join(argv if argv is not None else sys.argv[1:])
        args.out.write_text(
            f"# Before / after: {args.base} vs the working tree (HEAD {head})\n\n"
            f"`{command}`, {started:%Y-%m-%d %H:%M}-{ended:%H:%M} UTC, load average "
            f"{load[0]:.2f} at the start; each cell alternated between the two versions, "
            f"{args.reps} pairs, a fresh store per cell.\n\n{result}\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
