"""The dashboard as an ASGI app (Starlette + Jinja2, rendered on the server).

Pages: overview, jobs (filters, keyset pages), a job, the queue engine's graph, HTTP
outbox/inbox and sessions. Live parts refresh themselves through ``static/live.js`` (a few
lines, vendored: no build step, no CDN). Every action is a POST that carries the CSRF token
of a SameSite cookie (double submit), is refused in read-only mode, and leaves an audit
line in the ``homing.dashboard.audit`` log.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import re
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from homing.dashboard import graph, ops, views
from homing.dashboard.views import Source
from homing.database import Database, ShardedDatabase
from homing.errors import HomingError, JobNotFound

HERE = Path(__file__).parent
CSRF_COOKIE = "homing_csrf"
ACTIONS = ("redrive", "perm_fail", "delete", "cancel")


@dataclass(frozen=True)
class Access:
    """Who may look: a bearer token and/or basic-auth user:password; read-only or not."""

    token: str | None = None
    basic: tuple[str, str] | None = None
    read_only: bool = False

    @property
    def protected(self) -> bool:
        return self.token is not None or self.basic is not None

    def who(self, request: Request) -> str | None:
        """The caller's name if they may look, else None."""
        if not self.protected:
            return "local"
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if self.token and scheme.lower() == "bearer" and hmac.compare_digest(value, self.token):
            return "token"
        if scheme.lower() == "basic":
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                return None
            if self.basic and hmac.compare_digest(f"{user}:{password}", ":".join(self.basic)):
                return user
            if self.token and hmac.compare_digest(password, self.token):
                return user or "token"
        return None


def create_app(
    db: Database | ShardedDatabase,
    *,
    access: Access | None = None,
    metrics: bool = True,
) -> Starlette:
    """The dashboard over ``db``; mount it anywhere (``homing serve`` puts it at /dashboard)."""
    src = Source(db)
    acc = access or Access()
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["ago"] = _ago
    templates.env.filters["when"] = _when
    pages = _Pages(src, acc, templates)
    routes = [
        Route("/", pages.overview),
        Route("/jobs", pages.jobs),
        Route("/jobs/{handle:str}", pages.job),
        Route("/jobs/{handle:str}/{action:str}", pages.action, methods=["POST"]),
        Route("/bulk/redrive", pages.bulk, methods=["GET", "POST"]),
        Route("/engine", pages.engine),
        Route("/http", pages.simple("http.html", ops.http_state)),
        Route("/sessions", pages.simple("sessions.html", ops.sessions_state)),
        Route("/messenger", pages.simple("messenger.html", ops.messenger_state)),
        Route("/health", lambda _r: PlainTextResponse("ok")),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    if metrics:
        from homing.dashboard.metrics import metrics_route

        routes.append(metrics_route(src))
    app = Starlette(routes=routes)
    app.add_middleware(_Guard, access=acc)
    return app


class _Guard:
    """Authentication for every path, and a CSRF cookie for the forms."""

    def __init__(self, app: Any, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        who = self.access.who(request)
        if who is None:
            response = PlainTextResponse(
                "authentication required", 401, {"WWW-Authenticate": 'Basic realm="homing"'}
            )
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["who"] = who
        token = request.cookies.get(CSRF_COOKIE)
        fresh = None if token and len(token) == 43 else secrets.token_urlsafe(32)
        scope["state"]["csrf"] = token if fresh is None else fresh

        async def send_with_cookie(message: Any) -> None:
            if fresh and message["type"] == "http.response.start":
                path = scope.get("root_path") or "/"
                cookie = f"{CSRF_COOKIE}={fresh}; Path={path}; HttpOnly; SameSite=Strict"
                message.setdefault("headers", []).append((b"set-cookie", cookie.encode()))
            await send(message)

        await self.app(scope, receive, send_with_cookie)


class _Pages:
    def __init__(self, src: Source, access: Access, templates: Jinja2Templates) -> None:
        self.src = src
        self.access = access
        self.templates = templates

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)  # the store is synchronous

    def _render(self, request: Request, name: str, status: int = 200, **ctx: Any) -> Response:
        base = request.scope.get("root_path", "")
        context = {
            "base": base,
            "csrf": request.state.csrf,
            "read_only": self.access.read_only,
            "sharded": self.src.sharded,
            "fragment": request.headers.get("x-homing-fragment") == "1",
            "msg": _flash(request.query_params.get("msg")),
            **ctx,
        }
        return self.templates.TemplateResponse(request, name, context, status_code=status)

    async def _guarded(self, request: Request, page: Callable[[], Awaitable[Response]]) -> Response:
        try:
            return await page()
        except JobNotFound as exc:
            return self._render(request, "error.html", 404, error=str(exc))
        except HomingError as exc:
            return self._render(request, "error.html", 400, error=str(exc))

    async def overview(self, request: Request) -> Response:
        async def page() -> Response:
            data = await self._run(views.overview, self.src)
            return self._render(request, "overview.html", live="overview", **data)

        return await self._guarded(request, page)

    async def jobs(self, request: Request) -> Response:
        q = request.query_params

        async def page() -> Response:
            f = views.parse_filter(q.get("type"), q.get("state"), q.get("where"))
            data = await self._run(views.jobs_page, self.src, f, q.get("cursor"))
            query = {
                k: v
                for k, v in (("type", f.type), ("state", f.state), ("where", q.get("where")))
                if v
            }
            return self._render(
                request,
                "jobs.html",
                filt=f,
                where=q.get("where", ""),
                query=urlencode(query),
                **data,
            )

        return await self._guarded(request, page)

    async def job(self, request: Request) -> Response:
        handle = request.path_params["handle"]

        async def page() -> Response:
            asked = request.query_params.get("children") == "1"
            data = await self._run(lambda: views.job_page(self.src, handle, children=asked))
            return self._render(request, "job.html", live="job", **data)

        return await self._guarded(request, page)

    def _refused(self, request: Request, form: Any) -> Response | None:
        if self.access.read_only:
            return self._render(request, "error.html", 403, error="the dashboard is read-only")
        token = form.get("csrf") or ""
        cookie = request.cookies.get(CSRF_COOKIE) or ""
        if not cookie or not isinstance(token, str) or not hmac.compare_digest(token, cookie):
            return self._render(
                request,
                "error.html",
                403,
                error="missing or wrong CSRF token: reload the page and try again",
            )
        return None

    async def action(self, request: Request) -> Response:
        handle = request.path_params["handle"]
        action = request.path_params["action"]
        form = await _form(request)
        refused = self._refused(request, form)
        if refused is not None:
            return refused

        async def page() -> Response:
            if action not in ACTIONS:
                raise JobNotFound(f"no action {action!r}")
            msg = await self._run(views.act, self.src, handle, action, request.state.who)
            base = request.scope.get("root_path", "")
            target = f"{base}/jobs" if action == "delete" else f"{base}/jobs/{handle}"
            return RedirectResponse(f"{target}?{urlencode({'msg': msg})}", 303)

        return await self._guarded(request, page)

    async def bulk(self, request: Request) -> Response:
        if request.method == "GET":
            q = request.query_params

            async def confirm() -> Response:
                f = views.parse_filter(q.get("type"), q.get("state"), q.get("where"))
                n = await self._run(views.count_matching, self.src, f)
                return self._render(
                    request,
                    "confirm.html",
                    filt=f,
                    where=q.get("where", ""),
                    count=n,
                    cap=views.COUNT_CAP,
                    limit=views.BULK_LIMIT,
                )

            return await self._guarded(request, confirm)
        form = await _form(request)
        refused = self._refused(request, form)
        if refused is not None:
            return refused

        async def run() -> Response:
            if form.get("confirm") != "yes":
                raise HomingError("bulk redrive needs the confirmation")
            f = views.parse_filter(*(str(form.get(k) or "") for k in ("type", "state", "where")))
            n = await self._run(views.bulk_redrive, self.src, f, request.state.who)
            base = request.scope.get("root_path", "")
            query = urlencode(
                {"state": "ready", "type": f.type or "", "msg": f"bulk redrive: {n} jobs redriven"}
            )
            return RedirectResponse(f"{base}/jobs?{query}", 303)

        return await self._guarded(request, run)

    def simple(self, template: str, read: Callable[[Source], dict[str, Any]]) -> Any:
        """A live page that shows what ``read`` returns."""

        async def endpoint(request: Request) -> Response:
            async def page() -> Response:
                data = await self._run(read, self.src)
                return self._render(request, template, live=template, **data)

            return await self._guarded(request, page)

        return endpoint

    async def engine(self, request: Request) -> Response:
        async def page() -> Response:
            state = await self._run(views.engine_state, self.src)
            return self._render(
                request, "engine.html", live="engine", g=graph.layout(state), **state
            )

        return await self._guarded(request, page)


_FLASH = re.compile(r"^(redrive|perm-fail|delete|cancel|bulk redrive): [\w :.\-]{1,200}$")


def _flash(msg: str | None) -> str | None:
    """The line an action's redirect carries, shown only if it is one of ours (a crafted
    link cannot put arbitrary words on the page)."""
    return msg if msg and _FLASH.match(msg) else None


async def _form(request: Request) -> dict[str, str]:
    """A small urlencoded form (no multipart: the dashboard's forms are a few fields)."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > 64 * 1024:
            raise HomingError("form too large")
    pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
    return dict(pairs)


def _ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = float(seconds)
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 2 * 86400:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def _when(ts: float | None) -> str:
    import time

    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(ts)))
