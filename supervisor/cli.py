"""The `hermes-sup` command line.

Exit codes: 0 ok, 1 failure, 2 usage or configuration error. With --json a command prints one
JSON document to stdout (an error too, as {"error": ..., "exit_code": ...}); messages for people
go to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import psutil
from hermes_sup.agents.ledger import LedgerError
from hermes_sup.kanban import BoardError, BoardStore, TaskError
from hermes_sup.kanban.doccache import collector_paused
from hermes_sup.kanban.fsio import read_complete_lines
from hermes_sup.kanban.liveness import holder_alive
from hermes_sup.kanban.prefix import UnknownTaskId
from hermes_sup.kanban.why import Team
from rich.console import Console
from rich.text import Text

from . import render, team
from .cliargs import (
    JsonUsageCommand,
    JsonUsageGroup,
    Seconds,
    UsageError,
    emit_json,
    json_text,
    not_utf8,
    sane_children,
    sane_state,
)
from .control import CONTROL_SOCKET, SOCKET_DIR, request
from .ingestwarn import recent_rejections
from .interrupt import interruptible
from .procs import tree_rss_mb, trees_rss_mb
from .spec import build_specs
from .statefile import SUPERVISOR_FILE, read_state, supervisor_alive
from .sweep import LOCK_FILE, sweep
from .usage import board_model_calls, budget_standing_noted, summarize, team_calls
from .workspace import (
    EXAMPLE_NAMES,
    PRIVATE_UMASK,
    SHARED_UMASK,
    WORKSPACE_ENV,
    ConfigError,
    Workspace,
    board_settings,
    find_workspace,
    keep_out_of_git,
    load_config,
    open_workspace_board,
    private_dir,
    scaffold,
)

F = TypeVar("F", bound=Callable[..., Any])

# Markup and emoji codes off: a string that reaches print() by mistake is still printed as written.
# What people, agents and models wrote goes through render.literal/visible (see render.py).
out = Console(soft_wrap=False, markup=False, emoji=False)  # panels fit the width; a message passes soft_wrap=True
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)  # one line per message for grep
literal, visible = render.literal, render.visible


class Failure(Exception):
    """A command failed in a way the user can act on; carries its exit code."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def _exit(message: str, code: int, as_json: bool) -> NoReturn:
    if as_json:
        emit_json({"error": message, "exit_code": code})
    err.print(Text.assemble(("error:", "red"), " ", literal(message)), highlight=False)
    sys.exit(code)


def handled(func: F) -> F:
    """Turn the errors a user can cause into a message and an exit code, never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        as_json = bool(kwargs.get("as_json"))
        bad = not_utf8(kwargs)
        if bad is not None:
            ctx = click.get_current_context(silent=True)
            names = {param.name: param.human_readable_name for param in (ctx.command.params if ctx else [])}
            _exit(f"{names.get(bad, bad)}: the argument is not UTF-8 text", 2, as_json)
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            _exit(str(exc), 2, as_json)
        except Failure as exc:
            _exit(str(exc), exc.code, as_json)
        except (UsageError, UnknownTaskId) as exc:  # an id that names no task, or several: a usage error
            _exit(str(exc), 2, as_json)
        except (BoardError, TaskError) as exc:
            _exit(str(exc), 1, as_json)
        except OSError as exc:
            _exit(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "), 1, as_json)

    return wrapper  # type: ignore[return-value]


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document to stdout.")


def workspace_of(ctx: click.Context) -> Workspace:
    return find_workspace(ctx.obj.get("workspace"))


def open_board(ctx: click.Context) -> BoardStore:
    return open_workspace_board(workspace_of(ctx))


def refreshed(board: BoardStore) -> dict[str, Any]:
    """Without a running supervisor, a board command does its work: ingest drops, recover dead claims."""
    report = board.ingest()
    board.recover()
    return report.as_dict()


@click.group(cls=JsonUsageGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-w", "--workspace", type=click.Path(file_okay=False, path_type=Path),
              help="Workspace folder (else $HERMES_SUP_WORKSPACE, else the current folder upward).")
@click.version_option(package_name="hermes-sup")
@click.pass_context
def main(ctx: click.Context, workspace: Path | None) -> None:
    """hermes-sup: keep a team of LLM agents alive around a shared Kanban board of files."""
    # Nothing a command creates (hermes.yaml, the board's folders) is writable by others, even
    # under umask 000; `up` narrows further (see there).
    os.umask(os.umask(SHARED_UMASK) | SHARED_UMASK)
    ctx.ensure_object(dict)
    ctx.obj["workspace"] = workspace


# -- workspace --------------------------------------------------------------------------------------

@main.command()
@click.argument("directory", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option("--example", is_flag=False, flag_value="team", default=None, metavar="[team|research]",
              help="An example team with its tasks in kanban/inbox/: team (planner, two workers, reviewer; the "
                   "default) or research (papers read into a report, in granted folders).")
@json_option
@click.pass_context
@handled
def init(ctx: click.Context, directory: Path | None, example: str | None, as_json: bool) -> None:
    """Scaffold a workspace in DIRECTORY (default: -w, else $HERMES_SUP_WORKSPACE, else here):
    hermes.yaml, kanban/, skills/, runs/."""
    if example is not None and example not in EXAMPLE_NAMES:
        # `init --example DIR`, as it was written before examples had names: the team, in DIR.
        if directory is not None:
            raise Failure(f"no example named {example!r}; the examples are {', '.join(EXAMPLE_NAMES)}", 2)
        directory, example = Path(example), "team"
    root = init_root(directory, ctx.obj.get("workspace"), os.environ.get(WORKSPACE_ENV), Path.cwd())
    if root.exists() and not root.is_dir():
        raise Failure(f"{root} exists and is not a folder", 2)
    if example and (root / "hermes.yaml").exists():
        raise Failure(f"{root / 'hermes.yaml'} already exists; --example needs a folder without a team", 2)
    created = scaffold(root, example=example)
    open_workspace_board(Workspace(root)).close()
    private_dir(root / "runs")
    created += keep_out_of_git(root)
    if as_json:
        emit_json({"workspace": str(root), "created": created})
        return
    if created:
        out.print(literal(f"workspace ready in {root}: created {', '.join(created)}"), soft_wrap=True)
    else:
        out.print(literal(f"{root} is already a workspace; nothing to create"), soft_wrap=True)
    start = "hermes-sup up" if root == Path.cwd().absolute() else f"cd {root} && hermes-sup up"
    out.print(Text.assemble("next: ", (visible(start, one_line=True), "bold"),
                            ", then drop a task file into kanban/inbox/"), soft_wrap=True)  # one line for scripts


def init_root(directory: Path | None, workspace: Path | None, env: str | None, cwd: Path) -> Path:
    """Where `init` scaffolds (pure): DIRECTORY, else -w, else $HERMES_SUP_WORKSPACE, else the
    current folder, as every other command finds its workspace; DIRECTORY and -w naming two folders
    is a usage error rather than a guess."""
    def absolute(path: Path | str) -> Path:
        return (cwd / Path(path).expanduser()).absolute()

    if directory is not None and workspace is not None and absolute(directory) != absolute(workspace):
        raise Failure(f"init {directory} and -w {workspace} name two folders; name one", 2)
    chosen = directory if directory is not None else workspace if workspace is not None else env or None
    return absolute(chosen) if chosen else cwd.absolute()


# -- tasks ------------------------------------------------------------------------------------------

@main.group()
def task() -> None:
    """Add, read and change tasks on the board."""


# -- the board --------------------------------------------------------------------------------------

class BoardGroup(JsonUsageGroup, JsonUsageCommand):
    """`board` shows the board itself, and has subcommands (`board migrate`, cli_migrate.py)."""


@main.group("board", cls=BoardGroup, invoke_without_command=True)
@json_option
@click.option("--watch", is_flag=True,
              help="Redraw as tasks move, on the board's change events (--json: one document per line).")
@click.pass_context
@handled
def board_cmd(ctx: click.Context, as_json: bool, watch: bool) -> None:
    """The board as columns, with counts and the top tasks of each."""
    if ctx.invoked_subcommand is not None:
        return
    with open_board(ctx) as board:
        if watch:
            watch_board(board, as_json, lambda: team_now(ctx))
            return
        # Without the cyclic collector until it is printed: it walked the listing's hundreds of
        # thousands of objects (none in a cycle) again and again as they aged through its generations.
        with collector_paused():
            document = board_now(board, team_now(ctx), None if as_json else render.TOP_PER_COLUMN)
            if as_json:
                emit_json(document)
            else:
                render.print_board(out, document)


SETTLE = 0.05      # a burst of moves is drawn once it pauses this long...
SETTLE_MAX = 0.25  # ...or after this long, whichever comes first
SAFETY_RESCAN = 5.0  # events are a wake-up, not the truth (see kanban/watch.py): look again now and then


def board_now(board: BoardStore, members: Team | None, limit: int | None = None) -> dict[str, Any]:
    """The board as `board` shows it, after doing a board command's work (see refreshed) and
    setting damaged task files aside, with why each waiting task waits for the team `members`;
    with `limit`, only the first `limit` tasks of each column (what the picture shows: saying why
    each of 10,000 tasks waits would cost more than the rest of the command)."""
    ingest = refreshed(board)
    listing = board.list_fields()  # all a board shows or judges of a task, a fraction of its bytes
    board.quarantine_damaged(listing.damaged)
    ingested = set(ingest.get("ingested") or ())
    new = [doc for doc in listing.tasks if doc["id"] in ingested]
    shown = listing.tasks if limit is None else render.top_of_columns(listing.tasks, limit)
    statuses = {doc["id"]: doc["status"] for doc in listing.tasks}
    return render.board_document(listing.tasks, listing.damaged, ingest, team.reasons(shown, members, statuses),
                                 team.warnings_for(board, new, members), recent_rejections(board.root / "rejected"),
                                 limit=limit)


def team_now(ctx: click.Context) -> Team | None:
    """The team of hermes.yaml, with its agents' states when a supervisor runs."""
    ws = workspace_of(ctx)
    state = read_supervisor_state(ws)
    return team.load_team(ws, state, supervisor_alive(state))


def watch_board(board: BoardStore, as_json: bool, members: Callable[[], Team | None]) -> None:
    """Draw the board, then again each time the watcher reports a change that alters the picture."""
    from rich.live import Live

    board.start_watching()
    interruptible()  # leave the screen as Ctrl-C does
    live = Live(console=out, auto_refresh=False, screen=True) if out.is_terminal and not as_json else None
    drawn: Any = None
    try:
        if live is not None:
            live.start()
        while True:
            seen = board.signal.generation
            document = board_now(board, members(), None if as_json else render.TOP_PER_COLUMN)
            picture = {k: v for k, v in document.items() if k != "ingest"}
            if picture != drawn:
                drawn = picture
                if as_json:
                    click.echo(json_text(document))
                elif live is not None:
                    live.update(render.watched_board(document, board.watch_mode), refresh=True)
                else:
                    render.print_board(out, document)
            if board.signal.wait(seen, SAFETY_RESCAN):
                settle_until = time.monotonic() + SETTLE_MAX
                while time.monotonic() < settle_until:
                    seen = board.signal.generation
                    if not board.signal.wait(seen, SETTLE):
                        break
    except KeyboardInterrupt:
        pass
    finally:
        if live is not None:
            live.stop()


@main.command()
@json_option
@click.pass_context
@handled
def doctor(ctx: click.Context, as_json: bool) -> None:
    """Check the config, credentials (present, never their values), providers, process containment,
    the board's filesystem, watcher, inotify limits, damaged files and disk."""
    ws = workspace_of(ctx)
    from .doctor import BOARD_CONFIG, run_checks  # it brings the providers' code along, which no other command needs

    checks = run_checks(ws)
    worst = "ok"
    for check in checks:
        if check["level"] == "error":
            worst = "error"
        elif check["level"] == "warn" and worst == "ok":
            worst = "warn"
    if as_json:
        emit_json({"workspace": str(ws.root), "status": worst, "checks": checks})
    else:
        colour = {"ok": "green", "warn": "yellow", "error": "red", "info": "blue"}
        for check in checks:
            out.print(Text.assemble((f"{check['level']:>5}", colour[check["level"]]), " ",
                                    literal(f"{check['name']}: {check['detail']}")), highlight=False)
    if any(check["name"] == BOARD_CONFIG and check["level"] == "error" for check in checks):
        sys.exit(2)
    if worst == "error":
        sys.exit(1)


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


@main.command()
@click.option("-d", "--detach", is_flag=True,
              help="Run the supervisor in the background; return once every agent runs.")
@click.option("--agents", "agents_csv", metavar="A,B", help="Start only these agents.")
@click.option("--dashboard", "with_dashboard", is_flag=True,
              help="Also serve the web dashboard on 127.0.0.1 (see `dashboard`).")
@click.option("--dashboard-port", type=click.IntRange(0, 65535), default=8765, show_default=True,
              help="The dashboard's port with --dashboard.")
@click.pass_context
@handled
def up(ctx: click.Context, detach: bool, agents_csv: str | None, with_dashboard: bool = False,
       dashboard_port: int = 8765) -> None:
    """Start the supervisor and the team (foreground: events and agent logs; Ctrl-C stops)."""
    ws = workspace_of(ctx)
    config = load_config(ws.config_path)
    only = _agents_option(ws, config, agents_csv)
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
    from .metrics import serve_metrics
    from .runner import Supervisor

    try:
        supervisor = Supervisor(ws, config, only=only, say=lambda line: console.print(
            Text.assemble((time.strftime("%H:%M:%S"), "dim"), " ", literal(line)), highlight=False,
            soft_wrap=True))  # one line each, piped or not
        tail = LogTail(supervisor.children, out)
        tail.start()
        web = None
        if with_dashboard:  # in a thread of this process: it ends with the supervisor, however that ends
            from .cli_dashboard import dashboard_server, url_of

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
        tail.stop()
        if web is not None:
            web.stop()
    finally:
        singleton.release()
    sys.exit(code)


def _detach(ws: Workspace, agents_csv: str | None, dashboard_port: int | None = None) -> int:
    # -P: the workspace is the working directory, and its kanban/ board folder must not shadow
    # the kanban package.
    command = [sys.executable, "-P", "-m", "hermes_sup.supervisor", "-w", str(ws.root), "up"]
    if agents_csv:
        command += ["--agents", agents_csv]
    if dashboard_port is not None:
        command += ["--dashboard", "--dashboard-port", str(dashboard_port)]
    with open(ws.runs_path / "supervisor.log", "ab") as log:
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True)
    stall = Stall(DETACH_STALL, time.monotonic())
    while True:
        if proc.poll() is not None:
            err.print(literal(f"hermes-sup: the supervisor exited with status {proc.returncode}; "
                              f"see {ws.runs_path}/supervisor.log"))
            return 1
        state = read_supervisor_state(ws)
        agents = state.get("agents") or {} if state.get("pid") == proc.pid else {}
        if agents and all(a["state"] not in ("starting", "queued") for a in agents.values()):
            out.print(render.status_table(status_rows(state, ws.runs_path)))
            return 0 if all(a["state"] == "running" or a["held"] for a in agents.values()) else 1
        if stall.stalled(ready_progress(agents), time.monotonic()):
            ready = ready_progress(agents)[0]
            err.print(f"hermes-sup: agents did not all report ready: none more for {DETACH_STALL:g} s ({ready} of "
                      f"{len(agents)} ready); see `hermes-sup status`")
            return 1
        time.sleep(0.05)


DETACH_STALL = 60.0


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


class LogTail:
    """Prints what the agents write to their logs, prefixed by name (foreground `up` only; a
    display refresh on a short timer, not how crashes are found)."""

    def __init__(self, children: dict[str, Any], console: Console) -> None:
        self.children = children
        self.console = console
        self.offsets: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-tail", daemon=True)

    def start(self) -> None:
        for name, child in self.children.items():
            with contextlib.suppress(OSError):
                self.offsets[name] = (child.spec.workdir / "agent.log").stat().st_size
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._drain()

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._drain()

    def _drain(self) -> None:
        width = max((len(name) for name in self.children), default=0)
        for name, child in list(self.children.items()):
            if not is_regular(child.spec.workdir / "agent.log"):
                continue
            lines, self.offsets[name] = read_complete_lines(child.spec.workdir / "agent.log", self.offsets.get(name, 0))
            for line in lines:
                self.console.print(Text.assemble((visible(f"{name:<{width}}"), render.agent_colour(name)), " | ",
                                                 render.log_text(name, line.decode("utf-8", "replace"))),
                                   highlight=False, soft_wrap=True)  # a log line stays one line


def live_children(runs: Path, name: str) -> list[dict[str, Any]]:
    """The delegated child agents an agent reports in its state.json that are still running: the same
    process, pid and start time, as the agent saw start (a pid alone may have been reused since)."""
    return [child for child in sane_children(read_state(runs / name / "state.json"))
            if holder_alive(child["pid"], child["pid_started"], None) is True]


def status_rows(state: dict[str, Any], runs: Path) -> list[dict[str, Any]]:
    """Per agent: name, pid, state, restarts, uptime, task, rss, cpu, last exit (live from psutil),
    and its delegated children. CPU is sampled over one short interval for all agents together."""
    rows, live = [], []
    agents = state.get("agents") or {}
    alive = {name: agent["pid"] for name, agent in agents.items()
             if agent.get("pid") and holder_alive(agent["pid"], agent.get("pid_started"), None)}
    memory = trees_rss_mb(alive.values())  # one scan of the process table for every agent
    for name, agent in agents.items():
        row = {"name": name, **{k: agent.get(k) for k in ("pid", "state", "restarts", "task", "last_exit", "held")},
               "uptime_s": None, "rss_mb": None, "cpu_percent": None, "children": []}
        pid = alive.get(name)
        if pid:
            row["children"] = live_children(runs, name)
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                row["uptime_s"] = round(time.time() - proc.create_time(), 1)
                row["rss_mb"] = round(memory[pid], 1)
                proc.cpu_percent(None)  # starts the sample
                live.append((row, proc))
        rows.append(row)
    if live:
        time.sleep(0.1)
        for row, proc in live:
            with contextlib.suppress(psutil.Error):
                row["cpu_percent"] = proc.cpu_percent(None)
    return rows


def is_supervisor_process(pid: int) -> bool:
    """Whether `pid` runs `hermes-sup up`: checked before signalling it, never trusting the state file."""
    try:
        argv = psutil.Process(pid).cmdline()
    except psutil.Error:
        return False
    return "up" in argv and any(arg.endswith("hermes-sup") or arg == "hermes_sup.supervisor" for arg in argv)


def ask_supervisor(ws: Workspace, payload: dict[str, Any], timeout: float = 10.0) -> dict[str, Any] | None:
    """One command to the supervisor's control socket; None if nobody listens there."""
    try:
        reply = request(ws.runs_path, payload, timeout=timeout)
    except ValueError:
        reply = []
    if reply is not None and not isinstance(reply, dict):
        where = ws.runs_path / SOCKET_DIR / CONTROL_SOCKET
        raise Failure(f"the supervisor's control socket {where} answered something that is not a reply")
    return reply


@main.command()
@json_option
@click.pass_context
@handled
def status(ctx: click.Context, as_json: bool) -> None:
    """Per agent: pid, state, restarts, uptime, current task, rss, cpu, last exit, delegated children."""
    ws = workspace_of(ctx)
    state = read_supervisor_state(ws)
    running = supervisor_alive(state)
    if running:
        reply = ask_supervisor(ws, {"cmd": "status"}, timeout=5)
        if reply and reply.get("ok"):
            state = sane_state(reply.get("state"))
    rows = status_rows(state, ws.runs_path)
    document = {"running": running, "supervisor_pid": state.get("pid") if running else None,
                "workspace": str(ws.root), "agents": rows}
    if as_json:
        emit_json(document)
        return
    if not running:
        out.print("hermes-sup is not running in this workspace" + (" (last known state below)" if rows else ""))
    else:
        out.print(literal(f"hermes-sup running (pid {state.get('pid')}) in {ws.root}"))
    if rows:
        out.print(render.status_table(rows))


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


@main.command()
@click.argument("agent")
@json_option
@click.pass_context
@handled
def restart(ctx: click.Context, agent: str, as_json: bool) -> None:
    """Restart one agent (clears fatal; not counted as a crash)."""
    _ask(ctx, {"cmd": "restart", "agent": agent}, as_json)


@main.command()
@json_option
@click.pass_context
@handled
def reload(ctx: click.Context, as_json: bool) -> None:
    """Re-read hermes.yaml: start added agents, stop removed ones, restart changed ones."""
    _ask(ctx, {"cmd": "reload"}, as_json)


@main.command()
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
    if ask_supervisor(ws, payload) is None:
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


@main.command()
@json_option
@click.pass_context
@handled
def usage(ctx: click.Context, as_json: bool) -> None:
    """Tokens and cost per agent, per task and per provider, from the LLM-call logs (on a shared
    board, every host's)."""
    ws = workspace_of(ctx)
    shared = board_settings(ws)[0].get("backend") != "files"  # a shared board: the other hosts' calls too
    records, notes = team_calls(ws.runs_path, (lambda: board_model_calls(lambda: open_board(ctx))) if shared else None)
    summary = summarize(records)
    try:
        config = load_config(ws.config_path)
        budgets, ledger_notes = budget_standing_noted(
            ws.runs_path, config.get("budgets"), time.time(), board=config.get("board"),
            host=config.get("host")) if config.get("budgets") else ([], [])
        notes += ledger_notes
        notes += [f"agent {agent['name']} runs a CLI (runtime: command) that reports no tokens or cost: its runs "
                  "are not in these figures" for agent in config.get("agents") or []
                  if agent.get("runtime") == "command"]
    except (ConfigError, LedgerError) as exc:
        budgets = []
        notes.append(f"budgets not shown: {exc}")
    if as_json:
        emit_json({**summary, "budgets": budgets, "notes": notes})
        return
    for note in notes:
        err.print(Text.assemble(("note:", "yellow"), " ", literal(note)))
    if budgets:
        out.print(render.budget_table(budgets))
    total = summary["total"]
    if not total["calls"]:
        out.print("no LLM calls yet")
        return
    out.print(render.usage_table("agent", summary["agents"]))
    out.print(render.usage_table("provider (model)", summary["providers"]))
    out.print(render.usage_table("task", summary["tasks"]))
    unpriced = f" ({total['unpriced_calls']} calls unpriced: add their models to `prices`)" \
        if total["unpriced_calls"] else ""
    about = "~" if total["estimated_calls"] else ""
    out.print(f"total: {total['calls']} calls, {about}{total['tokens_in']:,} tokens in ({total['tokens_cached']:,} "
              f"cached), {about}{total['tokens_out']:,} out, ${total['cost_usd']:.4f}{unpriced}")
    if total["estimated_calls"]:
        out.print(f"~ estimated: {total['estimated_calls']} calls ({total['tokens_estimated']:,} tokens) got no usage "
                  "from their server and are counted at 4 characters a token")


@main.group()
def skills() -> None:
    """The skills: Python files that add tools, and instruction skills (SKILL.md)."""


def _skills(ctx: click.Context, name: str | None = None) -> Any:
    from hermes_sup.agents.skills import SKILL_NAME, Skills  # only these commands need the agents package

    if name is not None and not SKILL_NAME.fullmatch(name):
        raise Failure(f"{name!r} is not a skill name (a-z, 0-9 and _, starting with a letter)", 2)
    return Skills(workspace_of(ctx).root)


@skills.command("list")
@json_option
@click.pass_context
@handled
def skills_list(ctx: click.Context, as_json: bool) -> None:
    """Every skill, where it comes from, whether it is valid (and why not), and its tools."""
    rows = [skill.as_dict() for skill in _skills(ctx).catalog()]
    if as_json:
        emit_json({"skills": rows})
        return
    if not rows:
        out.print("no skills (drop a .py file or a folder with a SKILL.md into skills/)")
        return
    out.print(render.skills_table(rows))


@skills.command("history")
@click.argument("name")
@json_option
@click.pass_context
@handled
def skills_history(ctx: click.Context, name: str, as_json: bool) -> None:
    """The versions of a skill kept by skill_manage and rollbacks, oldest first."""
    found = _skills(ctx, name)
    entries = found.history(name)
    if not entries and name not in found.names():  # a typo is not a skill without history
        raise Failure(f"no skill named {name!r}; skills: {', '.join(sorted(found.names())) or 'none'}")
    if as_json:
        emit_json({"skill": name, "versions": entries})
        return
    if not entries:
        out.print(literal(f"skill {name} has no earlier versions"))
        return
    for entry in entries:
        out.print(literal(f"{entry.get('version', '?'):>3}  {entry.get('at')}  {entry.get('digest')}  "
                          f"by {entry.get('by')}: {entry.get('note')}", one_line=True), highlight=False)


@skills.command("rollback")
@click.argument("name")
@click.argument("version", type=click.IntRange(1, 10**9), required=False)
@json_option
@click.pass_context
@handled
def skills_rollback(ctx: click.Context, name: str, version: int | None, as_json: bool) -> None:
    """Make an earlier version of a skill current again (default: the latest kept)."""
    from hermes_sup.agents.tools import ToolError

    try:
        chosen, skill = _skills(ctx, name).rollback(name, version, by="cli")
    except ToolError as exc:
        raise Failure(str(exc)) from None
    if as_json:
        emit_json({"skill": name, "restored": chosen, **skill.as_dict()})
        return
    out.print(literal(f"skill {name}: version {chosen} restored ({skill.state}"
                      f"{': ' + skill.error if skill.error else ''})"), highlight=False)


def is_regular(path: Path) -> bool:
    """Whether `path` is a regular file: a log an agent replaced by a FIFO would block its reader
    (up's log thread, then up's shutdown) forever."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def read_supervisor_state(ws: Workspace) -> dict[str, Any]:
    return sane_state(read_state(ws.runs_path / SUPERVISOR_FILE))


# Register, on the groups above, the task commands (cli_task: add, list, show, cancel, answer, retry,
# move; cli_tasklog: task log), `events` (cli_events), `logs` (cli_logs), and `stop`, `start`, `ps`,
# `task wait` and `task comment` (cli_steer), `schedules` (cli_schedules), `dashboard` (cli_dashboard),
# `import-hermes` (cli_hermes), `prune` (cli_prune), `board migrate` (cli_migrate).
from . import (  # noqa: E402, F401
    cli_dashboard,
    cli_events,
    cli_hermes,
    cli_logs,
    cli_migrate,
    cli_prune,
    cli_schedules,
    cli_steer,
    cli_task,
    cli_tasklog,
)
