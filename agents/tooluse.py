"""Whether a provider answers the calls that offer it tools with tool calls, or seems to drop the tools."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kanban.fsio import write_json_atomic
from ..kanban.task import now_iso
from .translate import Message

IGNORED_AFTER = 3  # tool-offered answers in prose, none with a tool call, before a provider is suspected
TOOL_USE_FILE = "tool_use.json"  # runs/<agent>/: each provider's ToolUse, for `doctor`


@dataclass
class ToolUse:
    """How a provider has answered the calls that offered it tools (kept per provider for as long
    as the agent runs): a server that drops the tools (llama.cpp without a tool-capable template)
    never answers with a call."""
    offered: int = 0
    called: int = 0
    warned: bool = False


def ignores_tools(use: ToolUse, answer: str, known: set[str], after: int = IGNORED_AFTER) -> tuple[str, bool] | None:
    """Why a provider seems to drop the tools it is offered, and whether that is sure enough to say
    on the task, or None (pure). Suspect: it never answered an offer with a tool call, and now
    answers in prose that names one of the tools (sure), or has so answered `after` offers in a row
    (a hint only: a task may need no tool)."""
    if use.called or not use.offered:
        return None
    named = sorted(name for name in known if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", answer))
    if named:
        return (f"the model answered in prose that names the tool {named[0]} instead of calling it, and has not "
                f"called a tool in {use.offered} answer(s) that offered tools: its server may be dropping the tools "
                "(a chat template without tool support?)", True)
    if use.offered >= after:
        return (f"no tool call in {use.offered} answers that offered tools: if its tasks need tools, its server may "
                "be dropping them (a chat template without tool support?)", False)
    return None


def tool_use_document(tool_use: dict[str, ToolUse]) -> dict[str, Any]:
    """What the agent saves of its providers' tool use for `doctor` (pure)."""
    return {"saved_at": now_iso(), "providers": {name: {"offered": use.offered, "called": use.called,
                                                        "warned": use.warned} for name, use in tool_use.items()}}


def watch_answer(tool_use: dict[str, ToolUse], name: str, message: Message, known: set[str],
                 path: Path) -> tuple[list[str], list[str]]:
    """Count the answer to a tool-offered call for the provider `name` that gave it, and save the
    counts to `path`; returns what to say when that provider seems to drop the tools: notes for
    the agent's log, and warnings for the task (when sure)."""
    notes: list[str] = []
    warnings: list[str] = []
    use = tool_use.setdefault(name, ToolUse())
    use.offered += 1
    if message.get("tool_calls"):
        use.called += 1
    elif (found := ignores_tools(use, str(message.get("content") or ""), known)) is not None:
        why, sure = found
        if not use.warned:
            use.warned = True
            notes.append(f"provider {name}: {why}")
        if sure:
            warnings.append(f"provider {name}: {why}")
    try:  # beside the breakers, where `doctor` reads it; the task goes on without it
        write_json_atomic(path, tool_use_document(tool_use))
    except OSError as exc:
        notes.append(f"cannot save {path.name}: {exc}")
    return notes, warnings
