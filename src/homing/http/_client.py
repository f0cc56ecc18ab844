"""The dispatcher's HTTP client: a thin layer over ``aiohttp`` with homing's semantics.

httpx cost ~77% of a dispatcher's CPU in the pipeline's delivery stage. Measured on one
machine (local uvicorn no-op server, 32 concurrent, CPU per request in the client
process): httpx 3,100 us, aiohttp 138 us, a hand-written asyncio/httptools client 85 us.
The delivery stage spends ~1,500 us CPU per delivery in total, so aiohttp costs ~4% more
than the hand-written client while being a maintained library with full HTTP semantics;
the project uses the library made for the job. What this layer adds:

- one ``ClientSession`` per client: keep-alive connections, at most ``max_connections``
  requests in flight (and as many connections in use); idle ones dropped after
  ``KEEPALIVE_S`` (below the 5 s after which uvicorn closes them); no cookies, no
  proxies from the environment, no ``Accept``/``Accept-Encoding`` headers sent (gzip and
  deflate answers are still decoded);
- TLS with certificate and host name verification (certifi's CA bundle when installed,
  else the system's);
- ``timeout``: waiting for a free slot, connecting (the hook included), and the longest
  silence while an answer is read;
- redirects are never followed (a 3xx is an answer like any other);
- ``connect_to``: an async hook (host, port) -> address called before every new
  connection (an ``aiohttp`` resolver; the TLS server name stays the URL's host); the
  guarded client's hook (``_netguard.pinning``) checks the address and pins it (DNS
  rebinding), and may raise ``RefusedAddress``. aiohttp does not resolve IP literals, so
  for those the hook is called before each request (it checks, there is nothing to pin);
- ``before_send``: an async hook a request may carry, awaited once a connection is in hand
  and before anything is written (the dispatcher takes an endpoint's rate-limit token
  there, so the time a new connection takes does not bunch requests up at the server);
  whatever it raises ends the request unsent, the connection going back to the pool;
- a request on a kept-alive connection that the server closed before answering (its
  close had not reached us yet: a disconnect or a socket error, no answer) is sent once
  more on a new connection, for every method; aiohttp itself retries only idempotent ones.

Errors are ``HttpError`` subclasses; the dispatcher retries them (except ``RefusedAddress``).
"""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl
import weakref
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.connector import Connection
from aiohttp.helpers import is_ip_address
from multidict import istr

from homing import __version__

KEEPALIVE_S = 4.0
USER_AGENT = f"homing/{__version__}"
_FRAMING = frozenset({"host", "content-length", "transfer-encoding", "connection"})

ConnectTo = Callable[[str, int], Awaitable[str]]


class HttpError(Exception):
    """The request got no complete answer (connection, protocol or timeout problem)."""


class ConnectError(HttpError):
    """No connection could be made."""


class RequestTimeout(HttpError):
    """Nothing happened for ``timeout`` seconds."""


class RemoteProtocolError(HttpError):
    """The server closed the connection or answered something that is not HTTP/1.1."""


@dataclass(frozen=True)
class Response:
    status_code: int
    headers: dict[str, str]  # names lower-cased; repeated headers joined with ", "
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


@functools.lru_cache(maxsize=4096)
def _ip_literal_host(url: str) -> str | None:
    """Check the URL as the old client did; its host when that is an IP literal."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        raise ConnectError(f"unsupported URL scheme in {url[:200]!r}")
    if parts.username is not None or parts.password is not None:
        raise ConnectError("credentials in the URL are not sent; use an Authorization header")
    host = parts.hostname or ""
    if not host:
        raise ConnectError(f"no host in URL {url[:200]!r}")
    try:
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError as exc:
        raise ConnectError(f"bad port in URL {url[:200]!r}") from exc
    return host if is_ip_address(host) else None


def _port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme.lower() == "https" else 80)


def _ssl_context() -> ssl.SSLContext:
    try:
        import certifi

        ctx = ssl.create_default_context(cafile=certifi.where())
    except ImportError:  # pragma: no cover - certifi comes with httpx
        ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class _HookResolver(AbstractResolver):
    """aiohttp's resolver calls the hook before each new connection and pins its answer."""

    def __init__(self, connect_to: ConnectTo) -> None:
        self._hook = connect_to
        self._dns: AbstractResolver | None = None

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = await self._hook(host, port)
        if not is_ip_address(address):  # the hook let the name through (an allowed host)
            if self._dns is None:
                self._dns = aiohttp.ThreadedResolver()
            found = await self._dns.resolve(address, port, family)
            return [{**r, "hostname": host} for r in found]
        fam = socket.AF_INET6 if ":" in address else socket.AF_INET
        flags = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": fam,
                "proto": 0,
                "flags": flags,
            }
        ]

    async def close(self) -> None:
        if self._dns is not None:
            await self._dns.close()


BeforeSend = Callable[[], Awaitable[None]]


class _Sending:
    """One request's state shared with the connector: whether its connection was used
    before (the stale-connection retry) and the hook to run before it is written."""

    __slots__ = ("reused", "before_send")

    def __init__(self, before_send: BeforeSend | None) -> None:
        self.reused = False
        self.before_send = before_send


# Set by ``Client._send`` for the connector; cheaper than an aiohttp trace.
_SENDING: ContextVar[_Sending | None] = ContextVar("homing_http_sending", default=None)


class _Request(aiohttp.ClientRequest):
    """No ``Accept`` or ``Accept-Encoding`` added to each request. Asking the session to skip
    them (``skip_auto_headers``) rebuilt a header set on every request
    (``update_auto_headers``: the top entry of one py-spy profile of a delivery worker,
    not kept); an empty default costs nothing. ``bench.http_client_cpu`` is too noisy to
    show the difference (bench/results/http_client_cpu.txt)."""

    DEFAULT_HEADERS: dict[istr, str] = {}


class _Connector(aiohttp.TCPConnector):
    """aiohttp's connector, telling ``Client`` whether a connection is a kept-alive one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._used: weakref.WeakSet[object] = weakref.WeakSet()  # gone with the connection

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        sending = _SENDING.get()
        proto = conn.protocol
        if proto is not None:
            if proto not in self._used:
                self._used.add(proto)
            elif sending is not None:
                sending.reused = True
        if sending is not None and sending.before_send is not None:
            hook, sending.before_send = sending.before_send, None  # once, not on a retry
            try:
                await hook()
            except BaseException:
                conn.release()  # nothing was written on it
                raise
        return conn


class Client:
    """Requests over pooled keep-alive connections (see the module docstring)."""

    def __init__(
        self,
        *,
        max_connections: int,
        timeout: float,
        connect_to: ConnectTo | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.max_connections = max_connections
        self.timeout = timeout
        self.connect_to = connect_to
        self._ssl = ssl_context
        self._slots = asyncio.Semaphore(max_connections)
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _open_session(self) -> aiohttp.ClientSession:
        """Made on first use: aiohttp needs the running loop."""
        connector = _Connector(
            limit=self.max_connections,
            keepalive_timeout=KEEPALIVE_S,
            ssl=self._ssl or _ssl_context(),
            resolver=_HookResolver(self.connect_to) if self.connect_to else None,
            use_dns_cache=self.connect_to is None,  # the hook sees every new connection
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout, sock_read=self.timeout),
            cookie_jar=aiohttp.DummyCookieJar(),
            headers={"User-Agent": USER_AGENT},
            request_class=_Request,
            auto_decompress=True,
            trust_env=False,
        )
        return self._session

    async def request(
        self,
        method: str,
        url: str,
        *,
        content: bytes = b"",
        headers: Mapping[str, str] | None = None,
        before_send: BeforeSend | None = None,
    ) -> Response:
        """One request and its whole answer; ``before_send``: see the module docstring."""
        if self._closed:
            raise HttpError("the client is closed")
        literal = _ip_literal_host(url)
        if literal is not None and self.connect_to is not None:
            await self.connect_to(literal, _port(url))  # aiohttp skips the resolver for it
        sent = _headers(headers)
        if self._slots.locked():
            try:
                async with asyncio.timeout(self.timeout):
                    await self._slots.acquire()
            except TimeoutError:
                raise RequestTimeout(f"no free connection within {self.timeout:g} s") from None
        else:
            await self._slots.acquire()
        try:
            sending = _Sending(before_send)
            try:
                return await self._send(method, url, content, sent, sending)
            except _StaleConnection:  # once more, on a new connection
                return await self._send(method, url, content, sent, sending, retry=False)
        finally:
            self._slots.release()

    async def delete(self, url: str, *, headers: Mapping[str, str] | None = None) -> Response:
        return await self.request("DELETE", url, headers=headers)

    async def get(self, url: str, *, headers: Mapping[str, str] | None = None) -> Response:
        return await self.request("GET", url, headers=headers)

    async def _send(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        sending: _Sending,
        retry: bool = True,
    ) -> Response:
        session = self._session or self._open_session()
        sending.reused = False
        token = _SENDING.set(sending)
        try:
            async with session.request(
                method,
                url,
                data=body if body or method not in ("GET", "DELETE") else None,
                headers=headers,
                allow_redirects=False,
            ) as resp:
                content = await resp.read()
                found: dict[str, str] = {}
                for name, value in resp.headers.items():
                    key = name.lower()
                    old = found.get(key)
                    found[key] = value if old is None else f"{old}, {value}"
                return Response(resp.status, found, content)
        except HttpError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError):
                raise _mapped(exc, url, self.timeout) from exc
            if retry and sending.reused:  # the same rule as aiohttp's for idempotent methods
                raise _StaleConnection from exc
            raise RemoteProtocolError(f"no answer from {url[:200]}: {exc}") from exc
        except Exception as exc:
            raise _mapped(exc, url, self.timeout) from exc
        finally:
            _SENDING.reset(token)


class _StaleConnection(Exception):
    """A kept-alive connection was closed by the server before any answer."""


def _headers(headers: Mapping[str, str] | None) -> Mapping[str, str]:
    """The caller's headers without framing ones (framing is the client's job)."""
    if not headers:
        return {}
    for name, value in headers.items():
        if "\r" in value or "\n" in value or "\r" in name or "\n" in name or ":" in name:
            raise HttpError(f"header {name[:60]!r} has a line break or colon in it")
    if any(name.lower() in _FRAMING for name in headers):
        return {k: v for k, v in headers.items() if k.lower() not in _FRAMING}
    return headers


def _mapped(exc: Exception, url: str, timeout: float) -> HttpError:
    """aiohttp's (and the socket layer's) exceptions as homing's ``HttpError`` classes."""
    where = url[:200]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return RequestTimeout(f"could not connect for {where} within {timeout:g} s")
    if isinstance(exc, TimeoutError):  # aiohttp's ServerTimeoutError is one too
        return RequestTimeout(f"no answer within {timeout:g} s from {where}")
    if isinstance(exc, aiohttp.InvalidURL):
        return ConnectError(f"bad URL {where!r}: {exc}")
    if isinstance(exc, aiohttp.ClientConnectorError):  # DNS, refused, TLS verification
        return ConnectError(f"could not connect for {where}: {exc}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return RemoteProtocolError(f"no complete answer from {where}: {exc}")
    if isinstance(exc, ValueError):  # aiohttp's own checks of what would be sent
        return HttpError(f"request to {where} refused by the HTTP library: {exc}")
    raise exc
