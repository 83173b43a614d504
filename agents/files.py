"""File tools confined to the agent's scratch folder, whatever a task or a tool's arguments say (no
field of a task moves them elsewhere). A path is refused when it is absolute, when it has a `..`
part, or when it resolves (symlinks followed, at the moment of use) outside that folder; the file is
then opened by its resolved path."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path
from typing import Any

from hermes_sup.kanban.fsio import write_atomic

from .tools import Tool, ToolContext, ToolError, register

MAX_READ_CHARS = 100_000
MAX_MATCHES = 100


def root_of(ctx: ToolContext) -> Path:
    """The scratch folder, resolved. Refused when the folder itself is a symlink: a command that
    swapped it for a link to `/` would make everything "inside", for every later call, a task's
    steps with fewer rights included."""
    scratch = Path(ctx.scratch)
    if scratch.is_symlink():
        raise ToolError(f"refused: your folder {scratch} is a symlink (to {os.readlink(scratch)}); "
                        "file tools work only in a real folder")
    return scratch.resolve()


def confined(ctx: ToolContext, relative: object, *, allow_root: bool = False) -> Path:
    if not isinstance(relative, str) or not relative:
        raise ToolError("path must be a non-empty string")
    if os.path.isabs(relative) or relative.startswith("~"):
        raise ToolError(f"absolute paths are refused: {relative} (paths are relative to your folder)")
    if ".." in Path(relative).parts:
        raise ToolError(f"'..' is refused in paths: {relative}")
    root = root_of(ctx)
    target = (root / relative).resolve()
    if target == root and not allow_root:
        raise ToolError(f"{relative} is your folder itself, not a file in it")
    if target != root and root not in target.parents:
        raise ToolError(f"refused: {relative} leads outside your folder (a symlink to {target})")
    return target


def _text(target: Path, shown: str) -> str:
    try:
        return target.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ToolError(f"no such file: {shown}") from None
    except IsADirectoryError:
        raise ToolError(f"{shown} is a folder; search_files lists what is in it") from None
    except UnicodeDecodeError:
        raise ToolError(f"{shown} is not UTF-8 text") from None


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, text.encode("utf-8"), fsync=False)


def read_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = confined(ctx, args["path"])
    text = _text(target, args["path"])
    offset, limit = int(args.get("offset") or 1), args.get("limit")
    if offset > 1 or limit is not None:
        lines = text.splitlines(keepends=True)
        text = "".join(lines[offset - 1: None if limit is None else offset - 1 + int(limit)])
    if len(text) > MAX_READ_CHARS:
        return text[:MAX_READ_CHARS] + f"\n[... cut at {MAX_READ_CHARS:,} characters; read on with offset]"
    return text


def write_file(ctx: ToolContext, args: dict[str, Any]) -> str:
    _write(confined(ctx, args["path"]), args["content"])
    return f"wrote {len(args['content'])} characters to {args['path']}"


def patch(ctx: ToolContext, args: dict[str, Any]) -> str:
    target = confined(ctx, args["path"])
    text = _text(target, args["path"])
    old, new = args["old_string"], args["new_string"]
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_string does not occur in {args['path']}")
    if count > 1 and not args.get("replace_all"):
        raise ToolError(f"old_string occurs {count} times in {args['path']}; give more context, or replace_all")
    _write(target, text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1))
    return f"replaced {count if args.get('replace_all') else 1} occurrence(s) in {args['path']}"


def search_files(ctx: ToolContext, args: dict[str, Any]) -> str:
    try:
        pattern = re.compile(args["pattern"])
    except re.error as exc:
        raise ToolError(f"pattern is not a valid regular expression: {exc}") from None
    base = confined(ctx, args.get("path") or ".", allow_root=True)
    root = root_of(ctx)
    glob = args.get("file_glob") or "*"
    matches: list[str] = []
    files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    for path in files:
        real = path.resolve()
        if root not in real.parents or not fnmatch.fnmatch(path.name, glob):
            continue  # a symlink out of the folder is not followed
        shown = path.relative_to(root).as_posix()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        if not args.get("pattern"):
            matches.append(shown)
        else:
            matches += [f"{shown}:{number}: {line[:300]}" for number, line in enumerate(lines, 1)
                        if pattern.search(line)]
        if len(matches) >= MAX_MATCHES:
            return "\n".join(matches[:MAX_MATCHES]) + f"\n[... more than {MAX_MATCHES} matches; narrow the search]"
    return "\n".join(matches) or "no matches"


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


PATH = _string("a path relative to your folder")

register(Tool("read_file", "Read a text file from your folder (offset: first line, 1-based; limit: lines).",
              read_file, {"type": "object", "properties": {
                  "path": PATH, "offset": {"type": "integer", "minimum": 1},
                  "limit": {"type": "integer", "minimum": 0}},
                  "required": ["path"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, toolset="files"))
register(Tool("write_file", "Write a text file in your folder, replacing it if it exists.", write_file,
              {"type": "object", "properties": {"path": PATH, "content": _string("the whole text")},
               "required": ["path", "content"], "additionalProperties": False},
              capabilities=("fs.write",), idempotent=True, toolset="files"))
register(Tool("patch", "Replace old_string by new_string in a file of your folder (once, unless replace_all).",
              patch, {"type": "object", "properties": {
                  "path": PATH, "old_string": {"type": "string", "minLength": 1}, "new_string": {"type": "string"},
                  "replace_all": {"type": "boolean"}},
                  "required": ["path", "old_string", "new_string"], "additionalProperties": False},
              capabilities=("fs.write",), toolset="files"))
register(Tool("search_files", "Find lines matching a regular expression in the files of your folder (an empty "
              "pattern lists the files).", search_files, {"type": "object", "properties": {
                  "pattern": _string("a regular expression"), "path": _string("a folder or file to search in"),
                  "file_glob": _string("only files whose name matches, e.g. *.py")},
                  "required": ["pattern"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, toolset="files"))
