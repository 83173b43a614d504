"""File tools confined to the agent's scratch folder, whatever a task or a tool's arguments say (no
field of a task moves them elsewhere). A path is refused when it is absolute, when it has a `..`
part, or when it resolves (symlinks followed, at the moment of use) outside that folder; the file is
then reached along its resolved path one folder at a time, from a descriptor of the folder and never
through a symlink (O_NOFOLLOW at each step), so a folder swapped for a link between the check and the
use fails the call instead of leading a read or a write outside."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..kanban.fsio import read_fd, write_atomic_at
from . import v4a
from .grants import GrantRefused, Place, grants_of, place
from .offer import FILE_WORK
from .terminal import clean_env, withheld
from .tools import Tool, ToolContext, ToolError, register

MAX_READ_CHARS = 100_000
# What a file tool reads into memory at most: a file grown by a command must not grow the agent past
# its memory limit.
MAX_FILE_BYTES = 32 << 20
# O_PATH: a folder we may search but not list (a home of mode 0711) is still a step of the walk.
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
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


def confined(ctx: ToolContext, relative: object, *, allow_root: bool = False, write: bool = False) -> Path:
    """The resolved path a tool's `relative` names: in the task's folder, or in a folder granted to
    the agent (agents/grants.py); ToolError when it may not be used (for a write, with `write`)."""
    return placed(ctx, relative, allow_root=allow_root, write=write).target


def placed(ctx: ToolContext, relative: object, *, allow_root: bool = False, write: bool = False) -> Place:
    try:
        return place(relative, root_of(ctx), grants_of(ctx.settings), write=write, allow_root=allow_root)
    except GrantRefused as exc:
        raise ToolError(str(exc)) from None


def _moved(shown: str) -> ToolError:
    return ToolError(f"refused: a folder on the path of {shown} was replaced (by a symlink?) while it was being "
                     "opened; nothing was read or written")


def _folder(target: Path, shown: str, *, create: bool = False) -> tuple[int, str]:
    """A descriptor of the folder holding `target` (a path confined() resolved) and its name there,
    reached from "/" one folder at a time, never through a symlink; with `create`, the missing
    folders are made on the way."""
    root = Path(target.anchor)  # from "/": no folder above the agent's may be a swapped link either
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in target.parent.relative_to(root).parts:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fd)
            try:
                step = os.open(part, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise ToolError(f"no such file: {shown}") from None
            except OSError as exc:
                if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                    raise
                try:
                    link = stat.S_ISLNK(os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode)
                except OSError:
                    link = True  # gone again: it was being swapped
                if link:
                    raise _moved(shown) from None
                raise ToolError(f"{shown}: {part} on its path is a file, not a folder") from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd, target.name


def _text(target: Path, shown: str) -> str:
    data = _bytes(target, shown)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{shown} is not UTF-8 text") from None


def _bytes(target: Path, shown: str) -> bytes:
    data = read_nofollow(target, shown, MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:
        raise ToolError(f"{shown} is larger than {MAX_FILE_BYTES >> 20} MiB, more than the file tools read; "
                        "look at parts of it with the terminal (head, tail, grep)")
    return data


def read_nofollow(target: Path, shown: str, limit: int) -> bytes:
    """Up to `limit` + 1 bytes of the regular file at `target` (a resolved path), reached without
    following a symlink anywhere on its path: one swapped in since it was resolved is refused."""
    folder, name = _folder(target, shown)
    try:
        # Non-blocking: a FIFO planted under the name must not hang the agent (it is refused below).
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder)
    except FileNotFoundError:
        raise ToolError(f"no such file: {shown}") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _moved(shown) from None
        raise
    finally:
        os.close(folder)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise ToolError(f"{shown} is a folder; search_files lists what is in it")
        if not stat.S_ISREG(mode):
            raise ToolError(f"{shown} is not a regular file")
        return read_fd(fd, limit)
    finally:
        os.close(fd)


def _write(target: Path, text: str, shown: str) -> None:
    """Replace the file atomically, in its folder's descriptor (a symlink there is replaced, never
    written through)."""
    folder, name = _folder(target, shown, create=True)
    try:
        write_atomic_at(folder, name, text.encode("utf-8"), fsync=False)
    except IsADirectoryError:
        raise ToolError(f"{shown} is a folder, so it cannot be written as a file") from None
    finally:
        os.close(folder)


def _delete(target: Path, shown: str) -> None:
    folder, name = _folder(target, shown)
    try:
        os.unlink(name, dir_fd=folder)  # a symlink there is removed itself, never what it points to
    except FileNotFoundError:
        pass
    finally:
        os.close(folder)


def read_text(ctx: ToolContext, path: object) -> str:
    """The text of a file a tool's `path` names, read as read_file reads it (never through a
    symlink, a regular file of at most MAX_FILE_BYTES): for skills' tools, so a file swapped for a
    link after the check is not read through it."""
    return _text(confined(ctx, path), str(path))


def read_bytes(ctx: ToolContext, path: object) -> bytes:
    """A file's bytes, read as read_text reads it: for skills' tools that read other than text."""
    return _bytes(confined(ctx, path), str(path))


def write_text(ctx: ToolContext, path: object, text: str) -> None:
    """Write a file as write_file does (confined, atomic, never through a symlink): for skills' tools."""
    _write(confined(ctx, path, write=True), text, str(path))


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
    _write(confined(ctx, args["path"], write=True), args["content"], args["path"])
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
    target = confined(ctx, args["path"], write=True)
    text = _text(target, args["path"])
    old, new = args["old_string"], args["new_string"]
    count = text.count(old)
    if count == 0:
        raise ToolError(f"old_string does not occur in {args['path']}")
    if count > 1 and not args.get("replace_all"):
        raise ToolError(f"old_string occurs {count} times in {args['path']}; give more context, or replace_all")
    _write(target, text.replace(old, new) if args.get("replace_all") else text.replace(old, new, 1), args["path"])
    return f"replaced {count if args.get('replace_all') else 1} occurrence(s) in {args['path']}"


def v4a_patch(ctx: ToolContext, text: str) -> str:
    """Every file of the patch is computed before any is written: a hunk that does not apply
    changes nothing."""
    try:
        operations = v4a.parse(text)
        writes: list[tuple[Place, str | None, str]] = []  # (file, new text or None to delete, what)
        for op in operations:
            at = placed(ctx, op.path, write=True)  # every section writes: a Move deletes its source
            if op.kind == "add":
                if at.target.exists():
                    raise ToolError(f"Add File {op.path}: it exists already (Update File changes it)")
                writes.append((at, v4a.added_text(op), f"added {op.path}"))
            elif op.kind == "update":
                writes.append((at, v4a.updated(_text(at.target, op.path), op), f"updated {op.path}"))
            elif op.kind == "delete":
                if not at.target.is_file():
                    raise ToolError(f"Delete File {op.path}: no such file")
                writes.append((at, None, f"deleted {op.path}"))
            else:
                destination = placed(ctx, op.new_path, write=True)
                writes += [(destination, _text(at.target, op.path), f"moved {op.path} to {op.new_path}"),
                           (at, None, "")]
    except v4a.PatchError as exc:
        raise ToolError(f"the patch was not applied: {exc}") from None
    # Each section is computed from the file as it is on disk: a second section on one file would
    # undo the first, and a Move onto itself would write the file and then delete it.
    seen: set[Path] = set()
    for at, content, _ in writes:
        target, root = at.target, at.root
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
    for at, content, _ in writes:
        shown = str(at.target.relative_to(at.root))
        if content is None:
            _delete(at.target, shown)
        else:
            _write(at.target, content, shown)
    return "; ".join(what for _, _, what in writes if what)


def search_files(ctx: ToolContext, args: dict[str, Any]) -> str:
    """Confined here; matched in a process of its own (agents/search.py says why), which is killed
    after SEARCH_TIMEOUT or at once when the agent is asked to stop."""
    at = placed(ctx, args.get("path") or ".", allow_root=True)
    options = {key: args[key] for key in ("target", "limit", "offset", "output_mode", "context") if key in args}
    label = f"{at.grant.name}/" if at.grant else ""  # what the model names the files by
    request = json.dumps({"root": str(at.root), "base": str(at.target), "pattern": args["pattern"], "label": label,
                          "glob": args.get("file_glob") or "*", **options})
    proc = subprocess.Popen([sys.executable, "-P", "-m", "hermes_sup.agents.search"], cwd=ctx.scratch,
                            env=clean_env(os.environ, withheld(ctx.settings)),
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
              capabilities=("fs.read",), idempotent=True, toolset="files", cues=FILE_WORK))
register(Tool("write_file", "Write a text file in your folder, replacing it if it exists.", write_file,
              {"type": "object", "properties": {"path": PATH, "content": _string("the whole text")},
               "required": ["path", "content"], "additionalProperties": False},
              capabilities=("fs.write",), idempotent=True, toolset="files", cues=FILE_WORK,
              hidden={"cross_profile": CROSS_PROFILE}))
# Hermes' mode patch (a V4A patch) is accepted without being offered: its description alone would
# cost every call more than the rest of the tool.
register(Tool("patch", "Replace old_string by new_string in a file of your folder (once, unless replace_all).",
              patch, {"type": "object", "properties": {
                  "path": PATH, "old_string": {"type": "string", "minLength": 1}, "new_string": {"type": "string"},
                  "replace_all": {"type": "boolean"}},
                  "additionalProperties": False},
              capabilities=("fs.write",), toolset="files", cues=FILE_WORK, hidden={
                  "mode": {"type": "string", "enum": ["replace", "patch"]}, "patch": {"type": "string"},
                  "cross_profile": CROSS_PROFILE}))
register(Tool("search_files", "Find lines matching a regex in your folder's files (an empty one lists them).",
              search_files, {"type": "object", "properties": {
                  "pattern": _string("a regex"), "path": {"type": "string"}, "file_glob": _string("e.g. *.py")},
                  "required": ["pattern"], "additionalProperties": False},
              capabilities=("fs.read",), idempotent=True, toolset="files", cues=FILE_WORK, hidden={
                  "target": {"type": "string", "enum": ["content", "files"]},
                  "limit": {"type": "integer", "minimum": 1}, "offset": {"type": "integer", "minimum": 0},
                  "output_mode": {"type": "string", "enum": ["content", "files_only", "count"]},
                  "context": {"type": "integer", "minimum": 0, "maximum": 20}}))
