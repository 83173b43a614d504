"""API keys never reach a file, a log or the command line's output: not even when a provider echoes
the key it was sent back in an error body, and whether the key came from the environment or from
the workspace's .env."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
from pathlib import Path

import pytest
from hermes_sup.agents.fallback import complete_with_fallback
from hermes_sup.agents.keys import KeyFile
from hermes_sup.agents.notify import ORPHANED
from hermes_sup.agents.providers import OpenAIProvider, ProviderConfig, ProviderError
from hermes_sup.kanban import Board, redact
from hermes_sup.kanban.fsio import AppendLog, write_atomic, write_json_atomic
from hermes_sup.kanban.journal import Journal

from .conftest import CLI, init_workspace, wait_until
from .llm_server import ScriptedLLM, error_reply

ROOT = Path(__file__).resolve().parent.parent
FILE_KEY = "sk-file-0123456789abcdef"      # from the workspace's .env
SHELL_KEY = "sk-shell-fedcba9876543210"    # from the environment `up` runs in
MESSAGES = [{"role": "user", "content": "hello"}]


def echo(status: int) -> dict:
    """An error whose body quotes the key the request carried, as some providers do with a bad key."""
    return {**error_reply(status, "Incorrect API key provided: {key}. You can find your API key at ...",
                          kind="invalid_api_key"), "echo_key": True}


def test_redact_replaces_every_key_in_every_spelling_and_leaves_short_values_alone():
    text = 'key sk-abcdefgh1 and "sk-abcdefgh12" and {"k": "sk-q\\"uote\\\\d1"}'
    out = redact.redact(text, ["sk-abcdefgh1", "sk-abcdefgh12", 'sk-q"uote\\d1', "short"])
    assert out == 'key [redacted] and "[redacted]" and {"k": "[redacted]"}'
    assert redact.redact("a ok word", ["ok", "", "a"]) == "a ok word", "too short to be a key"


def test_what_the_process_knows_is_scrubbed_from_journals_task_documents_and_the_event_log(tmp_path):
    assert redact.scrub(f"x {FILE_KEY}") == f"x {FILE_KEY}", "nothing known yet (conftest: hermetic)"
    env = {"MY_KEY": SHELL_KEY}
    (tmp_path / ".env").write_text(f"OTHER_KEY={FILE_KEY}\n")
    KeyFile(tmp_path / ".env", {"MY_KEY", "OTHER_KEY"}, env).refresh()
    journal = Journal(tmp_path / "t.jsonl")
    journal.append({"error": f"bad key {SHELL_KEY}", "text": FILE_KEY})
    journal.close()
    log = AppendLog(tmp_path / "events.jsonl")
    log.append({"reason": f"failed: {FILE_KEY}"})
    log.close()
    write_json_atomic(tmp_path / "task.json", {"error": SHELL_KEY})  # a task document, state.json
    write_atomic(tmp_path / "notes.bin", b"\xff\xfe not UTF-8, then " + FILE_KEY.encode())  # any file
    written = b"".join((tmp_path / name).read_bytes() for name in ("t.jsonl", "events.jsonl", "task.json",
                                                                    "notes.bin"))
    assert SHELL_KEY.encode() not in written and FILE_KEY.encode() not in written
    assert written.count(b"[redacted]") == 5
    stream = io.StringIO()
    print(f"lost a task: bad key {SHELL_KEY}", file=redact.ScrubbingStream(stream), flush=True)
    assert stream.getvalue() == "lost a task: bad key [redacted]\n", "what an agent prints, to its log"


@pytest.mark.parametrize("status", [401, 500])
def test_a_provider_error_that_echoes_the_key_is_redacted(status):
    with ScriptedLLM() as llm:
        llm.script("openai", echo(status), echo(status), echo(status))
        # The key is the provider's own, known to no registry: the error is cleaned where it is made.
        provider = OpenAIProvider(ProviderConfig(name="p", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                 api_key=SHELL_KEY))
        attempts = []
        with pytest.raises(ProviderError) as info:
            complete_with_fallback([provider], MESSAGES, None, log=attempts.append, sleep=lambda s: None)
        assert llm.requests[0]["headers"]["authorization"] == f"Bearer {SHELL_KEY}", "the server did get the key"
    text = str(info.value) + "".join(a.error for a in attempts)
    assert SHELL_KEY not in text and "Incorrect API key provided: [redacted]" in text


def test_a_key_cut_in_half_by_the_length_limit_is_still_redacted():
    with ScriptedLLM() as llm:
        for pad in range(430, 470, 3):  # the key straddles the 500th character of the error for some pad
            reply = error_reply(400, "x" * pad + " {key} tail", kind="invalid_request_error")
            llm.script("openai", {**reply, "echo_key": True})
            provider = OpenAIProvider(ProviderConfig(name="p", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                     api_key=SHELL_KEY))
            with pytest.raises(ProviderError) as info:
                provider.complete(MESSAGES, None)
            assert SHELL_KEY[:8] not in str(info.value), pad


def run(ws: Path, *args: str) -> str:
    done = subprocess.run([*CLI, "-w", str(ws), *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, (args, done.stderr)
    return done.stdout + done.stderr


def failed_calls(ws: Path) -> list[dict]:
    try:
        lines = (ws / "runs" / "thinker" / "llm_calls.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [record for record in map(json.loads, lines) if record.get("error")]


def test_a_team_whose_provider_echoes_its_key_writes_it_nowhere_and_prints_it_nowhere(tmp_path):
    # Each provider gets a server error (retried), then a bad-key answer (the next provider), and
    # every answer quotes the key. Whether the task then fails or waits for a person to fix the key
    # is not what this test is about: the key must be in no file and no output either way.
    statuses = itertools.cycle([500, 401])
    with ScriptedLLM(lambda api, body: echo(next(statuses))) as llm:
        ws = tmp_path / "ws"
        init_workspace(ws)
        (ws / "hermes.yaml").write_text(
            f"providers:\n"
            f"  first: {{kind: openai, base_url: '{llm.url}/v1', model: m, api_key_env: HERMES_FILE_SECRET}}\n"
            f"  second: {{kind: openai, base_url: '{llm.url}/v1', model: m, api_key_env: HERMES_SHELL_SECRET}}\n"
            "tiers: {cheap: [first, second], standard: [first, second], premium: [first, second]}\n"
            "agents:\n  - name: thinker\n")
        (ws / ".env").write_text(f"HERMES_FILE_SECRET={FILE_KEY}\n")
        task = Board(ws / "kanban").add({"title": "needs a model"})
        env = {**os.environ, "HERMES_SHELL_SECRET": SHELL_KEY}
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                cwd=ROOT, env=env)
        try:
            wait_until(lambda: len(failed_calls(ws)) >= 4, timeout=60)
            sent = [r["headers"]["authorization"] for r in llm.requests]
            assert sent[:4] == [f"Bearer {FILE_KEY}"] * 2 + [f"Bearer {SHELL_KEY}"] * 2, "each key was sent, and echoed"
            assert all("Incorrect API key provided: [redacted]" in r["error"] for r in failed_calls(ws)[:4])
            outputs = {args: run(ws, *args) for args in (
                ("board", "--json"), ("board",), ("task", "show", task["id"], "--json"), ("task", "list", "--json"),
                ("status", "--json"), ("usage", "--json"), ("logs", "-n", "200"), ("doctor", "--json"))}
        finally:
            proc.terminate()
            up_output = proc.communicate(timeout=30)[0].decode()
    assert "claimed " in outputs[("logs", "-n", "200")], "the agent's log was shown"
    for args, text in outputs.items():
        assert FILE_KEY not in text and SHELL_KEY not in text, f"`{' '.join(args)}` printed a key"
    assert FILE_KEY not in up_output and SHELL_KEY not in up_output, "`up` printed a key"
    for path in ws.rglob("*"):
        if path.is_file() and path != ws / ".env":
            data = path.read_bytes()
            assert FILE_KEY.encode() not in data and SHELL_KEY.encode() not in data, f"a key was written to {path}"


def test_tools_hand_the_model_no_key(tmp_path, monkeypatch):
    import threading

    from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
    from hermes_sup.agents.tools import DEFAULT_CAPABILITIES, Tool, Toolbox, ToolContext, ToolError

    monkeypatch.setenv("HERMES_LLM_CRED", SHELL_KEY)  # a provider's api_key_env may have any name
    KeyFile(tmp_path / ".env", {"HERMES_LLM_CRED"}).refresh()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "copy.txt").write_text(f"someone pasted {SHELL_KEY} here\n")
    ctx = ToolContext(scratch=scratch, stop=threading.Event(), agent="a", task={"id": "t"})
    box = Toolbox(grants=(*DEFAULT_CAPABILITIES, "shell"))
    assert box.call(ctx, "read_file", {"path": "copy.txt"}) == "someone pasted [redacted] here\n"
    out = box.call(ctx, "terminal", {"command": f"cat copy.txt; echo {SHELL_KEY[:9]}''{SHELL_KEY[9:]}"})
    assert SHELL_KEY not in out and out.count("[redacted]") == 2, out
    with pytest.raises(ToolError) as info:
        box.call(ctx, "read_file", {"path": f"{SHELL_KEY}.txt"})
    assert SHELL_KEY not in str(info.value)


    def leaky(ctx, args):
        raise ValueError(f"connection string had {SHELL_KEY}")

    box = Toolbox(extra={"leaky": Tool("leaky", "A tool whose failure quotes a key", leaky)})
    with pytest.raises(ToolError) as info:
        box.call(ctx, "leaky", {})
    assert str(info.value) == "leaky raised ValueError: connection string had [redacted]"


def test_a_key_a_provider_sends_is_one_this_process_redacts_everywhere(tmp_path):
    with ScriptedLLM() as llm:
        llm.script("openai", {"close": True})
        provider = OpenAIProvider(ProviderConfig(name="p", kind="openai", model="m", base_url=f"{llm.url}/v1",
                                                 api_key=SHELL_KEY))  # not from any variable
        with pytest.raises(ProviderError):
            provider.complete(MESSAGES, None)
    journal = Journal(tmp_path / "log.jsonl")
    journal.append({"note": f"something else quoted {SHELL_KEY}"})
    journal.close()
    assert SHELL_KEY not in journal.path.read_text()


def test_a_new_workspace_keeps_its_keys_and_state_out_of_git(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / ".env").write_text(f"OPENAI_API_KEY={FILE_KEY}\n")
    (ws / "runs" / "a").mkdir()
    (ws / "runs" / "a" / "llm_calls.jsonl").write_text("{}\n")
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    listed = subprocess.run(["git", "-C", str(ws), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert "hermes.yaml" in listed and ".env" not in listed and "runs/" not in listed, listed
    (ws / ".gitignore").write_text("mine\n")
    init_workspace(ws)
    assert (ws / ".gitignore").read_text() == "mine\n", "a workspace's own .gitignore is kept"


def test_an_agent_prints_no_key_to_its_log(tmp_path):
    ws = tmp_path / "ws"
    init_workspace(ws)
    workdir = ws / "runs" / "agent"
    workdir.mkdir()
    # Its name carries the key, as anything it prints might: its log (stdout) must not.
    config = {"name": f"agent-{SHELL_KEY}", "orphan_grace": 0.5, "heartbeat_timeout": 1}
    env = {**os.environ, "HERMES_SUP_AGENT": json.dumps(config), "HERMES_SUP_WORKSPACE": str(ws),
           "OPENAI_API_KEY": SHELL_KEY}
    done = subprocess.run([*CLI[:1], "-P", "-m", "hermes_sup.agents", "run"], cwd=workdir, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == ORPHANED, done.stderr  # no supervisor here: it left, saying so
    assert "agent-[redacted]: ready" in done.stdout and "no supervisor" in done.stdout, done.stdout
    assert SHELL_KEY not in done.stdout + done.stderr
