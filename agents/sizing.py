"""How many tokens to ask a local server for: its context window, probed once, minus the prompt."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from ..kanban.parse import load_json

DEFAULT_MAX_TOKENS = 4096      # what a cloud API is asked for when nothing is known
# A local server that tells no context: its model may have 4k in all, which 4,096 answer tokens fill
# (a rambling small model did, and was then asked to continue). What an answer gets until it tells.
UNKNOWN_CONTEXT_MAX_TOKENS = 1024
MIN_MAX_TOKENS = 256           # below this an answer is useless: let the server say the context is full
SAFETY = 64                    # tokens of chat template around the messages, not in the estimate
CHARS_PER_TOKEN = 4            # as the usage estimate counts
CONTEXT_TIMEOUT = 2.0          # per request of the context probe
CONTEXT_DEADLINE = 3.0         # the whole probe of one endpoint, however the server answers
MAX_CONTEXT_BYTES = 1 << 20    # /props and /api/show are a few KiB (Ollama's includes the template)
CONTEXT_RECHECK = 60.0         # seconds before a server that did not tell its context is asked again


def size_max_tokens(context: int | None, prompt_tokens: int, configured: int | None,
                    default: int = DEFAULT_MAX_TOKENS) -> int:
    """max_tokens for one call (pure). A value hermes.yaml sets is kept as it is (its owner's
    choice); otherwise the answer may fill what the prompt leaves of the server's context window,
    up to `default`, and never less than MIN_MAX_TOKENS (a fuller context is the server's error to
    report, and compression's to avoid). An unknown context gets UNKNOWN_CONTEXT_MAX_TOKENS at most."""
    if configured is not None:
        return configured
    if not context or context <= 0:
        return min(default, UNKNOWN_CONTEXT_MAX_TOKENS)
    room = context - max(0, prompt_tokens) - SAFETY
    return max(MIN_MAX_TOKENS, min(default, room))


def filled_context(prompt: int, answer: int, window: int) -> bool:
    """Whether a call's prompt and its answer (tokens) took the whole context window (pure): an
    answer cut there cannot be continued, as the rest has no room."""
    return window > 0 and prompt + answer + 2 * SAFETY >= window


def prompt_tokens(messages: list[Any], tools: list[Any] | None) -> int:
    """The request's size in tokens, estimated as characters / 4 of what is sent (pure)."""
    sent = json.dumps(messages, ensure_ascii=False, default=str) + json.dumps(tools or [], ensure_ascii=False)
    return len(sent) // CHARS_PER_TOKEN


def context_from_props(data: Any) -> int | None:
    """llama.cpp's llama-server: GET /props, default_generation_settings.n_ctx (pure)."""
    if not isinstance(data, Mapping):
        return None
    settings = data.get("default_generation_settings")
    for where in (settings, data):
        if isinstance(where, Mapping) and _positive(where.get("n_ctx")):
            return int(where["n_ctx"])
    return None


def context_from_show(data: Any) -> int | None:
    """Ollama: POST /api/show, model_info "<architecture>.context_length" (pure). A num_ctx set in
    the model's parameters is what Ollama really loads it with, so it wins."""
    if not isinstance(data, Mapping):
        return None
    parameters = data.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            name, _, value = line.strip().partition(" ")
            if name == "num_ctx" and value.strip().isdigit() and int(value) > 0:
                return int(value)
    info = data.get("model_info")
    if isinstance(info, Mapping):
        for key, value in info.items():
            if isinstance(key, str) and key.endswith(".context_length") and _positive(value):
                return int(value)
    return None


def context_from_models(data: Any, model: str) -> int | None:
    """vLLM: GET /v1/models, max_model_len of the model (pure); the first model's when the name is
    not listed (a local server serves one)."""
    models = data.get("data") if isinstance(data, Mapping) else None
    if not isinstance(models, list):
        return None
    entries = [m for m in models if isinstance(m, Mapping)]
    chosen = [m for m in entries if m.get("id") == model] or entries[:1]
    return int(chosen[0]["max_model_len"]) if chosen and _positive(chosen[0].get("max_model_len")) else None


_STATED = re.compile(r"(?:maximum context length is|context window of|n_ctx[ =:]+|context size of)\s*(\d{2,9})")


def context_from_error(text: str) -> int | None:
    """The context window a server names in its context-overflow error (pure): llama-cpp-python and
    vLLM say "This model's maximum context length is 4096 tokens", llama-cpp-python's Llama "exceed
    context window of 4096". llama-cpp-python tells it nowhere else."""
    found = _STATED.search(text)
    return int(found.group(1)) if found and _positive(int(found.group(1))) else None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 31


def server_root(base_url: str) -> str:
    """The server's root, where llama-server's /props and Ollama's /api live: base_url without /v1."""
    url = base_url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def fetch_json(url: str, body: dict[str, Any] | None = None, timeout: float = CONTEXT_TIMEOUT,
               deadline: float = CONTEXT_DEADLINE) -> Any:
    """One GET (or POST of `body`) answered with JSON, or None: bounded whatever the server does
    (MAX_CONTEXT_BYTES, the board's bounded JSON loader, `deadline` for the whole exchange, in a
    thread that ends with its connection), and never through a proxy."""
    found: list[Any] = []
    worker = threading.Thread(target=lambda: found.append(_fetch(url, body, timeout, time.monotonic() + deadline)),
                              name="context-probe", daemon=True)
    worker.start()
    worker.join(deadline + timeout)
    return found[0] if found else None


def _fetch(url: str, body: dict[str, Any] | None, timeout: float, deadline: float) -> Any:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/json"} if data else {})
    try:
        with opener.open(request, timeout=timeout) as response:
            raw = bytearray()
            while chunk := response.read1(64 * 1024):
                raw += chunk
                if len(raw) > MAX_CONTEXT_BYTES or time.monotonic() > deadline:
                    return None
        return load_json(raw.decode("utf-8")) if raw.strip() else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def probe_context(base_url: str, model: str, fetch: Callable[..., Any] = fetch_json) -> int | None:
    """The context window of the model a local OpenAI-compatible server runs, as the server itself
    reports it, or None: llama-server's /props, then Ollama's /api/show, then vLLM's max_model_len."""
    root = server_root(base_url)
    return (context_from_props(fetch(f"{root}/props"))
            or context_from_show(fetch(f"{root}/api/show", {"model": model}))
            or context_from_models(fetch(f"{base_url.rstrip('/')}/models"), model))
