"""Connect only to checked addresses: closes the DNS-rebinding window (issue 14, item 4).

A response or confirmation URL is checked when it arrives, but the dispatcher calls it
later; a name that resolved to a public address then may resolve to 127.0.0.1 by the time
of the call. The HTTP client used for URLs a peer gave us therefore resolves the name
itself at connect time, refuses the connection if any address is not public, and connects
to the address it checked (the TLS server name stays the URL's host), so no second lookup
can change where the bytes go. Redirects are never followed (httpx's default).
"""

from __future__ import annotations

import asyncio
import typing
from collections.abc import Iterable

import httpcore
import httpx

from homing.http import wire


class RefusedAddress(httpcore.ConnectError):
    """The name resolved to an address homing will not call (request forgery guard)."""


class _PinningBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, allowed_hosts: Iterable[str], resolver: wire.Resolver) -> None:
        self.allowed_hosts = tuple(allowed_hosts)
        self.resolver = resolver
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        if not wire.is_allowed(host, port, self.allowed_hosts):
            if wire.unsafe_address(host) is None:
                addrs = [host.strip("[]")]
            else:
                try:
                    addrs = await asyncio.to_thread(self.resolver, host, port)
                except OSError as exc:
                    raise httpcore.ConnectError(f"{host} does not resolve: {exc}") from exc
            for addr in addrs:
                problem = wire.unsafe_address(addr)
                if problem is not None:
                    raise RefusedAddress(
                        f"{host} resolves to a non-public address at connect time "
                        f"({problem}); refused to prevent request forgery"
                    )
            if not addrs:
                raise httpcore.ConnectError(f"{host} resolves to no address")
            host = addrs[0]  # pinned: connect to the address just checked
        return await self._inner.connect_tcp(
            host,
            port,
            timeout=timeout,
            local_address=local_address,
            socket_options=socket_options,
        )

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not called for peer-given URLs")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_transport(
    limits: httpx.Limits, allowed_hosts: Iterable[str], resolver: wire.Resolver | None = None
) -> httpx.AsyncHTTPTransport:
    """An httpx transport whose every connection goes to a checked, pinned address."""
    transport = httpx.AsyncHTTPTransport(limits=limits)
    pool = transport._pool
    if not isinstance(pool, httpcore.AsyncConnectionPool):  # pragma: no cover - httpx changed
        raise RuntimeError("unexpected httpx transport; cannot pin peer addresses")
    pool._network_backend = _PinningBackend(allowed_hosts, resolver or wire.system_resolver)
    return transport
