"""Client CPU per request: httpx, plain aiohttp and homing's dispatcher client (aiohttp
behind ``homing.http._client``), against one local no-op uvicorn server, 32 in flight.

    python -m bench.http_client_cpu [--n 4000] [--reps 3]   (a module: bench/http.py
    would shadow the standard library's http as a script)

Prints microseconds of client-process CPU per request (process_time), interleaved over
the repetitions; docs/http.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

BODY = b'{"a":1}' * 20
CONCURRENCY = 32
SERVER = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
"""


async def _measure(one: Callable[[], Awaitable[None]], n: int) -> float:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def task() -> None:
        async with gate:
            await one()

    await asyncio.gather(*[task() for _ in range(200)])  # warm the pool
    cpu = time.process_time()
    await asyncio.gather(*[task() for _ in range(n)])
    return (time.process_time() - cpu) / n * 1e6


async def _httpx(url: str, n: int) -> float:
    import httpx

    limits = httpx.Limits(max_connections=CONCURRENCY)
    async with httpx.AsyncClient(limits=limits) as c:

        async def one() -> None:
            await c.post(url, content=BODY, headers={"content-type": "application/json"})

        return await _measure(one, n)


async def _aiohttp(url: str, n: int) -> float:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=CONCURRENCY)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def one() -> None:
            async with s.post(url, data=BODY, headers={"content-type": "application/json"}) as r:
                await r.read()

        return await _measure(one, n)


async def _homing(url: str, n: int) -> float:
    from homing.http._client import Client

    async with Client(max_connections=CONCURRENCY, timeout=10) as c:

        async def one() -> None:
            await c.request("POST", url, content=BODY, headers={"content-type": "application/json"})

        return await _measure(one, n)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="homing-noop-asgi-"))
    (work / "_noop_asgi.py").write_text(SERVER)
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "_noop_asgi:app",
            "--app-dir",
            str(work),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
    )
    try:
        time.sleep(2)
        url = f"http://127.0.0.1:{port}/x"
        clients = {"httpx": _httpx, "aiohttp": _aiohttp, "homing (aiohttp)": _homing}
        results: dict[str, list[float]] = {k: [] for k in clients}
        for _ in range(args.reps):
            for name, run in clients.items():
                results[name].append(asyncio.run(run(url, args.n)))
        print(
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            f"n={args.n}",
            f"in flight={CONCURRENCY}",
        )
        for name, runs in results.items():
            runs_s = ", ".join(f"{r:.0f}" for r in runs)
            print(f"{name:18} median {sorted(runs)[len(runs) // 2]:7.0f} us CPU/request ({runs_s})")
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
