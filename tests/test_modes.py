"""File modes: the team's state under runs/ (transcripts, logs, LLM calls, memory, sockets) is the
user's alone whatever the umask; the board, hermes.yaml and skills are never writable by others."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from hermes_sup.kanban import Board
from hermes_sup.kanban.fsio import AppendLog, mode_for, write_json_atomic
from hermes_sup.kanban.journal import Journal

from .conftest import CLI, init_workspace, wait_until
from .llm_server import ScriptedLLM, openai_reply

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def loose_umask() -> Iterator[None]:
    old = os.umask(0)
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_a_file_takes_its_folders_read_bits_and_never_anothers_write_bit(tmp_path, loose_umask):
    shared, private, wide = tmp_path / "shared", tmp_path / "private", tmp_path / "wide"
    for folder, bits in ((shared, 0o755), (private, 0o700), (wide, 0o777)):
        folder.mkdir()
        folder.chmod(bits)
        write_json_atomic(folder / "doc.json", {"a": 1})
        log = AppendLog(folder / "events.jsonl")
        log.append({"b": 2})
        log.close()
    assert [mode_for(f) for f in (shared, private, wide)] == [0o644, 0o600, 0o644]
    assert mode(shared / "doc.json") == 0o644 and mode(shared / "events.jsonl") == 0o644
    assert mode(private / "doc.json") == 0o600 and mode(private / "events.jsonl") == 0o600
    assert mode(wide / "doc.json") == 0o644, "umask 000 and a 0777 folder: still not writable by others"


def test_journals_are_private_under_umask_000(tmp_path, loose_umask):
    journal = Journal(tmp_path / "agent" / "transcripts" / "t.jsonl")
    journal.append({"role": "user", "content": "x"})
    journal.close()
    (journal.path).write_bytes(b'{"a": 1}\n{"torn')
    journal.append({"b": 2})  # sets the torn line aside in .damaged
    journal.close()
    assert mode(journal.path) == 0o600 and mode(journal.path.parent) == 0o700
    assert mode(journal.path.with_name("t.jsonl.damaged")) == 0o600


def test_a_board_made_under_umask_000_is_not_writable_by_others(tmp_path, loose_umask):
    with Board(tmp_path / "kanban") as board:
        board.add({"title": "t"})
    for path in [tmp_path / "kanban", *(tmp_path / "kanban").rglob("*")]:
        assert not mode(path) & 0o022, f"{path} is {oct(mode(path))}"


def reply(api: str, body: dict) -> dict:
    """Write a file with a tool, then answer: a transcript, a tool log and an LLM-call log."""
    if not any(m.get("role") == "tool" for m in body["messages"]):
        return openai_reply(tool_calls=[("write_file", {"path": "out.txt", "content": "private"})])
    return openai_reply("done")


@pytest.mark.parametrize("umask", [0o000, 0o022])
def test_under_any_umask_no_state_file_is_readable_by_others(tmp_path, umask):
    with ScriptedLLM(reply) as llm:
        ws = tmp_path / "ws"
        subprocess.run([*CLI, "init", str(ws)], check=True, capture_output=True, cwd=ROOT, umask=umask)
        (ws / "hermes.yaml").write_text(
            f"providers:\n  scripted: {{kind: openai, base_url: '{llm.url}/v1', model: m}}\n"
            "tiers: {cheap: [scripted], standard: [scripted], premium: [scripted]}\n"
            "agents:\n  - name: thinker\n")
        add = subprocess.run([*CLI, "-w", str(ws), "task", "add", "write a file", "--json"], capture_output=True,
                             text=True, check=True, cwd=ROOT, umask=umask)
        task_id = json.loads(add.stdout)["id"]
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=ROOT, umask=umask)
        try:
            board = Board(ws / "kanban")
            wait_until(lambda: board.get(task_id)["status"] == "done", timeout=60)
            thinker = ws / "runs" / "thinker"
            for name in ("agent.log", "llm_calls.jsonl", "tool_calls.jsonl", f"transcripts/{task_id}.jsonl",
                         "state.json"):
                assert (thinker / name).exists(), name
            assert (ws / "runs" / "tasks" / task_id / "work" / "out.txt").exists(), "the task's own folder"
            sockets = [p for p in (ws / "runs").rglob("*") if p.is_socket()]
            assert sockets, "the notify and control sockets are checked too"
            runs = [ws / "runs", *(ws / "runs").rglob("*")]
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0
    readable = {str(p.relative_to(ws)): oct(mode(p)) for p in runs if p.exists() and mode(p) & 0o077}
    assert not readable, f"state others may read under umask {umask:03o}: {readable}"
    shared = [ws, ws / "hermes.yaml", ws / "skills", *(ws / "kanban").rglob("*"), ws / "kanban"]
    writable = {str(p.relative_to(ws)): oct(mode(p)) for p in shared if p.exists() and mode(p) & 0o022}
    assert not writable, f"writable by others under umask {umask:03o}: {writable}"
    if umask == 0o022:
        assert mode(ws / "kanban") == 0o755 and mode(next((ws / "kanban" / "done").glob("*.json"))) == 0o644, \
            "the board stays readable for the team's humans"


def test_doctor_warns_of_a_key_file_others_may_read(tmp_path):
    from hermes_sup.supervisor.config.doctor import env_file_exposure

    ws = tmp_path / "ws"
    init_workspace(ws)
    env = ws / ".env"
    assert env_file_exposure(env) is None, "no key file, nothing to say"
    env.write_text("ANTHROPIC_API_KEY=sk-ant-0123456789\n")
    env.chmod(0o644)

    def checks() -> dict[str, dict]:
        done = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert "sk-ant-0123456789" not in done.stdout + done.stderr
        return {c["name"]: c for c in json.loads(done.stdout)["checks"]}

    warned = checks()["key file"]
    assert warned["level"] == "warn" and "0644" in warned["detail"] and f"chmod 600 {env}" in warned["detail"]
    env.chmod(0o666)
    assert "may write" in env_file_exposure(env)
    env.chmod(0o600)
    assert "key file" not in checks()
    if os.getuid() == 0:
        os.chown(env, 65534, 65534)
        assert "belongs to uid 65534" in env_file_exposure(env)
