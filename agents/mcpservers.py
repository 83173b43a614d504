"""An agent's MCP tool servers (hermes.yaml `mcp_servers:`), through the official `mcp` SDK: each one
connected in a thread of its own (an asyncio loop that never holds up the heartbeat), its tools
offered under Hermes Agent's names (`mcp__<server>__<tool>`), a call bounded in time and output.

A stdio server is the agent's child, confined as the terminal is (agents/sandbox.py: its own folder
runs/<agent>/mcp/<server>/ writable, the agent's grants, read-only for a worktree's repository), its
stderr in the agent's log; one that dies is started again with backoff. A streamable HTTP server is
reached from the agent, its headers' values taken from the environment by name. A tool marked
`readOnlyHint` or `idempotentHint` may be repeated after a crash; any other is not (the resume rule).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .tools import Tool, ToolContext, ToolError

PREFIX = "mcp__"
NAME_MAX = 64
MAX_OUTPUT = 20_000
CONNECT_TIMEOUT = 30.0
CALL_TIMEOUT = 120.0
BACKOFF = (1.0, 2.0, 5.0, 10.0, 30.0)
# A server's tools go into every model call's definitions: more, or larger, and every call of the
# agent would fail (a provider's limit on tools, the context), whatever the task.
MAX_TOOLS = 100
MAX_SCHEMA_BYTES = 16 << 10


def tool_name(server: str, tool: str) -> str:
    """Hermes Agent's (and Claude Code's) name for an MCP tool, `mcp__<server>__<tool>`, made safe
    for every provider (pure): other characters become `_`; a name past 64 characters keeps its start
    and a hash of the whole."""
    def safe(part: str) -> str:
        return re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9_]", "_", part)).strip("_") or "unnamed"

    name = f"{PREFIX}{safe(server)}__{safe(tool)}"
    if len(name) <= NAME_MAX:
        return name
    import hashlib

    return name[:NAME_MAX - 9] + "_" + hashlib.sha256(name.encode()).hexdigest()[:8]


def wanted(tool: str, filters: Mapping[str, Any] | None) -> bool:
    """Whether a server's tool is offered under its `tools: {include, exclude}` (pure)."""
    filters = filters or {}
    if filters.get("include"):
        return tool in filters["include"]
    return tool not in (filters.get("exclude") or ())


def usable(server: str, listed: list[Any], filters: Mapping[str, Any] | None) -> tuple[list[Any], list[str]]:
    """The tools of a server's list the agent may offer, and why each other one is not (pure over the
    list): filtered by `tools: {include, exclude}`, their schemas checked and bounded, at most
    MAX_TOOLS, none whose name is another's once made safe."""
    from .tools import schema_problem

    kept: list[Any] = []
    names: set[str] = set()
    notes: list[str] = []
    for tool in listed:
        if not wanted(str(tool.name), filters):
            continue
        schema = tool.input_schema or {"type": "object", "properties": {}}
        name = tool_name(server, str(tool.name))
        problem = schema_problem(schema) or ("its definition is larger than 16 KiB"
                                             if len(json.dumps(schema, default=str)) > MAX_SCHEMA_BYTES else None)
        if problem:
            notes.append(f"tool {str(tool.name)[:80]!r} left out: {problem[:200]}")
        elif name in names:
            notes.append(f"tool {str(tool.name)[:80]!r} left out: its name is another's once made safe ({name})")
        elif len(kept) >= MAX_TOOLS:
            notes.append(f"{len(listed) - len(kept)} more tool(s) left out: at most {MAX_TOOLS} of a server")
            break
        else:
            kept.append(tool)
            names.add(name)
    return kept, notes


def text_of(result: Any) -> tuple[str, bool]:
    """A CallToolResult as the model is shown it, and whether it is an error (pure): text parts as
    they are, structured content as JSON, other parts named; at most MAX_OUTPUT characters."""
    parts = []
    for item in getattr(result, "content", None) or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(str(item.text))
        elif kind == "resource" and hasattr(getattr(item, "resource", None), "text"):
            parts.append(str(item.resource.text))
        else:
            parts.append(f"[{kind or 'content'} omitted]")
    structured = getattr(result, "structured_content", None)
    if structured is not None and not parts:
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) > MAX_OUTPUT:
        half = MAX_OUTPUT // 2
        text = f"{text[:half]}\n[... {len(text) - MAX_OUTPUT:,} characters cut ...]\n{text[-half:]}"
    return text, bool(getattr(result, "is_error", False))


@dataclass
class Server:
    """One server's state, as the agent's thread and the loop share it."""
    name: str
    spec: dict[str, Any]
    tools: list[Any] = field(default_factory=list)  # mcp.types.Tool
    session: Any = None
    error: str = ""
    notes: list[str] = field(default_factory=list)  # tools left out, and why
    kick: Any = None  # an asyncio.Event of the loop: set, the server is stopped and started again
    ready: threading.Event = field(default_factory=threading.Event)
    starts: int = 0


class Hub:
    """The agent's MCP servers, each kept connected by a task of one asyncio loop in a thread."""

    def __init__(self, servers: Mapping[str, dict[str, Any]], command: Callable[[str, dict[str, Any]],
                 tuple[list[str], dict[str, str]]], errlog: Any = None) -> None:
        # command(server name, spec) -> (argv, env): the stdio server's confined command line
        self.servers = {name: Server(name, dict(spec)) for name, spec in servers.items()
                        if spec.get("enabled", True)}
        self.command = command
        self.errlog = errlog
        self.loop = asyncio.new_event_loop()
        self.stopping = asyncio.Event()
        self.thread = threading.Thread(target=self._run, name="mcp", daemon=True)

    def start(self) -> Hub:
        if self.servers:
            if self.errlog is None:
                # The servers' stderr through a pipe this process drains into its own (the agent's
                # log), at most STDERR_BUDGET bytes a minute: a server writing without end fills no
                # disk, and its log rotates with the agent's.
                read, write = os.pipe()
                self.errlog = os.fdopen(write, "w")
                threading.Thread(target=drain, args=(read, sys.stderr), name="mcp-stderr", daemon=True).start()
            self.thread.start()
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._all())

    async def _all(self) -> None:
        self.stopping = asyncio.Event()
        tasks = [asyncio.create_task(self._keep(server)) for server in self.servers.values()]
        await self.stopping.wait()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep(self, server: Server) -> None:
        """Connect, list the tools, serve until the server goes; again, after a backoff."""
        while not self.stopping.is_set():
            server.starts += 1
            try:
                await self._serve(server)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:
                server.error = _describe(exc)
            server.session = None
            server.ready.set()  # a caller waiting for the first connection learns of the failure
            delay = BACKOFF[min(server.starts - 1, len(BACKOFF) - 1)]
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), timeout=delay)

    async def _serve(self, server: Server) -> None:
        from mcp import ClientSession

        async with self._transport(server) as (read, write), ClientSession(read, write) as session:
            await asyncio.wait_for(session.initialize(), timeout=float(server.spec.get("connect_timeout")
                                                                         or CONNECT_TIMEOUT))
            listed = await asyncio.wait_for(session.list_tools(), timeout=CONNECT_TIMEOUT)
            server.tools, server.notes = usable(server.name, list(listed.tools), server.spec.get("tools"))
            server.kick = asyncio.Event()
            server.session, server.error = session, ""
            server.ready.set()
            await self._until_closed(server)

    async def _until_closed(self, server: Server) -> None:
        """Until the agent stops, the server goes (a ping that fails, or its process gone), or a call
        it did not answer in time has it started again (a server stuck on one call is stuck on all)."""
        while not self.stopping.is_set():
            waits = [asyncio.ensure_future(self.stopping.wait()), asyncio.ensure_future(server.kick.wait())]
            await asyncio.wait(waits, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
            if self.stopping.is_set():
                return
            if server.kick.is_set():
                server.error = "stopped and started again: a call was not answered in time"
                return
            await asyncio.wait_for(server.session.send_ping(), timeout=CONNECT_TIMEOUT)

    def _transport(self, server: Server) -> Any:
        spec = server.spec
        if spec.get("url"):
            from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

            headers = {key: os.environ.get(var, "") for key, var in (spec.get("headers_env") or {}).items()}
            return streamable_http_client(str(spec["url"]), http_client=create_mcp_http_client(headers=headers))
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client

        argv, env = self.command(server.name, spec)
        return stdio_client(StdioServerParameters(command=argv[0], args=argv[1:], env=env), errlog=self.errlog)

    def wait_ready(self, timeout: float = CONNECT_TIMEOUT) -> None:
        """Wait until every server connected once or failed (for the first tool list)."""
        deadline = time.monotonic() + timeout
        for server in self.servers.values():
            server.ready.wait(max(0.0, deadline - time.monotonic()))

    def tools(self) -> dict[str, Tool]:
        """The tools of the servers connected now, as the agent's toolbox takes them."""
        found = {}
        for server in self.servers.values():
            for tool in server.tools:
                hints = tool.annotations
                safe = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
                name = tool_name(server.name, tool.name)
                found[name] = Tool(name, (tool.description or tool.title or tool.name)[:1024],
                                   self._handler(server.name, tool.name),
                                   dict(tool.input_schema or {"type": "object", "properties": {}}),
                                   capabilities=("network",) if server.spec.get("url") else ("shell",),
                                   idempotent=safe, toolset="mcp")
        return found

    def _handler(self, server_name: str, tool: str) -> Callable[[ToolContext, dict[str, Any]], str]:
        def call(ctx: ToolContext, args: dict[str, Any]) -> str:
            return self.call(server_name, tool, args, ctx.stop)
        return call

    def call(self, server_name: str, tool: str, args: dict[str, Any], stop: threading.Event) -> str:
        """One call, waited for in slices so that a stop request ends it (InterruptedError)."""
        server = self.servers[server_name]
        session = server.session
        if session is None:
            raise ToolError(f"the MCP server {server_name} is not connected: {server.error or 'starting'}; "
                            "it is started again with backoff")
        timeout = float(server.spec.get("timeout") or CALL_TIMEOUT)
        # Our deadline, not the SDK's: its timeout reads as an error of the server's.
        future = asyncio.run_coroutine_threadsafe(session.call_tool(tool, args), self.loop)
        deadline = time.monotonic() + timeout
        while True:
            try:
                result = future.result(timeout=0.2)
                break
            except concurrent.futures.TimeoutError:
                if stop.is_set():
                    future.cancel()
                    raise InterruptedError from None
                if time.monotonic() > deadline:
                    future.cancel()
                    if server.kick is not None:
                        server.session = None  # the next call is told, not sent to a server being replaced
                        self.loop.call_soon_threadsafe(server.kick.set)
                    raise ToolError(f"the MCP server {server_name} did not answer {tool} within {timeout:g} s"
                                    ) from None
            except concurrent.futures.CancelledError:
                raise ToolError(f"the MCP server {server_name} went away during {tool}") from None
            except Exception as exc:
                raise ToolError(f"the MCP server {server_name} failed {tool}: {_describe(exc)}") from None
        text, failed = text_of(result)
        if failed:
            raise ToolError(text or f"{tool} failed")
        return text

    def close(self) -> None:
        if self.thread.is_alive():
            self.loop.call_soon_threadsafe(self.stopping.set)
            self.thread.join(timeout=10)
        if self.errlog is not None and self.errlog is not sys.stderr:
            with contextlib.suppress(OSError):
                self.errlog.close()


STDERR_BUDGET = 64 << 10


def drain(fd: int, out: Any, budget: int = STDERR_BUDGET, window: float = 60.0) -> None:
    """Copy what the servers write on stderr to `out`, at most `budget` bytes a `window`; say how much
    more was left out, once a window. Ends when every writer has closed the pipe."""
    started, sent, dropped = time.monotonic(), 0, 0
    with contextlib.suppress(OSError):
        while data := os.read(fd, 1 << 16):
            now = time.monotonic()
            if now - started >= window:
                if dropped:
                    print(f"[mcp: {dropped:,} bytes of the servers' stderr left out]", file=out, flush=True)
                started, sent, dropped = now, 0, 0
            room = max(0, budget - sent)
            if room:
                with contextlib.suppress(OSError, ValueError):
                    out.write(data[:room].decode("utf-8", "replace"))
                    out.flush()
            sent += min(room, len(data))
            dropped += max(0, len(data) - room)
    if dropped:
        with contextlib.suppress(OSError, ValueError):
            print(f"[mcp: {dropped:,} bytes of the servers' stderr left out]", file=out, flush=True)
    os.close(fd)


def _describe(exc: BaseException) -> str:
    """An exception in words, an exception group's first leaf included (anyio's task groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"[:500] if str(exc) else type(exc).__name__


def named_files(argv: list[str]) -> list[str]:
    """The files a server's command line names by absolute path (its program, a script): shown to it
    read-only, as hermes.yaml names them on purpose; never a folder (grant those)."""
    return [arg for arg in argv if os.path.isabs(arg) and os.path.isfile(arg)]


def server_folder(workdir: Path, name: str) -> Path:
    """runs/<agent>/mcp/<server>/: where a stdio server runs and may write."""
    folder = workdir / "mcp" / name
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    return folder
