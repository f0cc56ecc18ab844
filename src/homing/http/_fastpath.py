"""The receiver's fast path: a message to a registered node skips Starlette's routing.

Profiles of the pipeline's webhook receiver put Starlette's per-request layers (the
router's pattern matching, the exception middleware, the endpoint wrapper) at a large
part of its CPU per message. This ASGI middleware sits inside Starlette's outermost
error handler and hands a request for a node path (or the reply node) with one of the
accepted methods straight to the receiver's own endpoint, which answers every outcome
itself (problem documents, 503 on a store failure). Anything else (``/_homing/*``
internals, routes an application added, other methods) goes on through the router as
before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Container
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from homing.http import wire

Endpoint = Callable[[Request], Awaitable[Response]]
ASGIApp = Callable[[Any, Any, Any], Awaitable[None]]


def route_path(scope: Any) -> str:
    """The path below the mount point (``root_path``), as the receiver names nodes."""
    path = str(scope.get("path", ""))
    root = str(scope.get("root_path", ""))
    if root and path.startswith(root):
        path = path[len(root) :]
    return path or "/"


class NodeFastPath:
    def __init__(
        self, app: ASGIApp, *, nodes: Container[str], reply_path: str, endpoint: Endpoint
    ) -> None:
        self.app = app
        self.nodes = nodes
        self.reply_path = reply_path
        self.endpoint = endpoint

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("method") in wire.METHODS:
            path = route_path(scope)
            if path in self.nodes or path == self.reply_path:
                response = await self.endpoint(Request(scope, receive, send))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
