"""Request/reply round trips per second through sessions (Transactions 0-3), 1 and 16 clients.

    python bench/sessions_roundtrip.py [--seconds 5] [--postgres URL] [--json out.json]

Each client thread loops: submit (T0 + T1), wait for the reply, take it (T3); server
threads answer (T2). Durable commits (SQLite synchronous=FULL, PostgreSQL fsync) as in
production. Prints one row per backend, client count and placement: the servers as
threads of the clients' process ("one process": on SQLite a commit there wakes the other
threads at once) or in a process of their own ("apart": on SQLite the waiters poll,
10 ms doubling to 50 ms; on PostgreSQL LISTEN/NOTIFY either way).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import homing
from bench.latency_proxy import round_trip_s
from homing.sessions import Server, Sessions

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def _serve_apart(url: str, servers: int, ready: Any, stop: Any) -> None:
    """The servers' own process (``apart``): answer until ``stop`` is set."""
    db = homing.connect(url, pool_size=servers + 4)
    assert isinstance(db, homing.Database)
    done = threading.Event()
    srv = [Server(db, "bench", lambda r, t: r.body) for _ in range(servers)]
    threads = [
        threading.Thread(target=s.run, args=(done,), kwargs={"idle_wait": 0.05}) for s in srv
    ]
    for t in threads:
        t.start()
    ready.set()
    stop.wait()
    done.set()
    for t in threads:
        t.join()
    db.close()


def run_one(
    url: str, clients: int, servers: int, seconds: float, apart: bool = False
) -> dict[str, Any]:
    db = homing.connect(url, pool_size=clients + servers + 4)
    assert isinstance(db, homing.Database)
    if db.dialect == "postgres":
        # The schema is reused from run to run, and a server without autovacuum (this
        # one) keeps every dead row of the runs before: each run would start slower than
        # the last, and an A/B would favour whichever tree ran first.
        db.store.vacuum_if_due(0)
    api = Sessions(db)
    stop = threading.Event()
    counts = [0] * clients
    latencies: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        session = api.open(f"bench-{k}")
        mine: list[float] = []
        while not stop.is_set():
            t0 = time.perf_counter()
            request = session.submit("bench", {"k": k, "n": counts[k]})
            reply = session.take_reply(request_id=request.id, timeout=30)
            if reply is None:
                continue
            mine.append(time.perf_counter() - t0)
            counts[k] += 1
        with lock:
            latencies.extend(mine)

    server_stop = threading.Event()
    server_threads: list[threading.Thread] = []
    apart_proc = None
    if apart:
        ctx = multiprocessing.get_context("spawn")
        ready, apart_stop = ctx.Event(), ctx.Event()
        apart_proc = ctx.Process(target=_serve_apart, args=(url, servers, ready, apart_stop))
        apart_proc.start()
        if not ready.wait(60):
            raise RuntimeError("the servers' process did not start")
    else:
        srv = [Server(db, "bench", lambda r, t: r.body) for _ in range(servers)]
        server_threads = [
            threading.Thread(target=s.run, args=(server_stop,), kwargs={"idle_wait": 0.05})
            for s in srv
        ]
    client_threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in server_threads:
        t.start()
    start = time.perf_counter()
    for t in client_threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in client_threads:
        t.join()
    elapsed = time.perf_counter() - start
    server_stop.set()
    for t in server_threads:
        t.join()
    if apart_proc is not None:
        apart_stop.set()
        apart_proc.join(60)
    Sessions(db).gc(older_than=0)
    db.close()
    latencies.sort()
    total = sum(counts)

    def pct(p: float) -> float:
        return (
            latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0
        )

    return {
        "backend": url.split(":", 1)[0],
        "clients": clients,
        "servers": servers,
        "servers_in": "own process" if apart else "clients' process",
        "round_trips": total,
        "seconds": round(elapsed, 2),
        "round_trips_per_s": round(total / elapsed, 1),
        "p50_ms": round(pct(0.5), 2),
        "p99_ms": round(pct(0.99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--postgres", default=DEFAULT_PG)
    parser.add_argument("--clients", default="1,16")
    parser.add_argument("--json", dest="json_path", default=None)
    parser.add_argument(
        "--backends",
        default="sqlite,postgres",
        help="which of sqlite,postgres (with --postgres through bench/latency_proxy.py, a "
        "server some way off)",
    )
    parser.add_argument("--placements", default="one,apart", help="one process, apart, or both")
    args = parser.parse_args()
    results = []
    tmp = tempfile.mkdtemp(prefix="homing-sessions-bench-")
    schema = "homing_bench_sessions"  # reused between runs; gc() empties it
    sep = "&" if "?" in args.postgres else "?"
    targets = [
        ("sqlite", f"sqlite:///{tmp}/bench.db", 1),
        ("postgres", f"{args.postgres}{sep}schema={schema}", 2),
    ]
    backends = args.backends.split(",")
    placements = [p == "apart" for p in args.placements.split(",")]
    for backend, url, servers in targets:
        if backend not in backends:
            continue
        if backend == "postgres":  # how far the server is (bench/latency_proxy.py)
            print(f"postgresql SELECT 1 round trip {round_trip_s(url) * 1e6:,.0f} us", flush=True)
        for apart in placements:
            for clients in (int(c) for c in args.clients.split(",")):
                row = run_one(url, clients, servers, args.seconds, apart)
                results.append(row)
                where = "apart      " if apart else "one process"
                print(
                    f"{row['backend']:10} {where} clients={clients:3} servers={servers} "
                    f"{row['round_trips_per_s']:8.1f} round trips/s  p50 {row['p50_ms']:.1f} "
                    f"ms  p99 {row['p99_ms']:.1f} ms",
                    flush=True,
                )
    if args.json_path:
        with open(args.json_path, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
