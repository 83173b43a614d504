"""A scripted LLM server on 127.0.0.1 for the tests: the real openai and anthropic SDKs are pointed at
it (base_url), so their HTTP stack runs for real. It speaks /v1/chat/completions, /v1/messages and
/v1/models, answers each request with the next scripted reply for that API, and records requests.

A reply is a dict: {"json": body} (200 with that body), {"status": 429, "headers": {...}, "json": ...},
{"delay": seconds, ...} (answer late, to trigger a client timeout), or {"close": True} (drop the
connection). A request with "stream": true gets a 200 reply as server-sent events, cut the way the
real APIs cut them (text in small pieces, tool arguments in fragments, usage at the end);
{"stall": seconds} then pauses after the first event, to time out mid-stream, and {"drip": seconds}
between every two events, for a long answer; a stream the client cut is marked `aborted` in its request.
Two more per-reply options reproduce real servers' streams: {"cut": True} ends the stream with [DONE]
and no finish reason (llama-cpp-python, when another request arrives), and {"stream_error": {...}}
sends that error object as an event after the first chunk, then ends (llama.cpp's "Context size has
been exceeded"; anthropic's `event: error`). {"length": True} ends the answer, plain or streamed,
with finish reason "length" (anthropic: stop_reason "max_tokens"), as when it reached max_tokens.

`quirks` make the whole server behave like a real one nobody here wrote (see QUIRKS). `context`
(tokens) with `context_via` tells the model's context window as one real server does: "props"
(llama-server, GET /props), "show" (Ollama, POST /api/show) or "models" (vLLM, max_model_len in
/v1/models). `slow_models` (seconds) delays every answer to GET /v1/models, as llama-server's during
a prompt's evaluation.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def openai_reply(content: str | None = None, tool_calls: list[tuple[str, dict[str, Any]]] = (), *,
                 finish: str | None = None, prompt: int = 100, completion: int = 10, cached: int = 0,
                 model: str = "scripted-gpt") -> dict[str, Any]:
    calls = [{"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
             for i, (name, args) in enumerate(tool_calls)]
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"json": {
        "id": "chatcmpl-1", "object": "chat.completion", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish or ("tool_calls" if calls else "stop")}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": cached}},
    }}


def anthropic_reply(content: str | None = None, tool_calls: list[tuple[str, dict[str, Any]]] = (), *,
                    stop: str | None = None, prompt: int = 100, completion: int = 10, cache_read: int = 0,
                    model: str = "scripted-claude") -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": content}] if content else []
    blocks += [{"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": args}
               for i, (name, args) in enumerate(tool_calls)]
    return {"json": {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": blocks,
        "stop_reason": stop or ("tool_use" if tool_calls else "end_turn"), "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": completion, "cache_read_input_tokens": cache_read,
                  "cache_creation_input_tokens": 0},
    }}


def _pieces(text: str, size: int = 7) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def openai_events(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat.completion as the chunks of its stream."""
    base = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    choice = body["choices"][0]
    message = choice["message"]
    chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}]
    for piece in _pieces(message.get("content") or "") if message.get("content") else []:
        chunks.append({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
    for index, call in enumerate(message.get("tool_calls") or []):
        head = {"index": index, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}
        chunks.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [head]}, "finish_reason": None}]})
        for piece in _pieces(call["function"]["arguments"]):
            delta = {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
            chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]})
    chunks.append({**base, "choices": [], "usage": body["usage"]})
    return chunks


def anthropic_events(body: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A message as the (event, data) pairs of its stream."""
    usage = body["usage"]
    start = {**body, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [("message_start", {"type": "message_start", "message": start}), ("ping", {"type": "ping"})]
    for index, block in enumerate(body["content"]):
        if block["type"] == "text":
            events.append(("content_block_start", {"type": "content_block_start", "index": index,
                                                   "content_block": {"type": "text", "text": ""}}))
            events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "text_delta", "text": piece}})
                       for piece in _pieces(block["text"])]
        else:
            events.append(("content_block_start", {"type": "content_block_start", "index": index, "content_block": {
                "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}))
            events += [("content_block_delta", {"type": "content_block_delta", "index": index,
                                                "delta": {"type": "input_json_delta", "partial_json": piece}})
                       for piece in _pieces(block.get("raw_input") or json.dumps(block["input"]))]
        events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(("message_delta", {"type": "message_delta", "delta": {"stop_reason": body["stop_reason"],
                   "stop_sequence": None}, "usage": {"output_tokens": usage["output_tokens"]}}))
    events.append(("message_stop", {"type": "message_stop"}))
    return events


def error_reply(status: int, message: str = "error", *, kind: str = "api_error",
                headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": status, "headers": headers or {},
            "json": {"type": "error", "error": {"type": kind, "message": message, "code": kind}}}


QUIRKS = {
    # llama-cpp-python: a message whose content is null fails its request validation, as a 500.
    "null_content_500": "a message with null content is answered with HTTP 500",
    # llama.cpp / llama-cpp-python without tool_choice: the tools never reach the model, which answers
    # in prose (naming the tool it would have called).
    "tools_need_choice": "tools are dropped unless the request sets tool_choice",
    # vLLM started without --enable-auto-tool-choice: a request naming tool_choice is refused.
    "rejects_tool_choice": "a request with tool_choice is answered with HTTP 400",
    # llama-server with a chat template that has no tools: dropped whatever the request says.
    "tools_ignored": "tools are always dropped",
    # Many local servers ignore stream_options.include_usage.
    "no_stream_usage": "streams carry no usage",
    # A real server has nothing outside /v1: a base_url without it gets 404s.
    "v1_only": "a request outside /v1/ (a POST, or a GET of the model list) is answered with HTTP 404",
    # llama-cpp-python: a model's first answer is often nothing at all (content "", finish reason stop).
    "empty_first": "the first chat request is answered with an empty message, before any script",
}


def cut_at_max_tokens(api: str, reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as a server sends it when the answer reached max_tokens: complete, but cut short."""
    body = json.loads(json.dumps(reply["json"]))
    if api == "openai":
        body["choices"][0]["finish_reason"] = "length"
    else:
        body["stop_reason"] = "max_tokens"
    return {**reply, "json": body}


def ignored_tools(reply: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI reply as a model that never saw the tools gives it: prose naming the tools."""
    body = json.loads(json.dumps(reply.get("json") or {}))
    for choice in body.get("choices") or []:
        message = choice.get("message") or {}
        calls = message.pop("tool_calls", None)
        if calls:
            names = ", ".join(call["function"]["name"] for call in calls)
            message["content"] = f"To do this I would use the {names} tool with the right arguments."
            choice["finish_reason"] = "stop"
    return {**reply, "json": body}


def null_content(body: dict[str, Any]) -> int | None:
    """The index of the first message with null content in a request, or None."""
    for index, message in enumerate(body.get("messages") or []):
        if isinstance(message, dict) and "content" in message and message["content"] is None:
            return index
    return None


class ScriptedLLM:
    """`responder(api, body) -> reply`, when given, answers every request instead of the scripts (a
    team working many tasks at once needs answers by content, not by order). `port` 0 is any free
    port; a given one raises OSError if it is taken."""

    def __init__(self, responder: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
                 quirks: tuple[str, ...] = (), *, port: int = 0, context: int | None = None,
                 context_via: str = "props", slow_models: float = 0.0) -> None:
        unknown = set(quirks) - set(QUIRKS)
        if unknown:
            raise ValueError(f"unknown quirks: {sorted(unknown)}")
        if context_via not in ("props", "show", "models"):
            raise ValueError(f"unknown context_via: {context_via!r}")
        self.context, self.context_via, self.slow_models = context, context_via, slow_models
        self.probes: list[str] = []  # the paths of GETs and of /api/show POSTs, in order
        self.quirks = frozenset(quirks)
        self.responder = responder
        self.scripts: dict[str, deque[dict[str, Any]]] = {"openai": deque(), "anthropic": deque()}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes; without TCP_NODELAY the second waits for the
            # client's delayed ACK, adding 40 ms to every answer.
            disable_nagle_algorithm = True

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with server._lock:
                    server.probes.append(self.path)
                if self.path.rstrip("/").endswith("/models") and not (
                        "v1_only" in server.quirks and not self.path.startswith("/v1/")):
                    if server.slow_models:
                        time.sleep(server.slow_models)
                    model: dict[str, Any] = {"id": "scripted", "object": "model"}
                    if server.context and server.context_via == "models":
                        model["max_model_len"] = server.context
                    with contextlib.suppress(OSError):  # a client that gave up waiting
                        self._send(200, {"object": "list", "data": [model]})
                elif self.path == "/props" and server.context and server.context_via == "props":
                    self._send(200, {"default_generation_settings": {"n_ctx": server.context, "temperature": 0.8},
                                     "total_slots": 1, "chat_template": "{{ messages }}"})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path == "/api/show":
                    with server._lock:
                        server.probes.append(self.path)
                    if server.context and server.context_via == "show":
                        self._send(200, {"details": {"family": "llama"}, "parameters": "stop \"<|im_end|>\"",
                                         "model_info": {"general.architecture": "llama",
                                                        "llama.context_length": server.context}})
                    else:
                        self._send(404, {"error": "not found"})
                    return
                api = "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"
                record = {"api": api, "path": self.path, "body": body,
                          "headers": {k.lower(): v for k, v in self.headers.items()}}
                rejected = self._rejected(api, body)
                with server._lock:
                    server.requests.append(record)
                    if rejected is not None:
                        reply = rejected
                    elif "empty_first" in server.quirks and sum(r["api"] == api for r in server.requests) == 1:
                        reply = openai_reply("", completion=0) if api == "openai" else anthropic_reply("")
                    elif server.responder is not None:
                        reply = None
                    else:
                        reply = server.scripts[api].popleft() if server.scripts[api] else error_reply(
                            500, f"no scripted reply left for {api}")
                if reply is None:
                    try:
                        reply = server.responder(api, body)
                    except Exception as exc:  # a bug in a test's responder is an answer the test sees
                        reply = error_reply(500, f"responder failed: {exc!r}")
                if api == "openai" and body.get("tools") and ("tools_ignored" in server.quirks or (
                        "tools_need_choice" in server.quirks and not body.get("tool_choice"))):
                    record["tools_dropped"] = True
                    reply = ignored_tools(reply)
                if reply.get("delay"):
                    time.sleep(reply["delay"])
                if reply.get("close"):
                    self.close_connection = True
                    self.connection.close()
                    return
                # {"echo_key": True, ...}: every "{key}" in the body becomes the key the request
                # carried, as a server that quotes a bad key back does.
                if reply.get("echo_key"):
                    sent = self.headers.get("x-api-key") or (self.headers.get("authorization") or "").removeprefix(
                        "Bearer ")
                    reply = {**reply, "json": json.loads(json.dumps(reply.get("json", {})).replace(
                        "{key}", json.dumps(sent)[1:-1]))}
                if reply.get("length"):
                    reply = cut_at_max_tokens(api, reply)
                if body.get("stream") and reply.get("status", 200) == 200:
                    self._stream(api, reply, record)
                    return
                self._send(reply.get("status", 200), reply.get("json", {}), reply.get("headers", {}))

            def _rejected(self, api: str, body: dict[str, Any]) -> dict[str, Any] | None:
                """The error a real server answers this request with before any model runs, or None."""
                if "v1_only" in server.quirks and not self.path.startswith("/v1/"):
                    return {"status": 404, "json": {"detail": "Not Found"}}
                if "rejects_tool_choice" in server.quirks and body.get("tool_choice"):
                    return error_reply(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                            "--tool-call-parser to be set", kind="BadRequestError")
                index = null_content(body) if "null_content_500" in server.quirks else None
                if index is not None:
                    return error_reply(500, f"1 validation error for CreateChatCompletionRequest\nmessages.{index}"
                                            ".content\n  Input should be a valid string [type=string_type, "
                                            "input_value=None]", kind="internal_server_error")
                return None

            def _stream(self, api: str, reply: dict[str, Any], record: dict[str, Any]) -> None:
                if api == "openai":
                    chunks = openai_events(reply["json"])
                    if "no_stream_usage" in server.quirks or reply.get("cut"):
                        chunks = [chunk for chunk in chunks if not chunk.get("usage")]
                    if reply.get("cut"):
                        chunks = [chunk for chunk in chunks if not chunk["choices"][0].get("finish_reason")]
                    frames = [f"data: {json.dumps(chunk)}\n\n" for chunk in chunks]
                    if reply.get("stream_error"):
                        frames = [*frames[:2], f"data: {json.dumps({'error': reply['stream_error']})}\n\n"]
                    else:
                        frames.append("data: [DONE]\n\n")
                else:
                    frames = [f"event: {event}\ndata: {json.dumps(data)}\n\n"
                              for event, data in anthropic_events(reply["json"])]
                    if reply.get("cut"):
                        frames = [frame for frame in frames if not frame.startswith(("event: message_delta",
                                                                                    "event: message_stop"))]
                    if reply.get("stream_error"):
                        error = {"type": "error", "error": reply["stream_error"]}
                        frames = [*frames[:3], f"event: error\ndata: {json.dumps(error)}\n\n"]
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                for index, frame in enumerate(frames):
                    data = frame.encode()
                    try:
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                        self.wfile.flush()
                    except OSError:
                        record["aborted"] = True
                        return  # the client gave up (a timeout, or a stop)
                    if index == 0 and reply.get("stall"):
                        time.sleep(reply["stall"])
                    if reply.get("drip"):
                        time.sleep(reply["drip"])
                with contextlib.suppress(OSError):
                    self.wfile.write(b"0\r\n\r\n")

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                # A client that went away mid-answer (a killed agent, a timeout) is expected here.
                if not isinstance(sys.exc_info()[1], ConnectionError):
                    super().handle_error(request, client_address)

        self.httpd = Server(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def script(self, api: str, *replies: dict[str, Any]) -> None:
        with self._lock:
            self.scripts[api].extend(replies)

    def __enter__(self) -> ScriptedLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
