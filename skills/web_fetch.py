"""Fetch a web page or API over HTTP(S) and return its text (needs the network capability)."""

from __future__ import annotations

import html
import re
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
    url = args["url"]
    if not url.startswith(("http://", "https://")):
        raise ToolError("only http:// and https:// addresses are fetched")
    request = urllib.request.Request(url, headers={"User-Agent": "hermes-sup web_fetch"})
    try:
        with urllib.request.urlopen(request, timeout=float(args.get("timeout") or 20)) as response:
            data = response.read(MAX_BYTES + 1)
            content_type = response.headers.get("content-type", "")
            charset = response.headers.get_content_charset() or "utf-8"
            status = response.status
    except urllib.error.HTTPError as exc:
        raise ToolError(f"HTTP {exc.code} from {url}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ToolError(f"cannot fetch {url}: {getattr(exc, 'reason', exc)}") from None
    text = as_text(data[:MAX_BYTES].decode(charset, "replace"), content_type)
    cut = f"\n[... cut at {MAX_CHARS:,} characters]" if len(text) > MAX_CHARS else ""
    return f"HTTP {status} {content_type}\n\n{text[:MAX_CHARS]}{cut}"


register(Tool("web_fetch", "Fetch a URL (http or https) and return its text; HTML is reduced to readable text.",
              web_fetch, {"type": "object", "properties": {
                  "url": {"type": "string", "minLength": 1},
                  "timeout": {"type": "number", "minimum": 1, "maximum": 120}},
                  "required": ["url"], "additionalProperties": False},
              capabilities=("network",), idempotent=True))
