"""The task document: its schema, validation of untrusted input, and pure transitions.

Nothing here touches the filesystem; the store calls these functions with the bytes it read and
writes what they return.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeGuard

STATUSES = ("todo", "doing", "blocked", "done", "failed", "cancelled")
TERMINAL = frozenset({"done", "failed", "cancelled"})
TIERS = ("auto", "cheap", "standard", "premium")
ID_RE = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")

# Fields a person or a script may set in a dropped file or with `task add`.
USER_FIELDS = (
    "id", "title", "body", "status", "priority", "assignee", "role", "depends_on", "steps", "tier",
    "max_attempts", "meta",
)
# Fields only the board writes; present in a dropped file (a task copied out of done/, say) they are reset.
SYSTEM_FIELDS = (
    "attempts", "claims", "claim", "result", "error", "history", "created_at", "updated_at", "source", "waiting",
    "comments", "question",
)
DEFAULT_MAX_ATTEMPTS = 3
# One cap for every task put on the board (a dropped file, `task add`, `kanban_create`): its
# bytes as a file, its fields as a document.
MAX_BYTES = 1024 * 1024
# Deeper nesting than this is no task's data, and a parser or json.dumps recursing through
# 100,000 levels crashes the process that reads it.
MAX_DEPTH = 64
# Python refuses to print an int of more than 4,300 digits (json.dumps raises); no field needs 100.
MAX_INT_DIGITS = 100
_SURROGATE = re.compile("[\ud800-\udfff]")


class TaskError(ValueError):
    """Input that cannot become a task; the message says exactly what is wrong."""


def now_iso(clock: Callable[[], datetime] | None = None) -> str:
    moment = clock() if clock else datetime.now(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_valid_id(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None


def slugify(text: str, limit: int = 48) -> str:
    """A readable id prefix from free text: lower case, [a-z0-9-], no leading or doubled dashes."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    slug = slug[:limit].rstrip("-")
    return slug or "task"


def _type_name(value: object) -> str:
    return {dict: "object", list: "list", str: "string", bool: "boolean", int: "integer",
            float: "number", type(None): "null"}.get(type(value), type(value).__name__)


def _expect(name: str, value: object, kind: type | tuple[type, ...], what: str) -> None:
    # bool is an int in Python, never in a task file.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TaskError(f"field '{name}' must be {what}, got boolean {str(value).lower()}")
    if not isinstance(value, kind):
        raise TaskError(f"field '{name}' must be {what}, got {_type_name(value)} {_short(value)}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _plain_problem(value: object) -> str | None:
    """Why `value` is not plain JSON data within the board's bounds, or None (pure, iterative:
    no recursion to exhaust, and it stops after MAX_BYTES values, which no 1 MiB task holds)."""
    stack: list[tuple[object, int, str]] = [(value, 0, "")]
    seen = 0
    while stack:
        item, depth, where = stack.pop()
        seen += 1
        if seen > MAX_BYTES:
            return "it holds more values than a 1 MiB task can"
        at = f" at {where}" if where else ""
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found:
                code = ord(found.group())
                return f"the text{at} holds an unpaired surrogate \\u{code:04x}, which is not Unicode text"
        elif isinstance(item, int):
            if item.bit_length() > MAX_INT_DIGITS * 10 // 3:
                return f"the integer{at} has more than {MAX_INT_DIGITS} digits"
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"the number{at} ({item}) is not a finite number"
        elif isinstance(item, (dict, list, tuple)):
            if depth >= MAX_DEPTH:
                return f"the data{at} is nested more than {MAX_DEPTH} levels deep"
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return f"keys must be text, but {where or 'the task'} has the key {_short(key)}"
                    if _SURROGATE.search(key):
                        return f"the key {key!r}{at} holds an unpaired surrogate, which is not Unicode text"
                    stack.append((child, depth + 1, f"{where}.{key}" if where else key))
            else:
                stack.extend((child, depth + 1, f"{where}[{index}]") for index, child in enumerate(item))
        else:
            return (f"the value{at} is a {type(item).__name__}; a task holds only text, numbers, true/false, "
                    f"null, lists and objects")
    return None


def check_plain(value: object) -> None:
    """Raise TaskError unless `value` is plain JSON data within the board's bounds."""
    problem = _plain_problem(value)
    if problem is not None:
        raise TaskError(problem)


def document_size(doc: Mapping[str, Any]) -> int:
    return len(json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _optional_name(name: str, value: object) -> str | None:
    if value is None:
        return None
    _expect(name, value, str, "a string or null")
    assert isinstance(value, str)
    value = value.strip()
    return value or None


def _steps(value: object) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    _expect("steps", value, list, "a list of {tool, args} objects or null")
    assert isinstance(value, list)
    steps: list[dict[str, Any]] = []
    for index, step in enumerate(value):
        where = f"steps[{index}]"
        if not isinstance(step, dict):
            raise TaskError(f"{where} must be an object with 'tool' and 'args', got {_type_name(step)}")
        unknown = set(step) - {"tool", "args"}
        if unknown:
            raise TaskError(f"{where} has unknown field(s) {sorted(unknown)}; a step has 'tool' and 'args'")
        tool = step.get("tool")
        if not isinstance(tool, str) or not tool.strip():
            raise TaskError(f"{where}.tool must be a non-empty string")
        args = step.get("args", {})
        if not isinstance(args, dict):
            raise TaskError(f"{where}.args must be an object, got {_type_name(args)}")
        steps.append({"tool": tool.strip(), "args": args})
    return steps


def _depends_on(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    _expect("depends_on", value, list, "a list of task ids")
    assert isinstance(value, list)
    deps: list[str] = []
    for index, dep in enumerate(value):
        if not is_valid_id(dep):
            raise TaskError(
                f"depends_on[{index}] is not a task id: {_short(dep)} (ids match [a-z0-9][a-z0-9-]{{0,63}})"
            )
        if dep not in deps:
            deps.append(dep)
    return deps


def normalize(
    raw: Mapping[str, Any],
    *,
    default_id: str,
    now: str,
    by: str,
    note: str,
    allow_status: Iterable[str] = ("todo", "blocked", "done", "failed", "cancelled"),
) -> dict[str, Any]:
    """Validate untrusted fields and return a complete task document.

    `default_id` is used when the input names no id. Raises TaskError naming the first problem.
    """
    if not isinstance(raw, Mapping):
        raise TaskError(f"a task must be an object (a mapping of fields), got {_type_name(raw)}")
    check_plain(dict(raw))
    unknown = [key for key in raw if key not in USER_FIELDS and key not in SYSTEM_FIELDS]
    if unknown:
        key = str(unknown[0])
        close = difflib.get_close_matches(key, USER_FIELDS, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise TaskError(
            f"unknown field '{key}'{hint}; task fields are {', '.join(USER_FIELDS)} (free-form data goes in 'meta')"
        )

    task_id = raw.get("id", default_id)
    if task_id is None:
        task_id = default_id
    if not is_valid_id(task_id):
        raise TaskError(
            f"id {_short(task_id)} is not a safe file name: it must match [a-z0-9][a-z0-9-]{{0,63}}"
        )

    if "title" not in raw or raw["title"] is None:
        raise TaskError("missing title: every task needs a non-empty 'title'")
    _expect("title", raw["title"], str, "a non-empty string")
    title = raw["title"].strip()
    if not title:
        raise TaskError("missing title: 'title' is empty")

    body = raw.get("body", "")
    if body is None:
        body = ""
    _expect("body", body, str, "a string")

    status = raw.get("status", "todo")
    if status not in STATUSES:
        raise TaskError(f"unknown status {_short(status)}; statuses are {', '.join(STATUSES)}")
    if status not in set(allow_status):
        raise TaskError(f"status '{status}' cannot be set here (a claim is only taken by an agent)")

    priority = raw.get("priority", 0)
    _expect("priority", priority, int, "an integer")

    max_attempts = raw.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
    _expect("max_attempts", max_attempts, int, "an integer")
    if max_attempts < 1:
        raise TaskError(f"field 'max_attempts' must be at least 1, got {max_attempts}")

    tier = raw.get("tier", "auto")
    if tier not in TIERS:
        raise TaskError(f"unknown tier {_short(tier)}; tiers are {', '.join(TIERS)}")

    meta = raw.get("meta", {})
    if meta is None:
        meta = {}
    _expect("meta", meta, dict, "an object")

    deps = _depends_on(raw.get("depends_on"))
    if task_id in deps:
        raise TaskError(f"depends_on creates a cycle: {task_id} -> {task_id}")

    doc = {
        "id": task_id,
        "title": title,
        "body": body,
        "status": status,
        "priority": priority,
        "assignee": _optional_name("assignee", raw.get("assignee")),
        "role": _optional_name("role", raw.get("role")),
        "depends_on": deps,
        "steps": _steps(raw.get("steps")),
        "tier": tier,
        "max_attempts": max_attempts,
        "attempts": 0,
        "claims": 0,
        "claim": None,
        "result": None,
        "error": None,
        "meta": meta,
        "history": [{"at": now, "by": by, "from": None, "to": status, "note": note}],
        "created_at": now,
        "updated_at": now,
    }
    size = document_size(doc)
    if size > MAX_BYTES:
        raise TaskError(f"the task is {size} bytes as a document; the limit for a task is {MAX_BYTES} bytes (1 MiB)")
    return doc


_DOC_KINDS: dict[str, tuple[type, ...]] = {
    "title": (str,), "body": (str,), "created_at": (str,), "updated_at": (str,), "priority": (int,),
    "attempts": (int,), "max_attempts": (int,), "claims": (int,), "depends_on": (list,), "history": (list,),
    "assignee": (str, type(None)), "role": (str, type(None)), "steps": (list, type(None)),
    "claim": (dict, type(None)), "meta": (dict, type(None)), "tier": (str,), "comments": (list,),
    "waiting": (str, type(None)), "question": (str, type(None)),
}
# What recovery reads of a claim to decide whether its holder lives.
_CLAIM_KINDS: dict[str, tuple[type, ...]] = {
    "agent": (str,), "pid": (int, type(None)), "pid_started": (int, float, type(None)), "host": (str, type(None)),
    "token": (int,), "lease_until_ts": (int, float, type(None)),
}
# Linux pids stay below 2**22; a larger one would overflow psutil.
MAX_PID = 1 << 22


def check_document(doc: object, *, file_id: str | None = None) -> dict[str, Any]:
    """Validate a task document read back from a status folder (the board's own format, but any
    file there may have been written by hand, or by an attacker): every field the board reads has
    the type it expects, so no hand-made file can crash a claimer or a recovery.

    A document that fails this is damaged: it is moved aside, never guessed at. Counters a hand-made
    task may leave out start at their defaults.
    """
    if not isinstance(doc, dict):
        raise TaskError(f"a task document must be an object, got {_type_name(doc)}")
    for key in ("id", "title", "status", "history", "created_at"):
        if key not in doc:
            raise TaskError(f"task document lacks '{key}'")
    if not is_valid_id(doc["id"]):
        raise TaskError(f"task document has an invalid id {_short(doc['id'])}")
    if file_id is not None and doc["id"] != file_id:
        raise TaskError(f"task document's id '{doc['id']}' is not its file name {file_id + '.json'!r}")
    if doc["status"] not in STATUSES:
        raise TaskError(f"task document has an unknown status {_short(doc['status'])}")
    for key, kinds in _DOC_KINDS.items():
        if key in doc and (isinstance(doc[key], bool) or not isinstance(doc[key], kinds)):
            raise TaskError(f"task document's '{key}' is {_type_name(doc[key])}")
    if not all(isinstance(entry, dict) for entry in doc["history"]):
        raise TaskError("task document's history holds an entry that is not an object")
    if not all(is_valid_id(dep) for dep in doc.get("depends_on") or ()):
        raise TaskError("task document's depends_on holds something that is not a task id")
    for step in doc.get("steps") or ():
        if not (isinstance(step, dict) and isinstance(step.get("tool"), str)
                and isinstance(step.get("args", {}), dict)):
            raise TaskError("task document's steps hold an entry that is not a {tool, args} object")
    claim = doc.get("claim")
    if claim is not None:
        for key, kinds in _CLAIM_KINDS.items():
            value = claim.get(key)
            if isinstance(value, bool) or not isinstance(value, kinds):
                raise TaskError(f"task document's claim.{key} is {_type_name(value)}")
        if claim.get("pid") is not None and not 0 < claim["pid"] < MAX_PID:
            raise TaskError(f"task document's claim.pid {claim['pid']} is not a process id")
    doc.setdefault("priority", 0)
    doc.setdefault("attempts", 0)
    doc.setdefault("max_attempts", DEFAULT_MAX_ATTEMPTS)
    doc.setdefault("claims", doc["attempts"])
    return doc


def transition(doc: dict[str, Any], to: str, *, by: str, now: str, note: str = "", **changes: Any) -> dict[str, Any]:
    """A new document with status `to`, `changes` applied, and one more history entry."""
    new = dict(doc)
    new.pop("waiting", None)  # a note on why a todo task waits says nothing once it moves
    new.update(changes)
    entry = {"at": now, "by": by, "from": doc["status"], "to": to, "note": note}
    new["status"] = to
    new["history"] = [*doc.get("history", []), entry]
    new["updated_at"] = now
    return new


def find_cycle(start: str, deps: Iterable[str], deps_of: Callable[[str], Iterable[str]]) -> list[str] | None:
    """The dependency path back to `start` if adding `start -> deps` closes a cycle, else None.

    `deps_of(id)` gives an existing task's depends_on (empty for an unknown id). Only the part of
    the graph reachable from `deps` is visited.
    """
    stack: list[tuple[str, list[str]]] = [(dep, [start, dep]) for dep in deps]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        if node == start:
            return path
        if node in seen:
            continue
        seen.add(node)
        for nxt in deps_of(node):
            stack.append((nxt, [*path, nxt]))
    return None
