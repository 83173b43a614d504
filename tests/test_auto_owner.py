"""`auto` adopts only a local model server of our own user (or one hermes.yaml names), says which
one it found, and the test suite itself sees no server or key from outside it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hermes_sup.agents.routing import (
    AUTO_PORTS_ENV,
    LOCAL_PORTS,
    configured_ports,
    listeners,
    listening_owners,
    refusal,
    resolve_auto,
)

from .conftest import CLI, init_workspace, wait_until
from .llm_server import ScriptedLLM

ROOT = Path(__file__).resolve().parent.parent
HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")


def row(address: str, port: int, state: str, uid: int) -> str:
    return (f"   0: {address}:{port:04X} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000 "
            f"{uid:>5}        0 4242 1 0000000000000000 100 0 0 10 0\n")


def test_listeners_reads_the_owner_of_what_listens_where_127_0_0_1_reaches():
    table = HEADER + "".join([
        row("0100007F", 8080, "0A", 1000),   # 127.0.0.1, listening
        row("00000000", 8080, "0A", 1001),   # 0.0.0.0
        row("0100007F", 8080, "01", 1002),   # an established connection, not a server
        row("0200007F", 8080, "0A", 1003),   # 127.0.0.2: not where auto connects
        row("0100007F", 8081, "0A", 1004),   # another port
    ]) + "garbage line\n"
    assert listeners(table, 8080) == {1000, 1001}
    six = HEADER + row("00000000000000000000000001000000", 11434, "0A", 7) + row(
        "0000000000000000FFFF00000100007F", 11434, "0A", 8) + row("00000000000000000000000000000000", 11434, "0A", 9)
    assert listeners(six, 11434) == {7, 8, 9}
    assert listeners(HEADER, 8080) == set()


def test_refusal_is_a_decision_over_port_owner_our_uid_and_the_config():
    assert refusal(8080, {1000}, 1000, ()) is None, "our own server"
    why = refusal(8080, {65534}, 1000, ())
    assert "port 8080" in why and "uid 65534" in why and "hermes.yaml" in why
    assert refusal(8080, {65534}, 1000, (8080,)) is None, "hermes.yaml names it: the person chose it"
    assert refusal(8080, {1000, 65534}, 1000, ()) is not None, "two owners, one of them someone else"
    assert "cannot be looked up" in refusal(8080, None, 1000, ())
    assert refusal(8080, None, 1000, {8080}) is None


def test_configured_ports_are_the_local_ones_hermes_yaml_names():
    config = {"providers": {
        "a": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:8080/v1"},
        "b": {"kind": "openai", "model": "m", "base_url": "http://localhost:1234/v1"},
        "c": {"kind": "openai", "model": "m", "base_url": "https://example.com:8000/v1"},
        "d": {"kind": "openai", "model": "m", "base_url": "http://127.0.0.1:notaport/v1"},
        "e": {"kind": "anthropic", "model": "m"},
    }}
    assert configured_ports(config) == {8080, 1234}


def test_the_real_owner_lookup_finds_our_own_server_and_nothing_on_a_closed_port():
    with ScriptedLLM() as llm:
        assert listening_owners(llm.port) == {os.getuid()}
    assert listening_owners(llm.port) == set()


NOBODY_SERVER = """
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        data = json.dumps({"object": "list", "data": [{"id": "someone-elses-model"}]}).encode()
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *args):
        pass

server = HTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


@pytest.fixture
def nobodys_server():
    """A model server run by the user `nobody`: someone else on a shared machine."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin:/bin")
    if os.getuid() != 0 or python is None:
        pytest.skip("needs root (to start a process as nobody) and a system python3")
    try:
        import pwd

        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody")
    proc = subprocess.Popen([python, "-I", "-c", NOBODY_SERVER], stdout=subprocess.PIPE, text=True, cwd="/",
                            user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[], env={"PATH": "/usr/bin:/bin"})
    try:
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            pytest.skip(f"the server as nobody did not start ({proc.wait(timeout=10)})")
        yield int(line), nobody.pw_uid
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_auto_passes_over_a_server_of_another_user_unless_hermes_yaml_names_it(nobodys_server):
    port, uid = nobodys_server
    assert listening_owners(port) == {uid}
    notes: list[str] = []
    probed = []

    def probe(url):
        probed.append(url)
        return ["someone-elses-model"]

    assert resolve_auto({AUTO_PORTS_ENV: str(port)}, probe, notes=notes) is None
    assert probed == [], "not even asked: a probe already tells the server we are here"
    assert len(notes) == 2 and f"port {port}" in notes[0] and f"uid {uid}" in notes[0]
    assert notes[1] == f"auto is offline: no API key, and no local server of this user on ports {port}"
    found = resolve_auto({AUTO_PORTS_ENV: str(port)}, configured={port})
    assert found is not None and found.model == "someone-elses-model"
    config = {"providers": {"theirs": {"kind": "openai", "model": "m", "base_url": f"http://localhost:{port}/v1"}}}
    notes.clear()
    found = resolve_auto({AUTO_PORTS_ENV: str(port)}, config=config, notes=notes)
    assert found.model == "someone-elses-model" and notes == [
        f"auto uses auto:local, model someone-elses-model (server at http://127.0.0.1:{port}/v1)"]


def doctor(ws: Path, **env: str) -> dict[str, list[dict]]:
    done = subprocess.run([*CLI, "-w", str(ws), "doctor", "--json"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, **env})
    checks: dict[str, list[dict]] = {}
    for check in json.loads(done.stdout)["checks"]:
        checks.setdefault(check["name"], []).append(check)
    return checks


def test_doctor_says_which_server_auto_found_and_which_it_passed_over(tmp_path, nobodys_server):
    port, uid = nobodys_server
    ws = tmp_path / "ws"
    init_workspace(ws)
    with ScriptedLLM() as llm:
        checks = doctor(ws, **{AUTO_PORTS_ENV: f"{port},{llm.port}"})
        auto = checks["provider auto"][0]
        assert auto["level"] == "ok" and f"server at {llm.url}/v1" in auto["detail"] and "scripted" in auto["detail"]
        passed = checks["auto passed over"]
        assert len(passed) == 1 and f"port {port}" in passed[0]["detail"] and f"uid {uid}" in passed[0]["detail"]
    (ws / "hermes.yaml").write_text(
        f"providers:\n  theirs: {{kind: openai, base_url: 'http://127.0.0.1:{port}/v1', model: m}}\n"
        "agents:\n  - name: solo\n")
    checks = doctor(ws, **{AUTO_PORTS_ENV: str(port)})
    assert "someone-elses-model" in checks["provider auto"][0]["detail"] and "auto passed over" not in checks


def test_the_agent_log_says_which_server_auto_adopted(tmp_path):
    from .test_supervisor import state

    ws = tmp_path / "ws"
    init_workspace(ws)
    (ws / "hermes.yaml").write_text("agents:\n  - name: solo\n")
    with ScriptedLLM() as llm:
        proc = subprocess.Popen([*CLI, "-w", str(ws), "up"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=ROOT, env={**os.environ, AUTO_PORTS_ENV: str(llm.port)})
        try:
            log = ws / "runs" / "solo" / "agent.log"
            wait_until(lambda: log.exists() and "auto uses" in log.read_text(), timeout=30)
            line = next(line for line in log.read_text().splitlines() if "auto uses" in line)
            assert f"server at {llm.url}/v1" in line and "model scripted" in line
            wait_until(lambda: state(ws).get("agents", {}).get("solo", {}).get("state") == "running", timeout=30)
        finally:
            proc.terminate()
            assert proc.wait(timeout=30) == 0


def test_the_suite_sees_no_server_or_key_from_outside_it(tmp_path):
    """conftest's `hermetic` fixture: a model server on one of auto's usual ports (started here
    when one is free, as someone's llama.cpp would be) is not adopted, and no key is visible."""
    assert not [name for name in os.environ if name.endswith("_API_KEY")]
    assert os.environ.get(AUTO_PORTS_ENV) == ""
    for port, _ in LOCAL_PORTS:
        try:
            server = ScriptedLLM(port=port)
        except OSError:
            continue  # taken: by a server from outside the suite, which must not be adopted either
        break
    else:
        server = None
    try:
        if server is not None:
            server.__enter__()
            assert resolve_auto({}) is not None, "without the fixture, auto adopts it (the test can fail)"
        assert resolve_auto(os.environ) is None
        ws = tmp_path / "ws"
        init_workspace(ws)
        checks = doctor(ws)
        assert checks["provider auto"][0]["detail"].startswith("offline"), checks["provider auto"]
    finally:
        if server is not None:
            server.__exit__(None, None, None)


def test_the_hermetic_fixture_hides_a_key_and_ports_the_developers_shell_has():
    """The check above in a pytest of its own, started the way a developer with a key in the shell
    and a server for auto would start it: it still sees neither (the fixture must hide them, not
    the machine lack them)."""
    env = {**os.environ, "OPENAI_API_KEY": "sk-from-the-developers-shell", AUTO_PORTS_ENV: "8080"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           f"{Path(__file__)}::test_the_suite_sees_no_server_or_key_from_outside_it"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=170)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:]
