"""`memory/MEMORY.md`: facts an agent keeps across tasks, restarts and a change of provider.

The format is Hermes Agent's, so a Hermes memory file can be copied in and used as it is: entries
separated by a line holding only `§`. `replace` and `remove` find their entry by a substring that
must match exactly one entry. The size is bounded, and a full memory refuses an `add` (the model
is told to replace or remove first) rather than dropping old facts silently.

Changes are pure functions over the list of entries; `MemoryFile` applies one under a file lock,
re-reading the file first and replacing it atomically, so two writers never lose each other's
entries.
"""

from __future__ import annotations

from pathlib import Path

import filelock
from hermes_sup.kanban.fsio import write_atomic

SEPARATOR = "§"
DEFAULT_LIMIT = 8000  # characters of entries, about 2,000 tokens of every prompt


class MemoryEntryError(ValueError):
    """A memory change that cannot be made; the message is shown to the model."""


def parse(text: str) -> list[str]:
    entries, current = [], []
    for line in text.splitlines():
        if line.strip() == SEPARATOR:
            entries.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current).strip())
    return [entry for entry in entries if entry]


def render(entries: list[str]) -> str:
    return (f"\n{SEPARATOR}\n".join(entries) + "\n") if entries else ""


def size(entries: list[str]) -> int:
    return sum(len(entry) for entry in entries)


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


def apply(entries: list[str], action: str, *, content: str | None = None, old_text: str | None = None,
          limit: int = DEFAULT_LIMIT) -> list[str]:
    """The entries after `action` (add, replace, remove); MemoryEntryError says why not."""
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
        if text in entries:
            return entries
        updated = [*entries, text]
    else:
        index = _the_one(entries, old_text)
        updated = [*entries[:index], text, *entries[index + 1:]]
    if size(updated) > limit:
        raise MemoryEntryError(f"memory is full ({size(entries)} of {limit} characters); replace or remove entries "
                          "before adding")
    return updated


class MemoryFile:
    def __init__(self, path: Path, limit: int = DEFAULT_LIMIT) -> None:
        self.path = path
        self.limit = limit
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = filelock.FileLock(str(path) + ".lock", timeout=30)

    def entries(self) -> list[str]:
        try:
            return parse(self.path.read_text(encoding="utf-8", errors="replace"))
        except FileNotFoundError:
            return []

    def change(self, action: str, *, content: str | None = None, old_text: str | None = None) -> str:
        with self._lock:
            before = self.entries()
            after = apply(before, action, content=content, old_text=old_text, limit=self.limit)
            if after != before:
                write_atomic(self.path, render(after).encode("utf-8"))
        return f"memory {action}: {len(after)} entries, {size(after)} of {self.limit} characters"

    def prompt_block(self) -> str:
        """The memory as it goes into the system prompt (empty when there is none)."""
        entries = self.entries()
        if not entries:
            return ""
        return "## What you remember\n" + "\n".join(f"- {entry}" for entry in entries)
