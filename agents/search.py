"""`search_files`' matching, run in a process of its own: `python -P -m hermes_sup.agents.search`.

A regular expression is the caller's (a model's answer, a task's steps, whoever wrote them), and
one like `(a+)+$` backtracks for hours on a line of forty characters. Python's `re` holds the GIL
while it matches, so in the agent's process it would stop every thread: the heartbeat (the
supervisor then kills the agent as hung, again at each attempt, until it gives up on it), the claim
watch (a cancel is not noticed). Here the caller waits for it with a deadline, and a stop request,
and kills it. The request is one JSON object on stdin ({root, base, pattern, glob, and Hermes'
options}, paths already confined by the caller); the answer one JSON object on stdout: {"text": ...} or {"error": ...}.
Only the standard library is imported, so the process starts in a few tens of milliseconds.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import resource
import stat
import sys
from pathlib import Path

MAX_MATCHES = 100
MAX_FILE_BYTES = 32 << 20  # of each file searched, as the file tools read
MAX_LIMIT = 1000


def _files(root: Path, base: Path, label: str = "") -> list[tuple[Path, str]]:
    """The files under `base` that stay within `root` (a symlink leading out is not followed), with
    the path shown for each: relative to `root`, after `label` (a granted folder's `NAME/`)."""
    found = []
    for path in [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file()):
        try:
            inside = root in path.resolve().parents
        except OSError:  # swapped for a link or gone while resolved (a folder others write to): skipped
            continue
        if inside:
            found.append((path, label + path.relative_to(root).as_posix()))
    return found


def search(root: Path, base: Path, pattern: str, glob: str, *, target: str = "content", limit: int = MAX_MATCHES,
           offset: int = 0, output_mode: str = "content", context: int = 0, label: str = "") -> str:
    """The lines of the files under `base` (within `root`) that match `pattern`, or the files when
    it is empty, as search_files answers. Hermes Agent's options: `target` files (pattern is a glob
    of file names), `output_mode` files_only or count, `context` lines around each match, and
    `limit`/`offset` to page through the results."""
    limit = max(1, min(limit, MAX_LIMIT))
    wanted = offset + limit + 1  # one more than shown: whether there are more
    results: list[str] = []
    if target == "files":
        for path, shown in _files(root, base, label):
            if fnmatch.fnmatch(path.name, pattern or "*") or fnmatch.fnmatch(shown, pattern or "*"):
                results.append(shown)
                if len(results) >= wanted:
                    break
        return _page(results, offset, limit)
    compiled = re.compile(pattern)
    for path, shown in _files(root, base, label):
        if not fnmatch.fnmatch(path.name, glob):
            continue
        try:
            lines = _read_inside(root, path).decode("utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        if not pattern:
            results.append(shown)
        else:
            hits = [number for number, line in enumerate(lines, 1) if compiled.search(line)]
            if hits and output_mode == "files_only":
                results.append(shown)
            elif hits and output_mode == "count":
                results.append(f"{shown}: {len(hits)}")
            elif hits and context > 0:
                for number in hits:
                    around = range(max(1, number - context), min(len(lines), number + context) + 1)
                    results.append("\n".join(f"{shown}{':' if n == number else '-'}{n}{':' if n == number else '-'} "
                                             f"{lines[n - 1][:300]}" for n in around))
            else:
                results += [f"{shown}:{number}: {lines[number - 1][:300]}" for number in hits]
        if len(results) >= wanted:
            break
    return _page(results, offset, limit)


def _read_inside(root: Path, path: Path) -> bytes:
    """The bytes of `path`, reached from `root` one folder at a time and never through a symlink (a
    file swapped for a link to a secret after it was listed is not read: OSError). At most
    MAX_FILE_BYTES; not a regular file (a FIFO): OSError."""
    fd = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for part in path.relative_to(root).parts[:-1]:
            step = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = step
        file = os.open(path.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=fd)
    finally:
        os.close(fd)
    with os.fdopen(file, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise OSError("not a regular file")
        return handle.read(MAX_FILE_BYTES)


def _page(results: list[str], offset: int, limit: int) -> str:
    shown = results[offset:offset + limit]
    if not shown:
        return "no matches" if not offset else f"no matches past the first {offset}"
    more = f"\n[... more results; narrow the search, or page on with offset {offset + limit}]" if (
        len(results) > offset + limit) else ""
    return "\n".join(shown) + more


CPU_SECONDS = 60  # past the caller's deadline: a search whose caller died ends by itself


def main() -> int:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    request = json.loads(sys.stdin.read())
    try:
        options = {key: request[key] for key in ("target", "limit", "offset", "output_mode", "context", "label")
                   if key in request}
        answer = {"text": search(Path(request["root"]), Path(request["base"]), request["pattern"], request["glob"],
                                 **options)}
    except re.error as exc:
        answer = {"error": f"pattern is not a valid regular expression: {exc}"}
    except (RecursionError, MemoryError, OverflowError) as exc:
        answer = {"error": f"the search could not be done: {type(exc).__name__}"}
    sys.stdout.write(json.dumps(answer, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
