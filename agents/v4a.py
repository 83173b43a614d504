"""The V4A patch format (`*** Begin Patch` ... `*** End Patch`) that Hermes Agent's `patch` tool takes
in `mode: patch`, parsed and applied as pure functions over text: the file tools confine the paths
and write the results, all files or none.

    *** Update File: path        hunks of ' ' context, '-' removed and '+' added lines, each hunk
    @@ optional hint @@          found by its context and removed lines (exactly, once; a hint
     context                      picks among several)
    -old
    +new
    *** Add File: path           '+' lines: the new file
    *** Delete File: path
    *** Move File: old -> new
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MARKER = re.compile(r"\*\*\*\s*(Update|Add|Delete|Move)\s+File:\s*(.*)")


class PatchError(ValueError):
    """A patch that cannot be parsed or applied; the message says where."""


@dataclass
class Hunk:
    hint: str | None = None
    lines: list[tuple[str, str]] = field(default_factory=list)  # (' ' | '-' | '+', text)


@dataclass
class Operation:
    kind: str  # update | add | delete | move
    path: str
    new_path: str = ""
    hunks: list[Hunk] = field(default_factory=list)


def parse(text: str) -> list[Operation]:
    """The operations of a patch, in order (pure); PatchError when it has none or one is malformed."""
    lines = text.split("\n")
    begin = next((i for i, line in enumerate(lines) if re.match(r"\*\*\*\s*Begin Patch", line)), -1)
    end = next((i for i, line in enumerate(lines) if i > begin and re.match(r"\*\*\*\s*End Patch", line)), len(lines))
    operations: list[Operation] = []
    current: Operation | None = None
    for line in lines[begin + 1:end]:
        marker = MARKER.match(line)
        if marker:
            kind, rest = marker.group(1).lower(), marker.group(2).strip()
            current = Operation(kind, rest)
            if kind == "move":
                source, arrow, target = rest.partition("->")
                if not arrow or not source.strip() or not target.strip():
                    raise PatchError(f"Move File needs 'old -> new', got {rest!r}")
                current.path, current.new_path = source.strip(), target.strip()
            if kind in ("update", "add"):
                current.hunks.append(Hunk())
            operations.append(current)
            if kind in ("delete", "move"):
                current = None
        elif line.startswith("@@") and current is not None:
            hint = re.match(r"@@\s*(.*?)\s*@@", line)
            current.hunks.append(Hunk(hint.group(1) or None if hint else None))
        elif current is not None and line and not line.startswith(("\\", "*** End of File")):
            prefix = line[0] if line[0] in " -+" else " "
            current.hunks[-1].lines.append((prefix, line[1:] if line[0] in " -+" else line))
    if not operations:
        raise PatchError("no operation found: a patch holds *** Update File:, *** Add File:, *** Delete File: or "
                         "*** Move File: sections between *** Begin Patch and *** End Patch")
    for op in operations:
        if not op.path:
            raise PatchError(f"{op.kind.capitalize()} File without a path")
        op.hunks = [hunk for hunk in op.hunks if hunk.lines]
        if op.kind == "update" and not op.hunks:
            raise PatchError(f"Update File {op.path}: no hunk (lines starting with ' ', '-' or '+')")
    return operations


def added_text(op: Operation) -> str:
    """The content of an Add File (pure)."""
    return "".join(text + "\n" for hunk in op.hunks for prefix, text in hunk.lines if prefix == "+")


def _where(content: str, search: str, hint: str | None, path: str) -> int:
    starts = [m.start() for m in re.finditer(re.escape(search), content)]
    if not starts:
        raise PatchError(f"Update File {path}: a hunk's context and removed lines are not in the file:\n{search}")
    if len(starts) == 1:
        return starts[0]
    after = content.find(hint) if hint else -1
    chosen = [s for s in starts if after != -1 and s >= after]
    if not chosen:
        raise PatchError(f"Update File {path}: a hunk matches {len(starts)} places; give more context or an @@ hint")
    return chosen[0]


def updated(content: str, op: Operation) -> str:
    """The file's text after the hunks of an Update File, applied in order (pure)."""
    for hunk in op.hunks:
        search = "\n".join(text for prefix, text in hunk.lines if prefix != "+")
        replace = "\n".join(text for prefix, text in hunk.lines if prefix != "-")
        if not search:  # only added lines: after the hint's line, or at the end
            if hunk.hint and content.count(hunk.hint) == 1:
                eol = content.find("\n", content.find(hunk.hint))
                content = (content + "\n" + replace if eol == -1
                           else content[:eol + 1] + replace + "\n" + content[eol + 1:])
            else:
                content = content.rstrip("\n") + "\n" + replace + "\n"
            continue
        at = _where(content, search, hunk.hint, op.path)
        content = content[:at] + replace + content[at + len(search):]
    return content
