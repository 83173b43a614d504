"""Fetch a web page or API over HTTP(S) and return its text (needs the network capability)."""

from __future__ import annotations

import html
import re
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from hermes_sup.agents.tools import Tool, ToolError, register

MAX_BYTES = 2_000_000
MAX_CHARS = 20_000


def as_text(body: str, content_type: str) -> str:
    """HTML reduced to its readable text; anything else as it is (pure)."""
    if "html" not in content_type:
        return body
    body = re.sub(r"(?is)<(script|style|noscript)\b.*?</\1>", " ", body)
    body = re.sub(r"(?i)<(br|/p|/div|/h\d|/li|/tr)\b[^>]*>", "\n", body)
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    return re.sub(r"\n\s*\n+", "\n\n", re.sub(r"[ \t]+", " ", text)).strip()


def web_fetch(ctx: Any, args: dict[str, Any]) -> str:
    """The fetch runs in a thread of its own that this call waits on: the whole fetch is bounded by
    `timeout` and ends at once when the agent is asked to stop (a cancel, `down`). A server that
    sends its page a byte at a time, or never finishes, would otherwise hold the agent (and its
    task) for as long as it likes, every read arriving within the socket's timeout."""
    url = args["url"]
    if not url.startswith(("http://", "https://")):
        raise ToolError("only http:// and https:// addresses are fetched")
    timeout = float(args.get("timeout") or 20)
    outcome: dict[str, Any] = {}
    given_up = threading.Event()

    def fetch() -> None:
        try:
            outcome["page"] = _fetch(url, timeout, given_up)
        except BaseException as exc:  # handed to the waiting call, which raises it there
            outcome["error"] = exc

    worker = threading.Thread(target=fetch, name="web_fetch", daemon=True)
    worker.start()
    deadline = time.monotonic() + timeout
    while worker.is_alive():
        if ctx.stop.wait(0.1):
            given_up.set()  # the thread leaves at its next read
            raise InterruptedError
        if time.monotonic() > deadline:
            given_up.set()
            raise ToolError(f"{url} did not send its answer within {timeout:g} s")
    if "error" in outcome:
        raise outcome["error"]
    data, content_type, charset, status = outcome["page"]
    text = as_text(data[:MAX_BYTES].decode(charset, "replace"), content_type)
    cut = f"\n[... cut at {MAX_CHARS:,} characters]" if len(text) > MAX_CHARS else ""
    return f"HTTP {status} {content_type}\n\n{text[:MAX_CHARS]}{cut}"


def _fetch(url: str, timeout: float, given_up: threading.Event) -> tuple[bytes, str, str, int]:
    request = urllib.request.Request(url, headers={"User-Agent": "hermes-sup web_fetch"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = bytearray()
            # One receive at a time, so that a call given up on ends at the next one.
            while len(data) <= MAX_BYTES and not given_up.is_set() and (chunk := response.read1(64 * 1024)):
                data += chunk
            return (bytes(data), response.headers.get("content-type", ""),
                    response.headers.get_content_charset() or "utf-8", response.status)
    except urllib.error.HTTPError as exc:
        raise ToolError(f"HTTP {exc.code} from {url}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ToolError(f"cannot fetch {url}: {getattr(exc, 'reason', exc)}") from None


register(Tool("web_fetch", "Fetch a URL (http or https) and return its text; HTML is reduced to readable text.",
              web_fetch, {"type": "object", "properties": {
                  "url": {"type": "string", "minLength": 1},
                  "timeout": {"type": "number", "minimum": 1, "maximum": 120}},
                  "required": ["url"], "additionalProperties": False},
              capabilities=("network",), idempotent=True,
              cues=("http", "url", "web", "site", "page", "fetch", "link", "download", "online")))
