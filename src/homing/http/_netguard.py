"""Connect only to checked addresses: closes the DNS-rebinding window (issue 14, item 4).

A response or confirmation URL is checked when it arrives, but the dispatcher calls it
later; a name that resolved to a public address then may resolve to 127.0.0.1 by the time
of the call. The HTTP client used for URLs a peer gave us therefore resolves the name
itself at connect time, refuses the connection if any address is not public, and connects
to the address it checked (the TLS server name stays the URL's host), so no second lookup
can change where the bytes go. Redirects are never followed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from homing.http import wire
from homing.http._client import ConnectError, ConnectTo


class RefusedAddress(ConnectError):
    """The name resolved to an address homing will not call (request forgery guard)."""


def pinning(allowed_hosts: Iterable[str], resolver: wire.Resolver | None = None) -> ConnectTo:
    """The guarded client's connect hook: the address to connect to, checked just now.

    A host in ``allowed_hosts`` is connected to as it is; an IP literal is checked; a name
    is resolved here, every address it has must be public, and the first one is returned
    so that the connection goes to the address that was checked (TLS still verifies the
    URL's host name)."""
    allowed = tuple(allowed_hosts)
    resolve = resolver or wire.system_resolver

    async def connect_to(host: str, port: int) -> str:
        if wire.is_allowed(host, port, allowed):
            return host
        if wire.unsafe_address(host) is None:
            addrs = [host.strip("[]")]
        else:
            try:
                addrs = await asyncio.to_thread(resolve, host, port)
            except OSError as exc:
                raise ConnectError(f"{host} does not resolve: {exc}") from exc
        for addr in addrs:
            problem = wire.unsafe_address(addr)
            if problem is not None:
                raise RefusedAddress(
                    f"{host} resolves to a non-public address at connect time "
                    f"({problem}); refused to prevent request forgery"
                )
        if not addrs:
            raise ConnectError(f"{host} resolves to no address")
        return addrs[0]  # pinned: connect to the address just checked

    return connect_to
