"""A Python skill's tools run confined (agents/skillproc.py, agents/skillrun.py): black-box, a skill's
tool tries what its declared capabilities do not give it, under bubblewrap and under Landlock, and the
same tool under `sandbox: none` shows each probe can succeed; no code of a skill runs in the agent's
process; its model calls go through the agent; a stop ends it; only the checked version runs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

import pytest
from hermes_sup.agents import builtins  # noqa: F401 - registers the built-in tools
from hermes_sup.agents.skills import Skills
from hermes_sup.agents.tools import Toolbox, ToolContext, ToolError

from .conftest import marked_sleep, running, wait_until
from .test_sandbox import CONFINED, needs

PROBE = '''"""Try what a skill's tool may and may not do."""
import json, os, socket, subprocess, time
from pathlib import Path
from hermes_sup.agents.tools import Tool, register


def attempt(act):
    try:
        act()
        return True
    except Exception:
        return False


def probe(ctx, args):
    place, ws = Path(args["place"]), Path(args["place"]) / "ws"
    return json.dumps({
        "pid": os.getpid(), "key": os.environ.get("OPENAI_API_KEY"),
        "write_own": attempt(lambda: Path("own.txt").write_text("x")),
        "write_rw": attempt(lambda: (place / "rw" / "new.txt").write_text("x")),
        "write_ro": attempt(lambda: (place / "ro" / "new.txt").write_text("x")),
        "write_outside": attempt(lambda: (place / "outside" / "new.txt").write_text("x")),
        "write_runs": attempt(lambda: (ws / "runs" / "other" / "x").write_text("x")),
        "read_ro": attempt(lambda: (place / "ro" / "paper.txt").read_text()),
        "read_env": attempt(lambda: (ws / ".env").read_text()),
        "read_other": attempt(lambda: (ws / "runs" / "other" / "state.json").read_text()),
        "read_outside": attempt(lambda: (place / "outside" / "private.txt").read_text()),
        "connect": attempt(lambda: socket.create_connection(("127.0.0.1", args["port"]), timeout=3).close()),
    })


def ask(ctx, args):
    return ctx.llm("cheap", args["prompt"])


def hang(ctx, args):
    subprocess.Popen(args["prompt"].split(), start_new_session=True)  # what it starts goes with it
    Path("started").write_text("")
    while not ctx.stop.is_set():
        time.sleep(0.05)
    raise InterruptedError


SCHEMA = {"type": "object", "properties": {"place": {"type": "string"}, "port": {"type": "integer"},
                                           "prompt": {"type": "string"}}}
for name, caps in (("probe_read", ("fs.read",)), ("probe_write", ("fs.read", "fs.write")),
                   ("probe_net", ("network",)), ("probe_write_only", ("fs.write",))):
    register(Tool(name, "Probe.", probe, SCHEMA, capabilities=caps))
register(Tool("ask", "Ask the model.", ask, SCHEMA))
register(Tool("hang", "Wait for a stop.", hang, SCHEMA, capabilities=("fs.write",)))
'''
ALL = ("fs.read", "fs.write", "network")
KEYS = ("write_own", "write_rw", "write_ro", "write_outside", "write_runs", "read_ro", "read_env", "read_other",
        "read_outside", "connect")


@pytest.fixture
def place(tmp_path, monkeypatch):
    return make_place(tmp_path, monkeypatch)


@pytest.fixture
def place_outside(monkeypatch):
    """The same, outside every folder the sandbox hides by itself (/tmp, /home...): what is not
    given must be hidden by name there."""
    root = Path("/var/cache")
    if not os.access(root, os.W_OK):
        pytest.skip("/var/cache is not writable here")
    folder = Path(tempfile.mkdtemp(prefix="hermes-sup-test-", dir=root))
    try:
        yield make_place(folder, monkeypatch)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def make_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-AGENTS-OWN")
    ws = tmp_path / "ws"
    (ws / "runs" / "tasks" / "t1" / "work").mkdir(parents=True)
    (ws / "runs" / "other").mkdir()
    (ws / "runs" / "other" / "state.json").write_text('{"secret": "OTHERS-STATE"}')
    (ws / ".env").write_text("OPENAI_API_KEY=ENV-SECRET\n")
    (ws / "skills").mkdir()
    (ws / "skills" / "probe.py").write_text(PROBE)
    for name in ("rw", "ro", "outside"):
        (tmp_path / name).mkdir()
    (tmp_path / "ro" / "paper.txt").write_text("a paper\n")
    (tmp_path / "outside" / "private.txt").write_text("OUTSIDE-SECRET\n")
    return tmp_path


@pytest.fixture
def listener():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def setup(place: Path, mode: str, **ctx_fields) -> tuple[Toolbox, ToolContext]:
    skills = Skills(place / "ws", bundled=place / "none")
    tools, notes = skills.tools_for(None)
    assert notes == []
    folders = {"rw": {"path": str(place / "rw"), "mode": "rw"}, "ro": {"path": str(place / "ro"), "mode": "ro"}}
    ctx = ToolContext(scratch=place / "ws" / "runs" / "tasks" / "t1" / "work", stop=threading.Event(),
                      settings={"sandbox": mode, "folders": folders}, workspace=place / "ws", **ctx_fields)
    return Toolbox(grants=ALL, extra=tools), ctx


def probe(place: Path, mode: str, tool: str, port: int) -> dict:
    box, ctx = setup(place, mode)
    seen = json.loads(box.call(ctx, tool, {"place": str(place), "port": port}))
    assert seen["pid"] != os.getpid(), "the skill ran in the agent's process"
    assert seen["key"] is None, "the agent's key reached the skill"
    assert not list(ctx.scratch.glob("*tmp*")), "the Landlock launcher's temporary folder is not the task's"
    return {key: seen[key] for key in KEYS if seen[key]}


# What each probe may do confined, by the capabilities it declares: the task's folder and the rw grants
# are written with fs.write, every grant read with fs.read, the network reached with network alone.
ALLOWED = {"probe_write": {"write_own", "write_rw", "read_ro"}, "probe_read": {"read_ro"},
           "probe_net": {"connect"}, "probe_write_only": {"write_own", "write_rw"}}


@pytest.mark.parametrize("tool", sorted(ALLOWED))
@pytest.mark.parametrize("mode", CONFINED)
def test_outside_the_private_folders_a_grant_not_given_is_hidden_too(place_outside, mode, tool, listener):
    needs(mode)
    # "outside" is no grant there, just a folder of the system, which is shown read-only.
    assert set(probe(place_outside, mode, tool, listener)) == ALLOWED[tool] | {"read_outside"}


@pytest.mark.parametrize("tool", sorted(ALLOWED))
@pytest.mark.parametrize("mode", [*CONFINED, "none"])
def test_a_skill_tool_gets_what_its_capabilities_name_and_nothing_more(place, mode, tool, listener):
    needs(mode)
    done = probe(place, mode, tool, listener)
    assert set(done) == (set(KEYS) if mode == "none" else ALLOWED[tool])  # none: each probe can succeed
    if mode != "none":
        assert not (place / "ws" / "runs" / "other" / "x").exists() and not (place / "ro" / "new.txt").exists()


def test_a_skill_asks_the_model_through_the_agent(place):
    asked = []
    box, ctx = setup(place, "auto", llm=lambda tier, prompt: asked.append((tier, prompt)) or f"answer to {prompt}")
    assert box.call(ctx, "ask", {"prompt": "why?"}) == "answer to why?"
    assert asked == [("cheap", "why?")]

    def over_budget(tier: str, prompt: str) -> str:
        raise RuntimeError("budget reached")

    box, ctx = setup(place, "auto", llm=over_budget)  # the agent's failure is the skill's to handle
    with pytest.raises(ToolError, match=r"^RuntimeError: budget reached$"):
        box.call(ctx, "ask", {"prompt": "why?"})


def test_a_stop_ends_a_skill_call_and_what_it_runs(place):
    box, ctx = setup(place, "auto")
    mark = marked_sleep()
    outcome: dict = {}

    def call() -> None:
        try:
            box.call(ctx, "hang", {"prompt": mark})
        except BaseException as exc:
            outcome["raised"] = exc

    worker = threading.Thread(target=call)
    worker.start()
    wait_until(lambda: (ctx.scratch / "started").exists(), timeout=30)
    assert running(mark) and running(str(place / "ws" / "runs" / ".skillrun"))
    stopped = time.monotonic()
    ctx.stop.set()
    worker.join(timeout=10)
    assert not worker.is_alive() and isinstance(outcome.get("raised"), InterruptedError)
    assert time.monotonic() - stopped < 5
    wait_until(lambda: not running(mark) and not running(str(place / "ws" / "runs" / ".skillrun")), timeout=10)


def test_only_the_version_that_was_checked_runs(place):
    box, ctx = setup(place, "auto")
    path = place / "ws" / "skills" / "probe.py"
    path.write_text(path.read_text().replace('return ctx.llm("cheap", args["prompt"])', 'return "unchecked"'))
    with pytest.raises(ToolError, match="changed since it was checked; the call was not made"):
        box.call(ctx, "ask", {"prompt": "x"})
    box, ctx = setup(place, "auto")  # offered again once checked
    assert box.call(ctx, "ask", {"prompt": "x"}) == "unchecked"


def test_a_skill_declaring_what_only_the_agent_has_is_rejected(place):
    (place / "ws" / "skills" / "boarder.py").write_text(
        'from hermes_sup.agents.tools import Tool, register\n'
        'register(Tool("boarder", "x", lambda ctx, args: ctx.board, capabilities=("kanban",)))\n')
    skill = Skills(place / "ws", bundled=place / "none").get("boarder")
    assert skill.state == "rejected"
    assert "runs in a sandbox of its own, without the agent's kanban" in skill.error


HOSTILE = '''"""A call that misuses its pipe to the agent."""
import json, time
from hermes_sup.agents.tools import Tool, register


def flood_asks(ctx, args):
    for _ in range(20_000):  # asks and asks, never reading an answer
        ctx.llm.__self__.out.write(json.dumps({"llm": ["cheap", "x" * 100]}) + "\\n")
    ctx.llm.__self__.out.flush()
    time.sleep(600)


def fake_stop(ctx, args):
    raise InterruptedError


def huge(ctx, args):
    ctx.llm.__self__.out.write("x" * (3 << 20))  # no end of line: the agent must not keep it all
    ctx.llm.__self__.out.flush()
    time.sleep(600)


def deep(ctx, args):
    ctx.llm.__self__.out.write("[" * 200_000 + "]" * 200_000 + "\\n")
    ctx.llm.__self__.out.flush()
    time.sleep(600)


for name, handler in (("flood_asks", flood_asks), ("fake_stop", fake_stop), ("deep", deep), ("huge", huge)):
    register(Tool(name, "Misuse the pipe.", handler))
'''


@pytest.mark.parametrize("tool, message", [
    ("flood_asks", "asked the model again before reading its answer"),
    ("fake_stop", "said it was stopped, and no stop was asked"),
    ("deep", "answered something unreadable"),
    ("huge", "larger than 2 MiB"),
])
def test_a_call_that_misuses_its_pipe_is_ended_and_never_holds_the_agent(place, tool, message):
    """A child asking for answers it never read blocked the agent's thread in a write for good, past
    its stop and its time limit; one raising InterruptedError faked the agent's stop."""
    (place / "ws" / "skills" / "hostile.py").write_text(HOSTILE)
    box, ctx = setup(place, "auto", llm=lambda tier, prompt: "y" * 10_000)
    started = time.monotonic()
    with pytest.raises(ToolError, match=message):
        box.call(ctx, tool, {})
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("mode", [0o000, 0o777])
def test_a_copy_of_our_code_whose_modes_were_changed_is_made_again(place, mode):
    """Under Landlock a command may change modes where it may not write: the copy made unreadable
    broke every later call for good, made writable to all it would take another user's code."""
    box, ctx = setup(place, "auto", llm=lambda tier, prompt: "fine")
    assert box.call(ctx, "ask", {"prompt": "x"}) == "fine"
    (copy,) = (place / "ws" / "runs" / ".skillrun").iterdir()
    (copy / "hermes_sup" / "agents").chmod(mode)
    assert box.call(ctx, "ask", {"prompt": "x"}) == "fine"
    assert (copy / "hermes_sup" / "agents").stat().st_mode & 0o777 == 0o700


def test_a_call_is_denied_the_grants_its_capabilities_do_not_name_and_only_those():
    from hermes_sup.agents.skillproc import rights, withheld_folders

    settings = {"folders": {"rw": {"path": "/d/rw", "mode": "rw"}, "ro": {"path": "/d/ro", "mode": "ro"},
                            "app": {"path": "/d/app", "mode": "rw", "tree": "/w/runs/tasks/t/trees/app"}}}
    assert withheld_folders(settings, rights(settings, ("fs.read", "fs.write"))) == [Path("/d/app")]
    assert withheld_folders(settings, rights(settings, ("fs.read",))) == [Path("/d/app")]
    assert withheld_folders(settings, rights(settings, ())) == sorted(
        Path(p) for p in ("/d/rw", "/d/ro", "/d/app", "/w/runs/tasks/t/trees/app"))


def test_the_copy_of_our_code_follows_every_change_to_it_and_is_made_again_when_a_module_is_gone(tmp_path, monkeypatch):
    """What the copy holds is known by what stat says of our files (reading and hashing them all took
    15 ms of every call): a file rewritten to the same size with its old mtime still gives a
    copy of its own, and a copy missing a module is not taken as whole."""
    from hermes_sup.agents import skillproc

    code = tmp_path / "code"
    code.mkdir()
    (code / "a.py").write_text("A = 1\n")
    (code / "b.py").write_text("B = 1\n")
    found = (("hermes_sup/agents/a.py", code / "a.py"), ("hermes_sup/agents/b.py", code / "b.py"))
    monkeypatch.setattr(skillproc, "_package_files", lambda: found)
    runs = tmp_path / "runs"
    first = skillproc.library(runs)
    assert (first / "hermes_sup" / "agents" / "a.py").read_text() == "A = 1\n"
    assert skillproc.library(runs) == first

    before = os.stat(code / "a.py")
    (code / "a.py").write_text("A = 2\n")
    os.utime(code / "a.py", ns=(before.st_atime_ns, before.st_mtime_ns))
    second = skillproc.library(runs)
    assert second != first
    assert (second / "hermes_sup" / "agents" / "a.py").read_text() == "A = 2\n"

    (second / "hermes_sup" / "agents" / "b.py").unlink()
    again = skillproc.library(runs)
    assert again == second and (again / "hermes_sup" / "agents" / "b.py").read_text() == "B = 1\n"

    (again / "hermes_sup" / "agents" / "b.py").unlink()  # a folder where a module should be
    (again / "hermes_sup" / "agents" / "b.py").mkdir(mode=0o700)
    assert (skillproc.library(runs) / "hermes_sup" / "agents" / "b.py").read_text() == "B = 1\n"
