"""A TCP proxy that delays every chunk by a fixed time: a database "over the network" here.

    .venv/bin/python -m bench.latency_proxy --listen 127.0.0.1:55432 --to 127.0.0.1:5432 \
        --delay-ms 0.25

The benchmarks run against PostgreSQL on 127.0.0.1, where a round trip costs ~20-40 us;
in production the server is usually on another host, 0.2-1 ms away, and a path's round
trips then count for more than its statements' CPU. This adds ``--delay-ms`` each way
(so a round trip gains about twice that), keeping each connection's byte order: every
chunk is forwarded at ``arrival + delay``, in order, by a thread per direction that
sleeps until then (``time.sleep``: ~60 us late at worst here; asyncio's timers round to
whole milliseconds under epoll). ``tc netem`` would do it in the kernel, but this
machine's kernel has no netem qdisc. Run it as a process of its own, so that its threads
do not share the measured program's interpreter lock.
"""

from __future__ import annotations

import argparse
import collections
import socket
import threading
import time
from urllib.parse import urlsplit, urlunsplit


def _pipe(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    """Copy ``src`` to ``dst``, each chunk written ``delay_s`` after it was read."""
    pending: collections.deque[tuple[float, bytes]] = collections.deque()
    cond = threading.Condition()

    def sender() -> None:
        while True:
            with cond:
                while not pending:
                    cond.wait()
                due, data = pending.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        with cond:
            pending.append((time.monotonic() + delay_s, data))
            cond.notify()
        if not data:
            break
    thread.join()


def _serve(client: socket.socket, target: tuple[str, int], delay_s: float) -> None:
    try:
        upstream = socket.create_connection(target)
    except OSError:
        client.close()
        return
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    back = threading.Thread(target=_pipe, args=(upstream, client, delay_s), daemon=True)
    back.start()
    _pipe(client, upstream, delay_s)
    back.join()
    client.close()
    upstream.close()


def round_trip_s(url: str, tries: int = 3) -> float:
    """A ``SELECT 1`` round trip's seconds on a new connection to ``url`` (homing's own
    URL options, after ``?``, left out), the mean of ``tries`` after one to warm up."""
    import psycopg

    with psycopg.connect(url.split("?", 1)[0], autocommit=True) as conn:
        conn.execute("SELECT 1")
        t0 = time.perf_counter()
        for _ in range(tries):
            conn.execute("SELECT 1")
        return (time.perf_counter() - t0) / tries


class LatencyProxy:
    """The proxy on threads of this process: ``start()`` returns the port it listens on
    (127.0.0.1); forwards to ``target`` with ``delay_s`` added each way."""

    def __init__(self, target: tuple[str, int], delay_s: float, port: int = 0) -> None:
        self.target = target
        self.delay_s = delay_s
        self._server = socket.create_server(("127.0.0.1", port))
        self.port = int(self._server.getsockname()[1])

    @classmethod
    def before(cls, url: str, delay_s: float) -> LatencyProxy:
        """A proxy in front of the server of the PostgreSQL ``url``, not yet started."""
        parts = urlsplit(url)
        return cls((parts.hostname or "127.0.0.1", parts.port or 5432), delay_s)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by this proxy's (started)."""
        parts = urlsplit(url)
        netloc = parts.netloc.rsplit("@", 1)
        netloc[-1] = f"127.0.0.1:{self.port}"
        return urlunsplit(parts._replace(netloc="@".join(netloc)))

    def start(self) -> int:
        threading.Thread(target=self.serve_forever, name="latency-proxy", daemon=True).start()
        return self.port

    def serve_forever(self) -> None:
        """Accept and forward connections until ``close()``."""
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=_serve, args=(client, self.target, self.delay_s), daemon=True
            ).start()

    def close(self) -> None:
        """Stop accepting (open connections end with their ends)."""
        self._server.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--listen", default="127.0.0.1:55432")
    ap.add_argument("--to", default="127.0.0.1:5432")
    ap.add_argument("--delay-ms", type=float, default=0.25, help="added each way")
    args = ap.parse_args()
    host, port = args.to.rsplit(":", 1)
    proxy = LatencyProxy(
        (host, int(port)), args.delay_ms / 1000, int(args.listen.rsplit(":", 1)[1])
    )
    print(f"proxy 127.0.0.1:{proxy.port} -> {args.to}, +{args.delay_ms:g} ms each way", flush=True)
    proxy.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
