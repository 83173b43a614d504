"""A task's records as one timeline: each journal record an entry, every source merged in time order, and
the overview `task show` adds (pure functions over plain records)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..governance.usage import ended_calls, settle_call, summarize
from .taskrecords import ATTEMPT_LAST, WRITING_TOOLS, Raw, attempt_of


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value if ok else None


def model_entry(agent: str, record: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "model", "at": _text(record.get("at")), "agent": agent,
            "provider": _text(record.get("provider")), "model": _text(record.get("model")),
            "outcome": _text(record.get("outcome")), "tokens_in": _number(record.get("tokens_in")),
            "tokens_out": _number(record.get("tokens_out")), "tokens_cached": _number(record.get("tokens_cached")),
            "latency_s": _number(record.get("latency_s")), "cost_usd": _number(record.get("cost_usd")),
            "estimated": record.get("estimated") is True, "error": _text(record.get("error")),
            **({"route": route} if (route := route_entry(record.get("route"))) else {})}


ROUTE_KEYS = ("strategy", "tier", "check", "decision", "why")


def route_entry(route: Any) -> dict[str, str] | None:
    """A routing decision of an LLM-call record (agents/cascade.py) as text fields, or None: the
    record is a file anyone with access to runs/ may have written (pure)."""
    if not isinstance(route, dict):
        return None
    kept = {key: route[key][:300] for key in ROUTE_KEYS if isinstance(route.get(key), str)}
    return kept or None


def tool_entry(agent: str, record: dict[str, Any]) -> dict[str, Any]:
    entry = {"kind": "tool", "at": _text(record.get("at")), "agent": agent, "tool": _text(record.get("tool")),
             "call_id": str(record.get("call_id")), "turn": str(record.get("turn")),
             "status": _text(record.get("status"))}
    if record.get("status") == "done":
        entry.update(outcome=_text(record.get("outcome")), result=_text(record.get("result")),
                     duration_s=_number(record.get("duration_s")))
    else:
        entry["args"] = record.get("args")
    return entry


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            calls.append({"id": str(call.get("id")), "name": _text(function.get("name")),
                          "arguments": function.get("arguments")})
    return calls if isinstance(message.get("tool_calls"), list) else []


def message_entry(agent: str, message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    entry = {"kind": "message", "at": None, "agent": agent, "role": message.get("role"),
             "content": content if isinstance(content, str) else (None if content is None else json.dumps(content))}
    if _calls(message):
        entry["tool_calls"] = _calls(message)
    if message.get("tool_call_id") is not None:
        entry["tool_call_id"] = str(message.get("tool_call_id"))
    if message.get("is_error") is True:
        entry["is_error"] = True
    return entry


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def _new_part(messages: list[dict[str, Any]], earlier: list[list[dict[str, Any]]]) -> int:
    """Where the messages of a transcript stop repeating one an agent wrote before it (a reclaimed
    task's transcript starts with a copy of the previous holder's)."""
    best = 0
    for other in earlier:
        shared = 0
        while shared < min(len(messages), len(other)) and _same(messages[shared], other[shared]):
            shared += 1
        best = max(best, shared)
    return best


Key = tuple[str, str, int | str]  # an entry's source (kind, agent) and its index there: what follow mode printed


def claims(doc: dict[str, Any]) -> list[tuple[str, str]]:
    """When which agent claimed the task, from its history, in order (pure)."""
    return [(str(entry.get("at")), str(entry.get("by"))) for entry in doc.get("history") or []
            if isinstance(entry, dict) and entry.get("to") == "doing"]


def _holder(held: Sequence[tuple[str, str]], at: str, candidates: list[str]) -> str:
    """Of the agents whose logs hold a record, the one that held the task when it was written: a
    copy sits in the next holder's log too (pure)."""
    holder = None
    for since, agent in held:
        if since <= at:
            holder = agent
    return holder if holder in candidates else candidates[0]


def merge(raws: list[Raw], held: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
    """The task's records as entries in time order (see `merge_keyed`) (pure)."""
    return [entry for _, entry in merge_keyed(raws, held)]


def merge_keyed(raws: list[Raw], held: Sequence[tuple[str, str]] = (),
                open_calls: bool = True) -> list[tuple[Key, dict[str, Any]]]:
    """The task's model calls, tool calls and messages as entries in time order (pure).

    A model call started and never ended is shown as interrupted when its agent logged something
    after it, and, with `open_calls`, also when it is the agent's last (killed mid-call, or still
    under way: follow mode, which cannot take a line back, waits for what comes next).

    Model and tool records carry their time. Messages do not: each is placed by what it follows: an
    assistant message after the model call that produced it (the agent's next answered call), a tool
    result after its call's logged end, any other after the message before it. A record copied from
    the agent that held the task before (tool records, the transcript's head) is shown once, under
    the agent that wrote it: the holder at its time by `held` (see `claims`) for a tool record."""
    keyed: list[tuple[str, int, int, Key, dict[str, Any]]] = []
    seq = 0
    tool_agents: dict[str, list[str]] = {}
    for raw in raws:
        if raw.source.kind == "tool":
            for record in raw.records:
                key = json.dumps([record.get(k) for k in ("turn", "call_id", "status", "at")], default=str)
                tool_agents.setdefault(key, []).append(raw.source.agent)
    seen_tools: set[str] = set()
    done_at: dict[str, str] = {}
    answered: dict[str, list[str]] = {}
    for raw in sorted(raws, key=lambda r: (r.source.kind, r.source.agent)):
        ended = ended_calls((raw.source.agent, r) for r in raw.records) if raw.source.kind == "model" else set()
        for index, record in enumerate(raw.records):
            if raw.source.kind == "model":
                settled = settle_call(raw.source.agent, record, ended)  # a call's start: shown if it never ended
                if settled is None or (settled is not record and not open_calls and index == len(raw.records) - 1):
                    continue
                entry = model_entry(raw.source.agent, settled)
                ident: Key = ("model", raw.source.agent, index)
                if entry["outcome"] == "ok" and entry["at"]:
                    answered.setdefault(raw.source.agent, []).append(entry["at"])
            elif raw.source.kind == "tool":
                # Told apart by content, not by whose log: the same record copied to the next holder
                # is one call (and follow mode, which printed it once, knows it by its content).
                key = json.dumps([record.get(k) for k in ("turn", "call_id", "status", "at")], default=str)
                if key in seen_tools:
                    continue
                seen_tools.add(key)
                agents = sorted(set(tool_agents[key]))
                entry = tool_entry(_holder(held, str(record.get("at")), agents) if len(agents) > 1 else agents[0],
                                   record)
                ident = ("tool", "", key)
                if entry["status"] == "done" and entry["at"]:
                    done_at.setdefault(entry["call_id"], entry["at"])
            else:
                continue
            keyed.append((entry["at"] or "", 0, seq, ident, entry))
            seq += 1
    # The shorter transcript first: a copy is as long as its original at most. Of two as long, the
    # one of the agent that called a model first is the original.
    # Earlier attempts' transcripts (set aside when a new conversation started) first, in order: their
    # answers take an agent's first model calls, and the transcripts after them the calls left.
    transcripts = sorted((raw for raw in raws if raw.source.kind == "message"),
                         key=lambda r: (attempt_of(r.source.path.name), len(r.records),
                                        min(answered.get(r.source.agent) or ["~"]), r.source.agent))
    placed: list[tuple[list[dict[str, Any]], list[str]]] = []
    used: dict[str, str] = {}  # per agent: the last model call an earlier attempt's answer took
    for raw in transcripts:
        shared, previous = 0, ""
        for messages, anchors in placed:
            count = _new_part(raw.records, [messages])
            if count > shared:
                shared, previous = count, anchors[count - 1]
        times = sorted(t for t in answered.get(raw.source.agent, []) if t > used.get(raw.source.agent, ""))
        if shared < len(raw.records):  # its new messages come after the agent's earlier attempts
            previous = max(previous, used.get(raw.source.agent, ""))
        anchors = [previous] * shared
        for index, message in enumerate(raw.records[shared:], start=shared):
            entry = message_entry(raw.source.agent, message)
            anchor = previous
            if entry["role"] == "assistant":
                later = [t for t in times if t >= previous]
                if later:
                    anchor = later[0]
                    times.remove(anchor)
            elif entry["role"] == "tool" and entry.get("tool_call_id") in done_at:
                anchor = max(previous, done_at[entry["tool_call_id"]])
            entry["at"] = anchor or None
            anchors.append(anchor)
            previous = anchor
            # An earlier attempt's transcript numbers its messages from 0 too: its name keeps them apart.
            where: int | str = index if ".attempt-" not in raw.source.path.name else f"{raw.source.path.name}#{index}"
            keyed.append((anchor, 1, seq, ("message", raw.source.agent, where), entry))
            seq += 1
        if attempt_of(raw.source.path.name) < ATTEMPT_LAST and anchors:
            used[raw.source.agent] = max(used.get(raw.source.agent, ""), max(anchors))
        placed.append((raw.records, anchors))
    return [(key, entry) for *_, key, entry in sorted(keyed, key=lambda k: k[:3])]


def overview(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """What `task show` adds from the records: the models that answered, the files written (as each
    agent's scratch-relative path) and the cost so far, unpriced calls counted apart (pure)."""
    models: dict[tuple[Any, Any], int] = {}
    calls = []
    for entry in entries:
        if entry["kind"] == "model":
            calls.append((entry["agent"], entry))
            if entry["outcome"] == "ok":
                key = (entry["provider"], entry["model"])
                models[key] = models.get(key, 0) + 1
    started = {(e["agent"], e["call_id"]): e.get("args") for e in entries
               if e["kind"] == "tool" and e["status"] == "started"}
    files: list[dict[str, Any]] = []
    for entry in entries:
        if entry["kind"] != "tool" or entry["status"] != "done" or entry.get("outcome") != "ok" \
                or entry["tool"] not in WRITING_TOOLS:
            continue
        args = started.get((entry["agent"], entry["call_id"]))
        path = args.get("path") if isinstance(args, dict) else None
        item = {"agent": entry["agent"], "path": path, "tool": entry["tool"]}
        if isinstance(path, str) and item not in files:
            files.append(item)
    total = summarize(calls)["total"]
    cost = {key: total[key] for key in ("calls", "failed_calls", "tokens_in", "tokens_out", "cost_usd",
                                        "unpriced_calls", "estimated_calls")}
    return {"models": [{"provider": p, "model": m, "calls": n} for (p, m), n in models.items()],
            "files": files, "cost": cost}
