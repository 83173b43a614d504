"""LLM providers behind one interface, and the fallback chain that calls them.

`openai` covers OpenAI and every OpenAI-compatible server (OpenRouter, Ollama, LM Studio, vLLM,
llama.cpp) through `base_url`; `anthropic` uses Anthropic's SDK. Each SDK is imported when a
provider of its kind first makes a call (anthropic alone takes about a second to import), and its
own retries are off: the chain here decides, so retries never multiply.

Errors are sorted by a pure function (`classify`) into what the chain does with them: retry the
same provider (rate limits, server errors, overload), move to the next one (timeouts, connection
errors, bad credentials, exhausted quota, which is never retried), or give up (a request no provider
will accept, or a context overflow the caller must fix by compressing).
"""

from __future__ import annotations

import importlib
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hermes_sup.kanban.redact import known, redact, remember

from .streams import assemble_anthropic, assemble_openai
from .translate import Completion, Message, from_anthropic, from_openai, to_anthropic, to_openai

RETRY_SAME = frozenset({"rate_limit", "server"})
NEXT_PROVIDER = frozenset({"timeout", "unavailable", "auth", "quota"})
QUOTA_WORDS = ("insufficient_quota", "quota", "billing", "credit balance", "payment", "spend limit")
CONTEXT_WORDS = ("context length", "context_length", "maximum context", "prompt is too long", "too many tokens",
                 "context window")


class ProviderError(Exception):
    def __init__(self, kind: str, message: str, *, provider: str = "", retry_after: float | None = None,
                 status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.provider = provider
        self.retry_after = retry_after
        self.status = status


def classify(status: int | None, message: str, *, timeout: bool = False, connection: bool = False) -> str:
    """What kind of failure an error is: rate_limit, server, timeout, unavailable, auth, quota,
    context_overflow or bad_request (pure)."""
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
    if status in (408, 409, 425) or status >= 500:
        return "server"
    return "bad_request"


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


class Provider(Protocol):
    config: ProviderConfig

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 max_tokens: int | None = None) -> Completion: ...


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
    if isinstance(exc, sdk.APIStatusError):
        body = exc.body if isinstance(exc.body, dict) else {}
        detail = body.get("error", body) if isinstance(body, dict) else {}
        text = " ".join(str(part) for part in (
            getattr(exc, "message", ""), detail.get("code", "") if isinstance(detail, dict) else "",
            detail.get("type", "") if isinstance(detail, dict) else "") if part)
        kind = classify(exc.status_code, text)
        return ProviderError(kind, f"{provider}: HTTP {exc.status_code} ({kind}): {text}", provider=provider,
                             retry_after=retry_after_seconds(exc.response.headers), status=exc.status_code)
    raise exc


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
        self._secret = ""

    def _connect(self) -> Any:
        if self._client is None:
            self._sdk = importlib.import_module(self.module)  # lazy: anthropic alone takes a second
            self._secret = _key(self.config, self.key_env)
            remember((self._secret,))  # whatever key a provider sends is one no file or log may hold
            # Local OpenAI-compatible servers need no key, but the SDK insists on one.
            self._client = self._new_client(self._sdk, self._secret or "not-needed")
        return self._client

    def complete(self, messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 max_tokens: int | None = None) -> Completion:
        client = self._connect()
        path, body, response_type = self._request(messages, tools, max_tokens or self.config.max_tokens)
        try:
            if not self.config.stream:
                return self._read(client.post(path, body=body, cast_to=response_type).model_dump())
            # Stream[object] hands over each event as the decoded dict, without building a model
            # per chunk; a read timeout or a dropped connection mid-stream raises the SDK's errors.
            stream = client.post(path, body={**body, **self._stream_fields()}, cast_to=object, stream=True,
                                 stream_cls=self._sdk.Stream[object])
            with stream:
                return self._read(self._assemble(stream))
        except (self._sdk_error(), *self._transport_errors()) as exc:
            raise _provider_error(self._sdk, exc, self.config.name, self._secret) from None

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

    def _read(self, response: dict[str, Any]) -> Completion:
        raise NotImplementedError

    def _stream_fields(self) -> dict[str, Any]:
        return {"stream": True}

    def _assemble(self, events: Any) -> dict[str, Any]:
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
        return "/chat/completions", body, self._sdk.types.chat.ChatCompletion

    def _read(self, response: dict[str, Any]) -> Completion:
        return from_openai(response)

    def _stream_fields(self) -> dict[str, Any]:
        return {"stream": True, "stream_options": {"include_usage": True}}

    def _assemble(self, events: Any) -> dict[str, Any]:
        return assemble_openai(events)


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


KINDS: dict[str, Callable[[ProviderConfig], Provider]] = {"openai": OpenAIProvider, "anthropic": AnthropicProvider}


def make_provider(config: ProviderConfig) -> Provider:
    return KINDS[config.kind](config)


# -- the fallback chain -------------------------------------------------------------------------

@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 2            # extra attempts on the same provider for rate limits and server errors
    initial: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 30.0  # a longer retry-after moves on to the next provider instead


def next_step(error: ProviderError, attempt: int, policy: RetryPolicy, rng: random.Random) -> tuple[str, float]:
    """After a failed attempt (1-based) on a provider: ("retry", delay), ("next", 0) or ("raise", 0)."""
    if error.kind in RETRY_SAME and attempt <= policy.retries:
        if error.retry_after is not None:
            if error.retry_after > policy.max_retry_after:
                return "next", 0.0
            return "retry", error.retry_after
        base = min(policy.max_delay, policy.initial * 2 ** (attempt - 1))
        return "retry", base / 2 + rng.uniform(0, base / 2)
    if error.kind in RETRY_SAME or error.kind in NEXT_PROVIDER:
        return "next", 0.0
    return "raise", 0.0


@dataclass
class Attempt:
    provider: str
    model: str
    outcome: str  # ok, or the error kind
    latency: float
    completion: Completion | None = None
    error: str = ""


def complete_with_fallback(
    chain: list[Provider], messages: list[Message], tools: list[dict[str, Any]] | None, *,
    policy: RetryPolicy = RetryPolicy(), log: Callable[[Attempt], None] = lambda attempt: None,
    sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
) -> Completion:
    """Call the chain in order until one provider answers; every attempt goes to `log`."""
    rng = rng or random.Random()
    errors: list[str] = []
    for provider in chain:
        attempt = 0
        while True:
            attempt += 1
            started = time.monotonic()
            try:
                completion = provider.complete(messages, tools)
            except ProviderError as error:
                log(Attempt(provider.config.name, provider.config.model, error.kind, time.monotonic() - started,
                            error=str(error)))
                action, delay = next_step(error, attempt, policy, rng)
                if action == "raise":
                    raise
                if action == "retry":
                    sleep(delay)
                    continue
                errors.append(str(error))
                break
            log(Attempt(provider.config.name, provider.config.model, "ok", time.monotonic() - started,
                        completion=completion))
            return completion
    raise ProviderError("exhausted", "every provider failed: " + "; ".join(errors) if errors else "no provider")
