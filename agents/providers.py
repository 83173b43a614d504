"""LLM providers behind one interface (the fallback chain that calls them is agents/fallback.py).

`openai` covers OpenAI and every OpenAI-compatible server (OpenRouter, Ollama, LM Studio, vLLM,
llama.cpp) through `base_url`; `anthropic` uses Anthropic's SDK. Each SDK is imported when a
provider of its kind first makes a call (anthropic alone takes about a second to import), and its
own retries are off: the chain here decides, so retries never multiply.

Errors are sorted by a pure function (`classify`) into what the chain does with them: retry the
same provider (rate limits, server errors, overload), move to the next one (timeouts, connection
errors, bad credentials, exhausted quota, which is never retried, and a provider that is not found
where it is configured: a 404 is a wrong base_url or model, not a bad request), or give up (a request
no provider will accept, or a context overflow the caller must fix by compressing).

Real OpenAI-compatible servers are held to the same rules: an error sent inside a stream (llama.cpp's
"Context size has been exceeded") is classified like an HTTP one, a stream that ends without a finish
reason is a truncated answer (retried, never taken as finished), an answer the SDK cannot make sense
of is a `bad_response`, and nothing but a ProviderError (or a stop's InterruptedError) leaves here.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..kanban.redact import known, redact, remember
from .breaker import cooldown_delay as cooldown_delay  # re-exported: callers knew it from here
from .health import BREAKERS_FILE as BREAKERS_FILE  # re-exported: `doctor` and the dashboard read it from here
from .sizing import CONTEXT_RECHECK, context_from_error, probe_context, prompt_tokens, size_max_tokens
from .streams import assemble_anthropic, assemble_openai
from .translate import Completion, Message, from_anthropic, from_openai, to_anthropic, to_openai

RETRY_SAME = frozenset({"rate_limit", "server", "truncated", "bad_response"})
NEXT_PROVIDER = frozenset({"timeout", "unavailable", "auth", "quota", "misconfigured"})
# Failures that say nothing about the task, only that the provider cannot serve now: past the
# chain's own retries, the provider cools down (see ProviderHealth), and a task is not failed for it.
# A rejected key or exhausted quota needs a person (a new key in .env resets the cooldowns); until
# then the tasks wait, saying why, instead of failing one after the other.
COOL_DOWN = {"unavailable": "unreachable", "rate_limit": "rate limited", "auth": "rejected its key",
             "quota": "out of quota",
             "misconfigured": "is misconfigured (not found: check its base_url, which usually ends in /v1, "
                              "and its model)"}
TOOL_CHOICE = re.compile(r"tool[_ ]choice", re.IGNORECASE)
QUOTA_WORDS = ("insufficient_quota", "quota", "billing", "credit balance", "payment", "spend limit")
CONTEXT_WORDS = ("context length", "context_length", "maximum context", "prompt is too long", "too many tokens",
                 "context window", "context size", "exceed_context_size")
# Error types of the Anthropic API (and the names OpenAI-compatible servers give their errors) as
# the HTTP status they stand for: an error sent inside a stream arrives with the stream's 200.
ERROR_TYPES = {"invalid_request_error": 400, "authentication_error": 401, "permission_error": 403,
               "not_found_error": 404, "request_too_large": 413, "rate_limit_error": 429,
               "rate_limit_exceeded": 429, "api_error": 500, "server_error": 500, "overloaded_error": 529,
               "exceed_context_size_error": 400}


class ProviderError(Exception):
    def __init__(self, kind: str, message: str, *, provider: str = "", retry_after: float | None = None,
                 status: int | None = None, retry_at: float | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.retry_at = retry_at  # "unreachable": when (epoch seconds) the first provider may be tried again
        self.provider = provider
        self.retry_after = retry_after
        self.status = status


def classify(status: int | None, message: str, *, timeout: bool = False, connection: bool = False) -> str:
    """What kind of failure an error is: rate_limit, server, timeout, unavailable, auth, quota,
    misconfigured, context_overflow or bad_request (pure)."""
    text = message.lower()
    if timeout:
        return "timeout"
    if connection or status is None:
        return "unavailable"
    if status == 402 or (status in (400, 403, 429) and any(word in text for word in QUOTA_WORDS)):
        return "quota"
    if status == 429:
        return "rate_limit"
    if status in (401, 403):
        return "auth"
    if status in (400, 413, 422) and any(word in text for word in CONTEXT_WORDS):
        return "context_overflow"
    if status in (404, 405):  # nothing there: a base_url without /v1, or a model the server lacks
        return "misconfigured"
    if status in (408, 409, 425) or status >= 500:
        return "server"
    return "bad_request"


def stream_error(body: Any, default: int | None = None) -> tuple[int | None, str]:
    """The status and text of an error a server sent inside a stream, from its JSON body (pure):
    the status is the body's numeric `code`, else the one its error type stands for, else
    `default`. A context overflow is one whatever the status (llama.cpp sends it as a 500)."""
    detail = body.get("error", body) if isinstance(body, dict) else {"message": str(body)}
    detail = detail if isinstance(detail, dict) else {"message": str(detail)}
    parts = [str(detail.get(key)) for key in ("message", "type", "code") if detail.get(key) not in (None, "")]
    text = " ".join(parts) or "an error inside the stream"
    code = detail.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    if status is None:
        status = ERROR_TYPES.get(str(detail.get("type") or ""), ERROR_TYPES.get(str(code or ""), default))
    if status is not None and any(word in text.lower() for word in CONTEXT_WORDS):
        status = 400
    return status, text


def retry_after_seconds(headers: Any) -> float | None:
    if not headers:
        return None
    for key in ("retry-after-ms", "retry-after"):
        value = headers.get(key)
        if value is None:
            continue
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            continue
        return seconds / 1000 if key.endswith("-ms") else seconds
    return None


@dataclass(frozen=True)
class ProviderConfig:
    name: str
    kind: str  # openai | anthropic
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    api_key: str | None = field(default=None, repr=False)  # never logged, never written anywhere
    timeout: float = 120.0
    max_tokens: int = 4096
    context_window: int = 128_000
    stream: bool = False  # ask for server-sent events; `timeout` then bounds each read, not the whole answer
    # max_tokens was not set: a local server is asked its context window and each call may fill what
    # the prompt leaves of it, up to max_tokens (a 4k server must not be asked for 4,096 tokens).
    sized: bool = False
    # context_window was not set: a local server's own report of its context (n_ctx, max_model_len)
    # is the window compression keeps the conversation in, context_window only when it tells none.
    window_probed: bool = False


class Provider(Protocol):
    config: ProviderConfig

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 max_tokens: int | None = None, stop: threading.Event | None = None) -> Completion: ...


def abort(chain: Iterable[Any]) -> None:
    """Cut the requests in flight on these providers (a stop, a cancelled task): a model must not
    keep generating, and billing, an answer nobody will read. Providers without `abort` are left."""
    for provider in chain:
        cut = getattr(provider, "abort", None)
        if cut is not None:
            with contextlib.suppress(Exception):
                cut()


def _until(events: Iterable[Any], stop: threading.Event | None) -> Iterator[Any]:
    """A stream's events, ended by `stop` between two of them."""
    for event in events:
        if stop is not None and stop.is_set():
            raise InterruptedError
        yield event


def _key(config: ProviderConfig, default_env: str) -> str:
    if config.api_key:
        return config.api_key
    return os.environ.get(config.api_key_env or default_env, "")


def _provider_error(sdk: Any, exc: Exception, provider: str, key: str = "") -> ProviderError:
    """The SDK's exception as a ProviderError whose text holds no key: some servers echo the key
    they were sent (an "invalid key sk-..." body), and the text goes to logs and the task."""
    error = _sdk_error_text(sdk, exc, provider)
    text = redact(str(error), (key, *known()))[:500]  # cut after redacting: never half a key
    return ProviderError(error.kind, text, provider=error.provider, retry_after=error.retry_after,
                         status=error.status)


def _sdk_error_text(sdk: Any, exc: Exception, provider: str) -> ProviderError:
    # The anthropic SDK lets transport errors raised while a stream is read through unwrapped.
    transport = sys.modules.get("httpx2")
    if transport is not None and isinstance(exc, transport.TimeoutException):
        return ProviderError("timeout", f"{provider}: timed out", provider=provider)
    if transport is not None and isinstance(exc, transport.TransportError):
        return ProviderError("unavailable", f"{provider}: connection lost ({exc})", provider=provider)
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError("timeout", f"{provider}: timed out", provider=provider)
    if isinstance(exc, sdk.APIConnectionError):
        return ProviderError("unavailable", f"{provider}: cannot connect ({exc})", provider=provider)
    if isinstance(exc, sdk.APIStatusError) and exc.status_code < 400:
        # An error event inside a stream that had begun with a 200 (anthropic raises it so).
        return _stream_provider_error(exc.body, provider)
    if isinstance(exc, sdk.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("error", body) if isinstance(body, dict) else {}
        text = " ".join(str(part) for part in (
            getattr(exc, "message", ""), detail.get("code", "") if isinstance(detail, dict) else "",
            detail.get("type", "") if isinstance(detail, dict) else "") if part)
        kind = classify(exc.status_code, text)
        if kind == "misconfigured":
            text = f"{text[:300]}; {COOL_DOWN['misconfigured'].removeprefix('is misconfigured ')}"
        return ProviderError(kind, f"{provider}: HTTP {exc.status_code} ({kind}): {text}", provider=provider,
                             retry_after=retry_after_seconds(exc.response.headers), status=exc.status_code)
    if isinstance(exc, sdk.APIError):  # the openai SDK's error for an `error` object inside a stream
        return _stream_provider_error(exc.body if exc.body is not None else {"message": str(exc)}, provider)
    return ProviderError("bad_response", f"{provider}: {type(exc).__name__}: {exc}", provider=provider)


def _stream_provider_error(body: Any, provider: str) -> ProviderError:
    status, text = stream_error(body, default=500)
    kind = classify(status, text)
    return ProviderError(kind, f"{provider}: error in the stream ({kind}): {text}", provider=provider,
                         status=status)  # cut to size by _provider_error, after redacting


class _SDKProvider:
    """What both SDK providers share: the SDK imported on the first call, its retries off, and a
    request posted through its client (its HTTP stack, its error classes) but not through its
    create() methods, whose per-call request transform re-walks every message of the conversation
    (29 ms a call at 40 turns). The messages are already in the API's shape."""

    module = ""
    key_env = ""

    def __init__(self, config: ProviderConfig) -> None:
        self.config = config
        self._client: Any = None
        self._sdk: Any = None
        self.tool_choice = True  # sent with the tools until the server refuses it
        self._secret = ""
        # The server's context window once it said it; when it did not (busy, or it cannot), when
        # it was last asked: asked again after CONTEXT_RECHECK, not before every call.
        self._context: int | None = None
        self._context_asked = -CONTEXT_RECHECK

    def _connect(self) -> Any:
        if self._client is None:
            self._sdk = importlib.import_module(self.module)  # lazy: anthropic alone takes a second
            self._secret = _key(self.config, self.key_env)
            remember((self._secret,))  # whatever key a provider sends is one no file or log may hold
            # Local OpenAI-compatible servers need no key, but the SDK insists on one.
            self._client = self._new_client(self._sdk, self._secret or "not-needed")
        return self._client

    def abort(self) -> None:
        """Close the client, which closes its connections and so every request in flight on it (the
        thread waiting on one gets an error); the next call opens a new client."""
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 max_tokens: int | None = None, stop: threading.Event | None = None) -> Completion:
        try:
            return self._complete(messages, tools, max_tokens, stop)
        except ProviderError as error:
            if not (tools and self.tool_choice and error.kind == "bad_request" and TOOL_CHOICE.search(str(error))):
                raise
            # vLLM without --enable-auto-tool-choice refuses tool_choice outright: asked again
            # without it, and not sent to this provider again.
            self.tool_choice = False
            return self._complete(messages, tools, max_tokens, stop)

    def _complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, max_tokens: int | None,
                  stop: threading.Event | None) -> Completion:
        client = self._connect()
        path, body, response_type = self._request(messages, tools, max_tokens or self._max_tokens(messages, tools))
        try:
            if not self.config.stream:
                return self._read(client.post(path, body=body, cast_to=response_type).model_dump(warnings=False))
            # Stream[object] hands over each event as the decoded dict, without building a model
            # per chunk; a read timeout or a dropped connection mid-stream raises the SDK's errors.
            stream = client.post(path, body={**body, **self._stream_fields()}, cast_to=object, stream=True,
                                 stream_cls=self._sdk.Stream[object])
            with stream:  # leaving it closes the connection: a stop mid-stream ends the answer there
                assembled = self._assemble(_until(stream, stop))
            if not self._finished(assembled):
                # llama-cpp-python ends a stream it cut (another request came in) with [DONE] and no
                # finish reason: the text stops mid-sentence, and must not be taken as an answer.
                raise ProviderError("truncated", f"{self.config.name}: the stream ended without a finish reason "
                                    "(the answer was cut off)", provider=self.config.name)
            return self._read(assembled)
        except (self._sdk_error(), *self._transport_errors()) as exc:
            error = _provider_error(self._sdk, exc, self.config.name, self._secret)
            if error.kind == "context_overflow" and self._context is None and self.config.base_url:
                # The server said its window at last (llama-cpp-python does nowhere else): the next
                # call's max_tokens and the compression of the conversation fit it.
                self._context = context_from_error(str(error))
            raise error from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            # An answer in a shape no API gives (a hostile or broken server): its reason, not a crash.
            text = redact(f"{self.config.name}: an answer that cannot be read ({type(exc).__name__}: {exc})",
                          (self._secret, *known()))[:500]
            raise ProviderError("bad_response", text, provider=self.config.name) from None

    def _new_client(self, sdk: Any, key: str) -> Any:
        raise NotImplementedError

    @staticmethod
    def _transport_errors() -> tuple[type[Exception], ...]:
        transport = sys.modules.get("httpx2")  # the SDKs' HTTP stack, loaded with them
        return (transport.TransportError,) if transport is not None else ()

    def _sdk_error(self) -> type[Exception]:
        raise NotImplementedError

    def _request(self, messages: list[Message], tools: list[dict[str, Any]] | None,
                 max_tokens: int) -> tuple[str, dict[str, Any], Any]:
        raise NotImplementedError

    def _max_tokens(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
        if not (self.config.sized and self.config.base_url):
            return self.config.max_tokens
        return size_max_tokens(self._server_context(), prompt_tokens(to_openai(messages), tools), None,
                               self.config.max_tokens)

    def _server_context(self) -> int | None:
        # Known once per provider: the server's model does not change under it.
        if self._context is None and self.config.base_url and \
                time.monotonic() - self._context_asked >= CONTEXT_RECHECK:
            self._context_asked = time.monotonic()
            self._context = probe_context(self.config.base_url, self.config.model)
        return self._context

    def context_window(self) -> int:
        """The context window to keep a conversation within: what the server reports when hermes.yaml
        set none for a local server (a 4k llama.cpp must not be filled to a cloud model's 128k),
        else context_window as configured."""
        if self.config.window_probed:
            return self._server_context() or self.config.context_window
        return self.config.context_window

    def _read(self, response: dict[str, Any]) -> Completion:
        raise NotImplementedError

    def _stream_fields(self) -> dict[str, Any]:
        return {"stream": True}

    def _assemble(self, events: Any) -> dict[str, Any]:
        raise NotImplementedError

    def _finished(self, assembled: dict[str, Any]) -> bool:
        raise NotImplementedError


class OpenAIProvider(_SDKProvider):
    module, key_env = "openai", "OPENAI_API_KEY"

    def _new_client(self, sdk: Any, key: str) -> Any:
        return sdk.OpenAI(api_key=key, base_url=self.config.base_url, max_retries=0, timeout=self.config.timeout)

    def _sdk_error(self) -> type[Exception]:
        return self._sdk.OpenAIError

    def _request(self, messages: list[Message], tools: list[dict[str, Any]] | None,
                 max_tokens: int) -> tuple[str, dict[str, Any], Any]:
        body: dict[str, Any] = {"model": self.config.model, "messages": to_openai(messages), "max_tokens": max_tokens}
        if tools:
            body["tools"] = tools
            if self.tool_choice:  # said outright: llama.cpp and llama-cpp-python drop the tools without it
                body["tool_choice"] = "auto"
        return "/chat/completions", body, self._sdk.types.chat.ChatCompletion

    def _read(self, response: dict[str, Any]) -> Completion:
        return from_openai(response)

    def _stream_fields(self) -> dict[str, Any]:
        return {"stream": True, "stream_options": {"include_usage": True}}

    def _assemble(self, events: Any) -> dict[str, Any]:
        return assemble_openai(events)

    def _finished(self, assembled: dict[str, Any]) -> bool:
        return bool(assembled["choices"][0].get("finish_reason"))


class AnthropicProvider(_SDKProvider):
    module, key_env = "anthropic", "ANTHROPIC_API_KEY"

    def _new_client(self, sdk: Any, key: str) -> Any:
        return sdk.Anthropic(api_key=key, base_url=self.config.base_url, max_retries=0, timeout=self.config.timeout)

    def _sdk_error(self) -> type[Exception]:
        return self._sdk.AnthropicError

    def _request(self, messages: list[Message], tools: list[dict[str, Any]] | None,
                 max_tokens: int) -> tuple[str, dict[str, Any], Any]:
        body = {"model": self.config.model, "max_tokens": max_tokens, **to_anthropic(messages, tools)}
        return "/v1/messages", body, self._sdk.types.Message

    def _read(self, response: dict[str, Any]) -> Completion:
        return from_anthropic(response)

    def _assemble(self, events: Any) -> dict[str, Any]:
        return assemble_anthropic(events)

    def _finished(self, assembled: dict[str, Any]) -> bool:
        return bool(assembled.get("stop_reason"))


KINDS: dict[str, Callable[[ProviderConfig], Provider]] = {"openai": OpenAIProvider, "anthropic": AnthropicProvider}


def make_provider(config: ProviderConfig) -> Provider:
    return KINDS[config.kind](config)
