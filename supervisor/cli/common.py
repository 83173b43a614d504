"""What every command shares: the consoles, errors as exit codes, --json, the workspace and board of a command."""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console, RenderableType
from rich.text import Text

from ...kanban import BoardError, BoardStore, TaskError
from ...kanban.prefix import UnknownTaskId
from ..cliargs import JsonUsageCommand, JsonUsageGroup, UsageError, emit_json, not_utf8, sane_state
from ..config.workspace import ConfigError, Workspace, find_workspace, open_workspace_board
from ..statefile import SUPERVISOR_FILE, read_state
from ..views import render

F = TypeVar("F", bound=Callable[..., Any])

# Markup and emoji codes off: a string that reaches print() by mistake is still printed as written.
# What people, agents and models wrote goes through render.literal/visible (see render.py).
out = Console(soft_wrap=False, markup=False, emoji=False)  # panels fit the width; a message passes soft_wrap=True
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)  # one line per message for grep
literal, visible = render.literal, render.visible
PIPED_WIDTH = 100_000  # a table piped to another program: as wide as its rows, never folded into more lines


# What `out` prints piped: a console's width caps every print's, so a wide one of its own.
piped = Console(soft_wrap=False, markup=False, emoji=False, width=PIPED_WIDTH)


def print_table(table: RenderableType) -> None:
    """A table on stdout: fitted to a terminal; piped or in a file, one line a row (`ps | cat`, grep)."""
    (out if out.is_terminal else piped).print(table)


class Failure(Exception):
    """A command failed in a way the user can act on; carries its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _exit(message: str, code: int, as_json: bool) -> NoReturn:
    if as_json:
        emit_json({"error": message, "exit_code": code})
    err.print(Text.assemble(("error:", "red"), " ", literal(message)), highlight=False)
    sys.exit(code)


def handled(func: F) -> F:
    """Turn the errors a user can cause into a message and an exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        bad = not_utf8(kwargs)
        if bad is not None:
            ctx = click.get_current_context(silent=True)
            names = {param.name: param.human_readable_name for param in (ctx.command.params if ctx else [])}
            _exit(f"{names.get(bad, bad)}: the argument is not UTF-8 text", 2, as_json)
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            _exit(str(exc), 2, as_json)
        except Failure as exc:
            _exit(str(exc), exc.code, as_json)
        except (UsageError, UnknownTaskId) as exc:  # an id that names no task, or several: a usage error
            _exit(str(exc), 2, as_json)
        except (BoardError, TaskError) as exc:
            _exit(str(exc), 1, as_json)
        except OSError as exc:
            _exit(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 1, as_json)

    return wrapper  # type: ignore[return-value]


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")


def workspace_of(ctx: click.Context) -> Workspace:
    return find_workspace(ctx.obj.get("workspace"))


def open_board(ctx: click.Context) -> BoardStore:
    return open_workspace_board(workspace_of(ctx))


def refreshed(board: BoardStore) -> dict[str, Any]:
    """Without a running supervisor, a board command does its work: ingest drops, recover dead claims."""
    report = board.ingest()
    board.recover()
    return report.as_dict()



def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file: a log an agent replaced by a FIFO would block its reader
    (up's log thread, then up's shutdown) forever."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_supervisor_state(ws: Workspace) -> dict[str, Any]:
    return sane_state(read_state(ws.runs_path / SUPERVISOR_FILE))



def command(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Command]:
    """`click.command` whose usage errors are one JSON document under --json (cliargs.JsonUsageCommand)."""
    return click.command(*args, cls=JsonUsageCommand, **kwargs)


def group(*args: Any, **kwargs: Any) -> Callable[[Callable[..., Any]], click.Group]:
    """`click.group` whose commands are JsonUsageCommands (cliargs.JsonUsageGroup)."""
    kwargs.setdefault("cls", JsonUsageGroup)
    return click.group(*args, **kwargs)
