"""The cascade routing strategy: the cheap tier answers first, a check accepts its answer or escalates
the call to the premium tier, and every decision is written to the LLM-call log.

Selected in hermes.yaml (`routing: {strategy: cascade}`) for the tasks whose tier is `auto` (the
task's and its agent's), in place of the length heuristic. The check (`judge`, pure) accepts:
- an answer with tool calls when every call names a tool it was offered, with arguments that are a
  JSON object holding the tool's required parameters (a cheap model's malformed call escalates);
- a final answer whose last line reports a confidence (`confidence: 0.85`, asked for in the cheap
  tier's system prompt) of at least `min_confidence`; no confidence, or an empty answer, escalates.
The confidence line is taken out of the accepted answer. A cheap tier that cannot answer at all
(every provider failed or down) escalates too; the premium tier's answer is final, as it stands.
"""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .fallback import Attempt, complete_with_fallback
from .providers import Provider, ProviderError
from .translate import Completion, Message, text_tool_calls

ASK_CONFIDENCE = ("When you give your final answer (not a tool call), end it with one last line "
                  "`confidence: N`, N from 0 to 1: how sure you are that the answer is correct and complete.")
VERIFY = ("You check another model's answer. Reply with one word: YES if the answer below does what the request "
          "asks, correctly and completely; NO otherwise.")
VERIFY_CHARS = 8_000  # of the request and of the answer, in the verifier's prompt
CONFIDENCE = re.compile(r"^[ \t*_`]*confidence[ \t*_`]*[:=][ \t*_`]*(\d+(?:\.\d+)?|\.\d+)[ \t*_`%]*$",
                        re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class CascadePolicy:
    cheap: str = "cheap"
    premium: str = "premium"
    min_confidence: float = 0.7
    verify: bool = False  # a final answer that passed the check is also put to a cheap verifier call


def cascades(task: Mapping[str, Any], agent_tier: str) -> bool:
    """Whether a task's calls go through the cascade (when one is configured): its tier is left to
    routing, on the task and on its agent (pure)."""
    return task.get("tier") in (None, "", "auto") and agent_tier in ("", "auto")


def cascade_policy(llm: Mapping[str, Any]) -> CascadePolicy | None:
    """The cascade of an agent's LLM settings, or None when its routing is the tiers' (pure)."""
    spec = llm.get("routing") or {}
    if not isinstance(spec, Mapping) or spec.get("strategy") != "cascade":
        return None
    return CascadePolicy(cheap=str(spec.get("cheap", "cheap")), premium=str(spec.get("premium", "premium")),
                         min_confidence=float(spec.get("min_confidence", 0.7)), verify=spec.get("verify") is True)


def confidence(text: str) -> float | None:
    """The confidence the last `confidence: N` line of an answer reports (a percentage read as one),
    or None (pure)."""
    found = CONFIDENCE.findall(text or "")
    if not found:
        return None
    value = float(found[-1])
    return value / 100 if value > 1 else value


def without_confidence(message: Message) -> Message:
    content = message.get("content")
    if not isinstance(content, str):
        return message
    return {**message, "content": CONFIDENCE.sub("", content).rstrip()}


def _call_problem(call: Any, schemas: Mapping[str, Mapping[str, Any]]) -> str | None:
    function = call.get("function") if isinstance(call, Mapping) else None
    name = function.get("name") if isinstance(function, Mapping) else None
    if name not in schemas:
        return f"a call to {str(name)[:60]!r}, a tool it was not offered"
    try:
        args = json.loads(function.get("arguments") or "{}")
    except (TypeError, ValueError):
        return f"{name}: arguments that are not JSON"
    if not isinstance(args, dict):
        return f"{name}: arguments that are not an object"
    required = (schemas[name].get("parameters") or {}).get("required") or []
    missing = [key for key in required if key not in args]
    return f"{name}: missing required argument(s) {', '.join(map(str, missing))}" if missing else None


def judge(message: Message, tools: list[dict[str, Any]] | None, min_confidence: float) -> tuple[bool, str]:
    """Whether the cheap tier's answer is accepted, and why (pure): see the module's docstring."""
    schemas = {t["function"]["name"]: t["function"] for t in tools or () if isinstance(t.get("function"), Mapping)}
    message = text_tool_calls(message, set(schemas))
    calls = message.get("tool_calls") or []
    if calls:
        problems = [problem for call in calls if (problem := _call_problem(call, schemas))]
        if problems:
            return False, f"invalid tool call: {problems[0]}"
        return True, f"{len(calls)} valid tool call(s)"
    text = message.get("content") if isinstance(message.get("content"), str) else ""
    if not CONFIDENCE.sub("", text).strip():
        return False, "an empty answer"
    level = confidence(text)
    if level is None:
        return False, "no confidence reported"
    if level < min_confidence:
        return False, f"confidence {level:g} below {min_confidence:g}"
    return True, f"confidence {level:g}"


def verifier_prompt(messages: list[Message], answer: Message) -> list[Message]:
    """What the verifier is asked (pure): the task (the first user message), the latest request when
    it is another, and the answer, each cut to VERIFY_CHARS."""
    asked = [m.get("content") for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    request = asked[0][:VERIFY_CHARS] if asked else ""
    if len(asked) > 1 and asked[-1] != asked[0]:
        request += f"\n\n(latest message: {asked[-1][:VERIFY_CHARS]})"
    text = str(answer.get("content") or "")[:VERIFY_CHARS]
    return [{"role": "system", "content": VERIFY},
            {"role": "user", "content": f"The request:\n{request}\n\nThe answer:\n{text}"}]


def verified(reply: Message) -> bool:
    """Whether the verifier said yes (pure): its first word, whatever the case and punctuation."""
    words = re.findall(r"[A-Za-z]+", str(reply.get("content") or ""))
    return bool(words) and words[0].upper() == "YES"


def with_confidence_ask(messages: list[Message]) -> list[Message]:
    """The conversation as the cheap tier is sent it: its system prompt asks for a confidence line."""
    if messages and messages[0].get("role") == "system" and isinstance(messages[0].get("content"), str):
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{ASK_CONFIDENCE}"}, *messages[1:]]
    return [{"role": "system", "content": ASK_CONFIDENCE}, *messages]


class Cascade:
    """A `complete` for the task loop (the signature of complete_with_fallback) that routes each call
    through the cheap tier's chain, then, when the check escalates, the premium tier's."""

    def __init__(self, cheap: list[Provider], premium: list[Provider], policy: CascadePolicy,
                 complete: Callable[..., Completion] = complete_with_fallback) -> None:
        self.cheap, self.premium, self.policy, self.complete = cheap, premium, policy, complete

    @property
    def chain(self) -> list[Provider]:
        """Every provider a call may reach (what a stop aborts, what the loop sizes the context by)."""
        return [*self.cheap, *(p for p in self.premium if p not in self.cheap)]

    def __call__(self, _chain: list[Provider], messages: list[Message], tools: list[dict[str, Any]] | None, *,
                 log: Callable[[Attempt], None] = lambda attempt: None, stop: threading.Event | None = None,
                 **options: Any) -> Completion:
        route = {"strategy": "cascade", "tier": self.policy.cheap}
        held: list[Attempt] = []

        def hold(attempt: Attempt) -> None:  # the answer's record waits for the check's verdict
            (held.append if attempt.outcome == "ok" else log)(dataclasses.replace(attempt, route=route))

        why = ""
        if self.cheap:
            try:
                answer = self.complete(self.cheap, with_confidence_ask(messages), tools, log=hold, stop=stop,
                                       **options)
            except ProviderError as exc:
                if exc.kind == "context_overflow":
                    raise  # the caller compresses; the premium tier would overflow as well
                why = f"the cheap tier failed: {str(exc)[:200]}"
            else:
                accepted, why = judge(answer.message, tools, self.policy.min_confidence)
                if accepted and self.policy.verify and not answer.message.get("tool_calls"):
                    accepted, why = self._verify(messages, without_confidence(answer.message), why, log, stop)
                for attempt in held:
                    log(dataclasses.replace(attempt, route={**route, "decision": "accepted" if accepted else
                                                            "escalated", "why": why}))
                if accepted:
                    return dataclasses.replace(answer, message=without_confidence(answer.message))
        else:
            why = f"the {self.policy.cheap} tier has no provider"
        final = {"strategy": "cascade", "tier": self.policy.premium, "decision": "final",
                 "why": f"escalated: {why}"}
        return self.complete(self.premium, messages, tools, stop=stop, **options,
                             log=lambda attempt: log(dataclasses.replace(attempt, route=final)))

    def _verify(self, messages: list[Message], answer: Message, why: str, log: Callable[[Attempt], None],
                stop: threading.Event | None) -> tuple[bool, str]:
        """Put an answer that passed the check to a cheap verifier call: (accepted, why)."""
        route = {"strategy": "cascade", "tier": self.policy.cheap, "check": "verifier"}
        held: list[Attempt] = []

        def hold(attempt: Attempt) -> None:  # its record says the verdict
            (held.append if attempt.outcome == "ok" else log)(dataclasses.replace(attempt, route=route))

        try:
            reply = self.complete(self.cheap, verifier_prompt(messages, answer), None, stop=stop, log=hold)
        except ProviderError as exc:
            return False, f"{why}; the verifier failed: {str(exc)[:200]}"
        said = "yes" if verified(reply.message) else "no"
        for attempt in held:
            log(dataclasses.replace(attempt, route={**route, "decision": said}))
        return said == "yes", f"{why}; the verifier said {said}"
