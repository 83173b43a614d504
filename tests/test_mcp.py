"""MCP tool servers (agents/mcpservers.py) against real servers nobody here wrote: mcp-server-time and
mcp-server-git from PyPI over stdio, confined as the terminal is, and one served over streamable HTTP
on 127.0.0.1 by the SDK's own server classes; then hermes.yaml's checks and an agent end to end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.agents import mcpservers
from hermes_sup.agents.mcpservers import Hub, text_of, tool_name, wanted
from hermes_sup.agents.terminal import clean_env, command_for
from hermes_sup.agents.tools import ToolError
from hermes_sup.kanban import Board
from hermes_sup.supervisor.config.workspace import ConfigError, load_config

from .conftest import init_workspace, running, wait_until

BIN = Path(sys.executable).parent


def confined(tmp_path: Path, settings: dict | None = None):
    """The stdio command maker an agent uses: confined, in the server's own folder."""
    def command(name: str, spec: dict) -> tuple[list[str], dict[str, str]]:
        folder = mcpservers.server_folder(tmp_path / "agent", name)
        env = clean_env(os.environ)
        env.update({k: os.environ.get(v, "") for k, v in (spec.get("env_from") or {}).items()})
        argv = [spec["command"], *spec.get("args", [])]
        return command_for({"sandbox": "auto", **(settings or {})}, ("shell",), tmp_path / "ws", folder, folder,
                           env, argv)
    return command


@pytest.fixture
def hubs():
    made: list[Hub] = []
    yield made
    for hub in made:
        hub.close()


def started(hubs: list[Hub], servers: dict, command) -> Hub:
    hub = Hub(servers, command).start()
    hubs.append(hub)
    hub.wait_ready(60)
    return hub


def test_names_filters_and_results_are_hermes_agents():
    assert tool_name("time", "get_current_time") == "mcp__time__get_current_time"
    assert tool_name("my-git", "git.status") == "mcp__my_git__git_status"
    long = tool_name("s", "x" * 100)
    assert len(long) == 64 and long.startswith("mcp__s__xxx"), "cut, with a hash of the whole"
    assert wanted("a", {"include": ["a"]}) and not wanted("b", {"include": ["a"]})
    assert not wanted("a", {"exclude": ["a"]}) and wanted("b", {"exclude": ["a"]})

    class Part:
        def __init__(self, kind: str, text: str = "") -> None:
            self.type, self.text = kind, text

    class Result:
        def __init__(self, *parts: Part) -> None:
            self.content, self.structured_content, self.is_error = list(parts), None, True

    assert text_of(Result(Part("text", "one"), Part("image"))) == ("one\n[image omitted]", True)
    assert len(text_of(Result(Part("text", "y" * 50_000)))[0]) < 20_100


def test_mcp_server_time_over_stdio_confined(tmp_path, hubs):
    hub = started(hubs, {"time": {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}},
                  confined(tmp_path))
    tools = hub.tools()
    assert {"mcp__time__get_current_time", "mcp__time__convert_time"} <= set(tools), hub.servers["time"].error
    now = json.loads(tools["mcp__time__get_current_time"].handler(_ctx(), {"timezone": "UTC"}))
    assert now["timezone"] == "UTC"
    with pytest.raises(ToolError, match="Nowhere/Atlantis"):
        tools["mcp__time__get_current_time"].handler(_ctx(), {"timezone": "Nowhere/Atlantis"})
    assert tools["mcp__time__get_current_time"].capabilities == ("shell",), "a stdio server runs programs"
    from hermes_sup.agents.sandbox import how

    wrapper = {"bubblewrap": "bwrap", "landlock": "hermes_sup.agents.confine"}[how("auto")[0]]
    wrapped = [p for p in running("mcp-server-time") if wrapper in " ".join(_cmdline(p))]
    assert wrapped, "the server runs confined, as the terminal's commands do"


def test_mcp_server_git_reads_a_granted_repository_and_idempotence_comes_from_its_hints(tmp_path, hubs):
    repo = tmp_path / "app"
    repo.mkdir()
    ident = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@x"}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first commit here"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env={**os.environ, **ident})
    settings = {"folders": {"app": {"path": str(repo), "mode": "ro"}}}
    hub = started(hubs, {"git": {"command": str(BIN / "mcp-server-git"), "args": ["--repository", str(repo)]}},
                  confined(tmp_path, settings))
    tools = hub.tools()
    log = tools["mcp__git__git_log"].handler(_ctx(), {"repo_path": str(repo)})
    assert "first commit here" in log
    hinted = {t.name: t.annotations for t in hub.servers["git"].tools}
    for name, hints in hinted.items():
        safe = bool(hints and (hints.read_only_hint or hints.idempotent_hint))
        assert tools[tool_name("git", name)].idempotent is safe, name
    assert tools["mcp__git__git_log"].idempotent and not tools["mcp__git__git_commit"].idempotent


def _ctx():
    from hermes_sup.agents.tools import ToolContext

    return ToolContext(scratch=Path("/nonexistent"), stop=threading.Event())


def _cmdline(pid: int) -> list[str]:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    return []


def test_a_stdio_server_that_dies_is_started_again(tmp_path, hubs):
    hub = started(hubs, {"time": {"command": str(BIN / "mcp-server-time")}}, lambda name, spec: (
        [spec["command"]], clean_env(os.environ)))
    first = hub.servers["time"].starts
    for pid in running(str(BIN / "mcp-server-time")):
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: hub.servers["time"].starts > first and hub.servers["time"].session is not None, timeout=60)
    assert "timezone" in hub.tools()["mcp__time__get_current_time"].handler(_ctx(), {"timezone": "UTC"})


# -- streamable HTTP, served by the SDK's own server classes ------------------------------------------

@pytest.fixture
def http_server():
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse

    server = MCPServer("numbers")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    released = threading.Event()  # set at teardown: a call still sleeping would hold the server's exit

    @server.tool()
    def slow(seconds: float) -> str:
        """Take a while."""
        released.wait(seconds)
        return "slept"

    app = server.streamable_http_app()

    async def guarded(scope, receive, send):  # the header our config sends by variable name
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != b"Bearer s3cret":
            await PlainTextResponse("no", status_code=401)(scope, receive, send)
            return
        await app(scope, receive, send)

    del Request
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    web = uvicorn.Server(config)
    thread = threading.Thread(target=web.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait_until(lambda: web.started, timeout=30)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    released.set()
    web.should_exit = True
    thread.join(timeout=10)


def test_a_streamable_http_server_with_a_header_from_the_environment(http_server, hubs, monkeypatch):
    monkeypatch.setenv("NUMBERS_AUTH", "Bearer s3cret")
    hub = started(hubs, {"numbers": {"url": http_server, "headers_env": {"Authorization": "NUMBERS_AUTH"},
                                     "timeout": 2}}, confined(Path("/tmp")))
    tools = hub.tools()
    assert tools["mcp__numbers__add"].handler(_ctx(), {"a": 2, "b": 3}) == "5"
    assert tools["mcp__numbers__add"].idempotent and not tools["mcp__numbers__slow"].idempotent
    assert tools["mcp__numbers__add"].capabilities == ("network",)
    started_at = time.monotonic()
    with pytest.raises(ToolError, match="did not answer slow within 2 s"):
        tools["mcp__numbers__slow"].handler(_ctx(), {"seconds": 30})
    assert time.monotonic() - started_at < 15
    # A server stuck on a call is stuck on all: it is connected again, and answers.
    wait_until(lambda: hub.servers["numbers"].starts == 2 and hub.servers["numbers"].session is not None, timeout=30)
    assert tools["mcp__numbers__add"].handler(_ctx(), {"a": 1, "b": 1}) == "2"
    ctx = _ctx()
    threading.Timer(0.3, ctx.stop.set).start()
    started_at = time.monotonic()
    with pytest.raises(InterruptedError):
        tools["mcp__numbers__slow"].handler(ctx, {"seconds": 30})
    assert time.monotonic() - started_at < 5, "a stop request ends the call at once"


def test_without_its_header_a_server_is_not_connected_and_says_so(http_server, hubs, monkeypatch):
    monkeypatch.delenv("NUMBERS_AUTH", raising=False)
    hub = started(hubs, {"numbers": {"url": http_server, "headers_env": {"Authorization": "NUMBERS_AUTH"}}},
                  confined(Path("/tmp")))
    assert hub.tools() == {} and hub.servers["numbers"].error
    with pytest.raises(ToolError, match="not connected"):
        hub.call("numbers", "add", {"a": 1, "b": 1}, threading.Event())


# -- hermes.yaml --------------------------------------------------------------------------------------

@pytest.mark.parametrize("servers, agent, message", [
    ("  t: {command: x, url: 'http://127.0.0.1:1/mcp'}\n", "", "give either command"),
    ("  t: {args: [a]}\n", "", "give either command"),
    ("  t: {command: x, env: {GITHUB_TOKEN: ghp_abc}}\n", "", "env GITHUB_TOKEN looks like a secret"),
    ("  t: {command: x, env: {DB_PASS: hunter2}}\n", "", "env DB_PASS looks like a secret"),
    ("  t: {command: x, env: {DATABASE_URL: 'postgres://u:SECRET4@h/db'}}\n", "", "env DATABASE_URL looks like"),
    ("  t: {command: x, args: [--api-key, sk-live-0123456789]}\n", "", "argument --api-key looks like a secret"),
    ("  t: {command: x, args: ['--token=abc']}\n", "", "argument --token looks like a secret"),
    ("  t: {url: 'http://user:SECRET5@h/mcp'}\n", "", "url .a user or password in it. looks like"),
    ("  t: {url: 'http://h/mcp?token=SECRET6'}\n", "", "url .a secret in its query. looks like"),
    ("  my-git: {command: x}\n  my_git: {command: y}\n", "", "my-git and my_git would give their tools the same"),
    ("  t: {url: 'http://127.0.0.1:1/mcp', headers: {Authorization: x}}\n", "", "headers_env"),
    ("  t: {url: 'ftp://x/mcp'}\n", "", r"must be an http\(s\) URL"),
    ("  t: {command: x, env_from: {TOKEN: 'not a name'}}\n", "", "names of environment variables"),
    ("  t: {command: x, tools: {only: [a]}}\n", "", "MCP server t: unknown key 'tools.only'"),
    ("  T!: {command: x}\n", "", "MCP server name"),
    ("  t: {command: x}\n", "    mcp_servers: [other]\n", "no MCP server named 'other'"),
])
def test_bad_mcp_servers_are_refused_with_file_and_line(tmp_path, servers, agent, message):
    path = tmp_path / "hermes.yaml"
    path.write_text(f"mcp_servers:\n{servers}agents:\n  - name: a\n{agent}")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_plain_settings_are_not_taken_for_secrets(tmp_path):
    path = tmp_path / "hermes.yaml"
    path.write_text("mcp_servers:\n  t: {command: x, args: [--repository, /srv/app, --path, /tmp], "
                    "env: {PATH: /usr/bin, PYTHONPATH: /opt/lib, LOG_LEVEL: info}, env_from: {API_KEY: MY_KEY}}\n"
                    "  w: {url: 'http://127.0.0.1:8931/mcp?session_limit=2', headers_env: {Authorization: TOKEN_VAR}}\n"
                    "agents:\n  - name: a\n    mcp_servers: [t, w]\n")
    assert load_config(path)["mcp_servers"]["t"]["env_from"] == {"API_KEY": "MY_KEY"}


# -- end to end -----------------------------------------------------------------------------------------

def test_an_agent_calls_an_mcp_tool_from_a_task_and_its_log_shows_the_call(tmp_path, up):
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        f"mcp_servers:\n  time: {{command: {BIN / 'mcp-server-time'}, args: [--local-timezone, UTC]}}\n"
        "defaults:\n  stop_timeout: 5\n  heartbeat_timeout: 30\n"
        "agents:\n  - name: clock\n    capabilities: [fs.read, fs.write, shell]\n    mcp_servers: [time]\n")
    board = Board(ws / "kanban")
    task = board.add({"title": "what time is it", "steps": [
        {"tool": "mcp__time__get_current_time", "args": {"timezone": "UTC"}}]})
    up(ws)
    done = wait_until(lambda: (d := board.get(task["id"]))["status"] in ("done", "failed", "blocked") and d,
                      timeout=90)
    assert done["status"] == "done", done.get("error")
    assert json.loads(done["result"]["steps"][0])["timezone"] == "UTC"
    log = (ws / "runs" / "clock" / "agent.log").read_text()
    assert "mcp time: 2 tool(s)" in log
    calls = [json.loads(line) for line in (ws / "runs" / "clock" / "tool_calls.jsonl").read_text().splitlines()]
    assert [c["tool"] for c in calls if c["task"] == task["id"]][-1] == "mcp__time__get_current_time"


def test_doctor_starts_each_server_and_lists_its_tools(tmp_path):
    from .test_auto_owner import doctor

    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        f"mcp_servers:\n  time: {{command: {BIN / 'mcp-server-time'}}}\n  broken: {{command: /nonexistent/server}}\n"
        "  idle: {command: x, enabled: false}\n"
        "agents:\n  - name: a\n    mcp_servers: [time]\n")
    checks = doctor(ws)
    assert checks["mcp time"][0]["level"] == "ok", checks["mcp time"]
    assert "2 tool(s): get_current_time, convert_time; granted to a" in checks["mcp time"][0]["detail"]
    assert checks["mcp broken"][0]["level"] == "error" and "granted to no agent" in checks["mcp broken"][0]["detail"]
    assert checks["mcp idle"][0]["level"] == "info"


def test_a_servers_tools_are_checked_bounded_and_never_collide():
    # An attacker's review: a bad schema failed every attempt of the task (KeyError, TypeError out of
    # the check), 5,000 tools went into every model call, and two names made one.
    from types import SimpleNamespace

    from hermes_sup.agents.mcpservers import MAX_TOOLS, usable
    from hermes_sup.agents.tools import Refused, Tool, Toolbox

    def tool(name: str, schema: dict | None = None):
        return SimpleNamespace(name=name, input_schema=schema or {"type": "object", "properties": {}})

    listed = [tool("ok"), tool("bogus", {"type": "object", "properties": {"x": {"type": "bogus"}}}),
              tool("huge", {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}),
              tool("a.b"), tool("a_b")] + [tool(f"t{i}") for i in range(200)]
    kept, notes = usable("evil", listed, None)
    assert [t.name for t in kept][:2] == ["ok", "a.b"] and len(kept) == MAX_TOOLS
    assert any("'bogus' left out" in n for n in notes) and any("'huge' left out: its definition is larger" in n
                                                               for n in notes)
    assert any("'a_b' left out: its name is another's" in n for n in notes)
    assert any("more tool(s) left out: at most 100" in n for n in notes)
    odd = Tool("mcp__evil__odd", "odd", lambda ctx, args: "ran",
               {"type": "object", "properties": {"x": {"type": "integer", "minimum": "zero"}}})
    box = Toolbox(grants=(), extra={odd.name: odd})
    with pytest.raises(Refused, match="own definition cannot check these arguments"):
        box.check(odd.name, {"x": 1})


def test_a_servers_stderr_reaches_the_log_within_a_budget():
    # An attacker's review: a server writing to stderr without end filled 2.4 GB of the agent's
    # log in 8 s (it kept the log's descriptor across rotation).
    import io

    from hermes_sup.agents.mcpservers import drain

    read, write = os.pipe()
    out = io.StringIO()
    reader = threading.Thread(target=drain, args=(read, out, 1000))
    reader.start()
    with os.fdopen(write, "wb") as pipe:
        for _ in range(100):
            pipe.write(b"x" * 1000 + b"\n")
    reader.join(timeout=30)
    text = out.getvalue()
    assert len(text) < 1100 and "[mcp: 99,100 bytes of the servers' stderr left out]" in text


def test_doctor_gives_a_server_neither_the_boards_dsn_nor_a_providers_key(tmp_path):
    # An attacker's review: doctor's servers got the board database's DSN (its password) in their
    # environment. This server names its one tool by what it was given.
    from .test_auto_owner import doctor

    script = tmp_path / "envserver.py"
    script.write_text("import os\nfrom mcp.server.mcpserver import MCPServer\nserver = MCPServer('env')\n"
                      "leaked = [n for n in ('HERMES_SUP_PG_DSN', 'TEAM_KEY') if os.environ.get(n)]\n"
                      "@server.tool(name='leaked_' + ('_'.join(leaked) or 'nothing'))\n"
                      "def probe() -> str:\n    return 'x'\nserver.run()\n")
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text(
        f"providers:\n  p: {{kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m, api_key_env: TEAM_KEY}}\n"
        f"mcp_servers:\n  env: {{command: {sys.executable}, args: [{script}]}}\nagents:\n  - name: a\n")
    checks = doctor(ws, HERMES_SUP_PG_DSN="postgresql://u:pw@127.0.0.1/db", TEAM_KEY="sk-team-0123456789")
    assert "1 tool(s): leaked_nothing" in checks["mcp env"][0]["detail"], checks["mcp env"]
