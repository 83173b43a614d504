"""What the command line reads, checked as hostile input: arguments (numbers finite and in range,
JSON bounded in size and depth, text that is UTF-8), the supervisor's state file, and JSON printed
without raw control characters (all pure); and how that JSON reaches stdout, a usage error's too."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ..kanban.parse import load_json
from ..kanban.task import MAX_BYTES, TaskError


class UsageError(Exception):
    """An argument that cannot be used; the CLI exits 2 with this message."""


# A lone surrogate: how Python hands over an argument that is not UTF-8; it cannot be written anywhere.
_SURROGATE = re.compile("[\ud800-\udfff]")


def not_utf8(params: dict[str, Any]) -> str | None:
    """The name of the first text argument that is not UTF-8, if any (pure)."""
    for key, value in params.items():
        if any(isinstance(item, str) and _SURROGATE.search(item)
               for item in (value if isinstance(value, (tuple, list)) else (value,))):
            return key
    return None


# JSON escapes C0 controls itself; these it leaves raw, and a terminal would act on them.
_JSON_RAW_CONTROLS = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def json_text(document: Any, indent: int | None = None) -> str:
    """`document` as JSON with no raw control character in it (they only occur inside strings,
    where an escape means the same)."""
    text = json.dumps(document, indent=indent, ensure_ascii=False, default=str)
    if _JSON_RAW_CONTROLS.search(text) is None:
        return text
    return _JSON_RAW_CONTROLS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


MAX_SECONDS = 86_400.0  # a day: more is a typo, and a deadline that never comes
MAX_PRIORITY = 10**9


class Seconds(click.ParamType):
    """A number of seconds from 0 to MAX_SECONDS; click's FloatRange lets NaN through (every
    comparison with NaN is false) and inf, and either would mean a deadline that never comes."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not 0 <= seconds <= MAX_SECONDS:  # false for NaN too
            self.fail(f"{value!r} is not a number of seconds from 0 to {MAX_SECONDS:g}", param, ctx)
        return seconds


def parse_steps(text: str) -> Any:
    """--steps as JSON, read by the board's own loader (bounded in size, depth and numbers, as a
    dropped task is); UsageError (exit 2) says what is wrong."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise UsageError(f"--steps is longer than {MAX_BYTES:,} bytes (a task's limit)")
    try:
        return load_json(text)
    except TaskError as exc:
        raise UsageError(f"--steps: {exc}") from None


MAX_CHILDREN = 256  # far above any delegation limit: a forged list of a million costs no time
MAX_AGENTS = 10_000  # far above any team: a forged list of names costs no time either


def pid_or_none(value: Any) -> int | None:
    """`value` if it can be a process id, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 22 else None


def _seconds(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    return float(value) if ok else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31 else 0


def _text(value: Any) -> str | None:
    """Text as text, a number as its digits; anything else (a list, a mapping: however deep) is dropped."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


def sane_state(raw: Any) -> dict[str, Any]:
    """supervisor.json (or a status reply) as the CLI may use it: pids are pids, times are numbers,
    agents a mapping of names to mappings, texts are text; anything else is dropped, so a damaged
    or forged file cannot crash `status` or `down` or aim them at another process."""
    if not isinstance(raw, dict):
        return {}
    state: dict[str, Any] = {key: _text(raw[key]) for key in ("started_at", "workspace") if key in raw}
    if "shutting_down" in raw:
        state["shutting_down"] = raw["shutting_down"] is True
    if pid_or_none(raw.get("pid")) is not None and _seconds(raw.get("pid_started")) is not None:
        state["pid"], state["pid_started"] = raw["pid"], float(raw["pid_started"])
    if isinstance(raw.get("held"), list):  # the agents a person stopped (`hermes-sup stop`)
        state["held"] = [name for name in raw["held"][:MAX_AGENTS] if isinstance(name, str)]
    agents = raw["agents"] if isinstance(raw.get("agents"), dict) else {}
    state["agents"] = {str(name): {
        "pid": pid_or_none(agent.get("pid")), "pid_started": _seconds(agent.get("pid_started")),
        "state": _text(agent.get("state")), "task": _text(agent.get("task")),
        "last_exit": _text(agent.get("last_exit")), "started_at": _text(agent.get("started_at")),
        "uptime_s": _seconds(agent.get("uptime_s")), "log": _text(agent.get("log")),
        "digest": _text(agent.get("digest")),
        "restarts": _count(agent.get("restarts")),
        "held": agent.get("held") is True,
    } for name, agent in agents.items() if isinstance(agent, dict)}
    return state


def emit_json(document: Any) -> None:
    # Indented for a person at a terminal; one line for a script, which also keeps json on its C
    # encoder (indent makes it several times slower, a third of `board --json` over 10,000 tasks).
    indent = 2 if sys.stdout.isatty() else None
    click.echo(json_text(document, indent))


def _workspace_given(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        ctx.ensure_object(dict)["workspace"] = value


WORKSPACE_HELP = "Workspace folder (else $HERMES_SUP_WORKSPACE, else the current folder upward)."


class JsonUsageCommand(click.Command):
    """A command whose usage errors (a bad option value, a missing argument) are also one JSON
    document on stdout when --json was asked for: a script parsing stdout gets the error, not nothing.
    It also takes -w/--workspace after its name (`hermes-sup status -w DIR`), as people type it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not any(param.name == "workspace" for param in self.params):
            self.params.append(click.Option(["-w", "--workspace"], type=click.Path(file_okay=False, path_type=Path),
                                            expose_value=False, callback=_workspace_given, help=WORKSPACE_HELP))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        options = args[:args.index("--")] if "--" in args else args
        wants_json = "--json" in options and any(param.name == "as_json" for param in self.params)
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            if wants_json:
                emit_json({"error": exc.format_message(), "exit_code": exc.exit_code})
            raise


class JsonUsageGroup(click.Group):
    command_class = JsonUsageCommand
    group_class = type  # `task` and `skills` hand their commands JsonUsageCommand too

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Commands defined in other modules, by name: each loaded the first time it is asked for
        # (`task add` need not import what `task log` and `task wait` do: a third of its start).
        self.lazy: dict[str, Callable[[], click.Command]] = {}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        load = self.lazy.pop(cmd_name, None)
        if load is not None and cmd_name not in self.commands:
            self.add_command(load(), cmd_name)
        return super().get_command(ctx, cmd_name)


def sane_children(raw: Any) -> list[dict[str, Any]]:
    """The delegated children an agent's state.json lists, as the CLI may use them: a pid with its
    start time (without one a pid names nothing: it may have been reused), a name and a task as text."""
    if not isinstance(raw, dict) or not isinstance(raw.get("children"), list):
        return []
    return [{"name": _text(child.get("name")), "pid": child["pid"], "pid_started": float(child["pid_started"]),
             "task": _text(child.get("task"))}
            for child in raw["children"][:MAX_CHILDREN] if isinstance(child, dict)
            and pid_or_none(child.get("pid")) is not None and _seconds(child.get("pid_started"))]
