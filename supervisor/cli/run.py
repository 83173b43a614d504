"""Running the team: `up`, `status` (`ps`), `restart`, `reload` and `down`, through the supervisor's control socket."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import psutil
from rich.text import Text

from ..cliargs import Seconds, emit_json
from ..config.workspace import PRIVATE_UMASK, ConfigError, Workspace, load_config, private_dir
from ..procs import tree_rss_mb
from ..spec import build_specs
from ..statefile import supervisor_alive
from ..sweep import LOCK_FILE, sweep
from ..views import render
from .common import (
    Failure,
    command,
    err,
    handled,
    is_regular,
    json_option,
    literal,
    open_board,
    out,
    print_table,
    read_supervisor_state,
    workspace_of,
)
from .logtail import LogTail
from .status import ask_supervisor, status_rows


def _agents_option(ws: Workspace, config: dict[str, Any], csv: str | None) -> set[str] | None:
    if csv is None:  # "--agents ''" (an empty variable in a script) names no agent: refused below
        return None
    known = [spec.name for spec in build_specs(config, ws.root)]
    chosen = {name.strip() for name in csv.split(",") if name.strip()}
    if not chosen:
        raise Failure(f"--agents names no agent; agents: {', '.join(known)}", 2)
    unknown = sorted(chosen - set(known))
    if unknown:
        raise Failure(f"--agents names unknown agent(s) {', '.join(unknown)}; agents: {', '.join(known)}", 2)
    return chosen


@command()
@click.option("-d", "--detach", is_flag=True,
              help="Run the supervisor in the background; return once every agent runs.")
@click.option("--agents", "agents_csv", metavar="A,B", help="Start only these agents.")
@click.option("--dashboard", "with_dashboard", is_flag=True,
              help="Also serve the web dashboard on 127.0.0.1 (see `dashboard`).")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The dashboard's port with --dashboard.")
@click.option("--detached", is_flag=True, hidden=True)  # the background supervisor --detach starts
@click.pass_context
@handled
def up(ctx: click.Context, detach: bool, agents_csv: str | None, with_dashboard: bool = False,
       dashboard_port: int = 8765, detached: bool = False) -> None:
    """Start the supervisor and the team (foreground: events and agent logs; Ctrl-C stops)."""
    ws = workspace_of(ctx)
    config = load_config(ws.config_path)
    only = _agents_option(ws, config, agents_csv)
    refuse_rejected_skills(ws, config, only)
    # Whatever the supervisor and its agents create (logs, sockets, transcripts, a tool's files) is
    # the user's alone; the board's files keep their folders' modes (see kanban/fsio.py).
    os.umask(PRIVATE_UMASK)
    private_dir(ws.runs_path)
    open_board(ctx).close()  # refuse a network filesystem before anything starts
    import filelock  # only `up` needs it; 30 ms of start-up for every other command

    # One supervisor per workspace. The kernel drops the flock when its holder dies, so a
    # SIGKILLed supervisor never leaves the workspace locked.
    singleton = filelock.FileLock(str(ws.runs_path / LOCK_FILE), blocking=False)
    try:
        singleton.acquire()
    except filelock.Timeout:
        running = read_supervisor_state(ws)
        if detach:  # what --detach asks for is already so (a supervisor starting up saves its state soon)
            running = running if supervisor_alive(running) else wait_until_saved(ws, 30.0)
            out.print(literal(f"hermes-sup is already running in {ws.root} (pid {running['pid']})"), soft_wrap=True)
            return
        raise Failure(f"hermes-sup is already running in {ws.root} (pid {running.get('pid', '?')})") from None
    if detach:
        singleton.release()
        sys.exit(_detach(ws, agents_csv, dashboard_port if with_dashboard else None))
    # At a terminal: a live table of the agents and the board above which events and the agents'
    # logs scroll. Piped (or detached): plain lines only, so nobody pays for a display unseen.
    live = out.is_terminal
    console = out if live else err
    # Imported here: the runner brings the agent runtime along, which no other command needs.
    from ..dashboard.metrics import serve_metrics
    from ..runner import Supervisor

    try:
        supervisor = Supervisor(ws, config, only=only, say=lambda line: console.print(
            Text.assemble((time.strftime("%H:%M:%S"), "dim"), " ", literal(line)), highlight=False,
            soft_wrap=True))  # one line each, piped or not
        # Detached, nobody reads the agents' lines in supervisor.log (each agent's own log has them,
        # `hermes-sup logs` shows them): copying them there was half the supervisor's work in a drain.
        tail = None if detached else LogTail(supervisor.children, out, supervisor.runs)
        if tail is not None:
            tail.start()
        web = None
        if with_dashboard:  # in a thread of this process: it ends with the supervisor, however that ends
            from .dashboard import dashboard_server, url_of

            web = dashboard_server(ws, "127.0.0.1", dashboard_port, None)
            web.start_thread()
            supervisor.say(f"dashboard: {url_of('127.0.0.1', web.port)}")
        web = web or serve_metrics(ws, config, supervisor.say)  # metrics: {port}, for a team without the dashboard
        if live:
            from rich.live import Live

            with Live(console=out, refresh_per_second=2, transient=True,
                      get_renderable=lambda: render.live_view(supervisor.snapshot(), supervisor.board.counts(),
                                                             tree_rss_mb)):
                code = supervisor.serve()
        else:
            code = supervisor.serve()
        if tail is not None:
            tail.stop()
        if web is not None:
            web.stop()
    finally:
        singleton.release()
    sys.exit(code)


def refuse_rejected_skills(ws: Workspace, config: dict[str, Any], only: set[str] | None) -> None:
    """A skill an agent names that its check rejects (a handler of the wrong signature, an import
    error) stops `up` with the reason, before any task fails on it. Each skill is checked in a
    process of its own (agents/skillcheck.py), once per version: later `up`s read the verdict."""
    named = {name for agent in config.get("agents") or [] if only is None or _expanded_in(agent, only)
             for key in ("skills", "toolsets") for name in agent.get(key) or ()}
    if not named:
        return
    from ...agents.skills import Skills  # only teams that name skills pay for the import

    for skill in Skills(ws.root).catalog():
        if skill.name in named and skill.state == "rejected":
            raise ConfigError(f"{ws.config_path}: skill {skill.name} ({skill.path}) is rejected: {skill.error}")


def _expanded_in(agent: dict[str, Any], only: set[str]) -> bool:
    name, count = agent.get("name"), agent.get("count", 1)
    return any(item in only for item in ([name] if count == 1 else [f"{name}-{i}" for i in range(1, count + 1)]))


def _detach(ws: Workspace, agents_csv: str | None, dashboard_port: int | None = None) -> int:
    # -P: the workspace is the working directory, and its kanban/ board folder must not shadow
    # the kanban package.
    command = [sys.executable, "-P", "-m", "hermes_sup.supervisor", "-w", str(ws.root), "up", "--detached"]
    if agents_csv:
        command += ["--agents", agents_csv]
    if dashboard_port is not None:
        command += ["--dashboard", "--dashboard-port", str(dashboard_port)]
    with open(ws.runs_path / "supervisor.log", "ab") as log:
        start = log.tell()
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    stall = Stall(DETACH_STALL, time.monotonic())
    while True:
        if proc.poll() is not None:
            # Why, here: not only in the log.
            for line in lines_since(ws.runs_path / "supervisor.log", start, ERROR_LINE):
                err.print(literal(line, one_line=True), highlight=False)
            err.print(literal(f"hermes-sup: the supervisor exited with status {proc.returncode}; "
                              f"see {ws.runs_path}/supervisor.log"))
            return 1
        state = read_supervisor_state(ws)
        agents = state.get("agents") or {} if state.get("pid") == proc.pid else {}
        if agents and all(a["state"] not in ("starting", "queued") for a in agents.values()):
            print_table(render.status_table(status_rows(state, ws.runs_path)))
            # The dashboard's address (its port chosen by the system with 0) is said in the log
            # before any agent starts; the user asked for it here.
            for line in lines_since(ws.runs_path / "supervisor.log", start, DASHBOARD_LINE)[-1:]:
                err.print(literal(line[line.index("dashboard: "):], one_line=True), highlight=False)
            return 0 if all(a["state"] == "running" or a["held"] for a in agents.values()) else 1
        if stall.stalled(ready_progress(agents), time.monotonic()):
            ready = ready_progress(agents)[0]
            err.print(f"hermes-sup: agents did not all report ready: none more for {DETACH_STALL:g} s ({ready} of "
                      f"{len(agents)} ready); see `hermes-sup status`")
            return 1
        time.sleep(0.05)


DETACH_STALL = 60.0
ERRORS_READ = 64 * 1024  # of the log a failed detached start wrote: its error lines are near its end
ERROR_LINE = re.compile(r"error:")
DASHBOARD_LINE = re.compile(r"\d\d:\d\d:\d\d dashboard: http://")


def lines_since(log: Path, offset: int, kind: re.Pattern[str]) -> list[str]:
    """The lines starting with `kind` a detached supervisor wrote to its log after `offset` (the last
    five; bounded; an unreadable log gives none: the caller still names the file)."""
    if not is_regular(log):  # a FIFO put in its place would block this read
        return []
    try:
        with open(log, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(offset, size - ERRORS_READ))
            data = handle.read(ERRORS_READ)
    except OSError:
        return []
    lines = data.decode("utf-8", "replace").splitlines()
    return [line for line in lines if kind.match(line)][-5:]


def ready_progress(agents: dict[str, Any]) -> tuple[int, int]:
    """How far a team has come up (pure): (agents past starting, agents with a process)."""
    return (sum(1 for a in agents.values() if a.get("state") not in ("starting", "queued")),
            sum(1 for a in agents.values() if a.get("pid")))


class Stall:
    """Whether a wait has stalled: no change in what it watches for `seconds` (pure: the clock is
    given). 256 agents on 2 cores take minutes to start; a minute with none more started or
    ready is a stall, however long the whole takes."""

    def __init__(self, seconds: float, now: float) -> None:
        self.seconds, self.since, self.seen = seconds, now, None

    def stalled(self, seen: object, now: float) -> bool:
        if seen != self.seen:
            self.seen, self.since = seen, now
            return False
        return now - self.since > self.seconds


def is_supervisor_process(pid: int) -> bool:
    """Whether `pid` runs `hermes-sup up`: checked before signalling it, never trusting the state file."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "up" in argv and any(arg.endswith("hermes-sup") or arg == "hermes_sup.supervisor" for arg in argv)


def _ask(ctx: click.Context, payload: dict[str, Any], as_json: bool) -> dict[str, Any]:
    ws = workspace_of(ctx)
    if not supervisor_alive(read_supervisor_state(ws)):
        raise Failure(f"hermes-sup is not running in {ws.root}; start it with `hermes-sup up`")
    reply = ask_supervisor(ws, payload)
    if reply is None:
        raise Failure("the supervisor did not answer on its control socket")
    message = str(reply.get("message", "ok" if reply.get("ok") else "refused"))
    if as_json:
        emit_json(reply)
    elif reply.get("ok"):
        out.print(literal(message))
    if not reply.get("ok"):
        # A refused config and an agent name that is not one are usage errors, as in `logs AGENT`.
        usage = "reload refused" in message or message.startswith("no agent named")
        raise Failure(message, 2 if usage else 1)
    return reply


@command()
@click.argument("agent")
@json_option
@click.pass_context
@handled
def restart(ctx: click.Context, agent: str, as_json: bool) -> None:
    """Restart one agent (clears fatal; not counted as a crash)."""
    _ask(ctx, {"cmd": "restart", "agent": agent}, as_json)


@command()
@json_option
@click.pass_context
@handled
def reload(ctx: click.Context, as_json: bool) -> None:
    """Re-read hermes.yaml: start added agents, stop removed ones, restart changed ones."""
    _ask(ctx, {"cmd": "reload"}, as_json)


@command()
@click.option("--timeout", type=Seconds(),
              help="Seconds before SIGKILL (default: each agent's stop_timeout).")
@json_option
@click.pass_context
@handled
def down(ctx: click.Context, timeout: float | None, as_json: bool) -> None:
    """Stop the team gracefully (SIGTERM, then SIGKILL after the timeout) and the supervisor; with no
    supervisor running, stop whatever its agents left running."""
    ws = workspace_of(ctx)
    state = read_supervisor_state(ws)
    explicit = timeout
    if timeout is None:
        try:
            timeout = max((spec.stop_timeout for spec in build_specs(load_config(ws.config_path), ws.root)),
                          default=10.0)
        except ConfigError:
            timeout = 30.0
    if not supervisor_alive(state):
        # A supervisor killed with SIGKILL leaves its agents running: stop them, unless a supervisor
        # holds the workspace (one starting up that has not saved its state yet).
        left = sweep(ws.root, ws.runs_path, timeout)
        if left is not None:
            if as_json:
                emit_json({"ok": True, "message": "not running", "stopped_orphans": left})
            else:
                out.print("hermes-sup is not running in this workspace"
                          + (f"; stopped {left} process(es) its agents left running" if left else ""))
            return
        state = wait_until_saved(ws, 30.0)
    payload: dict[str, Any] = {"cmd": "down"}
    if explicit is not None:
        payload["timeout"] = explicit
    try:
        answered = ask_supervisor(ws, payload) is not None
    except TimeoutError:
        # Too busy to answer in time (starting or stopping hundreds of agents on 2 cores). Its
        # request waits in the socket; SIGTERM asks the same, taken even before it reads that, but
        # with each agent's own stop_timeout: a --timeout given is left to the request alone. The
        # pid is checked again (pid and start time) just before the signal.
        answered = explicit is not None or not supervisor_alive(state)
    if not answered:
        if not is_supervisor_process(state["pid"]):
            raise Failure(f"pid {state['pid']} in {ws.runs_path / 'supervisor.json'} is not hermes-sup up and "
                          "its control socket does not answer; not signalling it")
        os.kill(state["pid"], signal.SIGTERM)
    wait = timeout + 15  # SIGKILL comes at the timeout; then the agents' exits and the final save
    deadline = time.monotonic() + wait
    while supervisor_alive(state) and time.monotonic() < deadline:
        time.sleep(0.05)
    if supervisor_alive(state):
        raise Failure(f"the supervisor (pid {state['pid']}) is still running after {wait:g} s")
    # The last resort for a process that left its agent's session and cgroup (or ran with no cgroup).
    left = sweep(ws.root, ws.runs_path, min(timeout, 5.0)) or 0
    if as_json:
        emit_json({"ok": True, "message": "stopped", "stopped_orphans": left})
    else:
        out.print("hermes-sup stopped" + (f"; stopped {left} process(es) left behind" if left else ""))


def wait_until_saved(ws: Workspace, seconds: float) -> dict[str, Any]:
    """The state of a supervisor that holds the workspace lock but has not saved its state yet."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = read_supervisor_state(ws)
        if supervisor_alive(state):
            return state
        time.sleep(0.05)
    raise Failure(f"a supervisor holds {ws.runs_path}/supervisor.lock but did not save its state within "
                  f"{seconds:g} s; try again")
