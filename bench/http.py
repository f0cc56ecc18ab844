"""Benchmark of reliable HTTP (seed 000): durable send (Option 2) and put (Option 1)
against plain POSTs to a no-op endpoint of the same uvicorn server (the baselines: with
httpx, and with the dispatcher's own client, which costs less CPU than httpx).

    .venv/bin/python bench/http.py [--backend sqlite|postgres] [--n 2000] [--concurrency 32]

The receiver runs in a subprocess (uvicorn, one worker); the sender and its dispatcher in
this process. Both stores are durable (SQLite synchronous=FULL / PostgreSQL default).
Writes bench/results/http.json.
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory would shadow the standard library's ``http``.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
import time
import uuid
from typing import Any

import httpx

import homing
from homing.http import AsyncSender, batch_wire
from homing.http._client import Client

PG = os.environ.get("HOMING_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")

SERVER = r"""
import sys, socket, uvicorn, homing
from starlette.responses import Response
from starlette.routing import Route
from homing.http import Receiver
db = homing.connect(sys.argv[1])
receiver = Receiver(db, dispatch=False)
receiver.add_node("/noop", lambda body, tx: None)
async def plain(request):
    await request.body()
    return Response(status_code=204)
receiver.app.router.routes.insert(0, Route("/plain", plain, methods=["POST"]))
sock = socket.socket(); sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(sys.argv[2])))
uvicorn.Server(uvicorn.Config(receiver.app, log_level="error")).run(sockets=[sock])
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def store_url(backend: str, name: str, tmp: Path) -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp / (name + '.db')}"
    schema = f"bench_{name}_{os.getpid()}"
    return f"{PG}?schema={schema}"


def drop(url: str) -> None:
    if "schema=" in url:
        import psycopg

        schema = url.rsplit("schema=", 1)[1]
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def summary(name: str, latencies: list[float], elapsed: float) -> dict[str, Any]:
    lat = sorted(latencies)
    return {
        "name": name,
        "messages": len(lat),
        "msgs_per_s": round(len(lat) / elapsed, 1),
        "p50_ms": round(statistics.median(lat) * 1000, 2),
        "p99_ms": round(lat[int(len(lat) * 0.99) - 1] * 1000, 2),
    }


async def closed_loop(n: int, concurrency: int, one: Any) -> tuple[list[float], float]:
    latencies: list[float] = []
    counter = iter(range(n))

    async def worker() -> None:
        for i in counter:
            t = time.perf_counter()
            await one(i)
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, time.perf_counter() - t0


async def post_to_receiver(client: Client, base: str, i: int) -> None:
    """One durable Option 2 message to the receiver's no-op node, answered 204."""
    r = await client.request(
        "POST",
        base + "/noop",
        content=json.dumps({"i": i}).encode(),
        headers={
            "content-type": "application/json",
            "homing-message-id": str(uuid.uuid4()),
            "homing-mode": "send",
        },
    )
    assert r.status_code == 204, r.status_code


async def post_plain(client: Client, base: str, i: int) -> None:
    """One plain POST to the server's bare no-op endpoint (the receiver's baseline)."""
    r = await client.request(
        "POST",
        base + "/plain",
        content=json.dumps({"i": i}).encode(),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 204, r.status_code


async def post_batch_to_receiver(client: Client, base: str, i: int, per: int) -> None:
    """``per`` durable Option 2 messages to the no-op node in one batch request."""
    messages = [
        batch_wire.BatchMessage(
            "POST",
            "/noop",
            {
                "content-type": "application/json",
                "homing-message-id": str(uuid.uuid4()),
                "homing-mode": "send",
            },
            json.dumps({"i": i * per + k}).encode(),
        )
        for k in range(per)
    ]
    r = await client.request(
        "POST",
        base + "/_homing/batch",
        content=batch_wire.encode_batch(messages),
        headers={"content-type": batch_wire.BATCH_TYPE},
    )
    assert r.status_code == 200, r.status_code
    assert all(s == 204 for s, _ in batch_wire.decode_results(r.content, per))


def unhandled(rdb: homing.Database) -> int:
    with rdb.store.transaction(write=False) as tx:
        row = tx.query_one("SELECT COUNT(*) FROM homing_http_inbox WHERE state = 'received'")
    return int(row[0]) if row else 0


async def drained(rdb: homing.Database) -> float:
    """Seconds until the receiver handled every stored message (its background work
    belongs to its round, not to the next round's plain POSTs)."""
    started = time.perf_counter()
    while await asyncio.to_thread(unhandled, rdb):
        await asyncio.sleep(0.005)
    return time.perf_counter() - started


async def run(
    args: argparse.Namespace, base: str, sdb: homing.Database, rdb: homing.Database
) -> list[dict[str, Any]]:
    results = []
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:

        async def plain(i: int) -> None:
            r = await client.post(base + "/plain", json={"i": i})
            assert r.status_code == 204

        await closed_loop(200, args.concurrency, plain)  # warm-up
        results.append(
            summary("plain httpx POST", *await closed_loop(args.n, args.concurrency, plain))
        )
    # The same bare endpoint called with the dispatcher's own HTTP client: homing's send
    # against this one measures the durable receiver and outbox, not httpx's client cost.
    async with Client(max_connections=args.concurrency, timeout=30) as lean:

        async def plain_lean(i: int) -> None:
            await post_plain(lean, base, i)

        async def receive(i: int) -> None:
            await post_to_receiver(lean, base, i)

        await closed_loop(200, args.concurrency, plain_lean)  # warm-up
        await closed_loop(200, args.concurrency, receive)
        await drained(rdb)
        # The receiver alone against the bare endpoint, alternated in rounds so that the
        # machine's drift hits both alike; each keeps its own figure. A receiver round
        # ends when every message it stored was also handled.
        plain_lat: list[float] = []
        recv_lat: list[float] = []
        plain_s = recv_s = 0.0
        for _ in range(args.rounds):
            lat, took = await closed_loop(args.n, args.concurrency, plain_lean)
            plain_lat += lat
            plain_s += took
            lat, took = await closed_loop(args.n, args.concurrency, receive)
            recv_lat += lat
            recv_s += took + await drained(rdb)
        results.append(summary("plain POST (homing's client)", plain_lat, plain_s))
        results.append(summary("homing receiver (Option 2)", recv_lat, recv_s))
        if "batch" in set(args.only.split(",")):
            # the receiver alone again, the same messages posted 32 a request (batch_wire);
            # a latency is a batch's, the rate counts messages
            per = 32

            async def receive_batch(i: int) -> None:
                await post_batch_to_receiver(lean, base, i, per)

            lat, took = await closed_loop(
                args.n // per, max(1, args.concurrency // 8), receive_batch
            )
            took += await drained(rdb)
            row = summary(f"homing receiver (Option 2, batches of {per})", lat, took)
            row["messages"] = len(lat) * per
            row["msgs_per_s"] = round(len(lat) * per / took, 1)
            results.append(row)
    async with AsyncSender(
        sdb, per_destination=args.concurrency, max_in_flight=args.concurrency
    ) as s:

        async def send(i: int) -> None:
            await s.send(base + "/noop", {"i": i})

        async def put(i: int) -> None:
            await s.put(base + "/noop", {"i": i})

        only = set(args.only.split(","))
        if "send" in only:
            results.append(
                summary(
                    "homing send (Option 2)", *await closed_loop(args.n, args.concurrency, send)
                )
            )
        if "put" in only:
            results.append(
                summary("homing put (Option 1)", *await closed_loop(args.n, args.concurrency, put))
            )
    if "batch" in set(args.only.split(",")):
        # the same sends, the sender batching them (batch_wire): one request a batch
        async with AsyncSender(
            sdb,
            per_destination=args.concurrency,
            max_in_flight=args.concurrency,
            batch=args.concurrency,
        ) as b:

            async def send_batched(i: int) -> None:
                await b.send(base + "/noop", {"i": i})

            await closed_loop(200, args.concurrency, send_batched)  # learns the batch URL
            results.append(
                summary(
                    f"homing send (Option 2, batch {args.concurrency})",
                    *await closed_loop(args.n, args.concurrency, send_batched),
                )
            )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternated rounds of bare vs receiver (default 3)"
    )
    parser.add_argument(
        "--only",
        default="send,put,batch",
        help="which of send,put,batch (sender to receiver; batch: send with the sender "
        "batching) to run besides the receiver alone",
    )
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "http.json"))
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="homing-bench-http-"))
    rurl, surl = store_url(args.backend, "recv", tmp), store_url(args.backend, "send", tmp)
    homing.connect(rurl).close()  # migrate before the server starts
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, rurl, str(port)])
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                httpx.get(base + "/_homing/info", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        sdb = homing.connect(surl)
        assert isinstance(sdb, homing.Database)
        rdb = homing.connect(rurl)
        assert isinstance(rdb, homing.Database)
        results = asyncio.run(run(args, base, sdb, rdb))
        sdb.close()
        rdb.close()
    finally:
        server.terminate()
        server.wait()
        drop(rurl)
        drop(surl)
    plain = results[0]["msgs_per_s"]
    lean = results[1]["msgs_per_s"]
    for r in results:
        r["ratio_to_plain"] = round(r["msgs_per_s"] / plain, 3)
        r["ratio_to_plain_same_client"] = round(r["msgs_per_s"] / lean, 3)
    report = {
        "benchmark": "http",
        "backend": args.backend,
        "concurrency": args.concurrency,
        "machine": f"{platform.machine()} {os.cpu_count()} cores (shared, noisy)",
        "results": results,
    }
    out = Path(args.out)
    old = json.loads(out.read_text()) if out.exists() else {}
    old = old if isinstance(old, dict) and "runs" in old else {"runs": {}}
    old["runs"][args.backend] = report
    out.write_text(json.dumps(old, indent=2) + "\n")
    for r in results:
        print(
            f"{r['name']:24} {r['msgs_per_s']:8.1f} msg/s  p50 {r['p50_ms']:7.2f} ms  "
            f"p99 {r['p99_ms']:7.2f} ms  x{r['ratio_to_plain']} (httpx)  "
            f"x{r['ratio_to_plain_same_client']} (same client)"
        )


if __name__ == "__main__":
    main()
