"""The fallback chain: a model call tried on each provider in turn, with retries, breakers and a budget."""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..kanban.redact import known, redact
from .breaker import OPEN
from .health import COUNTED, ProviderHealth, retry_label
from .providers import COOL_DOWN, NEXT_PROVIDER, RETRY_SAME, Provider, ProviderError
from .translate import Completion, Message, Usage, to_openai


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


CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and code with BPE tokenizers


def estimate_usage(messages: list[Message], tools: list[dict[str, Any]] | None, answer: Message) -> Usage:
    """Tokens of a call whose server reported none (many local servers send no usage in a stream),
    estimated as characters / 4 of what was sent and of the answer, and marked as estimated (pure)."""
    def size(value: Any) -> int:
        return len(json.dumps(value, ensure_ascii=False, default=str))

    return Usage(input=(size(to_openai(messages)) + (size(tools) if tools else 0)) // CHARS_PER_TOKEN,
                 output=size({key: answer.get(key) for key in ("content", "tool_calls") if answer.get(key)})
                 // CHARS_PER_TOKEN, estimated=True)


# Bytes of the request per token, taken low on purpose: a budget reserves the prompt's worst case,
# and English BPE runs near 4 characters a token, other scripts near one character (2 to 3 bytes).
WORST_BYTES_PER_TOKEN = 2


def worst_prompt_tokens(messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    """An upper estimate of a request's prompt tokens, for a budget's reservation (pure)."""
    sent = json.dumps(to_openai(messages), ensure_ascii=False, default=str) + (json.dumps(tools) if tools else "")
    return len(sent.encode("utf-8", "replace")) // WORST_BYTES_PER_TOKEN + 1


def _max_tokens(provider: Provider, messages: list[Message], tools: list[dict[str, Any]] | None) -> int:
    sized = getattr(provider, "_max_tokens", None)
    return int(sized(messages, tools)) if callable(sized) else int(provider.config.max_tokens)


@dataclass
class Attempt:
    provider: str
    model: str
    outcome: str  # ok, or the error kind
    latency: float
    completion: Completion | None = None
    error: str = ""
    route: dict[str, Any] | None = None  # a routing strategy's decision on this call (see cascade.py)


def complete_with_fallback(
    chain: list[Provider], messages: list[Message], tools: list[dict[str, Any]] | None, *,
    policy: RetryPolicy = RetryPolicy(), log: Callable[[Attempt], None] = lambda attempt: None,
    sleep: Callable[[float], None] = time.sleep, rng: random.Random | None = None,
    stop: threading.Event | None = None, health: ProviderHealth | None = None, budget: Any = None,
) -> Completion:
    """Call the chain in order until one provider answers; every attempt goes to `log`. Once `stop`
    is set no further attempt is made (InterruptedError): a stopped or cancelled task spends nothing.
    With `health`, a provider whose breaker is open is skipped, and each provider's outcome is told
    to its breaker; when every provider's breaker is open the error's kind is "unreachable" (not the
    task's fault: it waits, "provider X down until T") with the moment the first may be tried again.
    With `budget` (a BudgetGate, agents/ledger.py) each attempt first reserves its worst case and
    settles its real cost after; a cap it would cross raises BudgetReached before anything is sent."""
    plan = CallPlan(messages, tools, policy, log, stop.wait if stop is not None else sleep, rng or random.Random(),
                    stop, health, budget)
    for provider in chain:
        name = provider.config.name
        cooling = health.admit(name) if health is not None else None
        if cooling is not None:
            plan.refused[name] = cooling
            plan.errors.append(f"{name}: {cooling[1]}, down until {retry_label(cooling[0])}")
            continue
        try:
            return _attempts(provider, plan)
        except _NextProvider:
            continue
        except InterruptedError:
            if health is not None:
                health.release(name)  # a probe stopped by us says nothing about the provider
            raise
    if chain and {provider.config.name for provider in chain} <= set(plan.refused):
        retry_at = min(until for until, _why in plan.refused.values())
        said = "; ".join(f"provider {name} down until {retry_label(until)} ({why})"
                         for name, (until, why) in plan.refused.items())
        raise ProviderError("unreachable", said, retry_at=retry_at)
    errors = plan.errors
    raise ProviderError("exhausted", "every provider failed: " + "; ".join(errors) if errors else "no provider")


@dataclass
class CallPlan:
    """One call through the chain: what is sent, how each provider's attempts are made, told and paid
    for, and what the providers tried so far said."""
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    policy: RetryPolicy
    log: Callable[[Attempt], None]
    sleep: Callable[[float], Any]  # the stop's wait when there is a stop: a stop cuts a retry's delay
    rng: random.Random
    stop: threading.Event | None
    health: ProviderHealth | None
    budget: Any  # a BudgetGate (agents/ledger.py), or None
    # provider -> when it may be tried again, and why not now
    refused: dict[str, tuple[float, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class _NextProvider(Exception):
    """This provider is done with for this call: the chain moves on."""


def _attempts(provider: Provider, plan: CallPlan) -> Completion:
    """One provider's attempts at a call, with the retries the plan's policy allows, its breaker told of the outcome."""
    name = provider.config.name
    messages, tools, stop, health, budget = plan.messages, plan.tools, plan.stop, plan.health, plan.budget
    attempt = 0
    while True:
        attempt += 1
        if stop is not None and stop.is_set():
            raise InterruptedError
        options: dict[str, Any] = {"stop": stop} if stop is not None else {}
        hold = None
        if budget is not None:  # the call asks for at most the max_tokens its reservation priced
            options["max_tokens"] = _max_tokens(provider, messages, tools)
            hold = budget.reserve(provider.config.model, worst_prompt_tokens(messages, tools), options["max_tokens"])
        started = time.monotonic()
        answered = False
        try:
            try:
                completion = provider.complete(messages, tools, **options)
                answered = True
            except (ProviderError, InterruptedError):  # as they are: not a bad_response
                raise
            except Exception as exc:  # a provider's own bug: logged and classified, never the agent's crash
                raise ProviderError("bad_response", redact(f"{name}: {type(exc).__name__}: {exc}", known())[:500],
                                    provider=name) from None
            finally:
                # Any way out but an answer gives the reservation back, whatever was raised (an
                # interrupt, a BaseException a library lets through): a live process's hold counts
                # against the caps until it ends.
                if budget is not None and not answered:
                    budget.release(hold)
        except ProviderError as error:
            if stop is not None and stop.is_set():
                raise InterruptedError from None  # the error is our own abort
            plan.log(Attempt(name, provider.config.model, error.kind, time.monotonic() - started, error=str(error)))
            action, delay = next_step(error, attempt, plan.policy, plan.rng)
            if health is not None and action == "next" and (error.kind in COOL_DOWN or error.kind in COUNTED):
                why = COOL_DOWN.get(error.kind) or COUNTED[error.kind]
                breaker = health.failed(name, why, at_once=error.kind in COOL_DOWN, at_least=error.retry_after or 0.0)
                if breaker.state == OPEN:
                    plan.refused[name] = (breaker.until, why)
            if action == "raise":
                if health is not None:
                    health.answered(name)  # a request refused on its merits: the provider is there
                raise
            if action == "retry":
                plan.sleep(delay)
                continue
            plan.errors.append(str(error))
            raise _NextProvider from None
        if not completion.usage.input and not completion.usage.output:
            completion = dataclasses.replace(completion, usage=estimate_usage(messages, tools, completion.message))
        if budget is not None:
            budget.settle(hold, completion.model or provider.config.model, completion.usage)
        plan.log(Attempt(name, provider.config.model, "ok", time.monotonic() - started, completion=completion))
        if health is not None:
            health.answered(name)
        return completion
