"""Turning the bytes of a dropped file into task fields (pure; no filesystem access).

Formats by extension: .json, .yaml/.yml, .md (optional YAML front matter, then first line = title),
.txt (first line = title, the rest = body). Errors say where and what, the way a person fixes them.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from .task import TaskError

EXTENSIONS = (".json", ".yaml", ".yml", ".md", ".txt")
MAX_BYTES = 1024 * 1024


def decode_text(data: bytes) -> str:
    if len(data) > MAX_BYTES:
        raise TaskError(f"file is {len(data)} bytes; the limit for a task file is {MAX_BYTES} bytes (1 MiB)")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise TaskError(f"file is binary, not text (a NUL byte at offset {nul})")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"file is not UTF-8 text (invalid byte 0x{data[exc.start]:02x} at offset {exc.start})") from exc
    return text.removeprefix("\ufeff")


def _yaml_mapping(text: str, what: str, line_offset: int = 0) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if mark is not None:
            raise TaskError(
                f"invalid YAML{what} at line {mark.line + 1 + line_offset}, column {mark.column + 1}: {problem}"
            ) from exc
        raise TaskError(f"invalid YAML{what}: {problem}") from exc


def _title_and_body(text: str) -> dict[str, Any]:
    lines = text.splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return {}
    title = lines[0].strip().lstrip("#").strip()
    body = "\n".join(lines[1:]).strip("\n")
    return {"title": title, "body": body}


def parse_markdown(text: str) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    rest = text
    lines = text.splitlines(keepends=True)
    if lines and lines[0].strip() == "---":
        for end in range(1, len(lines)):
            if lines[end].strip() in ("---", "..."):
                front = _yaml_mapping("".join(lines[1:end]), " front matter", line_offset=1)
                if front is None:
                    front = {}
                if not isinstance(front, dict):
                    raise TaskError("YAML front matter must be a mapping of fields")
                fields.update(front)
                rest = "".join(lines[end + 1:])
                break
        else:
            raise TaskError("YAML front matter opened with '---' on line 1 is never closed")
    if "title" in fields:
        body = rest.strip("\n")
        if body and "body" not in fields:
            fields["body"] = body
        return fields
    for key, value in _title_and_body(rest).items():
        fields.setdefault(key, value)
    return fields


def parse_task_file(name: str, data: bytes) -> dict[str, Any]:
    """The raw fields of a dropped file named `name`; raises TaskError with the reason."""
    lower = name.lower()
    if not lower.endswith(EXTENSIONS):
        raise TaskError(f"unsupported file type '{name}'; a task file ends in {', '.join(EXTENSIONS)}")
    text = decode_text(data)
    if lower.endswith(".json"):
        if not text.strip():
            raise TaskError("file is empty")
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TaskError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from exc
    elif lower.endswith((".yaml", ".yml")):
        if not text.strip():
            raise TaskError("file is empty")
        raw = _yaml_mapping(text, "")
    elif lower.endswith(".md"):
        raw = parse_markdown(text)
    else:
        raw = _title_and_body(text)
    if not isinstance(raw, dict):
        kind = "list" if isinstance(raw, list) else type(raw).__name__
        raise TaskError(f"a task file must hold one object (a mapping of fields), not a {kind}")
    return raw
