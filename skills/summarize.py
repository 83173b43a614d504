"""Summarize a long text, or a file of the agent's folder, with the cheap model tier."""

from __future__ import annotations

from typing import Any

from hermes_sup.agents.files import read_text
from hermes_sup.agents.offer import FILE_CUE
from hermes_sup.agents.tools import Tool, ToolError, register

MAX_INPUT = 200_000


def summarize(ctx: Any, args: dict[str, Any]) -> str:
    if ctx.llm is None:
        raise ToolError("no model is available to summarize with")
    if args.get("path"):
        text = read_text(ctx, args["path"])  # never through a symlink swapped in after the check
    elif args.get("text"):
        text = args["text"]
    else:
        raise ToolError("give text or path")
    focus = f" Focus on: {args['focus']}." if args.get("focus") else ""
    prompt = (f"Summarize the following in at most {int(args.get('max_words') or 150)} words, keeping names, "
              f"numbers and conclusions exact.{focus}\n\n{text[:MAX_INPUT]}")
    return ctx.llm("cheap", prompt)


register(Tool("summarize", "Summarize a long text or a file of your folder with a cheap model.", summarize,
              {"type": "object", "properties": {
                  "text": {"type": "string"}, "path": {"type": "string"}, "focus": {"type": "string"},
                  "max_words": {"type": "integer", "minimum": 10, "maximum": 2000}},
                  "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True,
              cues=(FILE_CUE, "summar", "long", "shorten", "condens")))
