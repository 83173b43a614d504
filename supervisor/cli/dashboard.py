"""`dashboard [--host H] [--port P] [--token-env VAR] [--column-limit N]`: the live web dashboard.

Registered on the command line when cli.py imports this module (at its end); `up --dashboard`
serves the same beside the team through dashboard_server.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import click

from ..config.workspace import Workspace
from ..dashboard.picture import COLUMN_LIMIT
from ..interrupt import interruptible
from .common import Failure, command, err, handled, literal, workspace_of

if TYPE_CHECKING:  # the web stack is imported only by the commands that serve it
    from ..dashboard.app import Server

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765


def dashboard_server(ws: Workspace, host: str, port: int, token_env: str | None,
                     column_limit: int = COLUMN_LIMIT) -> Server:
    """A dashboard server ready to run, or Failure with the reason it cannot (refused bind, port in use)."""
    from ..dashboard.app import Server, Settings, token_from_env
    from ..dashboard.security import BindError, check_bind

    token = token_from_env(token_env)
    try:
        check_bind(host, token_env, token)
    except BindError as exc:
        raise Failure(str(exc), 2) from None
    try:
        return Server(ws, Settings(host=host, port=port, token=token, column_limit=column_limit))
    except OSError as exc:
        raise Failure(f"dashboard: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def url_of(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


@command()
@click.option("--host", default=DEFAULT_HOST, show_default=True,
              help="The address to listen on; a non-loopback one needs --token-env.")
@click.option("--port", type=click.IntRange(0, 65535), default=DEFAULT_PORT, show_default=True,
              help="The port (0: any free one, printed).")
@click.option("--token-env", "token_env", metavar="VAR",
              help="Require the secret in environment variable VAR on every request.")
@click.option("--column-limit", type=click.IntRange(1, 10_000), default=COLUMN_LIMIT, show_default=True,
              help="Cards each column shows (the next to move, the newest finished), with its whole count.")
@click.pass_context
@handled
def dashboard(ctx: click.Context, host: str, port: int, token_env: str | None, column_limit: int) -> None:
    """Serve the live web dashboard: the board, the agents, usage, a task drawer and actions."""
    ws = workspace_of(ctx)
    server = dashboard_server(ws, host, port, token_env, column_limit)
    err.print(literal(f"dashboard: {url_of(host, server.port)} (Ctrl-C stops)"), highlight=False)
    interruptible()
    # uvicorn shuts down on Ctrl-C, then raises it again: the stop asked for, not a failure (exit 0,
    # as `events -f` and the other commands that run until Ctrl-C).
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
