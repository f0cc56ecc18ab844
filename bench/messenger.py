"""Benchmark of the ZeroMQ messenger (seed 003) against plain pyzmq in the same run.

    .venv/bin/python bench/messenger.py [--n 5000] [--durable-n 2000] [--backend sqlite|postgres]

For tcp and ipc, three workloads, each with the server in a subprocess:
- ``rt-latency``: one round trip at a time (p50/p99 latency, round trips/s);
- ``rt-throughput``: many round trips in flight (round trips/s);
- ``one-way``: messages with no reply (messages/s; homing counts a message done when its
  acknowledgement arrives, plain PUSH/PULL when the server has counted it).
Systems: ``zmq-dealer-router`` (plain echo, the baseline of the round trips),
``zmq-push-pull`` (baseline of one-way), ``homing-memory`` (messenger without a store),
``homing-durable`` (both sides keep pending and seen state in a store: SQLite with
synchronous=FULL by default) and ``store-batched-insert`` (``Database.insert_many`` of
100 rows per transaction into the same backend: the baseline of durable one-way, since a
durable message costs at least one stored row). Ratios are homing / baseline; issue 13's
targets: memory one-way >= 0.5x PUSH/PULL, memory round trips in flight >= 0.3x
DEALER/ROUTER, durable one-way >= 0.5x the store's batched insert rate. The machine is shared and
noisy: compare ratios, not absolute figures. Writes bench/results/messenger.json.
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory (bench/http.py, ...) would shadow the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import zmq

import homing
from homing.messenger import Incoming, Messenger

BODY = b"x" * 100
HERE = Path(__file__).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def endpoints(transport: str, tmp: Path, tag: str) -> tuple[str, str]:
    if transport == "tcp":
        return f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
    return f"ipc://{tmp}/{tag}.sock", f"ipc://{tmp}/{tag}-ctl.sock"


# -- servers (run in a subprocess) -------------------------------------------------------
def serve(kind: str, endpoint: str, control: str, store: str | None) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    if kind == "zmq-dealer-router":
        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.bind(endpoint)
        print("ready", flush=True)
        threading.Thread(target=_echo_router, args=(router,), daemon=True).start()
    elif kind == "zmq-push-pull":
        ctx = zmq.Context()
        pull, ctl = ctx.socket(zmq.PULL), ctx.socket(zmq.ROUTER)
        pull.setsockopt(zmq.RCVHWM, 100_000)
        pull.bind(endpoint)
        ctl.bind(control)
        print("ready", flush=True)
        threading.Thread(target=_count_pull, args=(pull, ctl), daemon=True).start()
    else:
        db = None
        if kind == "homing-durable":
            assert store is not None
            connected = homing.connect(store)
            assert isinstance(connected, homing.Database)
            db = connected
        m = Messenger("bench-server", db=db).start()

        def echo(msg: Incoming) -> None:
            if msg.dest_cb == 0 and msg.source_cb != 0:
                msg.reply(msg.body)

        m.listen(endpoint, echo)
        print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    os._exit(0)


def _echo_router(router: zmq.Socket[Any]) -> None:
    while True:
        router.send_multipart(router.recv_multipart())


def _count_pull(pull: zmq.Socket[Any], ctl: zmq.Socket[Any]) -> None:
    poller = zmq.Poller()
    poller.register(pull, zmq.POLLIN)
    poller.register(ctl, zmq.POLLIN)
    count, waiter = 0, None
    target = -1
    while True:
        for sock, _ in poller.poll():
            if sock is pull:
                pull.recv()
                count += 1
            else:
                ident, want = ctl.recv_multipart()
                waiter, target = ident, int(want)
        if waiter is not None and count >= target:
            ctl.send_multipart([waiter, str(count).encode()])
            count, waiter, target = 0, None, -1


class Server:
    def __init__(self, kind: str, endpoint: str, control: str, store: str | None) -> None:
        cmd = [sys.executable, str(HERE), "--serve", kind, "--endpoint", endpoint]
        cmd += ["--control", control] + (["--store", store] if store else [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"{kind} server did not start: {line!r}")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# -- clients -----------------------------------------------------------------------------
def _percentiles(lat: list[float]) -> dict[str, float]:
    lat = sorted(lat)
    return {
        "p50_us": round(lat[len(lat) // 2] * 1e6, 1),
        "p99_us": round(lat[max(0, int(len(lat) * 0.99) - 1)] * 1e6, 1),
    }


def raw_latency(endpoint: str, n: int) -> dict[str, Any]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send(BODY)
    s.recv()  # warm up / connected
    lat = []
    t0 = time.perf_counter()
    for _ in range(n):
        t = time.perf_counter()
        s.send(BODY)
        s.recv()
        lat.append(time.perf_counter() - t)
    elapsed = time.perf_counter() - t0
    s.close(0)
    ctx.term()
    return {"rate": n / elapsed, **_percentiles(lat)}


def raw_throughput(endpoint: str, n: int, window: int = 256) -> dict[str, Any]:
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(endpoint)
    s.send(BODY)
    s.recv()
    t0 = time.perf_counter()
    sent = received = 0
    while received < n:
        while sent < n and sent - received < window:
            s.send(BODY)
            sent += 1
        s.recv()
        received += 1
    elapsed = time.perf_counter() - t0
    s.close(0)
    ctx.term()
    return {"rate": n / elapsed}


def raw_one_way(endpoint: str, control: str, n: int) -> dict[str, Any]:
    ctx = zmq.Context()
    push, ctl = ctx.socket(zmq.PUSH), ctx.socket(zmq.DEALER)
    push.setsockopt(zmq.SNDHWM, 100_000)
    push.connect(endpoint)
    ctl.connect(control)
    t0 = time.perf_counter()
    ctl.send(str(n).encode())
    for _ in range(n):
        push.send(BODY)
    ctl.recv()
    elapsed = time.perf_counter() - t0
    push.close(0)
    ctl.close(0)
    ctx.term()
    return {"rate": n / elapsed}


def _client(durable: bool, store: str | None) -> tuple[Messenger, homing.Database | None]:
    db = None
    if durable:
        assert store is not None
        connected = homing.connect(store)
        assert isinstance(connected, homing.Database)
        db = connected
    return Messenger("bench-client", db=db).start(), db


def homing_latency(endpoint: str, n: int, durable: bool, store: str | None) -> dict[str, Any]:
    m, db = _client(durable, store)
    got = threading.Event()
    m.register_callback("got", lambda _r: got.set())
    lat = []
    try:
        for i in range(n + 1):
            got.clear()
            t = time.perf_counter()
            m.send(endpoint, BODY, "got")
            if not got.wait(30):
                raise RuntimeError("no reply within 30s")
            if i:  # the first one connects
                lat.append(time.perf_counter() - t)
        m.wait_idle(10)
    finally:
        m.close()
        if db is not None:
            db.close()
    return {"rate": n / sum(lat), **_percentiles(lat)}


def homing_throughput(
    endpoint: str, n: int, durable: bool, store: str | None, reply: bool
) -> dict[str, Any]:
    m, db = _client(durable, store)
    done = threading.Event()
    count = [0]
    lock = threading.Lock()

    def on_reply(_r: Incoming) -> None:
        with lock:
            count[0] += 1
            if count[0] == n:
                done.set()

    m.register_callback("count", on_reply)
    callback: str | int = "count" if reply else 0
    warm = threading.Event()
    m.register_callback("warm", lambda _r: warm.set())
    m.send(endpoint, BODY, "warm")
    warm.wait(30)
    m.wait_idle(10)
    try:
        t0 = time.perf_counter()
        batch = 100
        for start in range(0, n, batch):
            m.send_many(endpoint, [BODY] * min(batch, n - start), callback)
        if reply:
            if not done.wait(300):
                raise RuntimeError(f"only {count[0]} of {n} replies")
        if not m.wait_idle(300):
            raise RuntimeError("messages still unacknowledged after 300s")
        elapsed = time.perf_counter() - t0
        stats = m.stats()
    finally:
        m.close()
        if db is not None:
            db.close()
    return {"rate": n / elapsed, "retransmits": stats["retransmits"]}


def store_batched_insert(store: str, n: int, batch: int = 100) -> dict[str, Any]:
    """The store's own batched insert rate: ``insert_many`` of ``batch`` rows per commit."""
    db = homing.connect(store)
    assert isinstance(db, homing.Database)
    try:
        db.insert_many([("bench.warm", {"b": "x"})])
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            db.insert_many([("bench.row", {"b": "x" * 100})] * min(batch, n - start))
        elapsed = time.perf_counter() - t0
    finally:
        db.close()
    return {"rate": n / elapsed}


def _store_url(backend: str, tmp: Path, tag: str) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp}/{tag}.db"
    base = os.environ.get("HOMING_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
    return f"{base}?schema=bench_messenger_{tag}_{os.getpid()}"


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix="homing-bench-msg-"))
    k = 0
    for transport in ("tcp", "ipc"):
        for system in (
            "zmq-dealer-router", "zmq-push-pull", "store-batched-insert", "homing-memory",
            "homing-durable",
        ):  # fmt: skip
            k += 1
            if system == "store-batched-insert":
                if transport != "tcp":
                    continue  # no transport involved: measured once
                store = _store_url(args.backend, tmp, f"ins{k}")
                result = store_batched_insert(store, args.durable_n)
                for t in ("tcp", "ipc"):
                    row = {"transport": t, "system": system, "workload": "one-way"}
                    row |= {"n": args.durable_n, "rate": round(result["rate"], 1)}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
                continue
            durable = system == "homing-durable"
            endpoint, control = endpoints(transport, tmp, f"s{k}")
            server_store = _store_url(args.backend, tmp, f"srv{k}") if durable else None
            client_store = _store_url(args.backend, tmp, f"cli{k}") if durable else None
            server = Server(system, endpoint, control, server_store)
            n = args.durable_n if durable else args.n
            lat_n = max(50, n // 10)
            try:
                work: list[tuple[str, int, Callable[[], dict[str, Any]]]] = []
                if system == "zmq-dealer-router":
                    work += [
                        ("rt-latency", lat_n, partial(raw_latency, endpoint, lat_n)),
                        ("rt-throughput", n, partial(raw_throughput, endpoint, n)),
                    ]
                elif system == "zmq-push-pull":
                    work += [("one-way", n, partial(raw_one_way, endpoint, control, n))]
                else:
                    work += [
                        (
                            "rt-latency",
                            lat_n,
                            partial(homing_latency, endpoint, lat_n, durable, client_store),
                        ),
                        (
                            "rt-throughput",
                            n,
                            partial(homing_throughput, endpoint, n, durable, client_store, True),
                        ),
                        (
                            "one-way",
                            n,
                            partial(homing_throughput, endpoint, n, durable, client_store, False),
                        ),
                    ]
                for workload, count, fn in work:
                    result = fn()
                    row = {"transport": transport, "system": system, "workload": workload}
                    row |= {"n": count, **{k2: round(v, 1) for k2, v in result.items()}}
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                server.stop()
    return rows


def ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {"rt-latency": "zmq-dealer-router", "rt-throughput": "zmq-dealer-router"}
    base["one-way"] = "zmq-push-pull"
    out = []
    pairs = [(r, base[r["workload"]]) for r in rows if r["system"].startswith("homing")]
    pairs += [(r, "store-batched-insert") for r in rows
              if r["system"] == "homing-durable" and r["workload"] == "one-way"]  # fmt: skip
    for r, baseline in pairs:
        b = next(
            x
            for x in rows
            if x["transport"] == r["transport"]
            and x["workload"] == r["workload"]
            and x["system"] == baseline
        )
        out.append(
            {
                "transport": r["transport"],
                "workload": r["workload"],
                "system": r["system"],
                "baseline": b["system"],
                "rate_ratio": round(r["rate"] / b["rate"], 4),
                **(
                    {"p50_ratio": round(r["p50_us"] / b["p50_us"], 2)}
                    if "p50_us" in r and "p50_us" in b
                    else {}
                ),
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50000, help="messages per memory-mode run")
    parser.add_argument("--durable-n", type=int, default=2000)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--out", default=str(HERE.parent / "results" / "messenger.json"))
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--control", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.endpoint, args.control, args.store)
        return 0
    started = time.time()
    rows = run(args)
    result = {
        "benchmark": "messenger",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_at_start": os.getloadavg(),
            "pyzmq": zmq.__version__,
            "libzmq": zmq.zmq_version(),
            "note": "shared, noisy machine: compare ratios, not absolute figures",
        },
        "settings": {
            "n": args.n,
            "durable_n": args.durable_n,
            "backend": args.backend,
            "body_bytes": len(BODY),
        },
        "results": rows,
        "ratios": ratios(rows),
        "median_rate_ratio": {
            system: statistics.median(
                x["rate_ratio"] for x in ratios(rows) if x["system"] == system
            )
            for system in ("homing-memory", "homing-durable")
        },
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    for r in result["ratios"]:
        print(
            f"{r['transport']:4} {r['workload']:14} {r['system']:15} / {r['baseline']:18} "
            f"rate x{r['rate_ratio']:.3f}"
            + (f"  p50 x{r['p50_ratio']}" if "p50_ratio" in r else "")
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
