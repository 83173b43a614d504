"""The dashboard's web application (Starlette) and its server (uvicorn on a socket bound here, so a
port in use is a clear error): the page, its static assets, the event stream, the task drawer's
reads and the actions, every one behind the checks of security.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...kanban import BoardError, TaskError
from ...kanban.errors import InvalidTransition, TaskNotFound
from ..config.workspace import Workspace, board_settings, open_workspace_board
from ..views import taskrecords, timeline
from . import actions, follow, metrics, security, slowclients, views
from .picture import COLUMN_LIMIT
from .sse import Hub, StreamEnd

STATIC = Path(__file__).with_name("static")
MAX_STREAMS = 64  # open event streams (pages, drawers) at once: each holds a coroutine and reads files
MAX_BODY = (1 << 20) + (64 << 10)  # a 1 MiB comment or task body, in JSON, with room for its quoting
HEADERS = {
    # The page's own scripts and styles only: a title that slipped into markup still runs nothing.
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
log = logging.getLogger("hermes_sup.dashboard")

Scope = MutableMapping[str, Any]
ASGI = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8765
    token: str | None = None
    column_limit: int = COLUMN_LIMIT  # cards each column of the page ships
    loopback: bool = field(init=False)

    def __post_init__(self) -> None:
        self.loopback = security.is_loopback(self.host)


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=HEADERS)


class Guard:
    """Every request passes security.judge before it reaches a route."""

    def __init__(self, app: ASGI, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        cookie: SimpleCookie = SimpleCookie()
        try:
            cookie.load(headers.get("cookie", ""))
        except CookieError:  # a malformed cookie header is no token
            cookie = SimpleCookie()
        morsel = cookie.get(security.TOKEN_COOKIE)
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        path = scope["path"]
        verdict = security.judge(
            method=scope["method"], is_action=path.startswith("/api/") and scope["method"] not in ("GET", "HEAD"),
            host_header=headers.get("host"), origin=headers.get("origin"), scheme=scope.get("scheme", "http"),
            bound_loopback=self.settings.loopback, expected_token=self.settings.token,
            header_token=security.bearer(headers.get("authorization")),
            cookie_token=morsel.value if morsel else None,
            query_token=(query.get("token") or [None])[0] if path == "/" else None)
        if not verdict.status and self.settings.loopback and self.settings.token is None \
                and not _own_user(scope.get("client"), scope.get("server")):
            verdict = security.Verdict(403, "this dashboard answers only to the user running it; another user "
                                            "needs it started with --token-env")
        if verdict.status:
            await error(verdict.status, verdict.error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


NET_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _own_user(client: Any, server: Any) -> bool:
    """Whether the client's socket is this user's (or root's). Where the kernel publishes no socket
    table (not Linux), there is no telling: the loopback bind alone decides, as before."""
    if not NET_TABLES[0].exists():
        return True
    if not client or not server:
        return False
    tables = []
    for path in NET_TABLES:
        with contextlib.suppress(OSError):
            tables.append(path.read_text())
    uid = security.peer_uid(tables, (str(client[0]), int(client[1])), (str(server[0]), int(server[1])))
    return security.same_user(uid, os.getuid())


async def json_body(request: Request) -> Any:
    """The request's JSON document, refused when over MAX_BODY (counted as it arrives, whatever
    Content-Length claims) or not JSON."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise actions.ActionError("send the body as Content-Type: application/json", 415)
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise actions.ActionError(f"the body is over {MAX_BODY} bytes", 413)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > MAX_BODY:
            raise actions.ActionError(f"the body is over {MAX_BODY} bytes", 413)
    if not data:
        return {}
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        raise actions.ActionError("the body is not JSON") from None


class _Place:
    """One open stream's place among MAX_STREAMS."""


class Dashboard:
    """The application's state: the workspace, one board, the lock its calls take, the hub."""

    def __init__(self, ws: Workspace, settings: Settings) -> None:
        self.ws = ws
        self.settings = settings
        self.board = open_workspace_board(ws)
        self.lock = threading.Lock()  # one board call at a time from this process's threads
        self.host = board_settings(ws)[1] or socket.gethostname()  # this host's name on the board
        self.spend = views.LedgerVersion(ws)
        self.hub = Hub(self.board, ws.runs_path, self._picture, self.spend,
                       lambda: views.hosts_look(self.board, self.host))
        # The streams given out and not yet over. Counted from the moment one is made, not when it
        # starts: requests waiting in a burst are all let through before any stream runs. Weakly held:
        # one whose client left before it started never runs its finally, and leaves when dropped.
        self._streams: weakref.WeakSet[_Place] = weakref.WeakSet()

    @property
    def streams(self) -> int:
        return len(self._streams)

    def counted(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`stream`, counted among the open streams until it ends or is dropped."""
        if len(self._streams) >= MAX_STREAMS:
            raise actions.ActionError(f"too many open streams ({MAX_STREAMS}); close some pages", 503)

        place = _Place()  # held by the stream alone (no cycle): freed, and uncounted, when it is

        async def run() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                self._streams.discard(place)

        self._streams.add(place)
        return run()

    def _picture(self, hosts: list[dict[str, Any]] | None) -> dict[str, Any]:
        with self.lock:
            return views.snapshot(self.board, self.ws, self.host, hosts=hosts, limit=self.settings.column_limit)

    def locked(self, func: Callable[..., Any]) -> Callable[..., Any]:
        """`func`, called under the board's lock (one board call at a time from this process)."""
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                return func(*args, **kwargs)

        return call

    async def call(self, func: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(self.locked(func), *args)

    # -- routes -----------------------------------------------------------------------------------

    async def index(self, request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None and self.settings.token is not None:
            # Guard checked it. Kept as a cookie the page's requests and its event stream carry
            # (EventSource sends no header of our choosing); the address bar loses the token.
            response = RedirectResponse("/", status_code=303, headers=HEADERS)
            response.set_cookie(security.TOKEN_COOKIE, token, httponly=True, samesite="strict", path="/")
            return response
        return FileResponse(STATIC / "index.html", headers=HEADERS)

    async def snapshot(self, request: Request) -> Response:
        picture = await asyncio.to_thread(self.hub.picture)  # the JSON the streams are sent, as it is
        return Response(picture.data, media_type="application/json", headers=HEADERS)

    async def events(self, request: Request) -> Response:
        last = request.headers.get("last-event-id") or request.query_params.get("since")
        return StreamingResponse(self.counted(self.hub.stream(last)), media_type="text/event-stream",
                                 headers={**HEADERS, "X-Accel-Buffering": "no"})

    async def task(self, request: Request) -> Response:
        task_id = request.path_params["task_id"]
        from ...kanban.prefix import resolve_task_id

        def read() -> dict[str, Any]:
            return views.task_document(self.board, self.ws, resolve_task_id(self.board, task_id))

        return JSONResponse(await self.call(read), headers=HEADERS)

    async def task_log(self, request: Request) -> Response:
        from ...kanban.prefix import resolve_task_id

        found = await self.call(resolve_task_id, self.board, request.path_params["task_id"])

        def claims() -> list[tuple[str, str]]:
            with self.lock:
                return timeline.claims(self.board.get(found))

        end = StreamEnd(self.board)  # looked at every FOLLOW_INTERVAL: the events lock only on a change

        def stream_end() -> int:
            with self.lock:
                return end()

        journal = taskrecords.board_rows(self.board)  # another host's agents' records are only there
        stream = follow.task_log(self.ws.runs_path, found, claims, stream_end,
                                 None if journal is None else self.locked(journal),
                                 self.locked(self.board.journal_marks))
        return StreamingResponse(self.counted(stream), media_type="text/event-stream",
                                 headers={**HEADERS, "X-Accel-Buffering": "no"})

    async def add(self, request: Request) -> Response:
        body = await json_body(request)
        doc = await self.call(actions.add_task, self.board, body)
        self.hub.changed()
        return JSONResponse(doc, status_code=201, headers=HEADERS)

    async def change(self, request: Request) -> Response:
        body = await json_body(request)
        doc = await self.call(actions.change_task, self.board, request.path_params["task_id"],
                              request.path_params["command"], body)
        self.hub.changed()  # a comment is no transition: no event wakes the stream
        return JSONResponse(doc, headers=HEADERS)

    async def agent(self, request: Request) -> Response:
        await json_body(request)
        reply = await asyncio.to_thread(actions.agent_command, self.ws, request.path_params["agent"],
                                        request.path_params["command"])
        self.hub.changed()
        return JSONResponse(reply, headers=HEADERS)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return error(exc.status_code, str(exc.detail))


async def _action_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, actions.ActionError)
    return error(exc.status, str(exc))


async def _board_error(request: Request, exc: Exception) -> Response:
    status = 404 if isinstance(exc, TaskNotFound) else 409 if isinstance(exc, InvalidTransition) else 400
    return error(status, str(exc))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.error("dashboard: %s %s failed", request.method, request.url.path, exc_info=exc)
    return error(500, f"internal error ({type(exc).__name__}); the server's log has the details")


def create_app(ws: Workspace, settings: Settings) -> tuple[Guard, Dashboard]:
    dash = Dashboard(ws, settings)
    routes = [
        Route("/", dash.index),
        Route("/api/snapshot", dash.snapshot),
        Route("/api/events", dash.events),
        Route("/api/task", dash.add, methods=["POST"]),
        Route("/api/task/{task_id:str}", dash.task),
        Route("/api/task/{task_id:str}/log", dash.task_log),
        Route("/api/task/{task_id:str}/{command:str}", dash.change, methods=["POST"]),
        Route("/api/agent/{agent:str}/{command:str}", dash.agent, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
        metrics.route(dash),  # /metrics, for Prometheus
    ]
    handlers: dict[Any, Any] = {HTTPException: _http_error, actions.ActionError: _action_error,
                                BoardError: _board_error, TaskError: _board_error, Exception: _unexpected}
    app = Starlette(routes=routes, exception_handlers=handlers)
    return Guard(app, settings), dash


def bind(host: str, port: int) -> socket.socket:
    """The listening socket; OSError (in use, no such address) for the caller to say plainly."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, kind, proto, _name, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
        sock.set_inheritable(False)
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """uvicorn serving the dashboard on a bound socket, in the foreground or in a thread."""

    def __init__(self, ws: Workspace, settings: Settings) -> None:
        import uvicorn

        self.sock = bind(settings.host, settings.port)
        self.port = self.sock.getsockname()[1]
        self.app, self.dashboard = create_app(ws, settings)
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                                lifespan="off", server_header=False, **slowclients.server_options())
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.sock.close()
            self.dashboard.board.close()
            self.dashboard.spend.close()

    def start_thread(self) -> None:
        self._thread = threading.Thread(target=self.run, name="dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=5)


def token_from_env(name: str | None) -> str | None:
    return os.environ.get(name) if name else None
