"""OpenTelemetry traces of an agent's work (a span per task attempt, model call and tool call), over OTLP/HTTP
when configured."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .logline import say
from .spans import (
    QUIET_EVENTS,
    TRACE_FIELD,
    attempt_span_id,
    carrier_of,
    content,
    endpoint_of,
    event_attributes,
    model_attributes,
    name,
    root_trace_id,
    shown,
    task_attributes,
    tool_attributes,
)

EXPORT_TIMEOUT = 5.0  # seconds per batch (retries included): a collector that is away costs the exit no more


# -- the process's telemetry ---------------------------------------------------------------------

class Telemetry:
    """No telemetry: what an agent without configuration holds. Every hook is a no-op, nothing of
    OpenTelemetry is imported."""

    enabled = False
    content = False  # prompts, answers, tool arguments and results exported (`telemetry: {content: true}`)
    dropped = 0

    @contextlib.contextmanager
    def task_span(self, task: Mapping[str, Any]) -> Iterator[None]:
        yield

    def outcome(self, kind: str) -> None:
        pass

    def prompt(self, messages: Any) -> None:
        pass

    def model_call(self, record: Mapping[str, Any], attempt: Any) -> None:
        pass

    def tool_call(self, name: str, call_id: str, outcome: str, duration: float, args: Any = None,
                  result: str = "", *, at: tuple[float, float] | None = None,
                  extra: Mapping[str, Any] | None = None) -> None:
        """A tool call's span, ended now; or from `at`'s start to its end (epoch seconds) for a call
        another program made and recorded (a Hermes run's), with `extra` attributes of ours."""

    def carrier(self) -> dict[str, Any]:
        """What a task made during the current attempt carries in `meta` to join its trace."""
        return {}

    def event(self, record: Mapping[str, Any]) -> None:
        """A supervisor event (exited, restarting, fatal, ...), exported as a span of its own."""

    def close(self) -> None:
        pass

    @staticmethod
    def from_settings(settings: Mapping[str, Any] | None, env: Mapping[str, str], *, agent: str, workspace: str,
                      host: str | None = None, providers: Mapping[str, Any] | None = None) -> Telemetry:
        """The process's telemetry: exporting to the configured collector, or the no-op one."""
        endpoint = endpoint_of(settings, env)
        if endpoint is None:
            return Telemetry()
        try:
            import opentelemetry.exporter.otlp.proto.http.trace_exporter
            import opentelemetry.sdk.trace  # noqa: F401
        except ImportError as exc:  # configured, not installed: the agent works on and says why nothing goes out
            say(agent, f"telemetry: nothing is exported to {shown(endpoint)}: {exc.name or exc} is not installed "
                       "(the telemetry extra: pip install 'opentelemetry-sdk>=1.45' "
                       "'opentelemetry-exporter-otlp-proto-http>=1.45')", error=True)
            return Telemetry()
        return Tracing(endpoint, agent=agent, workspace=workspace, host=host or socket.gethostname(),
                       content=bool((settings or {}).get("content")), env=env,
                       kinds={name: str((spec or {}).get("kind") or "") for name, spec in (providers or {}).items()})


_active: Telemetry = Telemetry()


def install(telemetry: Telemetry) -> Telemetry:
    """Make `telemetry` the process's (one agent a process): the delegation tool reads it."""
    global _active
    _active = telemetry
    return telemetry


def active() -> Telemetry:
    return _active


def trace_meta() -> dict[str, Any]:
    """`meta` entries for a task made now (a delegation) so that its spans join this attempt's trace."""
    carrier = _active.carrier()
    return {TRACE_FIELD: carrier} if carrier else {}


def _never_raises(method: Callable[..., Any]) -> Callable[..., Any]:
    """A hook that cannot fail the agent's work: telemetry is a bystander. What went wrong is said
    once in the agent's log; the span is lost."""
    def guarded(self: Tracing, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:
            if not self._broken:
                self._broken = True
                say(self.agent, f"telemetry: {method.__name__} failed, its span is lost: {type(exc).__name__}: {exc}",
                    error=True)
            return {} if method.__name__ == "carrier" else None

    guarded.__name__ = method.__name__
    guarded.__doc__ = method.__doc__
    return guarded


class Tracing(Telemetry):
    """Spans exported by the OpenTelemetry SDK: batched on its own thread (an agent never waits for
    the collector), each batch given EXPORT_TIMEOUT, a batch the collector did not take counted as
    dropped and said in the agent's log."""

    enabled = True

    def __init__(self, endpoint: str, *, agent: str, workspace: str, host: str, content: bool,
                 env: Mapping[str, str], kinds: Mapping[str, str]) -> None:
        # Imported here: an agent without telemetry configured loads none of it.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

        # The exporter's own warnings would repeat at every batch while the collector is away; the
        # agent says it once, with the count, instead.
        logging.getLogger("opentelemetry.exporter.otlp.proto.http").setLevel(logging.CRITICAL)
        logging.getLogger("opentelemetry.exporter.otlp_common").setLevel(logging.CRITICAL)
        logging.getLogger("opentelemetry.sdk._shared_internal").setLevel(logging.CRITICAL)  # "Queue full": counted
        self.endpoint, self.agent, self.host, self.content, self.kinds = shown(endpoint), agent, host, content, kinds
        self._lock = threading.Lock()
        self.ended = 0
        self.exported = 0
        self._failing = False
        self._broken = False  # a hook failed once (said once; see _never_raises)
        self._context: Any = None  # the current attempt's span as a parent context
        self._span: Any = None
        self._outcome = ""
        self._prompt: Any = None
        tracing = self

        class Pinned(RandomIdGenerator):
            """Random ids but for a task attempt's span, whose trace and span ids are derived (see
            root_trace_id, attempt_span_id) and set just before it starts."""

            def __init__(self) -> None:
                self.pin = threading.local()

            def generate_span_id(self) -> int:
                pinned = getattr(self.pin, "span", None)
                self.pin.span = None
                return pinned or super().generate_span_id()

            def generate_trace_id(self) -> int:
                pinned = getattr(self.pin, "trace", None)
                self.pin.trace = None
                return pinned or super().generate_trace_id()

        class Counting(SpanExporter):
            """The OTLP exporter, its outcomes counted: what did not reach the collector is dropped."""

            def __init__(self, inner: Any) -> None:
                self.inner = inner

            def export(self, spans: Any) -> Any:
                result = self.inner.export(spans)
                tracing._exported(len(spans), result == SpanExportResult.SUCCESS)
                return result

            def shutdown(self) -> None:
                self.inner.shutdown()

            def force_flush(self, timeout_millis: int = 30000) -> bool:
                return self.inner.force_flush(timeout_millis)

        class Ending(BatchSpanProcessor):
            def on_end(self, span: Any) -> None:
                with tracing._lock:
                    tracing.ended += 1
                super().on_end(span)

        timeout = None if env.get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") or env.get("OTEL_EXPORTER_OTLP_TIMEOUT") \
            else EXPORT_TIMEOUT
        self._close_within = EXPORT_TIMEOUT + 1.0 if timeout is not None else None  # the variables': theirs
        self._ids = Pinned()
        resource = Resource.create({"service.name": "hermes-sup", "hermes.workspace": workspace, "host.name": host,
                                    "hermes.agent": agent, "service.instance.id": f"{host}/{agent}/{os.getpid()}"})
        self.provider = TracerProvider(resource=resource, id_generator=self._ids)
        self.provider.add_span_processor(Ending(Counting(OTLPSpanExporter(endpoint=endpoint, timeout=timeout)),
                                                schedule_delay_millis=500))
        self.tracer = self.provider.get_tracer("hermes_sup.agents")

    @property
    def dropped(self) -> int:  # type: ignore[override]
        with self._lock:
            return self.ended - self.exported

    def _exported(self, count: int, ok: bool) -> None:
        with self._lock:
            if ok:
                self.exported += count
            was, self._failing = self._failing, not ok
            dropped = self.ended - self.exported
        if not ok and not was:
            say(self.agent, f"telemetry: the collector at {self.endpoint} did not take {count} span(s); "
                            "spans are dropped while it is away")
        elif ok and was:
            say(self.agent, f"telemetry: the collector at {self.endpoint} takes spans again "
                            f"({dropped} dropped so far)")

    @contextlib.contextmanager
    def task_span(self, task: Mapping[str, Any]) -> Iterator[None]:
        span = self._start_attempt(task)
        if span is None:  # could not be made (said): the work goes on without it
            yield
            return
        try:
            yield
        except BaseException as exc:
            self._outcome = "error"
            span.record_exception(exc)
            raise
        finally:
            self._end_attempt(span)

    @_never_raises
    def _start_attempt(self, task: Mapping[str, Any]) -> Any:
        """The span of a task's attempt, started: its trace the parent's (meta.trace) or the task's own,
        its id derived from its claim, linked to the attempt before."""
        from opentelemetry import trace
        from opentelemetry.trace import Link, SpanContext, TraceFlags
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        task_id = str(task.get("id"))
        parent = None
        carried = carrier_of(task)
        if carried:
            parent = TraceContextTextMapPropagator().extract(carried)
        parent_span = trace.get_current_span(parent).get_span_context() if parent is not None else None
        trace_id = parent_span.trace_id if parent_span and parent_span.is_valid else root_trace_id(task)
        claim = int(task.get("claims") or 1)
        links = [Link(SpanContext(trace_id, attempt_span_id(trace_id, task_id, claim - 1), is_remote=True,
                                  trace_flags=TraceFlags(TraceFlags.SAMPLED)), {"hermes.link": "continues"})] \
            if claim > 1 else []
        joined = parent_span is not None and parent_span.is_valid
        self._ids.pin.trace = None if joined else trace_id  # a joined trace is the parent's: no id is generated
        self._ids.pin.span = attempt_span_id(trace_id, task_id, claim)
        span = self.tracer.start_span(f"task {name(task_id)}", context=parent if joined else None,
                                      attributes=task_attributes(task, agent=self.agent, host=self.host), links=links)
        self._span, self._context, self._outcome = span, trace.set_span_in_context(span), "interrupted"
        return span

    @_never_raises
    def _end_attempt(self, span: Any) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span = self._context = self._prompt = None
        span.set_attribute("hermes.task.outcome", self._outcome)
        if self._outcome in ("failed", "error"):
            span.set_status(Status(StatusCode.ERROR, self._outcome))
        span.end()

    def outcome(self, kind: str) -> None:
        self._outcome = kind

    @_never_raises
    def prompt(self, messages: Any) -> None:
        if self.content:
            self._prompt = list(messages)

    def _child(self, name: str, attributes: dict[str, Any], duration: float, error: bool,
               end: int | None = None) -> None:
        """A span under the current attempt's, ended now (or at `end`, ns), begun `duration` seconds
        before: the hooks are called once the call is over (its record written), so the loop wraps nothing."""
        from opentelemetry.trace import Status, StatusCode

        end = time.time_ns() if end is None else end
        start = end - int(max(duration, 0.0) * 1e9)
        # Never before the attempt it is part of: a run's duration may be rounded (a command's to
        # 10 ms), and a trace viewer draws a child that starts before its parent as broken.
        begun = getattr(self._span, "start_time", None)
        if isinstance(begun, int):
            start = min(max(start, begun), end)
        span = self.tracer.start_span(name, context=self._context, attributes=attributes, start_time=start)
        if error:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=end)

    @_never_raises
    def model_call(self, record: Mapping[str, Any], attempt: Any) -> None:
        completion = getattr(attempt, "completion", None)
        attributes = model_attributes(record, provider_kind=self.kinds.get(str(record.get("provider")), ""),
                                      requested=str(getattr(attempt, "model", "") or record.get("model")),
                                      finish=getattr(completion, "stop", None) if completion is not None else None)
        if self.content:
            if self._prompt is not None:
                attributes["gen_ai.input.messages"] = content(self._prompt)
            if completion is not None:
                attributes["gen_ai.output.messages"] = content([completion.message])
        self._child(f"chat {attributes['gen_ai.request.model']}", attributes, float(record.get("latency_s") or 0.0),
                    record.get("outcome") != "ok")

    @_never_raises
    def tool_call(self, name: str, call_id: str, outcome: str, duration: float, args: Any = None,
                  result: str = "", *, at: tuple[float, float] | None = None,
                  extra: Mapping[str, Any] | None = None) -> None:
        if at is not None:
            duration = at[1] - at[0]
        attributes = {**tool_attributes(name, call_id, outcome, duration), **(extra or {})}
        if self.content:
            attributes["gen_ai.tool.call.arguments"] = content(args if args is not None else {})
            attributes["gen_ai.tool.call.result"] = content(result)
        self._child(f"execute_tool {attributes['gen_ai.tool.name']}", attributes, duration,
                    "error.type" in attributes, end=int(at[1] * 1e9) if at is not None else None)

    @_never_raises
    def carrier(self) -> dict[str, Any]:
        if self._context is None:
            return {}
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier, context=self._context)
        return carrier

    @_never_raises
    def event(self, record: Mapping[str, Any]) -> None:
        from opentelemetry.trace import Status, StatusCode

        name = str(record.get("event"))
        if name in QUIET_EVENTS:
            return
        attributes = event_attributes(record)
        span = self.tracer.start_span(f"supervisor {name}", attributes=attributes)
        span.add_event(name, attributes)
        if name == "fatal" or record.get("why") in ("hang", "memory"):
            span.set_status(Status(StatusCode.ERROR, name))
        span.end()

    def close(self) -> None:
        """Export what is left, for EXPORT_TIMEOUT at most in all (the SDK's shutdown drains every batch
        queued, each given the export timeout, and waits up to 30 s: past an agent's stop_timeout a
        collector that takes connections and never answers would have it killed), and say what was
        dropped. What is still on its way then is dropped: the export thread dies with the process."""
        closing = threading.Thread(target=self.provider.shutdown, name="telemetry-close", daemon=True)
        closing.start()
        closing.join(self._close_within)
        with self._lock:
            ended, dropped = self.ended, self.ended - self.exported
        if dropped:
            say(self.agent, f"telemetry: {dropped} of {ended} span(s) dropped: the collector at {self.endpoint} "
                            "did not take them")
        else:
            say(self.agent, f"telemetry: {ended} span(s) exported to {self.endpoint}")
