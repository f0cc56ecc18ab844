"""CPU per job of every process in a harness cell: the consumers', the producer's and the
database server's, with how busy the machine was.

    .venv/bin/python -m bench.cell_cpu [--cells homing-pg:100 raw-pg:100 ...] [--seconds 8]
                                       [--rounds 2]

Each cell is the harness's full cycle (``bench.drivers``' ``cycle`` workload, 2 consumer
processes and a producer), run for ``--seconds`` while the CPU time of every process on
the machine is read from /proc at the start and the end of a window inside the
measurement. The Python processes (consumers, producer, the cell's own parent) and the
PostgreSQL backends are summed apart and divided by the jobs completed in the window;
"busy" is the share of the machine's cores not idle (nor waiting on I/O) in it. The
cells alternate ``--rounds`` times, so that the machine's drift hits them alike. Linux
only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench.common import machine_jiffies, proc_stat_started
from bench.run import cell_env

ROOT = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")
START_S = 3.0  # the cell's reset, consumers' start and warm-up before the window opens
# (they took well under that here; the window's jobs are the cell's rate times its length)


def process_cpu() -> dict[int, tuple[str, int, float]]:
    """Every process's command line, start time and CPU seconds so far. A server
    backend's command line changes with what it runs (``idle``, ``UPDATE``): the start
    time, not the command line, tells it is the same process."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            _, started, cpu = proc_stat_started(int(pid))
            with open(f"/proc/{pid}/cmdline") as f:
                cmd = f.read().replace("\0", " ")
        except OSError:
            continue  # it ended meanwhile
        out[int(pid)] = (cmd, started, cpu)
    return out


def kind(cmd: str) -> str:
    """postgres (the server's processes, background writers included), python, other."""
    if os.path.basename(cmd.split(" ", 1)[0]).startswith("postgres"):
        return "postgres"
    return "python" if "python" in cmd else "other"


def run_cell(system: str, batch: int, seconds: float) -> dict[str, float]:
    spec = {
        "system": system,
        "workload": "cycle",
        "batch": batch,
        "consumers": 2,
        "seconds": seconds + START_S,
        "warmup_s": 1.0,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.drivers", json.dumps(spec)],
        cwd=ROOT,
        env=cell_env(system),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(START_S + 1.0)
    before, (all0, idle0), t0 = process_cpu(), machine_jiffies(), time.perf_counter()
    time.sleep(seconds - 1.0)
    after, (all1, idle1), t1 = process_cpu(), machine_jiffies(), time.perf_counter()
    out, err = proc.communicate()
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    result = json.loads(lines[-1]) if lines else {"ok": False}
    if not result.get("ok"):
        raise RuntimeError(f"cell {system} failed: {err[-800:]}")
    jobs = result["rate"] * (t1 - t0)
    per_kind: dict[str, float] = {}
    for pid, (cmd, started, cpu) in after.items():
        if pid in before and before[pid][1] == started:
            per_kind[kind(cmd)] = per_kind.get(kind(cmd), 0.0) + cpu - before[pid][2]
    busy = ((all1 - all0) - (idle1 - idle0)) / TICK / (t1 - t0)
    return {
        "rate": result["rate"],
        "busy_cores": busy,
        **{f"{k}_us": v / jobs * 1e6 for k, v in per_kind.items()},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cells",
        nargs="+",
        default=["homing-pg:100", "raw-pg:100", "homing-worker-pg:1", "raw-pg:1"],
        help="system:batch",
    )
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    print(
        f"# python -m bench.cell_cpu {' '.join(sys.argv[1:])}  "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores)\n"
        "CPU us per job completed: python = consumers + producer + the cell's parent; "
        "postgres = every server backend"
    )
    for r in range(args.rounds):
        for cell in args.cells:
            system, _, batch = cell.partition(":")
            m = run_cell(system, int(batch or 1), args.seconds)
            print(
                f"round {r + 1} {system:18s} batch {int(batch or 1):3d}: "
                f"{m['rate']:9,.0f} jobs/s, busy {m['busy_cores']:.2f} cores, CPU/job "
                f"python {m.get('python_us', 0):5.1f} us, postgres {m.get('postgres_us', 0):5.1f} "
                f"us, total {m.get('python_us', 0) + m.get('postgres_us', 0):5.1f} us",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
