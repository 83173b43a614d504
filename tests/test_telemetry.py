"""Traces: a real team's agents export over the real OTLP/HTTP exporter to a receiver in the test that
decodes the protobuf (opentelemetry-proto): the shape of a task's trace, its GenAI attributes, no
content by default, a delegated child in its parent's trace, and an agent that works on and counts
what it dropped while no collector listens."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hermes_sup.agents import spans as span_rules
from hermes_sup.agents import telemetry
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import CLI, ROOT, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply

SECRET = "PROMPT-TEXT-7f3a"  # in a task's body: never in what is exported without `content: true`


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


class Receiver:
    """An OTLP/HTTP traces receiver on 127.0.0.1: each POST to /v1/traces decoded as the collector's
    ExportTraceServiceRequest, its spans kept flat with their resource's attributes."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict[str, Any]] = []
        self.bodies: list[bytes] = []
        self.paths: list[str] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                flat = []
                for resource_spans in request.resource_spans:
                    resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
                    for scope_spans in resource_spans.scope_spans:
                        for span in scope_spans.spans:
                            flat.append({
                                "name": span.name, "trace": span.trace_id.hex(), "id": span.span_id.hex(),
                                "parent": span.parent_span_id.hex(), "resource": resource,
                                "attributes": {a.key: _value(a.value) for a in span.attributes},
                                "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                                "start": span.start_time_unix_nano, "end": span.end_time_unix_nano,
                                "status": span.status.code})
                with receiver.lock:
                    receiver.bodies.append(body)
                    receiver.paths.append(self.path)
                    receiver.spans += flat
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def agents_spans(self) -> list[dict[str, Any]]:
        """The agents' spans (the supervisor's events are spans of their own, each its own trace)."""
        with self.lock:
            return [span for span in self.spans if span["resource"].get("hermes.agent") != "supervisor"]

    def named(self, prefix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [span for span in self.spans if span["name"].startswith(prefix)]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    found = Receiver()
    yield found
    found.close()


@pytest.fixture(autouse=True)
def no_otel_from_the_shell(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collector the shell names must not receive a test's spans, nor decide whether there are any."""
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def workspace(tmp_path: Path, llm: ScriptedLLM, endpoint: str | None, agent: str = "") -> Path:
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
        "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
        + (f"telemetry: {{otlp_endpoint: '{endpoint}'}}\n" if endpoint else "")
        + "defaults:\n  stop_timeout: 20\n"
        + f"agents:\n  - name: thinker\n{agent}")
    return ws


def finished(board: Board, task_id: str) -> dict[str, Any] | None:
    doc = board.get(task_id)
    return doc if doc["status"] in ("done", "failed", "blocked") else None


def test_one_task_is_one_trace_with_its_model_and_tool_calls_under_it(tmp_path, receiver, up):
    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, receiver.url)
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "a.txt", "content": SECRET})],
                                          prompt=120, completion=15),
                   openai_reply("Wrote it.", prompt=160, completion=4))
        board = Board(ws / "kanban")
        task = board.add({"title": "Write a note " + "x" * 200, "body": f"Write {SECRET} to a.txt"})
        up(ws)
        assert wait_until(lambda: finished(board, task["id"]), timeout=60)["status"] == "done"
        # Order by events: the attempt's span ends after the task's close, and is exported after it.
        tops = wait_until(lambda: receiver.named("task "), timeout=30)
    assert receiver.paths and set(receiver.paths) == {"/v1/traces"}
    assert len(tops) == 1
    top = tops[0]
    spans = [span for span in receiver.spans if span["trace"] == top["trace"]]
    assert len({span["trace"] for span in receiver.agents_spans()}) == 1, "one task, one trace"
    assert top["parent"] == "", "the attempt is the trace's root"
    chats = sorted((s for s in spans if s["name"].startswith("chat ")), key=lambda s: s["start"])
    tools = [s for s in spans if s["name"].startswith("execute_tool ")]
    assert len(chats) == 2 and len(tools) == 1 and len(spans) == 4
    assert {s["parent"] for s in chats + tools} == {top["id"]}, "model and tool calls are children of the attempt"
    assert chats[0]["end"] <= tools[0]["start"] + 1_000_000 and tools[0]["end"] <= chats[1]["start"] + 1_000_000
    assert top["start"] <= chats[0]["start"] and chats[1]["end"] <= top["end"]
    attrs = top["attributes"]
    assert attrs["hermes.task.id"] == task["id"] and attrs["hermes.agent"] == "thinker"
    assert attrs["hermes.task.outcome"] == "done" and attrs["hermes.task.attempt"] == 1
    assert len(attrs["hermes.task.title"]) <= span_rules.TITLE_CHARS
    assert attrs["hermes.task.title"].startswith("Write a")
    assert attrs["hermes.host"] == socket.gethostname()
    first = chats[0]["attributes"]
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.provider.name"] == "openai"
    assert first["gen_ai.request.model"] == "m" and first["gen_ai.response.model"] == "scripted-gpt"
    assert (first["gen_ai.usage.input_tokens"], first["gen_ai.usage.output_tokens"]) == (120, 15)
    assert first["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert chats[1]["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    assert "hermes.cost_usd" in first and first["hermes.outcome"] == "ok"
    tool = tools[0]["attributes"]
    assert tool["gen_ai.tool.name"] == "write_file" and tool["hermes.tool.outcome"] == "ok"
    assert tool["gen_ai.operation.name"] == "execute_tool" and tool["hermes.tool.duration_s"] >= 0
    resource = top["resource"]
    assert resource["service.name"] == "hermes-sup" and resource["hermes.workspace"] == str(ws)
    assert resource["host.name"] == socket.gethostname()
    assert all(SECRET.encode() not in body for body in receiver.bodies), "no prompt or tool content by default"
    assert not any(key.startswith(("gen_ai.input", "gen_ai.output", "gen_ai.tool.call.arg")) for span in spans
                   for key in span["attributes"])


def test_a_delegated_childs_attempt_joins_its_parents_trace(tmp_path, receiver, up):
    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, receiver.url, "    capabilities: [fs.read, fs.write, memory, kanban, delegate]\n")
        llm.script("openai", openai_reply(tool_calls=[("delegate_task", {"goal": "Add 2 and 3"})]),
                   openai_reply("5"), openai_reply("The helper says 5."))
        board = Board(ws / "kanban")
        task = board.add({"title": "compute with help"})
        up(ws)
        assert wait_until(lambda: finished(board, task["id"]), timeout=60)["status"] == "done"
        tops = wait_until(lambda: len(receiver.named("task ")) == 2 and receiver.named("task "), timeout=30)
    child = next(d for d in board.list().tasks if (d.get("meta") or {}).get("parent"))
    parent_span = next(s for s in tops if s["attributes"]["hermes.task.id"] == task["id"])
    child_span = next(s for s in tops if s["attributes"]["hermes.task.id"] == child["id"])
    assert child["meta"][telemetry.TRACE_FIELD]["traceparent"].split("-")[1:3] == \
        [parent_span["trace"], parent_span["id"]], "the trace context travels in the task document"
    assert child_span["trace"] == parent_span["trace"] and child_span["parent"] == parent_span["id"]
    assert child_span["attributes"]["hermes.agent"].startswith("thinker.sub-")
    delegation = next(s for s in receiver.spans if s["name"] == "execute_tool delegate_task")
    assert delegation["parent"] == parent_span["id"]
    assert len({span["trace"] for span in receiver.agents_spans()}) == 1


def test_without_a_collector_the_agent_works_on_and_says_how_many_spans_it_dropped(tmp_path, up):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, f"http://127.0.0.1:{port}")
        llm.script("openai", openai_reply(tool_calls=[("write_file", {"path": "a.txt", "content": "1"})]),
                   openai_reply("Wrote it."))
        board = Board(ws / "kanban")
        task = board.add({"title": "Write a note"})
        up(ws)
        assert wait_until(lambda: finished(board, task["id"]), timeout=60)["status"] == "done"
        stopped = subprocess.run([*CLI, "-w", str(ws), "down", "--timeout", "30"], capture_output=True, text=True,
                                 timeout=60, cwd=ROOT)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    log = (ws / "runs/thinker/agent.log").read_text()
    assert f"telemetry: 4 of 4 span(s) dropped: the collector at http://127.0.0.1:{port}/v1/traces" in log, log
    assert "did not take" in log and "Traceback" not in log


def test_a_resumed_attempt_links_to_the_one_it_continues(receiver):
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    doc = {"id": "t-1", "title": "t", "created_at": "2026-01-01T00:00:00Z", "claims": 1, "attempts": 0}
    try:
        with tracing.task_span(doc):
            pass
        with tracing.task_span({**doc, "claims": 2}):
            tracing.outcome("done")
    finally:
        tracing.close()
    first, second = sorted(receiver.named("task "), key=lambda s: s["attributes"]["hermes.task.claim"])
    assert first["trace"] == second["trace"], "every attempt at a task is in one trace"
    assert second["links"] == [(first["trace"], first["id"])]
    assert first["attributes"]["hermes.task.outcome"] == "interrupted"
    assert second["attributes"]["hermes.task.outcome"] == "done"


def test_a_call_said_to_last_longer_than_its_attempt_starts_with_the_attempt(receiver):
    """A command's or a Hermes run's duration is rounded (to 10 ms): a run begun right after its
    task's span was drawn starting before its parent (CI saw 0.66 ms)."""
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    try:
        with tracing.task_span({"id": "t-3", "title": "t", "claims": 1}):
            tracing.model_call({"provider": "p", "model": "m", "outcome": "ok", "latency_s": 5.0}, None)
    finally:
        tracing.close()
    [task], [chat] = receiver.named("task "), receiver.named("chat ")
    assert task["start"] <= chat["start"] <= chat["end"] <= task["end"]


def test_content_is_exported_only_when_asked_and_redacted(receiver, monkeypatch):
    from hermes_sup.agents.fallback import Attempt
    from hermes_sup.agents.translate import Completion, Usage
    from hermes_sup.kanban import redact

    monkeypatch.setattr(redact, "_known", ())
    redact.remember(["sk-live-1234567890abcdef"])
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url, "content": True}, {}, agent="a",
                                                workspace="/w")
    try:
        with tracing.task_span({"id": "t-2", "title": "t", "claims": 1}):
            tracing.prompt([{"role": "user", "content": "my key is sk-live-1234567890abcdef"}])
            completion = Completion(message={"role": "assistant", "content": "ok"}, usage=Usage(10, 2), stop="stop",
                                    model="m")
            tracing.model_call({"provider": "p", "model": "m", "outcome": "ok", "tokens_in": 10, "tokens_out": 2,
                                "latency_s": 0.2}, Attempt("p", "m", "ok", 0.2, completion))
    finally:
        tracing.close()
    chat = receiver.named("chat ")[0]["attributes"]
    sent = chat["gen_ai.input.messages"]
    assert "my key is" in sent and "sk-live-1234567890abcdef" not in sent
    assert '"ok"' in chat["gen_ai.output.messages"]


def test_unconfigured_nothing_is_exported_and_nothing_imported():
    script = ("import sys, os\n"
              "from hermes_sup.agents import worker, loop\n"
              "from hermes_sup.agents.telemetry import Telemetry\n"
              "t = Telemetry.from_settings(None, {}, agent='a', workspace='/w')\n"
              "with t.task_span({'id': 'x'}):\n"
              "    t.tool_call('read_file', 'c', 'ok', 0.1)\n"
              "t.close()\n"
              "loaded = sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'prometheus')))\n"
              "print(type(t).__name__, loaded)")
    env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60,
                         cwd=ROOT, check=True).stdout
    assert out.strip() == "Telemetry []"


def test_where_spans_go():
    assert telemetry.endpoint_of(None, {}) is None
    assert telemetry.endpoint_of({"otlp_endpoint": "http://c:4318"}, {}) == "http://c:4318/v1/traces"
    assert telemetry.endpoint_of({"otlp_endpoint": "http://c:4318/custom"}, {}) == "http://c:4318/custom"
    assert telemetry.endpoint_of({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}) == "http://c:4318/v1/traces"
    assert telemetry.endpoint_of({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/x"}) == "http://c/x"
    assert telemetry.endpoint_of({"otlp_endpoint": "http://c"}, {"OTEL_SDK_DISABLED": "true"}) is None
    assert telemetry.endpoint_of({}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_TRACES_EXPORTER": "none"}) \
        is None


@pytest.mark.parametrize("section, line, message", [
    ("telemetry: {endpoint: 'http://c'}", 3, "unknown key 'telemetry.endpoint'"),
    ("telemetry: {otlp_endpoint: 'c:4318'}", 3, "'telemetry.otlp_endpoint' must be an http(s) URL"),
    ("telemetry: {content: 'yes'}", 3, "'telemetry.content' must be true or false"),
    ("telemetry: [http://c]", 1, "'telemetry' must be a mapping"),  # a scalar or list has no line: the file's
    ("metrics: {port: 'x'}", 3, "'metrics.port' must be a port number"),
    ("metrics: {path: /m}", 3, "unknown key 'metrics.path'"),
])
def test_telemetry_and_metrics_settings_that_cannot_be_are_refused_with_file_and_line(tmp_path, section, line,
                                                                                       message):
    path = tmp_path / "hermes.yaml"
    path.write_text(f"agents:\n  - name: a\n{section}\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, skills=lambda: ())
    assert f"{path}:{line}: {message}" in str(info.value)


def test_attributes_are_pure_and_cut():
    attrs = telemetry.task_attributes({"id": "t", "title": "y" * 500, "claims": 3, "attempts": 1}, agent="a",
                                      host="h")
    assert len(attrs["hermes.task.title"]) == span_rules.TITLE_CHARS and attrs["hermes.task.claim"] == 3
    model = telemetry.model_attributes({"provider": "p", "model": "m2", "outcome": "rate_limited", "tokens_in": 0},
                                       provider_kind="", requested="m", finish=None)
    assert model["error.type"] == "rate_limited" and model["gen_ai.provider.name"] == "p"
    assert "gen_ai.response.finish_reasons" not in model
    assert json.dumps(telemetry.tool_attributes("t", "c", "refused", 0.5))


def test_the_supervisor_exports_an_agents_exit_and_restart_on_the_same_resource(tmp_path, receiver, up):
    from .conftest import supervisor_state

    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, receiver.url)
        up(ws)
        wait_until(lambda: (supervisor_state(ws).get("agents") or {}).get("thinker", {}).get("state") == "running",
                   timeout=30)
        pid = supervisor_state(ws)["agents"]["thinker"]["pid"]
        os.kill(pid, 9)
        restarting = wait_until(lambda: receiver.named("supervisor restarting"), timeout=30)[0]
        exited = receiver.named("supervisor exited")[0]
    assert exited["attributes"]["hermes.agent"] == "thinker" and exited["attributes"]["hermes.signal"] == "SIGKILL"
    assert restarting["attributes"]["hermes.event"] == "restarting"
    resource = restarting["resource"]
    assert resource["service.name"] == "hermes-sup" and resource["hermes.workspace"] == str(ws)
    assert resource["host.name"] == socket.gethostname()
    assert not receiver.named("supervisor note"), "the supervisor's chatter stays in its log"


def test_the_standard_otel_variables_configure_it_without_hermes_yaml(tmp_path, receiver, up, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, None)
        llm.script("openai", openai_reply("Done."))
        board = Board(ws / "kanban")
        task = board.add({"title": "Say done"})
        up(ws)
        assert wait_until(lambda: finished(board, task["id"]), timeout=60)["status"] == "done"
        top = wait_until(lambda: receiver.named("task "), timeout=30)[0]
    assert top["attributes"]["hermes.task.id"] == task["id"]
    assert [s["parent"] for s in receiver.named("chat ")] == [top["id"]]


PG_DSN_ENV = "HERMES_SUP_TELEMETRY_TEST_DSN"


@pytest.fixture
def database(pg_server) -> Iterator[str]:
    from . import pgserver

    with pgserver.fresh_database(pg_server, "telemetry", "pw-telemetry-test") as dsn:
        yield dsn


def test_a_task_made_on_one_host_joins_its_makers_trace_on_another_host_of_a_postgres_board(
        tmp_path, receiver, up, database, monkeypatch):
    from hermes_sup.kanban.backends import open_board

    monkeypatch.setenv(PG_DSN_ENV, database)

    def responder(api: str, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if "Help with the sum" in str(messages[1].get("content")):
            return openai_reply("4")  # the helper, on box-b
        if messages[-1]["role"] == "tool":
            return openai_reply("Asked for help.")
        return openai_reply(tool_calls=[("kanban_create", {"title": "Help with the sum", "role": "help"})])

    with ScriptedLLM(responder=responder) as llm:
        hosts = {}
        for host, agent in (("box-a", "lead"), ("box-b", "helper")):
            ws = tmp_path / host
            init_workspace(ws)
            (ws / "hermes.yaml").write_text(
                f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
                "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
                f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\n"
                f"board: {{backend: postgres, dsn_env: {PG_DSN_ENV}}}\nhost: {host}\n"
                f"agents:\n  - name: {agent}\n    roles: [{'lead' if agent == 'lead' else 'help'}]\n"
                "    offer_tools: all\n")
            hosts[host] = ws
        board = open_board(hosts["box-a"], {"backend": "postgres", "dsn_env": PG_DSN_ENV}, host="box-a")
        try:
            task = board.add({"title": "Lead the work", "role": "lead"})
            up(hosts["box-a"])
            up(hosts["box-b"])
            assert wait_until(lambda: finished(board, task["id"]), timeout=60)["status"] == "done"
            made = wait_until(lambda: [d for d in board.list().tasks
                                       if (d.get("meta") or {}).get("created_by_task") == task["id"]
                                       and d["status"] == "done"], timeout=60)[0]
        finally:
            board.close()
        tops = wait_until(lambda: len(receiver.named("task ")) == 2 and receiver.named("task "), timeout=30)
    lead = next(s for s in tops if s["attributes"]["hermes.task.id"] == task["id"])
    helper = next(s for s in tops if s["attributes"]["hermes.task.id"] == made["id"])
    assert (lead["resource"]["host.name"], helper["resource"]["host.name"]) == ("box-a", "box-b")
    assert helper["attributes"]["hermes.agent"] == "helper"
    assert helper["trace"] == lead["trace"] and helper["parent"] == lead["id"], \
        "the task made on box-a carries the trace to box-b's agent through the database"


def test_a_hook_that_fails_never_fails_the_work_and_says_so_once(receiver, capsys):
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    try:
        with tracing.task_span({"id": "t-3", "title": "t", "claims": 1}):
            for _ in range(2):  # a record no log would hold: a latency that is no number
                tracing.model_call({"provider": "p", "model": "m", "outcome": "ok", "latency_s": "slow"}, None)
            tracing.outcome("done")
    finally:
        tracing.close()
    said = capsys.readouterr().err
    assert said.count("telemetry: model_call failed, its span is lost: ValueError") == 1
    assert [s["attributes"]["hermes.task.outcome"] for s in receiver.named("task ")] == ["done"]
    assert not receiver.named("chat ")


def test_a_collectors_password_in_its_address_is_never_said_in_the_agents_log(receiver, capsys):
    with_password = receiver.url.replace("http://", "http://user:hunter2-otlp-pass@") + "/v1/traces?token=tk-9f8e7d"
    tracing = telemetry.Telemetry.from_settings({}, {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": with_password},
                                                agent="a", workspace="/w")
    with tracing.task_span({"id": "t-4", "title": "t", "claims": 1}):
        tracing.outcome("done")
    tracing.close()
    said = capsys.readouterr().out
    assert "span(s) exported to http://127.0.0.1:" in said
    assert "hunter2-otlp-pass" not in said and "tk-9f8e7d" not in said and "user" not in said
    assert telemetry.shown("https://u:p@c.example:4318/v1/traces?k=v") == "https://c.example:4318/v1/traces"
    from hermes_sup.supervisor.suptelemetry import change_line, export_of

    assert change_line(None, with_password).endswith("exported to http://127.0.0.1:" + receiver.url.rsplit(":", 1)[1]
                                                     + "/v1/traces"), "a reload says where, never the credentials"
    assert export_of({"telemetry": {"otlp_endpoint": "http://c", "content": True}}, {}) == \
        export_of({"telemetry": {"otlp_endpoint": "http://c"}}, {}), "content changes no supervisor event"


def test_a_hostile_task_or_answer_inflates_no_span_and_a_known_key_in_a_title_is_redacted(receiver, monkeypatch,
                                                                                         capsys):
    from hermes_sup.kanban import redact

    monkeypatch.setattr(redact, "_known", ())
    redact.remember(["sk-live-1234567890abcdef"])
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    forged = [{"traceparent": 123}, {"traceparent": ["00-" + "a" * 32 + "-" + "b" * 16 + "-01"]}, "x",
              {"traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01", "tracestate": "k=" + "v" * 100_000}]
    try:
        for index, trace in enumerate(forged):
            with tracing.task_span({"id": f"t-{index}", "title": "use sk-live-1234567890abcdef now", "claims": 1,
                                    "role": "r" * 100_000, "meta": {"trace": trace}}):
                tracing.tool_call("n" * 100_000, "c" * 100_000, "refused", 0.1)
                tracing.outcome("done")
    finally:
        tracing.close()
    assert "failed" not in capsys.readouterr().err, "a forged meta.trace costs no span"
    tasks = receiver.named("task ")
    assert len(tasks) == len(forged)
    for span in tasks:
        assert span["attributes"]["hermes.task.title"] == "use [redacted] now"
        assert len(span["attributes"]["hermes.task.role"]) <= span_rules.NAME_CHARS
    for span in receiver.named("execute_tool "):
        assert len(span["name"]) <= span_rules.NAME_CHARS + 20
        assert len(span["attributes"]["gen_ai.tool.name"]) <= span_rules.NAME_CHARS
        assert len(span["attributes"]["gen_ai.tool.call.id"]) <= span_rules.NAME_CHARS


def test_a_collector_that_takes_connections_and_never_answers_costs_the_exit_the_export_timeout_at_most(capsys):
    import time

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the connections; nothing ever answers them
    try:
        tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": f"http://127.0.0.1:{silent.getsockname()[1]}"},
                                                    {}, agent="a", workspace="/w")
        with tracing.task_span({"id": "t-5", "title": "t", "claims": 1}):
            for index in range(2000):  # a few batches queued: the SDK's shutdown gave each the export timeout
                tracing.tool_call("read_file", str(index), "ok", 0.01)
        started = time.monotonic()
        tracing.close()
        took = time.monotonic() - started
    finally:
        silent.close()
    # The default stop_timeout is 10 s: an exit slower than that is a SIGKILL.
    assert took < telemetry.EXPORT_TIMEOUT + 3, f"close took {took:.1f} s"
    assert "span(s) dropped" in capsys.readouterr().out


def test_a_count_past_an_int64_in_a_tasks_file_costs_no_traceback_in_the_log(receiver, caplog):
    # The OTLP encoder logs "Failed to encode key ..." with a traceback (the agent's log: its stderr).
    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    with tracing.task_span({"id": "t-6", "title": "t", "claims": 1, "attempts": 10**30}):
        tracing.outcome("done")
    tracing.close()
    assert not [record for record in caplog.records if "encode" in record.getMessage()]
    [span] = receiver.named("task ")
    assert span["attributes"]["hermes.task.attempt"] == 1


def test_a_providers_token_counts_of_any_size_or_kind_cost_no_model_span(receiver, caplog, capsys):
    from hermes_sup.agents.fallback import Attempt

    tracing = telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a", workspace="/w")
    with tracing.task_span({"id": "t-7", "title": "t", "claims": 1}):
        for tokens_in in (10**30, "many", [1]):  # as a provider's answer said them
            tracing.model_call({"provider": "p", "model": "m", "outcome": "ok", "tokens_in": tokens_in,
                                "tokens_out": 2, "latency_s": 0.1}, Attempt("p", "m", "ok", 0.1))
        tracing.outcome("done")
    tracing.close()
    assert "failed" not in capsys.readouterr().err
    assert not [record for record in caplog.records if "encode" in record.getMessage()]
    assert [s["attributes"]["gen_ai.usage.input_tokens"] for s in receiver.named("chat ")] == [0, 0, 0]


HERMES_STAND_IN = ('#!/bin/sh\nwhile [ "$1" != "--usage-file" ]; do shift; done\n'
                   'printf \'{"completed": true, "failed": false, "model": "hermes-model", "provider": "openrouter", '
                   '"input_tokens": 1200, "output_tokens": 34, "api_calls": 3}\' > "$2"\necho answered\n')


def test_steps_and_hermes_and_command_runtimes_trace_what_hermes_sup_knows_of_them(tmp_path, receiver, up):
    """A task's steps give a tool-call span each, as the loop's; a Hermes run gives one model-call span
    of its usage file (its calls summed, timed as the run: marked so); a command runtime's attempt
    is all there is. The Hermes CLI is a stand-in writing the usage file a real run writes (its shape:
    test_runtime_hermes.py's run of the real CLI)."""
    program = tmp_path / "cli" / "bin" / "hermes"
    program.parent.mkdir(parents=True)
    program.write_text(HERMES_STAND_IN)
    program.chmod(0o755)
    (tmp_path / "hermes-home").mkdir()
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\n"
        "agents:\n  - {name: stepper, roles: [steps]}\n"
        f"  - {{name: herm, roles: [herm], runtime: hermes, profile: default, hermes_home: '{tmp_path}/hermes-home',"
        f" program: '{program}', capabilities: [network], sandbox: none}}\n"
        "  - {name: cmd, roles: [cmd], runtime: command, argv: [/bin/echo, 'did {task_id}'], sandbox: none}\n")
    board = Board(ws / "kanban")
    tasks = {"steps": board.add({"title": "two steps", "role": "steps", "max_attempts": 2, "steps": [
                 {"tool": "write_file", "args": {"path": "a.txt", "content": "1"}},
                 {"tool": "read_file", "args": {"path": "nowhere.txt"}}]}),
             "herm": board.add({"title": "ask hermes", "role": "herm"}),
             "cmd": board.add({"title": "run a cli", "role": "cmd"})}
    up(ws)
    for task in tasks.values():
        wait_until(lambda t=task: board.get(t["id"])["status"] in ("done", "failed"), timeout=60)
    tops = wait_until(lambda: len(receiver.named("task ")) == 4 and receiver.named("task "), timeout=30)
    top = {(s["attributes"]["hermes.agent"], s["attributes"]["hermes.task.claim"]): s for s in tops}

    def children(agent: str, claim: int = 1) -> list[dict[str, Any]]:
        parent = top[agent, claim]
        return sorted((s for s in receiver.agents_spans() if s["parent"] == parent["id"]), key=lambda s: s["start"])

    steps = children("stepper")
    assert [s["name"] for s in steps] == ["execute_tool write_file", "execute_tool read_file"]
    assert [s["attributes"]["gen_ai.tool.call.id"] for s in steps] == ["step-1", "step-2"]
    assert [s["attributes"]["hermes.tool.outcome"] for s in steps] == ["ok", "error"]
    assert steps[1]["attributes"]["error.type"] == "error" and steps[1]["status"] == 2  # STATUS_CODE_ERROR
    assert all(s["attributes"]["gen_ai.operation.name"] == "execute_tool" and s["attributes"]["hermes.tool.duration_s"]
               >= 0 and s["trace"] == top["stepper", 1]["trace"] for s in steps)
    # The second attempt takes step 1's result from the journal, runs step 2 again: its span alone.
    assert [s["attributes"]["gen_ai.tool.call.id"] for s in children("stepper", 2)] == ["step-2"]
    assert top["stepper", 2]["attributes"]["hermes.task.outcome"] == "failed"
    [run] = children("herm")
    attrs = run["attributes"]
    assert run["name"] == "chat hermes-model" and attrs["gen_ai.request.model"] == "hermes-model"
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (1200, 34)
    assert attrs["hermes.model_calls"] == 3 and attrs["hermes.usage.aggregate"] is True
    assert attrs["hermes.timing"] == "run" and attrs["hermes.provider"] == "hermes:default"
    assert top["herm", 1]["start"] <= run["start"] <= run["end"] <= top["herm", 1]["end"]
    assert "gen_ai.response.finish_reasons" not in attrs, "Hermes' usage file says none: none is made up"
    assert children("cmd") == [] and top["cmd", 1]["attributes"]["hermes.task.outcome"] == "done"


def test_a_step_done_by_an_earlier_attempt_is_not_run_again_and_gives_no_span(tmp_path, receiver):
    import threading

    from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
    from hermes_sup.agents.durable import call_done
    from hermes_sup.agents.steps import TURN, StepRun
    from hermes_sup.agents.tools import Toolbox, ToolContext
    from hermes_sup.kanban.journal import FileTaskJournal

    tracing = telemetry.install(telemetry.Telemetry.from_settings({"otlp_endpoint": receiver.url}, {}, agent="a",
                                                                  workspace="/w"))
    task = {"id": "t-8", "title": "t", "claims": 2, "history": [{"by": "cli"}], "steps": [
        {"tool": "write_file", "args": {"path": "a.txt", "content": "1"}},
        {"tool": "write_file", "args": {"path": "b.txt", "content": "2"}}]}
    journal = FileTaskJournal(tmp_path, task["id"])
    journal.append_tool_call(call_done(task["id"], TURN, "step-1", "write_file", "ok", "wrote a.txt", 0.1))
    ctx = ToolContext(scratch=tmp_path / "work", stop=threading.Event(), task=task, agent="a")
    try:
        with tracing.task_span(task):
            outcome = StepRun(task=task, workdir=tmp_path, ctx=ctx, toolbox=Toolbox(grants=("fs.read", "fs.write")),
                              agent="a", journal=journal).run()
            tracing.outcome(outcome.kind)
    finally:
        telemetry.install(telemetry.Telemetry())
        tracing.close()
    assert outcome.kind == "done" and not (tmp_path / "work" / "a.txt").exists()
    [step] = receiver.named("execute_tool ")
    assert step["attributes"]["gen_ai.tool.call.id"] == "step-2", "step 1's span is its own attempt's"
    assert step["parent"] == receiver.named("task ")[0]["id"]


def test_a_reload_starts_keeps_stops_and_restarts_the_supervisors_export(tmp_path, receiver, up):
    """The supervisor's own export follows hermes.yaml's `telemetry:` at each reload (the command and
    SIGHUP); a broken section is refused, the team and the export as they were. Each reload is an
    event of the supervisor's, exported when the export is on after it. Absence is shown by order:
    one exporter sends in order, so had the export gone on, the reload that turned it off would reach
    the collector before the last one, which names an agent added then."""
    from .conftest import supervisor_state

    with ScriptedLLM() as llm:
        ws = workspace(tmp_path, llm, None)
        config = ws / "hermes.yaml"
        plain = config.read_text()
        exporting = plain.replace("defaults:", f"telemetry: {{otlp_endpoint: '{receiver.url}'}}\ndefaults:")
        proc = up(ws)
        log = tmp_path / "up.log"
        wait_until(lambda: (supervisor_state(ws).get("agents") or {}).get("thinker", {}).get("pid"), timeout=30)

        def reloads(event: str = "reload") -> list[dict[str, Any]]:
            return [s for s in receiver.named(f"supervisor {event}") if s["name"] == f"supervisor {event}"]

        def reload(text: str) -> subprocess.CompletedProcess[str]:
            config.write_text(text)
            return subprocess.run([*CLI, "-w", str(ws), "reload"], capture_output=True, text=True, cwd=ROOT,
                                  timeout=60)

        assert reload(exporting).returncode == 0
        wait_until(lambda: len(reloads()) == 1, timeout=30)
        assert f"supervisor: telemetry: its events are exported to {receiver.url}/v1/traces" in log.read_text()
        pid = supervisor_state(ws)["agents"]["thinker"]["pid"]
        refused = reload(exporting.replace(receiver.url, "c:4318"))
        assert refused.returncode == 2 and "reload refused, the team is unchanged" in refused.stderr
        assert "'telemetry.otlp_endpoint' must be an http(s) URL" in refused.stderr, refused.stderr
        wait_until(lambda: reloads("reload_refused"), timeout=30)  # exported: the refusal kept the export on
        assert supervisor_state(ws)["agents"]["thinker"]["pid"] == pid
        config.write_text(plain)
        os.kill(proc.pid, 1)  # SIGHUP
        wait_until(lambda: "supervisor: telemetry: its events are no longer exported" in log.read_text(), timeout=30)
        assert reload(exporting + "  - name: helper\n").returncode == 0
        last = wait_until(lambda: [s for s in reloads() if "helper" in s["attributes"].get("hermes.note", "")],
                          timeout=30)
        assert len(reloads()) == 2, "the reload that stopped the export was not exported"
        assert last[0]["resource"]["service.name"] == "hermes-sup"
        logged = [json.loads(line) for line in (ws / "kanban" / "events.jsonl").read_text().splitlines()]
        assert [r["event"] for r in logged if r.get("event", "").startswith("reload")] == \
            ["reload", "reload_refused", "reload", "reload"]
