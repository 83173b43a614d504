"""Hermes Agent's two memory files, `memory/MEMORY.md` (the agent's notes) and `memory/USER.md`
(what it knows of the user): facts kept across tasks, restarts and a change of provider.

The format and the limits are Hermes Agent's, so a Hermes memory folder can be copied in and used
as it is, and back: entries joined by a line holding only `§` (`\\n§\\n`, no newline at the end),
each entry stripped; a file Hermes wrote is read and written back byte-identical. The size of a
file is the length of that text, bounded per file (Hermes: 2,200 and 1,375 characters; both
configurable). A full memory refuses an `add` (the model is told to replace or remove first) rather
than dropping old facts silently, and a file larger than Hermes accepts is flagged.

Changes are pure functions over the list of entries; `MemoryFile` applies them under a file lock,
re-reading the file first and replacing it atomically, so two writers never lose each other's
entries.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..kanban.fsio import write_atomic

SEPARATOR = "§"
DELIMITER = f"\n{SEPARATOR}\n"
TARGETS = ("memory", "user")
FILES = {"memory": "MEMORY.md", "user": "USER.md"}
HERMES_LIMITS = {"memory": 2200, "user": 1375}  # hermes-agent 0.19.0, tools/memory_tool.py
DEFAULT_LIMIT = HERMES_LIMITS["memory"]
MAX_LIMIT = 1_000_000


class MemoryEntryError(ValueError):
    """A memory change that cannot be made; the message is shown to the model."""


def parse(text: str) -> list[str]:
    """The entries of a memory file, split as Hermes splits them (pure)."""
    return [entry for entry in (part.strip() for part in text.split(DELIMITER)) if entry]


def render(entries: list[str]) -> str:
    """The file's text, as Hermes writes it: no newline at the end (pure)."""
    return DELIMITER.join(entries)


def size(entries: list[str]) -> int:
    """What the limit is measured against: the file's length in characters, as Hermes counts it."""
    return len(render(entries))


def round_trips(text: str) -> bool:
    """Whether writing back what was read gives the same text (pure): true of every file Hermes
    writes; false of one edited by hand with, say, a newline at its end."""
    return render(parse(text)) == text


def beyond_hermes(target: str, entries: list[str]) -> str | None:
    """Why Hermes Agent would not accept this memory as it is, or None (pure)."""
    limit = HERMES_LIMITS[target]
    if size(entries) > limit:
        return (f"{FILES[target]} holds {size(entries):,} characters, more than Hermes Agent's {limit:,}: "
                "Hermes would refuse to add to it until entries are removed")
    return None


def limits_problem(settings: Any) -> str | None:
    """Why the `memory` settings of an agent are unusable, or None (pure)."""
    if settings is None:
        return None
    if not isinstance(settings, Mapping):
        return "'memory' must be a mapping with memory_char_limit and user_char_limit"
    for key, value in settings.items():
        if key == "__line__":
            continue
        if key not in ("memory_char_limit", "user_char_limit"):
            return f"unknown key 'memory.{key}'; expected memory_char_limit or user_char_limit"
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
            return f"memory.{key} must be a whole number of characters from 1 to {MAX_LIMIT:,}, got {value!r}"
    return None


def limits_of(settings: Any) -> dict[str, int]:
    """The limit of each file: Hermes' unless the settings say otherwise (pure; checked settings)."""
    settings = settings if isinstance(settings, Mapping) else {}
    return {target: int(settings.get(f"{target}_char_limit") or HERMES_LIMITS[target]) for target in TARGETS}


def _the_one(entries: list[str], old_text: str | None) -> int:
    if not old_text or not old_text.strip():
        raise MemoryEntryError("old_text is required: a piece of the entry to change, unique to it")
    matches = [index for index, entry in enumerate(entries) if old_text in entry]
    if not matches:
        raise MemoryEntryError(f"no memory entry contains {old_text!r}")
    if len(matches) > 1:
        raise MemoryEntryError(f"{len(matches)} memory entries contain {old_text!r}; give a longer piece of the one "
                               "to change")
    return matches[0]


def _step(entries: list[str], action: str, content: str | None, old_text: str | None) -> list[str]:
    if action == "remove":
        index = _the_one(entries, old_text)
        return entries[:index] + entries[index + 1:]
    if action not in ("add", "replace"):
        raise MemoryEntryError(f"unknown memory action {action!r}; actions are add, replace, remove")
    text = (content or "").strip()
    if not text:
        raise MemoryEntryError("content is required and must not be empty")
    if any(line.strip() == SEPARATOR for line in text.splitlines()):
        raise MemoryEntryError(f"content must not contain a line holding only {SEPARATOR}")
    if action == "add":
        return entries if text in entries else [*entries, text]
    index = _the_one(entries, old_text)
    return [*entries[:index], text, *entries[index + 1:]]


def apply(entries: list[str], action: str, *, content: str | None = None, old_text: str | None = None,
          limit: int = DEFAULT_LIMIT) -> list[str]:
    """The entries after `action` (add, replace, remove); MemoryEntryError says why not (pure)."""
    return apply_all(entries, [{"action": action, "content": content, "old_text": old_text}], limit=limit)


def apply_all(entries: list[str], operations: list[dict[str, Any]], *, limit: int = DEFAULT_LIMIT) -> list[str]:
    """The entries after every operation, in order, or MemoryEntryError and none of them (pure).
    As in Hermes, only the end result must fit: a batch may remove to make room for what it adds."""
    if not operations:
        raise MemoryEntryError("no memory operation given: an action, or operations [{action, content?, old_text?}]")
    updated = entries
    for number, op in enumerate(operations, 1):
        try:
            updated = _step(updated, str(op.get("action")), op.get("content"), op.get("old_text"))
        except MemoryEntryError as exc:
            raise MemoryEntryError(f"operation {number}: {exc}" if len(operations) > 1 else str(exc)) from None
    if size(updated) > limit and size(updated) > size(entries):
        raise MemoryEntryError(f"memory is full ({size(entries)} of {limit} characters); replace or remove entries "
                               "before adding")
    return updated


class MemoryFile:
    """One of the two files, changed under its lock."""

    def __init__(self, path: Path, limit: int = DEFAULT_LIMIT, target: str = "memory") -> None:
        self.path = path
        self.limit = limit
        self.target = target
        self.path.parent.mkdir(parents=True, exist_ok=True)
        import filelock  # here: hermes.yaml's checks import this module, and every command would pay for it

        self._lock = filelock.FileLock(str(path) + ".lock", timeout=30)

    def entries(self) -> list[str]:
        try:
            return parse(self.path.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            return []

    def change(self, action: str | None = None, *, content: str | None = None, old_text: str | None = None,
               target: str | None = None, operations: list[dict[str, Any]] | None = None) -> str:
        if target not in (None, self.target):
            raise MemoryEntryError(f"this agent keeps only its {self.target} memory ({self.path.name})")
        if operations is not None:
            return self.change_all(operations)
        if action is None:
            raise MemoryEntryError("action is required (add, replace, remove), or operations for a batch")
        return self.change_all([{"action": action, "content": content, "old_text": old_text}], action)

    def change_all(self, operations: list[dict[str, Any]], what: str = "") -> str:
        with self._lock:
            before = self.entries()
            after = apply_all(before, operations, limit=self.limit)
            if after != before:
                write_atomic(self.path, render(after).encode("utf-8"))
        said = f"{'user memory' if self.target == 'user' else 'memory'} {what or f'{len(operations)} changes'}: " \
               f"{len(after)} entries, {size(after)} of {self.limit} characters"
        beyond = beyond_hermes(self.target, after) if self.target in HERMES_LIMITS else None
        return f"{said} (note: {beyond})" if beyond else said

    def prompt_block(self) -> str:
        """The memory as it goes into the system prompt (empty when there is none)."""
        entries = self.entries()
        if not entries:
            return ""
        title = "What you know about the user" if self.target == "user" else "What you remember"
        return f"## {title}\n" + "\n".join(f"- {entry}" for entry in entries)


class Memories:
    """An agent's memory folder: MEMORY.md and USER.md, each with its limit."""

    def __init__(self, folder: Path, settings: Any = None) -> None:
        limits = limits_of(settings)
        self.files = {target: MemoryFile(folder / FILES[target], limits[target], target) for target in TARGETS}

    def change(self, action: str | None = None, *, content: str | None = None, old_text: str | None = None,
               target: str = "memory", operations: list[dict[str, Any]] | None = None) -> str:
        if target not in self.files:
            raise MemoryEntryError(f"unknown memory target {target!r}; targets are memory, user")
        return self.files[target].change(action, content=content, old_text=old_text, operations=operations)

    def entries(self, target: str = "memory") -> list[str]:
        return self.files[target].entries()

    def flags(self) -> list[str]:
        """Each file Hermes Agent would not accept as it is (see beyond_hermes)."""
        return [note for target, file in self.files.items() if (note := beyond_hermes(target, file.entries()))]

    def prompt_block(self) -> str:
        return "\n\n".join(block for file in self.files.values() if (block := file.prompt_block()))
