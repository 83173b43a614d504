"""File tools confined to the agent's scratch folder, whatever a task or a tool's arguments say (no
field of a task moves them elsewhere). A path is refused when it is absolute, when it has a `..`
part, or when it resolves (symlinks followed, at the moment of use) outside that folder; the file is
then opened by its resolved path."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from hermes_sup.kanban.fsio import write_atomic

from . import v4a
from .keys import key_names
from .terminal import clean_env
from .tools import Tool, ToolContext, ToolError, register

MAX_READ_CHARS = 100_000
SEARCH_TIMEOUT = 20.0


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
    """Hermes Agent's two modes: replace (path, old_string, new_string) and patch (a V4A patch)."""
    if args.get("mode") == "patch":
        if not args.get("patch"):
            raise ToolError("mode patch needs patch: the V4A text (*** Begin Patch ... *** End Patch)")
        return v4a_patch(ctx, args["patch"])
    missing = [name for name in ("path", "old_string", "new_string") if name not in args]
    if missing:
        raise ToolError(f"mode replace needs path, old_string and new_string (missing: {', '.join(missing)}); "
                        "or give mode patch and a V4A patch")
    if not args["old_string"]:
        raise ToolError("old_string must not be empty")
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


def v4a_patch(ctx: ToolContext, text: str) -> str:
    """Every file of the patch is computed before any is written: a hunk that does not apply
    changes nothing."""
    try:
        operations = v4a.parse(text)
        writes: list[tuple[Path, str | None, str]] = []  # (file, new text or None to delete, what)
        for op in operations:
            target = confined(ctx, op.path)
            if op.kind == "add":
                if target.exists():
                    raise ToolError(f"Add File {op.path}: it exists already (Update File changes it)")
                writes.append((target, v4a.added_text(op), f"added {op.path}"))
            elif op.kind == "update":
                writes.append((target, v4a.updated(_text(target, op.path), op), f"updated {op.path}"))
            elif op.kind == "delete":
                if not target.is_file():
                    raise ToolError(f"Delete File {op.path}: no such file")
                writes.append((target, None, f"deleted {op.path}"))
            else:
                destination = confined(ctx, op.new_path)
                writes += [(destination, _text(target, op.path), f"moved {op.path} to {op.new_path}"),
                           (target, None, "")]
    except v4a.PatchError as exc:
        raise ToolError(f"the patch was not applied: {exc}") from None
    # Each section is computed from the file as it is on disk: a second section on one file would
    # undo the first, and a Move onto itself would write the file and then delete it.
    root = root_of(ctx)
    seen: set[Path] = set()
    for target, content, _ in writes:
        shown = target.relative_to(root)
        if target in seen:
            raise ToolError(f"the patch was not applied: it names {shown} more than once (directly, as a Move's "
                            "source or target, or by another spelling); give one section per file")
        seen.add(target)
        # Found now, not halfway through the writes: a file where a folder must go, or a folder
        # where the file must go, would fail after the files before it were written.
        blocker = next((p for p in [target, *target.parents] if p != root and root in p.parents and p.exists()
                        and not (p.is_file() if p == target else p.is_dir())), None)
        if content is not None and blocker is not None:
            raise ToolError(f"the patch was not applied: {blocker.relative_to(root)} is "
                            f"{'a folder' if blocker.is_dir() else 'a file'}, so {shown} cannot be written")
    for target, content, _ in writes:
        if content is None:
            target.unlink(missing_ok=True)
        else:
            _write(target, content)
    return "; ".join(what for _, _, what in writes if what)


def search_files(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Confined here; matched in a process of its own (agents/search.py says why), which is killed
    after SEARCH_TIMEOUT or at once when the agent is asked to stop."""
    base = confined(ctx, args.get("path") or ".", allow_root=True)
    options = {key: args[key] for key in ("target", "limit", "offset", "output_mode", "context") if key in args}
    request = json.dumps({"root": str(root_of(ctx)), "base": str(base), "pattern": args["pattern"],
                          "glob": args.get("file_glob") or "*", **options})
    proc = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents.search"], cwd=ctx.scratch,
                            env=clean_env(os.environ, key_names(ctx.settings.get("llm") or {})),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            process_group=0, close_fds=True)  # in the agent's session: killed with it
    deadline = time.monotonic() + SEARCH_TIMEOUT
    pending: bytes | None = request.encode("utf-8")
    try:
        while True:
            try:
                out, err = proc.communicate(pending, timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pending = None  # handed over already
                if ctx.stop.is_set():
                    raise InterruptedError from None
                if time.monotonic() >= deadline:
                    raise ToolError(f"the search took longer than {SEARCH_TIMEOUT:g} s and was stopped (a pattern "
                                    "that backtracks, like (a+)+$, or too many files); narrow it") from None
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    try:
        answer = json.loads(out)
    except ValueError:
        tail = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit status {proc.returncode}"]
        raise ToolError(f"the search failed: {tail[0][:300]}") from None
    if "error" in answer:
        raise ToolError(str(answer["error"]))
    return str(answer.get("text", ""))


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "description": description}


PATH = _string("a path relative to your folder")
CROSS_PROFILE = {"type": "boolean"}  # Hermes' guard between profiles: no profiles here, every path is yours

register(Tool("read_file", "Read a text file from your folder (offset: first line, 1-based; limit: lines).",
              read_file, {"type": "object", "properties": {
                  "path": PATH, "offset": {"type": "integer", "minimum": 1},
                  "limit": {"type": "integer", "minimum": 0}},
                  "required": ["path"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, toolset="files"))
register(Tool("write_file", "Write a text file in your folder, replacing it if it exists.", write_file,
              {"type": "object", "properties": {"path": PATH, "content": _string("the whole text")},
               "required": ["path", "content"], "additionalProperties": False},
              capabilities=("fs.write",), idempotent=True, toolset="files", hidden={"cross_profile": CROSS_PROFILE}))
# Hermes' mode patch (a V4A patch) is accepted without being offered: its description alone would
# cost every call more than the rest of the tool.
register(Tool("patch", "Replace old_string by new_string in a file of your folder (once, unless replace_all).",
              patch, {"type": "object", "properties": {
                  "path": PATH, "old_string": {"type": "string", "minLength": 1}, "new_string": {"type": "string"},
                  "replace_all": {"type": "boolean"}},
                  "additionalProperties": False},
              capabilities=("fs.write",), toolset="files", hidden={
                  "mode": {"type": "string", "enum": ["replace", "patch"]}, "patch": {"type": "string"},
                  "cross_profile": CROSS_PROFILE}))
register(Tool("search_files", "Find lines matching a regex in your folder's files (an empty one lists them).",
              search_files, {"type": "object", "properties": {
                  "pattern": _string("a regex"), "path": _string("a folder or file to search in"),
                  "file_glob": _string("only files whose name matches, e.g. *.py")},
                  "required": ["pattern"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, toolset="files", hidden={
                  "target": {"type": "string", "enum": ["content", "files"]},
                  "limit": {"type": "integer", "minimum": 1}, "offset": {"type": "integer", "minimum": 0},
                  "output_mode": {"type": "string", "enum": ["content", "files_only", "count"]},
                  "context": {"type": "integer", "minimum": 0, "maximum": 20}}))
