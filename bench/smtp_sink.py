"""CPU of the pipeline's SMTP sink per message, per source tree.

    .venv/bin/python -m bench.smtp_sink [--src DIR ...] [--n 4000] [--reps 2]

(a module: bench/http.py would shadow the standard library's http as a script)

Starts ``python -m homing.pipeline.sinks smtp`` from each source tree (``--src``, default
this checkout's ``src``; give two to compare, run alternately), sends ``--n`` messages
from 4 threads through the delivery workers' own client (``homing.pipeline.deliver``'s
``Channels``: smtplib, one connection per thread, 1 in 50 to a bounce mailbox), and prints
the sink process's CPU per message (utime + stime from /proc) and the messages per second.
The sink shares the cores with the delivery workers in ``make run``: its CPU is theirs.
Appends to bench/results/smtp-sink.txt.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.common import append_result, proc_stat, run_header

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "smtp-sink.txt"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_run(src: Path, n: int) -> str:
    from homing.errors import PermanentFailure
    from homing.pipeline.deliver import Channels

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="homing-smtp-") as tmp:
        env = dict(os.environ, PYTHONPATH=str(src))
        sink = subprocess.Popen(
            [sys.executable, "-m", "homing.pipeline.sinks", "smtp", "--log", f"{tmp}/r.jsonl"]
            + ["--port", str(port), "--temp-pct", "3"],
            env=env,
        )
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            counts = {"ok": 0, "bounced": 0, "retry": 0}
            lock = threading.Lock()

            def send(share: int) -> None:
                channels = Channels(port)
                for i in range(share):
                    to = "bounce-x@example.com" if i % 50 == 0 else f"u{i}@example.com"
                    args = {"email": to, "event_id": i, "subscriber_id": i}
                    try:
                        channels.send_email(str(uuid.uuid4()), args)
                        kind = "ok"
                    except PermanentFailure:
                        kind = "bounced"
                    except RuntimeError:
                        kind = "retry"
                    with lock:
                        counts[kind] += 1

            cpu0, t0 = proc_stat(sink.pid)[1], time.perf_counter()
            threads = [threading.Thread(target=send, args=(n // 4,)) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            seconds, cpu = time.perf_counter() - t0, proc_stat(sink.pid)[1] - cpu0
        finally:
            sink.terminate()
            sink.wait()
        sent = sum(counts.values())
        return (
            f"{src}: {sent} messages in {seconds:.1f} s = {sent / seconds:,.0f}/s; sink CPU "
            f"{cpu * 1e6 / sent:,.0f} us a message; {counts}"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, action="append", help="a source tree (its src dir)")
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    srcs = a.src or [ROOT / "src"]
    head = run_header(f"n={a.n}")
    print(head)
    out = [head]
    for _ in range(a.reps):
        for src in srcs:
            line = one_run(src.resolve(), a.n)
            print(line, flush=True)
            out.append(line)
    append_result(OUT, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
