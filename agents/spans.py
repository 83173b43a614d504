"""What telemetry exports, as pure functions: hermes.yaml's `telemetry:` settings, the collector's address,
and each span's attributes (OpenTelemetry's GenAI conventions), cut to bounds and redacted."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..kanban.redact import scrub

TRACE_FIELD = "trace"  # in a task's `meta`: the W3C trace context of the attempt that made it (a delegation)
TITLE_CHARS = 80
NAME_CHARS = 200  # of a name or an id a span carries: a tool's name, a call's id, a model's, a role (a model's
# answer or a task's file may hold any text; a span is not where it lands whole)
CARRIER_CHARS = 512  # of each W3C trace-context header a task's meta.trace carries (traceparent's own cap)
CONTENT_CHARS = 8_000  # of a prompt or an answer, exported only with `telemetry: {content: true}`
ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
TRACES_PATH = "/v1/traces"
SETTINGS_KEYS = ("otlp_endpoint", "content")
UNKNOWN_OUTCOME = "unknown"  # of a tool call whose result nobody recorded (a Hermes run ended during it): no error


# -- pure: settings and attributes ---------------------------------------------------------------

def check_settings(section: Any) -> str | None:
    """What is wrong with hermes.yaml's `telemetry:` section, or None (pure)."""
    if section is None:
        return None
    if not isinstance(section, dict):
        return "'telemetry' must be a mapping (otlp_endpoint, content)"
    for key in section:
        if key != "__line__" and key not in SETTINGS_KEYS:
            return f"unknown key 'telemetry.{key}'; expected one of {', '.join(SETTINGS_KEYS)}"
    endpoint = section.get("otlp_endpoint")
    if endpoint is not None:
        parts = urlsplit(str(endpoint))
        if not isinstance(endpoint, str) or parts.scheme not in ("http", "https") or not parts.netloc:
            return "'telemetry.otlp_endpoint' must be an http(s) URL (the collector's OTLP/HTTP address)"
    if "content" in section and not isinstance(section["content"], bool):
        return "'telemetry.content' must be true or false"
    return None


def traces_url(base: str) -> str:
    """A collector's base address as the URL its traces go to (pure): /v1/traces is added unless the
    address names a path already (as OTEL_EXPORTER_OTLP_ENDPOINT's base and a signal's full URL)."""
    path = urlsplit(base).path
    return base if path not in ("", "/") else base.rstrip("/") + TRACES_PATH


def endpoint_of(settings: Mapping[str, Any] | None, env: Mapping[str, str]) -> str | None:
    """Where this process's traces go, or None for nowhere (pure): hermes.yaml's otlp_endpoint, else
    the standard OTEL_EXPORTER_OTLP_* variables; OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none turn it off."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    configured = (settings or {}).get("otlp_endpoint")
    if configured:
        return traces_url(str(configured))
    if env.get(TRACES_ENDPOINT_ENV):
        return env[TRACES_ENDPOINT_ENV]  # a signal's URL is taken as it is (the OTLP exporter spec)
    if env.get(ENDPOINT_ENV):
        return env[ENDPOINT_ENV].rstrip("/") + TRACES_PATH
    return None


def shown(endpoint: str) -> str:
    """A collector's address as the agent's log says it (pure): without the user and password its
    URL may hold (basic auth) nor its query, which are credentials, not where it is."""
    parts = urlsplit(endpoint)
    host = parts.netloc.rpartition("@")[2]
    return parts._replace(netloc=host, query="", fragment="").geturl()


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def name(value: Any) -> str:
    """A name or an id as a span carries it (pure but for the keys this process knows): cut, redacted."""
    return cut(scrub(str(value)), NAME_CHARS)


def task_attributes(task: Mapping[str, Any], *, agent: str, host: str) -> dict[str, Any]:
    """A task attempt's span attributes (pure but for the keys this process knows): ids and counts, the
    title cut short and redacted, no body."""
    return {"hermes.task.id": name(task.get("id")),
            "hermes.task.title": cut(scrub(str(task.get("title") or "")), TITLE_CHARS),
            "hermes.task.role": name(task.get("role") or ""), "hermes.agent": agent, "hermes.host": host,
            "hermes.task.attempt": count(task.get("attempts")),  # counted at the claim
            "hermes.task.claim": count(task.get("claims"))}


def tokens(value: Any) -> int:
    """A call's tokens as a span carries them (pure): the provider's answer said them, as anything;
    0 for what is no count an int64 holds."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63 else 0


def count(value: Any) -> int:
    """A task's count of attempts or claims as a span carries it (pure): 1 for none, at most an int64
    (OTLP's integer: a larger one fails to encode, with a traceback in the agent's log each export)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 63 else 1


def model_attributes(record: Mapping[str, Any], *, provider_kind: str, requested: str,
                     finish: str | None) -> dict[str, Any]:
    """A model call's span attributes (pure), GenAI semantic conventions; cost is ours (hermes.*).
    `record` is the LLM-call log's record of the call (agents/loop.py llm_record)."""
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider_kind or name(record.get("provider")),
        "gen_ai.request.model": name(requested), "gen_ai.response.model": name(record.get("model") or requested),
        "gen_ai.usage.input_tokens": tokens(record.get("tokens_in")),
        "gen_ai.usage.output_tokens": tokens(record.get("tokens_out")),
        "hermes.provider": name(record.get("provider")), "hermes.outcome": name(record.get("outcome")),
        "hermes.cost_usd": float(record.get("cost_usd") or 0.0)}
    if finish:
        attributes["gen_ai.response.finish_reasons"] = [finish]
    if record.get("outcome") != "ok":
        attributes["error.type"] = name(record.get("outcome"))
    if record.get("estimated"):
        attributes["hermes.usage.estimated"] = True
    if record.get("runtime") == "hermes":
        # One record for a whole Hermes run (agents/hermesrun.py usage_record): its model calls summed
        # as its usage file counts them; their own times are unknown, the span's are the run's.
        attributes.update({"hermes.runtime": "hermes", "hermes.usage.aggregate": True,
                           "hermes.model_calls": tokens(record.get("calls")), "hermes.timing": "run"})
    return attributes


def tool_attributes(tool: str, call_id: str, outcome: str, duration: float) -> dict[str, Any]:
    """A tool call's span attributes (pure but for the keys this process knows), GenAI semantic
    conventions; the name and id are the model's words, cut."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name(tool),
                                  "gen_ai.tool.call.id": name(call_id), "hermes.tool.outcome": outcome,
                                  "hermes.tool.duration_s": round(duration, 6)}
    if outcome not in ("ok", UNKNOWN_OUTCOME):
        attributes["error.type"] = outcome
    return attributes


QUIET_EVENTS = ("note",)  # what the supervisor says without an event of its own: its log has it


def event_attributes(record: Mapping[str, Any]) -> dict[str, Any]:
    """A supervisor event's attributes (pure): which, for which agent, why; its line redacted and cut."""
    attributes: dict[str, Any] = {"hermes.event": str(record.get("event")),
                                  "hermes.agent": str(record.get("agent") or "")}
    for key in ("why", "code", "signal", "reason", "delay", "state"):
        value = record.get(key)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != "":
            attributes[f"hermes.{key}"] = cut(scrub(value), 500) if isinstance(value, str) else value
    if record.get("note"):
        attributes["hermes.note"] = cut(scrub(str(record["note"])), 500)
    return attributes


def content(value: Any) -> str:
    """A prompt, an answer or a tool's arguments as exported with `content: true` (pure but for the
    keys this process knows): keys redacted as in every other text, cut to CONTENT_CHARS."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return cut(scrub(text), CONTENT_CHARS)


def carrier_of(task: Mapping[str, Any]) -> dict[str, str]:
    """The W3C trace context a task's meta.trace carries, as a propagator takes it (pure): string
    headers of a sane length only; a task's file may hold anything there, which is then no parent."""
    meta = task.get("meta")
    carried = meta.get(TRACE_FIELD) if isinstance(meta, dict) else None
    if not isinstance(carried, dict):
        return {}
    return {key: value for key, value in carried.items()
            if key in ("traceparent", "tracestate") and isinstance(value, str) and len(value) <= CARRIER_CHARS}


def root_trace_id(task: Mapping[str, Any]) -> int:
    """The trace of a task no other task's attempt made (pure): from its id and creation time, so
    every attempt at it, on any host, lands in the same trace."""
    digest = hashlib.sha256(f"hermes-sup trace\0{task.get('id')}\0{task.get('created_at')}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1


def attempt_span_id(trace_id: int, task_id: str, claim: int) -> int:
    """The span id of a task's attempt by its claim number (pure): the next attempt can link to the
    one it continues without anything written to the task."""
    digest = hashlib.sha256(f"hermes-sup span\0{trace_id:032x}\0{task_id}\0{claim}".encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1
