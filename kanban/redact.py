"""The API key values this process knows, and the one function that takes them out of any text
before it is written to a file, a log or a terminal.

It lives in kanban (the lowest layer) because the board's own files are one of the places text is
persisted: the task documents and events.jsonl (kanban/fsio.py), the agents' journals, their logs.
The agent registers every value of every variable its providers name (agents/keys.py); whatever
carries that value afterwards, a provider's echo of it in an error body included, is written with
`[redacted]` in its place.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Any

MARK = "[redacted]"
# Shorter values are not taken for keys: replacing every "abc" in every file would mangle the
# files, and a key that short protects nothing anyway.
MIN_LENGTH = 8

_lock = threading.Lock()
_known: tuple[str, ...] = ()


def _forms(value: str) -> list[str]:
    # As it stands, and as JSON spells it inside a string (a key holding a quote or a backslash).
    escaped = json.dumps(value, ensure_ascii=False)[1:-1]
    return [value] if escaped == value else [value, escaped]


def redact(text: str, secrets: Iterable[str]) -> str:
    """`text` with every secret (of MIN_LENGTH or more characters) replaced by MARK (pure)."""
    for secret in sorted({s for s in secrets if s and len(s) >= MIN_LENGTH}, key=len, reverse=True):
        for form in _forms(secret):
            if form in text:
                text = text.replace(form, MARK)
    return text


def remember(values: Iterable[str]) -> None:
    """Add key values to what this process redacts; a value is never forgotten (text written
    while it was a key may still be on its way out)."""
    global _known
    fresh = {v for v in values if isinstance(v, str) and len(v) >= MIN_LENGTH}
    with _lock:
        if not fresh <= set(_known):
            _known = tuple(sorted(set(_known) | fresh, key=len, reverse=True))


def known() -> tuple[str, ...]:
    return _known


def scrub(text: str) -> str:
    """`text` without any key value this process knows (see remember)."""
    secrets = _known
    if not secrets:
        return text
    return redact(text, secrets)


def scrub_bytes(data: bytes) -> bytes:
    """`data` (a file's bytes, in UTF-8 or not) without any key value this process knows."""
    secrets = _known
    if not secrets:
        return data
    mark = MARK.encode()
    for secret in secrets:  # longest first (see remember)
        for form in _forms(secret):
            data = data.replace(form.encode("utf-8", "surrogateescape"), mark)
    return data


class ScrubbingStream:
    """A text stream (sys.stdout, sys.stderr) whose writes go out scrubbed: an agent's log is a
    file on disk like any other. Each write is scrubbed whole; print() hands over each argument in
    one write, so a key printed inside a message never straddles two."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(scrub(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
