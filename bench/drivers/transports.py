"""The transports homing's messenger and HTTP receiver are built on, bare, as baselines.

- ``zmq-pushpull``: PUSH -> PULL, fire and forget, no acknowledgement (in memory).
- ``zmq-dealer-router``: DEALER -> ROUTER with an ack reply per message; the producer
  waits for each ack (one per call), or sends a batch and then waits for its acks.
- ``starlette``: a no-op ``POST /msg`` (204) on uvicorn, one server process; the producer
  posts sequentially over one keep-alive connection (httpx).
Nothing is stored: these are the ceilings for "durable messages/s" over the same wire.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from bench.common import Tally, payload_bytes
from bench.drivers import Driver


def _ports(n: int) -> list[int]:
    out = []
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        out.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return out


class _Transport(Driver):
    family = "transport"
    durability = "none (in memory)"
    startup_s = 0.3

    def reset(self) -> None:
        self.ports = _ports(4)

    def settings(self) -> dict[str, Any]:
        import zmq

        return {"pyzmq": zmq.__version__, "libzmq": zmq.zmq_version()}


class ZmqPushPull(_Transport):
    name = "zmq-pushpull"

    def consume(self, slot: int) -> None:
        import zmq

        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.bind(f"tcp://127.0.0.1:{self.ports[slot]}")
        while True:
            msg = sock.recv()
            Tally.started(msg)
            Tally.done()

    def open_producer(self) -> Any:
        return _PushProducer(self.ports)


class _PushProducer:
    def __init__(self, ports: list[int]) -> None:
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.PUSH)
        for port in ports[:2]:
            self.sock.connect(f"tcp://127.0.0.1:{port}")

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.sock.send(payload_bytes(i))

    def close(self) -> None:
        self.sock.close(linger=2000)  # PUSH has no ack: let queued messages reach the peer


class ZmqDealerRouter(_Transport):
    name = "zmq-dealer-router"
    batch_ok = True

    def consume(self, slot: int) -> None:
        import zmq

        sock = zmq.Context.instance().socket(zmq.ROUTER)
        sock.bind(f"tcp://127.0.0.1:{self.ports[slot]}")
        while True:
            ident, msg = sock.recv_multipart()
            Tally.started(msg)
            sock.send_multipart([ident, b"ack"])
            Tally.done()

    def open_producer(self) -> Any:
        return _DealerProducer(self.ports)


class _DealerProducer:
    def __init__(self, ports: list[int]) -> None:
        import zmq

        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        for port in ports[:2]:
            self.sock.connect(f"tcp://127.0.0.1:{port}")

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            self.sock.send(payload_bytes(i))
        for _ in seqs:
            self.sock.recv()

    def close(self) -> None:
        self.sock.close(linger=0)


class StarletteNoop(_Transport):
    name = "starlette"
    consumers = 1
    startup_s = 0.2

    def settings(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {
            "starlette": version("starlette"),
            "uvicorn": version("uvicorn"),
            "httpx": version("httpx"),
            "server": "uvicorn, 1 process, log_level=warning, access_log off",
        }

    def consume(self, slot: int) -> None:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import Response
        from starlette.routing import Route

        async def msg(request: Request) -> Response:
            body = await request.body()
            Tally.started(body)
            Tally.done()
            return Response(status_code=204)

        app = Starlette(routes=[Route("/msg", msg, methods=["POST"])])
        uvicorn.run(
            app, host="127.0.0.1", port=self.ports[0], log_level="warning", access_log=False
        )

    def open_producer(self) -> Any:
        return _HttpProducer(self.ports[0])


class _HttpProducer:
    def __init__(self, port: int) -> None:
        import httpx

        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 10
        while True:  # the server may still be binding
            try:
                self.client.get("/")
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        self.pid = os.getpid()

    def send(self, seqs: list[int]) -> None:
        for i in seqs:
            r = self.client.post("/msg", content=payload_bytes(i))
            if r.status_code != 204:
                raise RuntimeError(f"POST /msg answered {r.status_code}")

    def close(self) -> None:
        self.client.close()
