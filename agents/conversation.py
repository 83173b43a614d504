"""What a task's history and transcript say of its conversation, as pure functions: whose
conversation a claim continues, whether it starts afresh, which calls are unanswered, and whether
the last answer was cut at max_tokens or empty and asked again."""

from __future__ import annotations

import contextlib
import json
import re
from typing import Any

from ..kanban.journal import holder_name
from .translate import Message, text_tool_calls

# An answer that reached max_tokens is cut mid-way: the model is asked for the rest this many times.
MAX_CONTINUATIONS = 3
CONTINUE = ("Your answer was cut off at the output token limit. Continue it exactly where it stopped, "
            "without repeating anything.")

# An empty answer (llama-cpp-python's first one often is) is asked again this many times within the
# attempt, in the transcript, before the attempt counts as failed: a server's quirk spends no attempt.
MAX_REASKS = 2
REASK = "Your last answer was empty. Answer the task now, or call one of the tools."
# An answer that is nothing but <tool_call> blocks none of which can be read (small models close one
# brace too many) is a call gone wrong, never the task's result: asked again the same way.
UNREADABLE = ("Your tool call could not be read: its JSON is not valid. Call the tool again with valid JSON, "
              "or answer without a tool.")

ROLES = ("system", "user", "assistant", "tool")


def _claims(task: dict[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """The task's history entries and the indexes of its claims (moves to doing) among them."""
    history = [entry for entry in task.get("history") or [] if isinstance(entry, dict)]
    return history, [index for index, entry in enumerate(history) if entry.get("to") == "doing"]


def _restart(history: list[dict[str, Any]], claims: list[int], k: int) -> tuple[list[dict[str, Any]],
                                                                               list[dict[str, Any]]]:
    """Why claim `k` (k >= 1) started a new conversation: the failed attempts and the retries by a
    person between it and the claim before it (both empty: it continued the conversation)."""
    since = history[claims[k - 1] + 1:claims[k]]
    failed = [entry for entry in since if entry.get("from") == "doing" and entry.get("by") != "board"
              and re.match(r"attempt \d+ of \d+ failed: ", str(entry.get("note") or ""))]
    # An answered question (blocked -> todo) is no retry: the conversation goes on with the answer.
    retries = [entry for entry in since if entry.get("to") == "todo" and entry.get("by") != "board"
               and (entry.get("from") in ("failed", "cancelled")
                    or str(entry.get("note") or "").startswith("retry"))]
    return failed, retries


def _last_restart(history: list[dict[str, Any]], claims: list[int]) -> int:
    """The index of the latest claim before the current one that started a new conversation, else 0."""
    return next((k for k in range(len(claims) - 2, 0, -1) if any(_restart(history, claims, k))), 0)


def holders(task: dict[str, Any], me: str) -> tuple[list[str], list[str]]:
    """From a task's history: the agents whose transcript may hold the conversation this claim
    continues (the holders of the claims before it, back to the one that last started afresh, the
    latest claim's first, each once, `me` included), and every other agent that ever held it (whose
    spending counts against the task's ceilings). Which of the first has the conversation is the
    journal's to say (the one written last): a holder may have died before writing anything, however
    many in a row."""
    history, claims = _claims(task)
    names = [history[index].get("by") for index in claims]
    others = sorted({name for name in names if holder_name(name)} - {me})
    if len(claims) < 2:
        return [], others
    start = _last_restart(history, claims)
    earlier: list[str] = []
    for name in reversed(names[start:-1]):
        if holder_name(name) and name not in earlier:
            earlier.append(name)
    return earlier, others


NOTE_CHARS = 300  # of the previous attempt's error in a fresh start's first message: a hint, not a replay


def fresh_start(task: dict[str, Any]) -> str | None:
    """Whether this attempt starts a new conversation, from the task's history: the error of the
    previous attempt when it failed (the model ran out of turns, a provider error failed it) or a
    person retried the task since, else None (resume). An attempt whose holder died, lost its lease,
    or gave the task back (a stop, a budget) ended through no fault of the conversation: resumed."""
    history, claims = _claims(task)
    if len(claims) < 2:
        return None
    failed, retries = _restart(history, claims, len(claims) - 1)
    if not failed and not retries:
        return None
    why = _why(failed, retries)
    if not failed and task.get("error"):
        why = f"{why} after: {task['error']}"
    return why if len(why) <= NOTE_CHARS else why[:NOTE_CHARS] + "…"


def _why(failed: list[dict[str, Any]], retries: list[dict[str, Any]]) -> str:
    return str(failed[-1].get("note")) if failed else f"a person ({retries[-1].get('by')}) retried it"


def begun_since_restart(task: dict[str, Any], records: list[dict[str, Any]]) -> bool:
    """Whether a transcript is of the conversation this claim may continue (pure): when a claim
    before this one started afresh, only a conversation begun there, whose first message carries
    that fresh start's note, is; one from before it ended badly (a holder that started afresh may
    have died before setting its own old one aside, and a transcript's time cannot tell them apart)."""
    history, claims = _claims(task)
    start = _last_restart(history, claims) if len(claims) >= 2 else 0
    if start == 0:
        return True
    mark = _why(*_restart(history, claims, start))[:NOTE_CHARS]
    first = next((r.get("content") for r in records if r.get("role") == "user"), None)
    return isinstance(first, str) and f"did not succeed ({mark}" in first


def fresh_note(why: str) -> str:
    """The note a fresh start's first message ends with, so the model does not repeat the attempt."""
    return (f"\n\nNote: an earlier attempt at this task did not succeed ({why}). Its conversation is set "
            "aside; start afresh and take another approach.")


def unanswered(messages: list[Message]) -> tuple[str, list[dict[str, Any]]]:
    """The turn id of the last assistant message and its tool calls that have no result yet.

    Tool calls are logged by turn and call id: call ids alone are not unique (some local servers
    number them from call_0 on every turn). The turn id is stored in the assistant message itself,
    so it survives restarts and the rewriting of the transcript by compression."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index]["role"] == "assistant":
            answered = {m.get("tool_call_id") for m in messages[index + 1:] if m["role"] == "tool"}
            turn = str(messages[index].get("turn") or index)
            return turn, [c for c in messages[index].get("tool_calls") or [] if c["id"] not in answered]
    return "", []


def repeats(calls: list[dict[str, Any]]) -> dict[str, str]:
    """Each call of a turn that is the same as an earlier one of that turn (tool and arguments, keys
    in any order), mapped to that earlier call's id (pure). A small model wrote one kanban_create 16
    times in one answer: 16 tasks on the board."""
    first: dict[str, str] = {}
    same: dict[str, str] = {}
    for call in calls:
        function = call.get("function") or {}
        text = str(function.get("arguments") or "{}")
        with contextlib.suppress(ValueError, RecursionError):
            text = json.dumps(json.loads(text), sort_keys=True)
        key = f"{function.get('name')}\0{text}"
        if key in first:
            same[str(call.get("id"))] = first[key]
        else:
            first[key] = str(call.get("id"))
    return same


def called(messages: list[Message]) -> set[str]:
    """The names of the tools the conversation's assistant messages called (pure)."""
    return {str(call.get("function", {}).get("name")) for message in messages if message.get("role") == "assistant"
            for call in message.get("tool_calls") or [] if isinstance(call, dict)}


def answer_pieces(messages: list[Message]) -> list[str]:
    """The texts of the last assistant message and of the cut answers it continues, in order: an
    answer that reached max_tokens is marked `cut` in the transcript and followed by CONTINUE."""
    index = len(messages) - 1
    if index < 0 or messages[index]["role"] != "assistant":
        return []
    pieces = [str(messages[index].get("content") or "")]
    while (index >= 2 and messages[index - 1]["role"] == "user" and messages[index - 1].get("content") == CONTINUE
           and messages[index - 2]["role"] == "assistant" and messages[index - 2].get("cut")):
        index -= 2
        pieces.insert(0, str(messages[index].get("content") or ""))
    return pieces


def reasks(messages: list[Message]) -> int:
    """How many times in a row the model was asked again after an empty answer or an unreadable call,
    up to the last message (pure): the REASKs and UNREADABLEs each after an assistant message,
    counted back from the end."""
    count, index = 0, len(messages) - 2
    while index >= 1 and messages[index]["role"] == "user" and messages[index].get("content") in (REASK, UNREADABLE) \
            and messages[index - 1]["role"] == "assistant":
        count += 1
        index -= 2
    return count


def awaits_continuation(messages: list[Message]) -> bool:
    """Whether the conversation ends with a cut answer whose rest was not asked for yet."""
    last = messages[-1] if messages else {}
    return last.get("role") == "assistant" and bool(last.get("cut")) and not last.get("tool_calls")


def calls_across_cuts(message: Message, cut: list[str], known: set[str]) -> Message:
    """`message`, the rest of the answers `cut` at max_tokens before it, with the tool calls they
    write together as text (pure): a call a local model writes as text may be longer than its
    max_tokens (a whole file for write_file), and no piece of it alone is a call. Their text is in
    the cut answers already; unchanged when they write no call."""
    if message.get("tool_calls") or not cut:
        return message
    whole = text_tool_calls({"role": "assistant", "content": "".join(cut) + str(message.get("content") or "")},
                            known)
    return {**message, "content": None, "tool_calls": whole["tool_calls"]} if whole.get("tool_calls") else message
