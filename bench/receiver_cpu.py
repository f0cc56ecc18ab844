"""CPU of the HTTP receiver's server process per durable message, two versions alternated.

    .venv/bin/python bench/receiver_cpu.py --base REV [--backend sqlite|postgres]
        [--pairs 3] [--n 30000]
    .venv/bin/python bench/receiver_cpu.py --versus-plain [--backend ...] [--pairs 2]

The receiver cell of ``bench/http.py`` (and of ``bench.ab``) reports messages per second
with the client, the server and the store on the same two cores: its pairs swing by
+-15% on this machine. This measures the server alone: ``bench/http.py``'s server (a
``Receiver`` with a no-op node, uvicorn) runs on REV's ``src`` (a temporary git worktree)
and on the working tree's, alternately, and after a warm-up of 2,000 messages receives
``--n`` Option 2 messages (32 concurrent, homing's HTTP client). Reported per run: the
rate, and the server process's CPU time (user + system, from /proc) per message. Linux only.

``--versus-plain``: the working tree only, one server; its bare no-op endpoint (the
target's baseline: plain POSTs, same client, same concurrency) and the receiver's durable
path alternated in it, each with the server's and this client process's CPU per message.
"""

# ruff: noqa: E402
from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's directory would shadow the standard library's ``http``.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from bench.common import proc_stat, revision_tree
from bench.http import SERVER, drop, free_port, post_plain, post_to_receiver, store_url
from homing.http._client import Client


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a live process."""
    return proc_stat(pid)[1]


async def drive_plain(base: str, n: int) -> float:
    """``n`` plain POSTs to the server's bare no-op endpoint, 32 concurrent."""
    return await _drive(base, n, post_plain)


async def drive(base: str, n: int) -> float:
    """``n`` durable Option 2 messages to the receiver's no-op node, 32 concurrent."""
    return await _drive(base, n, post_to_receiver)


async def _drive(base: str, n: int, post: Any) -> float:
    async with Client(max_connections=32, timeout=30) as client:
        counter = iter(range(n))

        async def worker() -> None:
            for i in counter:
                await post(client, base, i)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(32)))
        return n / (time.perf_counter() - started)


def _start(src: Path, url: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, url, str(port)],
        env={**os.environ, "PYTHONPATH": str(src)},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            asyncio.run(drive(base, 1))
            return server, base
        except Exception:
            if time.monotonic() > deadline or server.poll() is not None:
                server.terminate()
                raise
            time.sleep(0.2)


def one_run(src: Path, backend: str, n: int, tmp: Path, name: str) -> tuple[float, float]:
    url = store_url(backend, name, tmp)
    server, base = _start(src, url)
    try:
        asyncio.run(drive(base, 2000))
        before = cpu_seconds(server.pid)
        rate = asyncio.run(drive(base, n))
        time.sleep(0.5)  # the handling of the last messages, after their 204
        return rate, (cpu_seconds(server.pid) - before) / n * 1e6
    finally:
        server.terminate()
        server.wait(30)
        drop(url)


def versus_plain(backend: str, n: int, pairs: int, tmp: Path) -> None:
    url = store_url(backend, "plain", tmp)
    server, base = _start(ROOT / "src", url)
    try:
        asyncio.run(drive(base, 2000))
        asyncio.run(drive_plain(base, 2000))
        for i in range(pairs):
            for label, run in (("bare no-op", drive_plain), ("receiver", drive)):
                before, mine = cpu_seconds(server.pid), time.process_time()
                rate = asyncio.run(run(base, n))
                client = time.process_time() - mine
                time.sleep(0.5)  # the handling of the last messages, after their 204
                server_us = (cpu_seconds(server.pid) - before) / n * 1e6
                print(
                    f"{i + 1} {label:>10} {backend}: {rate:,.0f} msgs/s, server CPU "
                    f"{server_us:.0f} us/msg, client CPU {client / n * 1e6:.0f} us/msg",
                    flush=True,
                )
    finally:
        server.terminate()
        server.wait(30)
        drop(url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base", help="a git revision to compare with")
    ap.add_argument(
        "--versus-plain", action="store_true", help="the receiver against the bare endpoint"
    )
    ap.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--n", type=int, default=30000)
    args = ap.parse_args()
    print(f"# {' '.join(sys.argv)}  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})")
    if args.versus_plain:
        with tempfile.TemporaryDirectory() as stores:
            versus_plain(args.backend, args.n, args.pairs, Path(stores))
        return
    if args.base is None:
        ap.error("--base REV (or --versus-plain)")
    with revision_tree(args.base) as tree, tempfile.TemporaryDirectory() as stores:
        for i in range(args.pairs):
            for side, label, src in (
                ("base", args.base, tree / "src"),
                ("head", "working tree", ROOT / "src"),
            ):
                rate, cpu = one_run(src, args.backend, args.n, Path(stores), f"r{i}_{side}")
                print(
                    f"{i + 1} {label:>12} {args.backend}: {rate:,.0f} msgs/s, "
                    f"server CPU {cpu:.0f} us/msg",
                    flush=True,
                )


if __name__ == "__main__":
    main()
