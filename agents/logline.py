"""The agent's log lines: one per outcome, stamped with the time written, user text short and literal."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

SHORT = 80  # characters of a title, an argument list or a reason in a log line
# Control characters (C0, DEL, C1) and the line and paragraph separators: a title with a newline
# or an escape sequence must not forge a second log line or repaint the reader's terminal.
_CONTROLS = {code: " " for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)}


def short(value: Any, limit: int = SHORT) -> str:
    """`value` as one short line of plain text: control characters become spaces, whitespace runs
    one space, and the rest is cut to `limit` characters with an ellipsis (pure)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    # Cut before cleaning so a megabyte argument costs no more than its first few hundred characters.
    flat = " ".join(text[: limit * 4].translate(_CONTROLS).split())
    return flat if len(flat) <= limit and len(text) <= limit * 4 else flat[: limit - 1].rstrip() + "…"


def stamp(now: float | None = None) -> str:
    """The UTC time of a log line, to the second, as `logs --since` reads it back (pure given `now`)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if now is None else now))


def say(name: str, text: str, *, error: bool = False) -> None:
    """Write one stamped line of agent `name` to its log (stdout, or stderr for `error`)."""
    print(f"{stamp()} {name}: {text}", file=sys.stderr if error else sys.stdout, flush=True)


def seconds(duration: float) -> str:
    """A duration as a log line shows it (pure)."""
    return f"{duration:.1f}s" if duration >= 0.1 else f"{duration * 1000:.0f}ms"


def call_line(task_id: str, kind: str, name: str, args: Any, outcome: str, duration: float, detail: str = "") -> str:
    """The line of one tool call or step: its name, short arguments, outcome and duration, and for
    an error its first words (pure)."""
    shown = "" if args is None else short(args, 60)
    tail = f": {short(detail)}" if outcome != "ok" and detail else ""
    return f"{task_id} {kind} {short(name, 40)}({shown}) {outcome} {seconds(duration)}{tail}"


def model_line(record: dict[str, Any]) -> str:
    """The line of one model call from its LLM-call record: provider, model, tokens in/out, latency,
    outcome (pure)."""
    tail = f": {short(record['error'])}" if record.get("outcome") != "ok" and record.get("error") else ""
    return (f"{record.get('task')} model {short(record.get('provider'), 40)} {short(record.get('model'), 60)} "
            f"{record.get('tokens_in', 0)} in / {record.get('tokens_out', 0)} out tokens "
            f"{seconds(float(record.get('latency_s') or 0))} {record.get('outcome')}{tail}")
