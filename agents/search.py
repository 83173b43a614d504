"""`search_files`' matching, run in a process of its own: `python -P -m hermes_sup.agents.search`.

A regular expression is the caller's (a model's answer, a task's steps, whoever wrote them), and
one like `(a+)+$` backtracks for hours on a line of forty characters. Python's `re` holds the GIL
while it matches, so in the agent's process it would stop every thread: the heartbeat (the
supervisor then kills the agent as hung, again at each attempt, until it gives up on it), the claim
watch (a cancel is not noticed). Here the caller waits for it with a deadline, and a stop request,
and kills it. The request is one JSON object on stdin ({root, base, pattern, glob}, paths already
confined by the caller); the answer one JSON object on stdout: {"text": ...} or {"error": ...}.
Only the standard library is imported, so the process starts in a few tens of milliseconds.
"""

from __future__ import annotations

import fnmatch
import json
import re
import resource
import sys
from pathlib import Path

MAX_MATCHES = 100


def search(root: Path, base: Path, pattern: str, glob: str) -> str:
    """The lines of the files under `base` (within `root`) that match `pattern`, or the files when
    it is empty, as search_files answers. A symlink that leads out of `root` is not followed."""
    compiled = re.compile(pattern)
    matches: list[str] = []
    files = [base] if base.is_file() else sorted(p for p in base.rglob("*") if p.is_file())
    for path in files:
        real = path.resolve()
        if root not in real.parents or not fnmatch.fnmatch(path.name, glob):
            continue
        shown = path.relative_to(root).as_posix()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        if not pattern:
            matches.append(shown)
        else:
            matches += [f"{shown}:{number}: {line[:300]}" for number, line in enumerate(lines, 1)
                        if compiled.search(line)]
        if len(matches) >= MAX_MATCHES:
            return "\n".join(matches[:MAX_MATCHES]) + f"\n[... more than {MAX_MATCHES} matches; narrow the search]"
    return "\n".join(matches) or "no matches"


CPU_SECONDS = 60  # past the caller's deadline: a search whose caller died ends by itself


def main() -> int:
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))
    request = json.loads(sys.stdin.read())
    try:
        answer = {"text": search(Path(request["root"]), Path(request["base"]), request["pattern"], request["glob"])}
    except re.error as exc:
        answer = {"error": f"pattern is not a valid regular expression: {exc}"}
    except (RecursionError, MemoryError, OverflowError) as exc:
        answer = {"error": f"the search could not be done: {type(exc).__name__}"}
    sys.stdout.write(json.dumps(answer, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
