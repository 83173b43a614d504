"""Which of an agent's tools a task's model calls offer (pure): the definitions go with every call,
so a tool nothing in the task calls for is left out of them.

Measured on a 4k-context local server, the default agent's nine definitions were 1,203 of a
1,289-token first prompt. A one-line question needs none of `ask_human`, `kanban_create` or `wait`.
Leaving a tool out of the definitions takes no right away: it stays callable (a model that names it
is served), and once called, or named in the task, it is offered for the rest of the task.

A tool's `cues` (agents/tools.py) are word beginnings; the tool is offered when a word of the task,
the agent's identity or its instructions begins with one of them. A tool without cues is always
offered (memory, terminal, skills' tools, Hermes' worker tools). `FILE_CUE` stands for a file name
or a path in the text (`notes.md`, a 2 to 5 character extension; `src/app`, `~/papers`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

FILE_CUE = "<file>"
MODES = ("task", "all")  # an agent's `offer_tools`: by what the task calls for (default), or every tool

# The cues of the built-ins. English first; a few words of the languages users wrote tasks in. A miss
# costs a tool the model is not told of (it can still call it), a false hit the tokens of a definition.
FILE_WORK = (FILE_CUE, "file", "folder", "director", "path", "save", "edit", "patch", "repo", "code",
             "script", "readme", "fichier", "dossier", "datei", "ordner", "archivo", "carpeta")
WAITING = ("wait", "sleep", "pause", "delay", "second", "minute", "poll", "later")
ASKING = ("ask", "human", "person", "people", "confirm", "approv", "clarif", "permission", "decid",
          "unclear", "unsure")
PLANNING = ("tasks", "subtask", "sub", "follow", "board", "kanban", "plan", "split", "break", "team",
            "assign", "depend", "schedul", "ticket", "card", "role", "worker", "review")
COMMENTING = ("comment", "board", "kanban", "ticket", "card", "remark")
DELEGATING = ("delegat", "helper", "parallel", "subtask", "split", "agent", "team")

_WORD = re.compile(r"\w+")
_FILE = re.compile(r"\b[\w-]+\.[A-Za-z][A-Za-z0-9]{1,4}\b|\w/\w|(?:^|\s)[~.]?/\w")


def calls_for(cues: Iterable[str], text: str) -> bool:
    """Whether a word of `text` begins with one of `cues` (case-blind), or, for FILE_CUE, whether
    `text` names a file or a path. An empty `cues` always calls for the tool."""
    # A skill's own cues may be anything: a lone string is one cue, what is not text is no cue.
    cues = (cues,) if isinstance(cues, str) else tuple(cue for cue in cues if isinstance(cue, str) and cue)
    if not cues:
        return True
    lowered = text.lower()
    words = set(_WORD.findall(lowered))
    for cue in cues:
        if cue == FILE_CUE:
            if _FILE.search(text):
                return True
        elif any(word.startswith(cue) for word in words):
            return True
    return False


def offered(cues: Mapping[str, Iterable[str]], text: str, used: Iterable[str] = (),
            mode: str = "task") -> list[str]:
    """The names of the tools to offer, sorted (provider caches need byte-identical prompts):
    `cues` maps each tool the agent may call to its cues; `text` is what the model is given to work
    from; `used` names the tools the conversation already called. In mode "all", every tool."""
    used = set(used)
    named = set(_WORD.findall(text))
    return sorted(name for name, tool_cues in cues.items()
                  if mode == "all" or name in used or name in named or calls_for(tool_cues, text))


def task_text(task: Mapping[str, object], inputs: Iterable[Mapping[str, object]] | None = None,
              *also: str) -> str:
    """What the cues are looked for in: the task's title, body and comments, the results of the
    tasks it depends on, and `also` (the agent's identity and instructions). Not the prompt's fixed
    headers ("Task t1: ..."), which would call for the board's tools in every task."""
    parts = [str(task.get("title") or ""), str(task.get("body") or ""), *also]
    comments = task.get("comments")
    if isinstance(comments, list):
        parts += [str(c.get("text") or "") for c in comments if isinstance(c, dict)]
    for dep in inputs or ():
        result = dep.get("result")
        parts.append(result if isinstance(result, str) else repr(result))
    return "\n".join(part for part in parts if part)
