"""Write transactions per delivery in the pipeline's delivery stage (SQLite).

    .venv/bin/python -m bench.pipeline_commits [--src DIR ...] [--reps 1] [-- RUN_ARGS]

Runs ``homing pipeline run`` on a fresh SQLite store (default: 1 delivery worker process,
no kills, so that every process lives to the end) with ``bench/tx_trace`` loaded into the
delivery worker and the webhook receiver, then prints, per source tree (``--src``, default
this checkout's ``src``; give two to compare, run alternately), the run's deliveries/s and
each process's write transactions by caller: how many, seconds waiting for the write lock,
seconds holding it. Every commit of a durable store is an fsync: on a disk where fsyncs
are slow, these counts set the pace. Appends to bench/results/pipeline-commits.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import append_result, run_header

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "pipeline-commits.txt"


def one_run(src: Path, run_args: list[str]) -> str:
    with tempfile.TemporaryDirectory(prefix="homing-commits-") as tmp:
        trace = Path(tmp) / "trace"
        trace.mkdir()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(src), str(ROOT / "bench" / "tx_trace")])
        env["HOMING_TX_TRACE_DIR"] = str(trace)
        args = ["--workers", "1", "--kills", "0", "--dashboard", "off", *run_args]
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "homing",
                "--db",
                f"sqlite:///{tmp}/p.db",
                "pipeline",
                "run",
                "--data-dir",
                str(Path(tmp) / "data"),
                *args,
            ],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        text = proc.stdout + proc.stderr
        found = re.search(
            r"deliveries: (\d+) in ([\d.]+) s .*? = ([\d,]+)/s", text.replace("\n", " ")
        )
        verdict = "OK" if "-> OK" in text else "FAILED"
        lines = [
            f"{src}: "
            + (
                f"deliveries {found.group(1)} in {found.group(2)} s = {found.group(3)}/s"
                if found
                else "no delivery figure"
            )
            + f"; check {verdict}"
        ]
        deliveries = int(found.group(1)) if found else 0
        for path in sorted(trace.glob("*.json")):
            data = json.loads(path.read_text())
            total = sum(int(v[0]) for v in data["stats"].values())
            per = f", {total / deliveries:.3f} a delivery" if deliveries else ""
            lines.append(f"  {data['role']} (pid {data['pid']}): {total} write transactions{per}")
            for key, (n, wait, hold) in sorted(data["stats"].items(), key=lambda kv: -kv[1][0]):
                lines.append(
                    f"    {key:<62} {int(n):>6}  wait {wait:6.2f} s  hold {hold:6.2f} s "
                    f"({hold / max(n, 1) * 1000:.2f} ms each)"
                )
        shutil.rmtree(trace, ignore_errors=True)
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, action="append", help="a source tree (its src dir)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("run_args", nargs="*", help="more `pipeline run` options, after --")
    a = ap.parse_args()
    srcs = a.src or [ROOT / "src"]
    head = run_header(f"{len(srcs)} tree(s) x {a.reps}")
    print(head)
    out = [head]
    for rep in range(a.reps):
        for src in srcs:
            t = time.monotonic()
            block = one_run(src.resolve(), a.run_args)
            block += f"\n  (run {rep + 1}, {time.monotonic() - t:.0f} s)"
            print(block, flush=True)
            out.append(block)
    append_result(OUT, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
