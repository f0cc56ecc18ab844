"""CPU of every process of a pipeline run during its delivery stage, per delivery.

    .venv/bin/python -m bench.pipeline_cpu [--src DIR] [-- RUN_ARGS]

Runs ``homing pipeline run`` (make run's defaults unless RUN_ARGS say otherwise, with
``--kills 0`` so that every process lives to the end) on a fresh SQLite store, samples the
CPU (utime + stime from /proc) of every process under it once a second, and prints, for
the middle of the delivery stage (from 20% to 80% of the time between the first and the
last receipt of the SMTP sink), each group's CPU seconds and cores, and milliseconds per
delivery (webhooks + IM for the webhook receiver, emails for the SMTP sink, all
deliveries for the others). Appends to bench/results/pipeline-cpu.txt.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import append_result, proc_stat, run_header

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "pipeline-cpu.txt"
GROUPS = (
    ("homing.pipeline.deliver", "delivery workers"),
    ("sinks hooks", "webhook receiver"),
    ("sinks smtp", "SMTP sink"),
    ("pipeline run", "driver"),
    ("java", "Spark (JVM)"),
)


def tree(root: int) -> dict[int, tuple[float, str]]:
    """CPU seconds and group of every process under ``root`` (itself included)."""
    procs: dict[int, tuple[int, float, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            ppid, cpu = proc_stat(int(name))
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        procs[int(name)] = (ppid, cpu, cmd)
    keep, grew = {root}, True
    while grew:
        grew = False
        for pid, (ppid, _, _) in procs.items():
            if ppid in keep and pid not in keep:
                keep.add(pid)
                grew = True
    out = {}
    for pid in keep & procs.keys():
        _, cpu, cmd = procs[pid]
        group = next((label for key, label in GROUPS if key in cmd), "other")
        out[pid] = (cpu, group)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("run_args", nargs="*", help="more `pipeline run` options, after --")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="homing-cpu-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(a.src.resolve()))
        args = ["--kills", "0", "--dashboard", "off", *a.run_args]
        proc = subprocess.Popen(
            [sys.executable, "-m", "homing", "--db", f"sqlite:///{tmp}/p.db", "pipeline", "run"]
            + ["--data-dir", f"{tmp}/data", *args],
            cwd=tmp,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        samples: list[tuple[float, dict[int, tuple[float, str]]]] = []
        while proc.poll() is None:
            samples.append((time.time(), tree(proc.pid)))
            time.sleep(1.0)
        text = proc.communicate()[0]
        receipts = next(Path(tmp, "data").glob("run-*/smtp-receipts.jsonl"))
        times = [json.loads(line)["t"] for line in receipts.read_text().splitlines()]
    found = re.search(r"deliveries: (\d+) in ([\d.]+) s", text.replace("\n", " "))
    if not found or "-> OK" not in text:
        print(text[-2000:])
        return 1
    rate = int(found.group(1)) / float(found.group(2))
    first, last = min(times), max(times)
    t0, t1 = first + 0.2 * (last - first), first + 0.8 * (last - first)
    a0 = min(samples, key=lambda s: abs(s[0] - t0))
    a1 = min(samples, key=lambda s: abs(s[0] - t1))
    window = a1[0] - a0[0]
    cpu: dict[str, float] = {}
    for pid, (seconds, group) in a1[1].items():
        before = a0[1].get(pid, (0.0, group))[0]
        cpu[group] = cpu.get(group, 0.0) + seconds - before
    deliveries = rate * window
    per = {"webhook receiver": 2 / 3, "SMTP sink": 1 / 3}  # the run's channel mix
    lines = [
        run_header(str(a.src)),
        f"deliveries/s {rate:,.0f} (first to last); window {window:.1f} s; "
        f"{sum(cpu.values()) / window:.2f} cores in all",
    ]
    for group, seconds in sorted(cpu.items(), key=lambda kv: -kv[1]):
        share = per.get(group, 1.0)
        lines.append(
            f"  {group:<18} {seconds:6.1f} s  {seconds / window:4.2f} cores  "
            f"{seconds * 1000 / (deliveries * share):5.2f} ms a "
            + {"webhook receiver": "webhook/IM", "SMTP sink": "email"}.get(group, "delivery")
        )
    lines.append(f"  all processes: {sum(cpu.values()) * 1000 / deliveries:.2f} ms a delivery")
    print("\n".join(lines))
    append_result(OUT, lines)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
