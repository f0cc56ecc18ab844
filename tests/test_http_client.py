"""The dispatcher's HTTP/1.1 client (homing.http._client) against raw asyncio servers:
keep-alive reuse, framing (length, chunked, until close), timeouts, connection limits,
redirects not followed, header injection refused, TLS verification (openssl-made
certificates), and the request-forgery pin."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from homing.http._client import Client, ConnectError, HttpError, RemoteProtocolError, RequestTimeout
from homing.http._netguard import RefusedAddress, pinning

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """(head, body) of one request, or None at the end of the stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    return head, await reader.readexactly(length)


async def serve(handler: Handler) -> tuple[asyncio.Server, int, list[int]]:
    """A server on a free port; the list counts its connections."""
    connections: list[int] = []

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            await handler(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], connections


async def echo_keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while (req := await read_request(reader)) is not None:
        head, body = req
        first = head.split(b"\r\n", 1)[0]
        out = first + b"|" + body
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nX-A: 1\r\nX-A: 2\r\n\r\n" % len(out)
        )
        writer.write(out)
        await writer.drain()


def run(coro: Awaitable[None]) -> None:
    asyncio.run(asyncio.wait_for(coro, 30))  # type: ignore[arg-type]


def test_keepalive_reuse_and_headers() -> None:
    async def main() -> None:
        server, port, conns = await serve(echo_keepalive)
        async with server, Client(max_connections=4, timeout=5) as client:
            for i in range(5):
                r = await client.request(
                    "POST",
                    f"http://127.0.0.1:{port}/p?q={i}",
                    content=b"x" * i,
                    headers={"content-type": "text/plain"},
                )
                assert r.status_code == 200
                assert r.content == b"POST /p?q=%d HTTP/1.1|" % i + b"x" * i
                assert r.headers["x-a"] == "1, 2"
        assert len(conns) == 1  # one connection, kept alive

    run(main())


def test_before_send_runs_once_connected_and_can_stop_the_request() -> None:
    """The dispatcher's rate-limit gate: awaited once a connection is made and before the
    request is written, once a request (not again on the stale-connection retry); what it
    raises ends the request unsent and gives the connection back to the pool."""
    requests: list[int] = []  # the connection each request line came on

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = len(conns)
        while await read_request(reader) is not None:
            requests.append(conn)
            if conn == 1 and len(requests) == 3:  # the server gave the connection up
                return
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()

    class Stop(Exception):
        pass

    seen: list[tuple[int, int]] = []

    async def gate() -> None:
        await asyncio.sleep(0.01)  # let the server see what was written so far
        seen.append((len(conns), len(requests)))

    async def refuse() -> None:
        raise Stop

    async def main() -> None:
        nonlocal conns
        server, port, conns = await serve(handler)
        url = f"http://127.0.0.1:{port}/x"
        async with server, Client(max_connections=1, timeout=5) as client:
            assert (await client.request("POST", url, before_send=gate)).status_code == 204
            assert seen == [(1, 0)]  # connected, nothing written yet
            with pytest.raises(Stop):
                await client.request("POST", url, before_send=refuse)
            assert requests == [1]  # not sent; and its connection is free again (1 max)
            assert (await client.request("POST", url, before_send=gate)).status_code == 204
            assert seen == [(1, 0), (1, 1)] and requests == [1, 1]
            # the server drops the kept-alive connection: sent again on a new one, the
            # gate not asked again
            assert (await client.request("POST", url, before_send=gate)).status_code == 204
            assert seen == [(1, 0), (1, 1), (1, 2)] and requests == [1, 1, 1, 2]

    conns: list[int] = []
    run(main())


def test_chunked_and_until_close_bodies_and_redirect_not_followed() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        req = await read_request(reader)
        assert req is not None
        path = req[0].split(b" ")[1]
        if path == b"/chunked":
            writer.write(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            )
        elif path == b"/close":
            writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end")
            await writer.drain()
            writer.close()
        else:
            writer.write(
                b"HTTP/1.1 302 Found\r\nLocation: http://example.com/\r\nContent-Length: 0\r\n\r\n"
            )
        await writer.drain()

    async def main() -> None:
        server, port, _ = await serve(handler)
        async with server, Client(max_connections=2, timeout=5) as client:
            r = await client.request("POST", f"http://127.0.0.1:{port}/chunked")
            assert (r.status_code, r.content) == (200, b"abcde")
            r = await client.request("POST", f"http://127.0.0.1:{port}/close")
            assert (r.status_code, r.content) == (200, b"until the end")
            r = await client.request("POST", f"http://127.0.0.1:{port}/moved")
            assert r.status_code == 302 and r.headers["location"] == "http://example.com/"

    run(main())


def test_errors_timeout_refused_and_truncated() -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        await asyncio.sleep(10)

    async def truncated(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()

    async def main() -> None:
        s1, p1, _ = await serve(silent)
        s2, p2, _ = await serve(truncated)
        async with s1, s2, Client(max_connections=2, timeout=0.5) as client:
            with pytest.raises(RequestTimeout):
                await client.request("POST", f"http://127.0.0.1:{p1}/")
            with pytest.raises(RemoteProtocolError):
                await client.request("POST", f"http://127.0.0.1:{p2}/")
            s1.close()
            await s1.wait_closed()
            with pytest.raises(ConnectError):
                await client.request("POST", f"http://127.0.0.1:{p1}/")
            with pytest.raises(HttpError):
                await client.request("POST", f"http://127.0.0.1:{p2}/", headers={"x": "a\r\nb: c"})

    run(main())


def test_connection_limit() -> None:
    active = 0
    peak = 0

    async def slow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal active, peak
        while await read_request(reader) is not None:
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.05)
            active -= 1
            writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            await writer.drain()

    async def main() -> None:
        server, port, conns = await serve(slow)
        async with server, Client(max_connections=2, timeout=5) as client:
            rs = await asyncio.gather(
                *(client.request("POST", f"http://127.0.0.1:{port}/") for _ in range(8))
            )
        assert [r.status_code for r in rs] == [204] * 8
        assert peak <= 2 and len(conns) <= 2

    run(main())


def test_pinning_refuses_private_addresses_unless_allowed() -> None:
    async def main() -> None:
        server, port, _ = await serve(echo_keepalive)
        url = f"http://rebind.example:{port}/x"
        guard = pinning((), resolver=lambda host, p: ["127.0.0.1"])
        async with server, Client(max_connections=2, timeout=5, connect_to=guard) as client:
            with pytest.raises(RefusedAddress):
                await client.request("POST", url)
        allowed = pinning(["rebind.example"], resolver=lambda host, p: ["127.0.0.1"])
        async with Client(max_connections=2, timeout=5, connect_to=allowed) as client:
            with pytest.raises(ConnectError):  # allowed: no check, the name itself is used
                await client.request("POST", url)
        public = pinning((), resolver=lambda host, p: ["127.0.0.1"] if host == "x" else [])
        assert await public("8.8.8.8", 80) == "8.8.8.8"

    run(main())


def _self_signed(tmp_path: Path, name: str) -> tuple[Path, Path]:
    cert, key = tmp_path / f"{name}.pem", tmp_path / f"{name}.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={name}",
            "-addext",
            f"subjectAltName=DNS:{name}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls_verifies_the_certificate_and_the_host_name(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path, "localhost")
    other, other_key = _self_signed(tmp_path, "other.example")

    async def main() -> None:
        for chain, secret, ok in ((cert, key, True), (other, other_key, False)):
            server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            server_ctx.load_cert_chain(chain, secret)
            server = await asyncio.start_server(
                lambda r, w: echo_keepalive(r, w), "127.0.0.1", 0, ssl=server_ctx
            )
            port = server.sockets[0].getsockname()[1]
            trusting = ssl.create_default_context(cafile=str(chain))
            async with server, Client(max_connections=2, timeout=5, ssl_context=trusting) as c:
                if ok:
                    r = await c.request("POST", f"https://localhost:{port}/t", content=b"s")
                    assert r.content == b"POST /t HTTP/1.1|s"
                else:  # a certificate for another name
                    with pytest.raises(ConnectError):
                        await c.request("POST", f"https://localhost:{port}/t")
            if ok:  # not signed by a CA the default context trusts
                server = await asyncio.start_server(
                    lambda r, w: echo_keepalive(r, w), "127.0.0.1", 0, ssl=server_ctx
                )
                port = server.sockets[0].getsockname()[1]
                async with server, Client(max_connections=2, timeout=5) as c:
                    with pytest.raises(ConnectError):
                        await c.request("POST", f"https://localhost:{port}/t")

    run(main())
