"""The auto strategy and tier chains: keys first, then local servers, then offline."""

from __future__ import annotations

import contextlib
import dataclasses
import http.server
import os
import threading
import time

import pytest
from hermes_sup.agents.routing import (
    AUTO_KEEP_FOUND,
    AUTO_KEEP_MISS,
    AUTO_PORTS_ENV,
    BUSY_MODEL,
    LOCAL_PORTS,
    auto_ports,
    chain_for,
    describe,
    keep_auto,
    probe_models,
    provider_configs,
    resolve_auto,
    task_tier,
)

from .conftest import init_workspace
from .llm_server import ScriptedLLM

NOTHING = lambda url: None  # noqa: E731 - a probe that finds no server
OURS = lambda port: {os.getuid()}  # noqa: E731 - every port has a server of ours


def test_keys_come_first_in_order():
    env = {"OPENAI_API_KEY": "o", "ANTHROPIC_API_KEY": "a"}
    found = resolve_auto(env, NOTHING)
    assert (found.kind, found.api_key_env) == ("anthropic", "ANTHROPIC_API_KEY")
    found = resolve_auto({"OPENROUTER_API_KEY": "sk-or-SECRET-123"}, NOTHING)
    assert found.kind == "openai" and found.base_url == "https://openrouter.ai/api/v1"
    # repr() hides api_key (repr=False), so it cannot tell: every field is looked at.
    fields = dataclasses.asdict(found)
    assert found.api_key is None and not any("SECRET" in str(value) for value in fields.values()), \
        "the config names the variable; the key itself stays in the environment"
    assert "SECRET" not in describe(found) and "$OPENROUTER_API_KEY" in describe(found)


def test_then_local_servers_on_their_usual_ports_then_offline():
    seen = []

    def probe(url):
        seen.append(url)
        return ["qwen2.5:7b"] if ":1234/" in url else None

    found = resolve_auto({}, probe, owners=OURS)
    assert seen == ["http://127.0.0.1:11434/v1", "http://127.0.0.1:1234/v1"]
    assert (found.name, found.model, found.base_url) == ("auto:lm-studio", "qwen2.5:7b", "http://127.0.0.1:1234/v1")
    assert "http://127.0.0.1:1234/v1" in describe(found) and "qwen2.5:7b" in describe(found)
    assert resolve_auto({}, NOTHING, owners=OURS) is None
    seen.clear()
    assert resolve_auto({}, probe, owners=lambda port: set()) is None and seen == [], "nothing listens: no probe"


def test_the_probe_reads_a_real_server_and_finds_none_on_a_closed_port():
    with ScriptedLLM() as llm:
        assert probe_models(f"{llm.url}/v1") == ["scripted"]
        found = resolve_auto({}, ports=((llm.port, "test"),))  # the real owner lookup: our own server
        assert found.base_url == f"{llm.url}/v1" and found.model == "scripted"
    assert probe_models(f"{llm.url}/v1", timeout=0.2) is None


class _Hostile(http.server.BaseHTTPRequestHandler):
    """A local "model server" whose list of models is an attack: nested past any recursion limit,
    endless, or trickled a byte at a time."""

    def do_GET(self) -> None:
        kind = self.server.kind  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if kind == "deep":
            body = b'{"data": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if kind == "endless":  # a length no one can allocate; the trickle has none: read to the end
            self.send_header("Content-Length", str(1 << 40))
        self.end_headers()
        with contextlib.suppress(OSError):
            while not self.server.done.is_set():  # type: ignore[attr-defined]
                self.wfile.write(b" " * (1 << 20) if kind == "endless" else b" ")
                self.wfile.flush()
                if kind == "trickle":
                    self.server.done.wait(0.05)  # type: ignore[attr-defined]

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("kind", ["deep", "endless", "trickle"])
def test_a_hostile_list_of_models_neither_crashes_nor_hangs_the_probe(kind):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    server.kind, server.done, server.daemon_threads = kind, threading.Event(), True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        result: list[object] = []
        prober = threading.Thread(target=lambda: result.append(probe_models(
            f"http://127.0.0.1:{server.server_address[1]}/v1")), daemon=True)
        prober.start()
        prober.join(30)
        assert not prober.is_alive(), "the probe hung"
        assert result == [None], "nothing usable answers there"
        assert time.monotonic() - started < 15
    finally:
        server.done.set()
        server.shutdown()
        server.server_close()


def test_the_ports_auto_probes_come_from_the_environment():
    assert auto_ports({}) == LOCAL_PORTS
    assert auto_ports({AUTO_PORTS_ENV: ""}) == ()
    assert auto_ports({AUTO_PORTS_ENV: "8080, 9999,x,0,70000"}) == ((8080, "llama.cpp"), (9999, "local"))
    seen = []
    assert resolve_auto({AUTO_PORTS_ENV: "9999"}, lambda url: seen.append(url), owners=OURS) is None
    assert seen == ["http://127.0.0.1:9999/v1"]


CONFIG = {
    "providers": {"cloud": {"kind": "anthropic", "model": "c", "api_key_env": "ANTHROPIC_API_KEY"},
                  "local": {"kind": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "l"}},
    "tiers": {"cheap": ["local", "cloud"], "standard": ["cloud", "auto"], "premium": ["cloud"]},
}


def test_tier_chains_skip_providers_without_their_key_and_resolve_auto():
    no_keys = chain_for("cheap", CONFIG, lambda: None, {})
    assert [p.name for p in no_keys] == ["local"]
    with_key = chain_for("standard", CONFIG, lambda: None, {"ANTHROPIC_API_KEY": "k"})
    assert [p.name for p in with_key] == ["cloud"]
    assert chain_for("premium", CONFIG, lambda: None, {}) == [], "offline: nothing can serve premium"


def test_task_tier_falls_back_to_the_agent_then_escalates_by_attempt():
    assert task_tier({"tier": "premium"}, "cheap") == "premium"
    assert task_tier({"tier": "auto", "attempts": 3}, "standard") == "standard"
    short = {"title": "rename a file", "body": ""}
    assert [task_tier({**short, "attempts": n}, "auto") for n in (1, 2, 3, 4)] == [
        "cheap", "standard", "premium", "premium"]
    long = {"title": "write a report", "body": "x" * 600, "attempts": 1}
    assert task_tier(long, "auto") == "standard" and task_tier({**long, "attempts": 2}, "auto") == "premium"


def test_a_busy_server_that_accepts_but_does_not_answer_is_found():
    # llama-server answers nothing to /v1/models for seconds while it evaluates a prompt: the
    # connection is accepted, so the server is there; its model is learnt on a later probe.
    with ScriptedLLM(slow_models=8.0) as llm:
        started = time.monotonic()
        found = resolve_auto({}, ports=((llm.port, "llama.cpp"),))  # the real owner lookup and probe
        waited = time.monotonic() - started
    assert found is not None and found.base_url == f"{llm.url}/v1"
    assert found.model == BUSY_MODEL and found.sized
    assert waited < 8.0, "the probe is bounded, the server's delay is not waited out"
    assert keep_auto(found) == AUTO_KEEP_MISS < AUTO_KEEP_FOUND, "its model is asked for again soon"


def test_a_miss_is_looked_at_again_sooner_than_a_find():
    found = dataclasses.replace(resolve_auto({}, lambda url: ["m"], owners=OURS), model="m")
    assert keep_auto(found) == AUTO_KEEP_FOUND
    assert keep_auto(None) == AUTO_KEEP_MISS < AUTO_KEEP_FOUND


def test_llama_servers_new_default_port_is_probed():
    assert (9931, "llama.cpp") in LOCAL_PORTS and (8080, "llama.cpp") in LOCAL_PORTS


def test_an_agent_learns_a_busy_servers_model_on_its_sooner_look(tmp_path, monkeypatch):
    from hermes_sup.agents.worker import Agent

    with ScriptedLLM(slow_models=8.0) as llm:
        monkeypatch.setenv(AUTO_PORTS_ENV, str(llm.port))
        agent = Agent({"name": "a"}, tmp_path, tmp_path / "runs" / "a")
        try:
            assert [p.config.model for p in agent.chain("standard")] == [BUSY_MODEL]
            llm.slow_models = 0.0  # the prompt is evaluated: the server answers again
            assert [p.config.model for p in agent.chain("standard")] == [BUSY_MODEL], "kept a while"
            when, found = agent._auto
            agent._auto = (when - AUTO_KEEP_MISS - 1, found)  # the short wait after a busy probe is over
            assert [p.config.model for p in agent.chain("standard")] == ["scripted"]
        finally:
            agent.board.close()


def test_a_local_server_waits_longer_for_an_answer_than_a_cloud_api():
    # llama-cpp-python on 2 cores answers one request at a time: with four agents a call waited in its
    # queue past 120 s and the task failed on "timed out" (make real-smoke), the server alive and busy.
    from hermes_sup.agents.routing import CLOUD_TIMEOUT, LOCAL_TIMEOUT, provider_configs

    configs = provider_configs({"providers": {
        "local": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:8080/v1"},
        "named": {"kind": "openai", "model": "m", "base_url": "http://localhost:11434/v1", "timeout": 30},
        "cloud": {"kind": "openai", "model": "m", "api_key_env": "OPENAI_API_KEY"},
        "remote": {"kind": "openai", "model": "m", "base_url": "https://api.example.invalid/v1"}}})
    assert LOCAL_TIMEOUT >= 600 > CLOUD_TIMEOUT == 120
    assert configs["local"].timeout == LOCAL_TIMEOUT
    assert configs["named"].timeout == 30, "a timeout hermes.yaml sets is kept"
    assert configs["cloud"].timeout == configs["remote"].timeout == CLOUD_TIMEOUT
    found = resolve_auto({}, lambda url: ["m"], ports=((8080, "llama.cpp"),), owners=OURS)
    assert found is not None and found.timeout == LOCAL_TIMEOUT, "auto's local server too"


def test_a_provider_of_kind_offline_is_no_model_and_no_crash(tmp_path, up):
    """`kind: offline` passed validation and then every agent crashed at start (KeyError 'offline')
    and crash-looped: it is a provider of no model, so its team runs steps tasks and nothing else."""

    from hermes_sup.kanban import Board

    from .conftest import wait_until

    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("providers:\n  none: {kind: offline}\n"
                                    "tiers: {cheap: [none], standard: [none], premium: [none]}\n"
                                    "agents:\n  - name: worker\n")
    assert provider_configs({"providers": {"none": {"kind": "offline"}}}) == {}
    board = Board(ws / "kanban")
    try:
        board.add({"id": "steps", "title": "write it", "steps": [{"tool": "write_file",
                                                                  "args": {"path": "out.txt", "content": "ok"}}]})
        up(ws)
        done = wait_until(lambda: board.get("steps")["status"] in ("done", "failed") and board.get("steps"),
                          timeout=60)
        assert done["status"] == "done", done
        assert "KeyError" not in (ws / "runs" / "worker" / "agent.log").read_text()
    finally:
        board.close()
