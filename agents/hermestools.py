"""The tool calls of one Hermes run, read from Hermes Agent's session store (state.db) for their spans."""

from __future__ import annotations

import json
import math
import re
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .hermesrun import open_hostile, private_copy
from .spans import UNKNOWN_OUTCOME as UNKNOWN

STATE_DB = "state.db"  # in the profile folder (HERMES_HOME): hermes_state.SessionDB's file
MAX_STATE_BYTES = 512 << 20  # a profile's store keeps every session it ever had; past this, no tool spans
MAX_VALUE = 16 << 20  # of one stored value; SQLite refuses the query when a row holds a larger one
MAX_ROWS = 20_000  # message rows of the run's session read at most
MAX_SPANS = 1_000  # tool spans of one run at most; the rest are counted
MAX_CALLS_JSON = 1 << 20  # characters of an assistant row's tool_calls read; a longer list is no list
MAX_RESULT = 8 << 10  # characters of a tool's result read: its outcome is judged on them, content exports fewer
MAX_READ = 64 << 20  # characters read from the store in all, whatever its rows hold
MAX_ARGS = 64 << 10  # characters of a tool call's arguments kept (exported with content: true only)
MAX_ID = 200  # characters of a session id or a call id taken as one
EXIT_CODE = re.compile(r'"exit_code"\s*:\s*(-?\d+)')
FAILED = re.compile(r'"error"\s*:(?!\s*(?:null|false|""|\{\}|\[\]))|"success"\s*:\s*false')


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a Hermes run as its span says it: name, call id, outcome (ok, error or unknown),
    start and end in seconds since the epoch, `timing` "store" (when Hermes wrote the request and the
    result to its session store) or "run" (the store had no usable time: the run's), and its
    arguments and result (None unless content was asked for)."""
    name: str
    call_id: str
    outcome: str
    start: float
    end: float
    timing: str
    args: str | None = None
    result: str | None = None


# -- pure: which session, which calls ------------------------------------------------------------

def reported_session(value: Any) -> str | None:
    """The session id Hermes' usage file names (`hermes -z --usage-file`'s session_id), as an id or
    None (pure)."""
    return value if isinstance(value, str) and 0 < len(value) <= MAX_ID and value.isprintable() else None


def match_session(reported: str | None, candidates: Iterable[Sequence[Any]], start: float, end: float) -> str | None:
    """This run's session among the store's rows (id, source, parent_session_id, started_at), or None
    (pure). The id the usage file reports when the store holds it, and nothing else then (the store
    would be another's); without one, the only one-shot session (source cli, no parent) begun while
    the run ran, never a guess between two."""
    rows = [row for row in candidates if len(row) >= 4]
    if reported is not None:
        return reported if any(row[0] == reported for row in rows) else None
    begun = {row[0] for row in rows if isinstance(row[0], str) and row[1] == "cli" and row[2] is None
             and _time(row[3]) is not None and start <= row[3] <= end}
    return begun.pop() if len(begun) == 1 else None


def tool_calls(rows: Iterable[Sequence[Any]], start: float, end: float, *, content: bool = False
               ) -> tuple[list[ToolCall], int]:
    """The tool calls of a session's message rows (role, content, tool_call_id, tool_calls, tool_name,
    timestamp), in the order they were asked for, and how many more there were than MAX_SPANS (pure).
    An assistant row's tool_calls asks for them; the tool row with the same call id after it answers
    (ids repeat from turn to turn: the latest unanswered call of that id is answered). Any field may
    be anything: what is no name, id, time or text is taken as absent, never as an error of ours."""
    calls: list[dict[str, Any]] = []
    waiting: dict[str, list[int]] = {}
    for row in rows:
        if len(row) < 6:
            continue
        role, text, call_id, asked, tool_name, at = row[:6]
        if role == "assistant" and isinstance(asked, str):
            for call in _asked(asked):
                key = _text(call.get("id") or call.get("call_id"), MAX_ID)
                function = call.get("function") if isinstance(call.get("function"), dict) else call
                calls.append({"name": _text(function.get("name"), MAX_ID) or UNKNOWN, "id": key, "start": _time(at),
                              "args": _args(function.get("arguments")) if content else None})
                if key:
                    waiting.setdefault(key, []).append(len(calls) - 1)
        elif role == "tool":
            key = _text(call_id, MAX_ID)
            pending = waiting.get(key) if key else None
            if pending:
                index = pending.pop()
            else:  # an answer to nothing asked for in the rows read: still a call that ran
                calls.append({"name": _text(tool_name, MAX_ID) or UNKNOWN, "id": key, "start": None, "args": None})
                index = len(calls) - 1
            result = _text(text, MAX_RESULT)
            calls[index].update(end=_time(at), result=result,
                                outcome=outcome_of(str(calls[index]["name"]), result))
    made = [_span(call, start, end, content) for call in calls[:MAX_SPANS]]
    return made, max(len(calls) - MAX_SPANS, 0)


def outcome_of(tool: str, result: str | None) -> str:
    """A tool's outcome from its result, as Hermes' own display judges one (agent/display.py
    _detect_tool_failure), structured checks only (pure): none recorded is unknown; a terminal's
    non-zero exit_code, a JSON object with an error or success false, text beginning "Error" are errors."""
    if result is None:
        return UNKNOWN
    try:
        data = json.loads(result)
    except (ValueError, RecursionError):
        data = None
    if tool == "terminal":
        code = data.get("exit_code") if isinstance(data, dict) else _exit_code(result)
        return "error" if isinstance(code, int) and not isinstance(code, bool) and code != 0 else "ok"
    if isinstance(data, dict):
        if tool == "write_file" and "bytes_written" in data and not data.get("error"):
            return "ok"  # Hermes' "the write landed"
        return "error" if data.get("error") or data.get("success") is False else "ok"
    if data is None and result.lstrip().startswith("{"):  # cut at MAX_RESULT: its head is judged
        return "error" if FAILED.search(result[:500]) else "ok"
    return "error" if result.startswith("Error") else "ok"


def _span(call: Mapping[str, Any], start: float, end: float, content: bool) -> ToolCall:
    """A call's times checked against the run's (a store's times outside the run are not this run's)."""
    began, ended = call.get("start"), call.get("end", None)
    began = began if began is not None and start - 1 <= began <= end + 1 else None
    ended = ended if ended is not None and start - 1 <= ended <= end + 1 else None
    stored = began is not None and ended is not None and began <= ended
    return ToolCall(str(call["name"]), str(call.get("id") or ""), str(call.get("outcome") or UNKNOWN),
                    began if stored else start, ended if stored else end, "store" if stored else "run",
                    call.get("args") if content else None, call.get("result") if content else None)


def _asked(text: str) -> list[dict[str, Any]]:
    if len(text) > MAX_CALLS_JSON:
        return []
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return []
    return [call for call in value if isinstance(call, dict)] if isinstance(value, list) else []


def _args(value: Any) -> str | None:
    if isinstance(value, str):
        return value[:MAX_ARGS]
    try:
        return json.dumps(value, ensure_ascii=False)[:MAX_ARGS] if value is not None else None
    except (TypeError, ValueError, RecursionError):
        return None


def _text(value: Any, limit: int) -> str | None:
    return value[:limit] if isinstance(value, str) and value else None


def _time(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def _exit_code(text: str) -> int | None:
    found = EXIT_CODE.search(text[:4096])
    return int(found.group(1)) if found and len(found.group(1)) < 19 else None


# -- the edge: the store read ----------------------------------------------------------------------

def read(profile_dir: Path, session: Any, start: float, end: float, *, content: bool = False
         ) -> tuple[list[ToolCall], str | None]:
    """The tool calls of the run that ran from `start` to `end` (seconds since the epoch), and what kept
    some or all from being read, said in a sentence (None when nothing did). Read from a private
    copy of the profile's state.db (the run could have written anything there), bounded. `session` is
    the id the run's usage file reported, as it was written."""
    path = profile_dir / STATE_DB
    with private_copy(path, MAX_STATE_BYTES) as copy:
        if copy is None:
            return [], f"{path} is not there, is no regular file or is larger than {MAX_STATE_BYTES >> 20} MB"
        try:
            conn = open_hostile(copy, ("sessions", "messages"), max_value=MAX_VALUE, readonly=False)
        except (OSError, sqlite3.Error, ValueError) as exc:
            return [], f"{path} could not be opened as Hermes' session store: {exc}"
        try:
            reported = reported_session(session)
            candidates = conn.execute(
                "SELECT id, source, parent_session_id, started_at FROM sessions WHERE id = ? "
                "OR started_at BETWEEN ? AND ? LIMIT 50", (reported, start, end)).fetchall()
            session = match_session(reported, candidates, start, end)
            if session is None:
                return [], f"{path} holds no session of this run" + (f" ({reported})" if reported else "")
            rows, cut_short = _rows(conn, session)
        except sqlite3.Error as exc:
            return [], f"{path} could not be read as Hermes' session store: {exc}"
        finally:
            conn.close()
    calls, left_out = tool_calls(rows, start, end, content=content)
    if cut_short or left_out:
        return calls, (f"the run's session in {path} holds more than this reads ({MAX_ROWS} messages, "
                       f"{MAX_READ >> 20} M characters, {MAX_SPANS} tool calls): {len(calls)} tool calls are traced")
    return calls, None


def _rows(conn: sqlite3.Connection, session: str) -> tuple[list[tuple[Any, ...]], bool]:
    """The session's message rows for tool_calls(), and whether there were more than MAX_ROWS or
    MAX_READ characters of them (the rest are not read)."""
    cursor = conn.execute(
        "SELECT role, substr(content, 1, ?), substr(tool_call_id, 1, ?), "
        "CASE WHEN length(tool_calls) <= ? THEN tool_calls END, substr(tool_name, 1, ?), timestamp "
        "FROM messages WHERE session_id = ? AND role IN ('assistant', 'tool') ORDER BY id LIMIT ?",
        (MAX_RESULT, MAX_ID, MAX_CALLS_JSON, MAX_ID, session, MAX_ROWS + 1))
    rows, read = [], 0
    for row in cursor:
        read += sum(len(value) for value in row if isinstance(value, (str, bytes)))
        if len(rows) == MAX_ROWS or read > MAX_READ:
            return rows, True
        rows.append(row)
    return rows, False
