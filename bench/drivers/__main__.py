"""One measurement ("cell") in a process of its own: ``python -m bench.drivers SPEC_JSON``.

Prints one JSON object on its last stdout line. The spec names the system, the workload
(enqueue | drain | cycle | latency), the batch size and the sizes. Each cell resets the
system's store first, so every run starts from an empty database, file, queue or stream.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import FORK, Shared, Tally, bench_dir, percentile
from bench.drivers import Driver, driver_class


def _die_with_parent() -> None:
    """Linux: SIGKILL this consumer when the cell's process ends, however it ends (a
    timeout in the harness killed cells whose celery consumers then ran on for hours)."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)


def _consumer_main(drv: Driver, shared: Shared, slot: int, track: bool) -> None:
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    Tally.bind(shared, slot, track)
    shared.ready[slot] = 1
    try:
        drv.consume(slot)
    except KeyboardInterrupt:
        pass
    except BaseException:
        traceback.print_exc()
        os._exit(3)


def _start_consumers(drv: Driver, shared: Shared, track: bool) -> list[Any]:
    procs = []
    for slot in range(shared.consumers):
        p = FORK.Process(target=_consumer_main, args=(drv, shared, slot, track), daemon=True)
        p.start()
        procs.append(p)
    deadline = time.monotonic() + 30
    while not all(shared.ready[k] for k in range(shared.consumers)):
        if time.monotonic() > deadline:
            raise RuntimeError("consumers did not start within 30 s")
        if any(p.exitcode not in (None, 0) for p in procs):
            raise RuntimeError("a consumer process died at start-up")
        time.sleep(0.01)
    time.sleep(drv.startup_s)
    return procs


def _warm_up(drv: Driver, shared: Shared, procs: list[Any], first_seq: int) -> float:
    """Send one job per consumer and wait until they are done: every system is consuming
    (library start-up over, connections open) before a timed window starts."""
    n = shared.consumers
    before = shared.total()
    p = drv.open_producer()
    started = time.monotonic()
    try:
        for k in range(n):
            p.send([first_seq + k])
    finally:
        p.close()
    deadline = started + 60
    while shared.total() - before < n:
        _check_alive(procs)
        if time.monotonic() > deadline:
            raise RuntimeError("the consumers did not finish the warm-up jobs within 60 s")
        time.sleep(0.005)
    return time.monotonic() - started


def _stop(procs: list[Any]) -> None:
    """SIGKILL: the measurement is over, and a graceful shutdown (celery, huey, uvicorn,
    homing's worker) would only cost seconds. The next reset cleans up after them."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(5)


def _check_alive(procs: list[Any]) -> None:
    dead = [p.exitcode for p in procs if not p.is_alive()]
    if dead:
        raise RuntimeError(f"a consumer process exited during the run (exit codes {dead})")


def _producer_loop(drv: Driver, shared: Shared, stop: Any, max_backlog: int) -> None:
    """Enqueue as fast as the consumers keep up: never more than ``max_backlog`` ahead, so
    the window measures the sustainable rate of the whole cycle, not a producer that
    starves the consumers of a shared lock (SQLite) or builds an unbounded backlog."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    p = drv.open_producer()
    b = drv.batch
    n = 0
    try:
        while not stop.is_set():
            while n - shared.total() > max_backlog and not stop.is_set():
                time.sleep(0.0005)
            p.send(list(range(n, n + b)))
            n += b
            shared.produced.value = n
    finally:
        p.close()


def enqueue(drv: Driver, spec: dict[str, Any]) -> dict[str, Any]:
    p = drv.open_producer()
    b = drv.batch
    n = 0
    start = time.perf_counter()
    deadline = start + spec["seconds"]
    try:
        while True:
            p.send(list(range(n, n + b)))
            n += b
            now = time.perf_counter()
            if now >= deadline:
                break
    finally:
        p.close()
    elapsed = now - start
    return {"rate": n / elapsed, "jobs": n, "elapsed_s": elapsed}


def drain(drv: Driver, spec: dict[str, Any]) -> dict[str, Any]:
    n = drv.preload(spec["jobs"], time.monotonic() + spec["preload_s"])
    shared = Shared(spec["consumers"], 1)
    procs = _start_consumers(drv, shared, track=False)
    deadline = time.monotonic() + spec["seconds"]
    steady = bool(spec.get("steady"))
    all_running: tuple[int, float] | None = None
    try:
        while shared.total() < n and time.monotonic() < deadline:
            _check_alive(procs)
            if steady and all_running is None and shared.all_started():
                all_running = (shared.total(), time.time())
            time.sleep(0.005)
        done = shared.total()
        first, last = shared.span()
    finally:
        _stop(procs)
    span = last - first
    rate = (done - 1) / span if done > 1 and span > 0 else float("nan")
    out = {"rate": rate, "jobs": n, "completed": done, "elapsed_s": span, "all_done": done >= n}
    if steady:
        out.update(_steady_rate(rate, done, last, all_running))
    return out


def _steady_rate(
    from_first: float, done: int, last: float, all_running: tuple[int, float] | None
) -> dict[str, Any]:
    """The drain's rate once every consumer has completed a job: from that moment (polled
    every 5 ms) to the last completion. Processes start one after another, and a short
    backlog is otherwise measured partly with fewer consumers than the cell names (the
    start-up skew of 4 processes was a fifth of a 6,000-job drain). Falls back to the rate
    from the first completion when the backlog ran out before every consumer had a job."""
    steady = {"rate_from_first": from_first, "steady": False}
    if all_running is not None:
        count, at = all_running
        if done - count >= 100 and last > at:
            steady.update(rate=(done - count) / (last - at), steady=True, steady_jobs=done - count)
    return steady


def cycle(drv: Driver, spec: dict[str, Any]) -> dict[str, Any]:
    shared = Shared(spec["consumers"], 1)
    procs = _start_consumers(drv, shared, track=False)
    try:
        warm_s = _warm_up(drv, shared, procs, 10**9)
    except BaseException:
        _stop(procs)
        raise
    stop = FORK.Event()
    max_backlog = max(spec.get("max_backlog", 500), 20 * drv.batch)
    producer = FORK.Process(
        target=_producer_loop, args=(drv, shared, stop, max_backlog), daemon=True
    )
    try:
        producer.start()
        time.sleep(spec["warmup_s"])
        _check_alive(procs)
        c0, p0, t0 = shared.total(), shared.produced.value, time.perf_counter()
        time.sleep(spec["seconds"])
        c1, p1, t1 = shared.total(), shared.produced.value, time.perf_counter()
        _check_alive(procs)
        if not producer.is_alive():
            raise RuntimeError(f"the producer exited with code {producer.exitcode}")
    finally:
        stop.set()
        producer.join(3)
        _stop([producer, *procs])
    elapsed = t1 - t0
    return {
        "rate": (c1 - c0) / elapsed,
        "completed": c1 - c0,
        "enqueued_rate": (p1 - p0) / elapsed,
        "backlog_at_end": p1 - c1,
        "max_backlog": max_backlog,
        "warm_up_s": warm_s,
        "elapsed_s": elapsed,
    }


def latency(drv: Driver, spec: dict[str, Any]) -> dict[str, Any]:
    rate = float(spec["rate"])
    n = max(10, min(int(rate * spec["seconds"]), spec["max_jobs"]))
    shared = Shared(spec["consumers"], n)
    procs = _start_consumers(drv, shared, track=True)
    try:
        _warm_up(drv, shared, procs, n + 1)  # seqs >= n are not tracked
    except BaseException:
        _stop(procs)
        raise
    time.sleep(0.2)
    p = drv.open_producer()
    try:
        start = time.time()
        behind = 0
        for i in range(n):
            due = start + i / rate
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            elif wait < -0.01:
                behind += 1
            p.send([i])
            shared.commits[i] = time.time()
        sent_s = time.time() - start
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            if all(shared.starts[i] for i in range(n)):
                break
            _check_alive(procs)
            time.sleep(0.01)
        lat = [(shared.starts[i] - shared.commits[i]) * 1000 for i in range(n) if shared.starts[i]]
    finally:
        p.close()
        _stop(procs)
    return {
        "rate": rate,
        "achieved_rate": n / sent_s,
        "jobs": n,
        "started": len(lat),
        "late_sends": behind,
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "max_ms": max(lat) if lat else float("nan"),
    }


WORKLOADS = {"enqueue": enqueue, "drain": drain, "cycle": cycle, "latency": latency}


def run_cell(spec: dict[str, Any]) -> dict[str, Any]:
    cls = driver_class(spec["system"])
    workdir = Path(tempfile.mkdtemp(prefix="cell-", dir=bench_dir()))
    drv = cls(batch=spec["batch"], workdir=workdir, options=spec.get("options", {}))
    if cls.consumers is not None:
        spec = {**spec, "consumers": cls.consumers}
    t = time.perf_counter()
    drv.reset()
    reset_s = time.perf_counter() - t
    settings = drv.settings()
    result = WORKLOADS[spec["workload"]](drv, spec)
    drv.close()
    for f in workdir.iterdir():
        f.unlink(missing_ok=True)
    workdir.rmdir()
    return {
        **result,
        "ok": True,
        "consumers": spec["consumers"],
        "reset_s": reset_s,
        "settings": settings,
        "durability": cls.durability,
    }


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        out = run_cell(spec)
    except BaseException as exc:  # a failing peer must not stop the harness
        traceback.print_exc()
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
