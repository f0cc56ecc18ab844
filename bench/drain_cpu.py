"""How busy the machine is while 1, 2 and 4 homing worker processes drain a backlog on
PostgreSQL, and so the CPU each job costs.

    .venv/bin/python -m bench.drain_cpu [--jobs 120000] [--procs 1 2 4]

Each count runs the harness's drain cell (``bench.drivers``: the backlog inserted first,
then the worker processes started; the rate is taken from the moment every process has
completed a job to the last completion, as in the harness's ``workers-N`` groups) with a
bigger backlog than the harness's 30,000. Meanwhile /proc/stat is sampled every 0.1 s; reported: the
rate, the share of the machine's cores busy over the busiest stretch as long as the drain
(the drain itself: the insert of the backlog before it runs at another rate), and
busy cores / rate as CPU per job, every process of the machine included (the server's
too). Linux only.
"""

from __future__ import annotations

import argparse
import io
import os
import threading
import time

from bench import run as bench_run
from bench.common import machine_jiffies

SAMPLE_S = 0.1


def busiest(samples: list[tuple[int, int]], span_s: float) -> float:
    """The busy share of the cores over the busiest window of ``span_s``."""
    k = max(1, round(span_s / SAMPLE_S))
    best = 0.0
    for i in range(len(samples) - k):
        total = samples[i + k][0] - samples[i][0]
        idle = samples[i + k][1] - samples[i][1]
        if total > 0:
            best = max(best, 1 - idle / total)
    return best


def one(jobs: int, procs: int) -> tuple[float, float, float]:
    samples: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(machine_jiffies())
            stop.wait(SAMPLE_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    spec = {
        "system": "homing-worker-pg",
        "workload": "drain",
        "batch": 1,
        "consumers": procs,
        "jobs": jobs,
        "preload_s": 120.0,
        "seconds": 120.0,
        "steady": True,
    }
    try:
        result = bench_run.run_cell(spec, io.StringIO(), 600.0)
    finally:
        stop.set()
        sampler.join()
    if not result.get("ok"):
        raise SystemExit(f"the drain failed: {result.get('error')}")
    return float(result["rate"]), float(result["elapsed_s"]), busiest(samples, result["elapsed_s"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=120_000)
    ap.add_argument("--procs", type=int, nargs="*", default=[1, 2, 4])
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(
        f"# python -m bench.drain_cpu --jobs {args.jobs} --procs "
        f"{' '.join(map(str, args.procs))}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {os.getloadavg()[0]:.2f}, {cores} cores)",
        flush=True,
    )
    base = None  # the rate of the latest run with the list's first count: the ratios' base
    for procs in args.procs:
        rate, span, busy = one(args.jobs, procs)
        if base is None or procs == args.procs[0]:
            base = rate
        cpu_us = busy * cores / rate * 1e6
        print(
            f"{procs} process{'es' if procs > 1 else '  '}: {rate:8,.0f} jobs/s "
            f"({rate / base:.2f}x) over {span:5.2f} s, cores {busy * 100:3.0f}% busy, "
            f"{cpu_us:4.0f} us of CPU a job",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
