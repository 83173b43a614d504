"""A scripted LLM server on 127.0.0.1 for the tests: the real openai and anthropic SDKs are pointed at
it (base_url), so their HTTP stack runs for real. It speaks /v1/chat/completions, /v1/messages and
/v1/models, answers each request with the next scripted reply for that API, and records requests.

A reply is a dict: {"json": body} (200 with that body), {"status": 429, "headers": {...}, "json": ...},
{"delay": seconds, ...} (answer late, to trigger a client timeout), or {"close": True} (drop the
connection).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
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


def error_reply(status: int, message: str = "error", *, kind: str = "api_error",
                headers: dict[str, str] | None = None) -> dict[str, Any]:
    return {"status": status, "headers": headers or {},
            "json": {"type": "error", "error": {"type": kind, "message": message, "code": kind}}}


class ScriptedLLM:
    def __init__(self) -> None:
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
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                api = "anthropic" if self.path.rstrip("/").endswith("/messages") else "openai"
                with server._lock:
                    server.requests.append({"api": api, "path": self.path, "body": body,
                                            "headers": {k.lower(): v for k, v in self.headers.items()}})
                    reply = server.scripts[api].popleft() if server.scripts[api] else error_reply(
                        500, f"no scripted reply left for {api}")
                if reply.get("delay"):
                    time.sleep(reply["delay"])
                if reply.get("close"):
                    self.close_connection = True
                    self.connection.close()
                    return
                self._send(reply.get("status", 200), reply.get("json", {}), reply.get("headers", {}))

            def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
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
