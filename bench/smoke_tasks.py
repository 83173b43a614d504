"""The workload of `make real-smoke` (bench/real_smoke.py): 20 varied tasks with known answers (short
answers, files written and read back, memory, a delegated task, a long input near a 4k context,
other languages, JSON output, dependencies, a steps-only task), each with the check of its answer."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Check = Callable[[str, Path], bool]  # (the answer, the task's work folder) -> right?
# Errors of the model's own making: it did not finish within its turns, looped, or rambled.
MODEL_CAUSES = ("no final answer after", "answered nothing", "the same tool call returned the same result",
                "cut at max_tokens", "token ceiling", "filled the context", "could not be read")


@dataclass(frozen=True)
class SmokeTask:
    id: str
    title: str
    body: str
    check: Check
    assignee: str | None = None
    depends_on: tuple[str, ...] = ()
    steps: list[dict[str, Any]] | None = None
    files: dict[str, str] = field(default_factory=dict)


def read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def json_in(text: str) -> Any:
    """The first JSON value in `text` (a fenced block, or the text itself), or None."""
    fenced = re.search(r"```(?:json)?\s*(.*?)```", text, re.S)
    for candidate in ([fenced.group(1)] if fenced else []) + [text, text[text.find("{"):], text[text.find("["):]]:
        try:
            return json.JSONDecoder().raw_decode(candidate.strip())[0]
        except ValueError:
            continue
    return None


def memory_of(work: Path, word: str) -> bool:
    """Whether worker-1's memory file holds `word` (the task's folder is runs/tasks/<id>/work)."""
    return word in read(work.parents[2] / "worker-1" / "memory" / "MEMORY.md").lower()


def answer_text(result: Any) -> str:
    return str(result.get("answer", json.dumps(result))) if isinstance(result, dict) else str(result)


def is_tool_call(text: str) -> bool:
    """Whether a final answer is a tool call written as text (the runtime should have run it)."""
    from hermes_sup.agents.translate import text_tool_calls

    known = {"read_file", "write_file", "patch", "search_files", "memory", "kanban_create", "kanban_comment",
             "ask_human", "wait", "delegate_task"}
    parsed = text_tool_calls({"role": "assistant", "content": text}, known)
    return bool(parsed.get("tool_calls")) or "<tool_call>" in text


FILLER = " ".join(f"On day {n} the weather was mild and the market sold apples, bread and fish." for n in range(1, 90))
LONG = FILLER[:len(FILLER) // 2] + " The secret word is PLUM. " + FILLER[len(FILLER) // 2:]

TASKS: list[SmokeTask] = [
    SmokeTask("smoke-add", "What is 17 + 25?", "Answer with the number only.", lambda a, w: "42" in a),
    SmokeTask("smoke-capital", "What is the capital of France?", "Answer with one word.",
              lambda a, w: "paris" in a.lower()),
    SmokeTask("smoke-week", "How many days are in a week?", "Answer with the number only.",
              lambda a, w: "7" in a or "seven" in a.lower()),
    SmokeTask("smoke-opposite", "What is the opposite of hot?", "Answer with one word.",
              lambda a, w: "cold" in a.lower()),
    SmokeTask("smoke-upper", "Write the word kanban in capital letters.", "Answer with that word only.",
              lambda a, w: "KANBAN" in a),
    SmokeTask("smoke-fruits", "List three fruits.", "Answer with the three names, separated by commas.",
              lambda a, w: a.count(",") >= 2),
    SmokeTask("smoke-french", "Translate 'thank you' into French.", "Answer with the French words only.",
              lambda a, w: "merci" in a.lower()),
    SmokeTask("smoke-german", "Was ist die Hauptstadt von Deutschland?", "Antworte mit einem Wort.",
              lambda a, w: "berlin" in a.lower()),
    SmokeTask("smoke-json", "Describe Ann, who is 30, as JSON.",
              'Answer with a JSON object with the keys "name" and "age" only.',
              lambda a, w: isinstance(j := json_in(a), dict) and str(j.get("name", "")).lower() == "ann"
              and str(j.get("age")) == "30"),
    SmokeTask("smoke-json-list", "The first three even numbers as a JSON list.", "Answer with the JSON list only.",
              lambda a, w: json_in(a) == [2, 4, 6] or json_in(a) == [0, 2, 4]),
    SmokeTask("smoke-write", "Write a file.", "Use write_file to write the text hello into the file hello.txt, "
              "then answer with the word done.", lambda a, w: "hello" in read(w / "hello.txt").lower()),
    SmokeTask("smoke-read", "Read a file.", "Use read_file to read notes.txt and answer with its first line.",
              lambda a, w: "alpha" in a.lower(), files={"notes.txt": "alpha beta\nsecond line\n"}),
    SmokeTask("smoke-roundtrip", "Write count.txt and read it back.",
              "Use write_file to write the numbers 1, 2 and 3 into count.txt, one per line. Then use read_file "
              "to read count.txt and answer with its last line.",
              lambda a, w: "3" in a and read(w / "count.txt").split() == ["1", "2", "3"]),
    SmokeTask("smoke-remember", "Remember the project codename.",
              "Use the memory tool to save this fact: the project codename is Bluebird. Then answer saved.",
              lambda a, w: memory_of(w, "bluebird"), assignee="worker-1"),
    SmokeTask("smoke-recall", "What is the project codename?", "Answer with the codename only.",
              lambda a, w: "bluebird" in a.lower(), assignee="worker-1", depends_on=("smoke-remember",)),
    SmokeTask("smoke-delegate", "Delegate a sum.",
              "Use delegate_task with the goal 'What is 6 times 7?' and answer with the helper's result.",
              lambda a, w: "42" in a),
    SmokeTask("smoke-long", "Find the secret word.", f"{LONG}\n\nWhat is the secret word in the text above? "
              "Answer with the word only.", lambda a, w: "plum" in a.lower()),
    SmokeTask("smoke-dep-first", "What is 3 + 4?", "Answer with the number only.", lambda a, w: "7" in a),
    SmokeTask("smoke-dep-then", "Double the earlier result.",
              "The result of the task this one depends on is a number: answer with twice that number, only "
              "the number.", lambda a, w: "14" in a, depends_on=("smoke-dep-first",)),
    SmokeTask("smoke-steps", "Write the date file (steps only).", "Runs without a model.",
              lambda a, w: read(w / "date.txt") == "2026-11-27\n",
              steps=[{"tool": "write_file", "args": {"path": "date.txt", "content": "2026-11-27\n"}}]),
]
