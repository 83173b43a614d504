"""The `terminal` tool: a shell command in the agent's folder, with a timeout, its output capped, in
a process group of its own (the timeout kills the whole group; the supervisor kills every group of
the agent's session when the agent exits, so nothing it started outlives it), with no API key in
its environment, and refused when it matches a destructive pattern the agent's config has not
approved (`terminal: {approve: [rule, ...]}`).

Hermes Agent's `background: true` starts the command and returns at once: its output goes to a log
file in the agent's folder (read with read_file), kept to its first and its latest
BACKGROUND_LOG_KEEP bytes, and its process group is killed at its deadline (`timeout`, default an
hour), when its task ends or is stopped, or with the agent."""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from . import sandbox
from .tools import Tool, ToolContext, ToolError, register

DEFAULT_TIMEOUT = 60.0
MAX_TIMEOUT = 600.0
BACKGROUND_TIMEOUT = 3600.0
MAX_BACKGROUND_TIMEOUT = 86400.0
BACKGROUND_LOGS = ".background"
MAX_OUTPUT = 20_000
# Bytes of a background command's output its log keeps at each end (the start, and the latest, which
# are rewritten at most every LOG_FLUSH seconds): a `yes` left running for its hour fills no disk.
BACKGROUND_LOG_KEEP = 1 << 20
LOG_FLUSH = 0.5
# The signals our own stops send (down, restart, the memory limit, a cancel), and how long a command
# ended by one waits for the agent's stop request to arrive before its exit counts as a result.
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})
STOP_GRACE = 2.0
KILL_GRACE = 0.5  # how long a command asked to stop has before its group is killed

# Rule name -> pattern. The names are what `terminal.approve` lists to allow one.
DENY_RULES: dict[str, re.Pattern[str]] = {
    "rm-root": re.compile(r"\brm\s+(-[a-zA-Z]*[rR][a-zA-Z]*\s+|--recursive\s+|--no-preserve-root\s+|-[a-zA-Z]+\s+)*"
                          r"(/|/\*|~|~/|\$HOME|/[a-z]+/?)(\s|$|;|&|\|)"),
    "block-device": re.compile(r"(\bof=/dev/(sd|nvme|hd|vd|xvd|mmcblk|disk)|>\s*/dev/(sd|nvme|hd|vd|xvd|mmcblk|disk))"),
    "mkfs": re.compile(r"\b(mkfs(\.\w+)?|mkswap|wipefs|fdisk|parted|sgdisk)\b"),
    "fork-bomb": re.compile(r":\s*\(\s*\)\s*\{.*:\s*\|\s*:.*\}|\bfork\s*\(\s*\)\s*while|while\s*true.*&\s*done"),
    "power": re.compile(r"(?:^|[;&|(]\s*|\bsudo\s+)(shutdown|reboot|halt|poweroff|init\s+[06])(\s|;|$)"),
    "kill-all": re.compile(r"\bkill(all)?\s+(-\w+\s+)*-1\b|\bpkill\s+-9\s+-?u?\s*\S*\s*\.\*"),
    "chmod-root": re.compile(r"\bch(mod|own)\s+(-[a-zA-Z]*R[a-zA-Z]*\s+)\S+\s+/(\s|$)"),
}
SECRET_NAMES = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)


def denied(command: str, approved: tuple[str, ...] = ()) -> str | None:
    """The name of the first deny rule `command` matches and the config does not approve (pure)."""
    for name, pattern in DENY_RULES.items():
        if name not in approved and pattern.search(command):
            return name
    return None


# The agent's OTLP exporter's settings (agents/telemetry.py): its headers are where a collector's key
# goes (`x-honeycomb-team=...`, `Authorization=Bearer ...`), its endpoint may hold a user and password.
OTLP_SECRETS = re.compile(r"^OTEL_EXPORTER_OTLP_(\w+_)?(HEADERS|ENDPOINT)$", re.IGNORECASE)


def clean_env(env: Mapping[str, str], keys: Collection[str] = ()) -> dict[str, str]:
    """The environment without anything that looks like a credential, nor the variables the
    agent's providers take their keys from (`keys`, which may be named anyhow), nor the agent's
    collector's headers and address (pure)."""
    return {key: value for key, value in env.items()
            if not SECRET_NAMES.search(key) and key not in keys and not OTLP_SECRETS.match(key)}


def withheld(settings: Mapping[str, Any]) -> set[str]:
    """The variables no command is given whatever their names (pure): those the agent's providers take
    their keys from, and those holding the board database's connection string (the default and the
    one `board: {dsn_env}` names), whose password opens every row of the board to whoever reads it."""
    from ..kanban.backends import DEFAULT_DSN_ENV  # here: a skill's call imports this module, and pays for it
    from .keys import key_names

    board = settings.get("board")
    named = board.get("dsn_env") if isinstance(board, Mapping) else None
    return key_names(settings.get("llm") or {}) | {DEFAULT_DSN_ENV} | ({named} if isinstance(named, str) else set())


def _cap(text: str, dropped: int = 0) -> str:
    """At most MAX_OUTPUT characters: the start and the end, saying how much of the middle is cut
    (`dropped`: bytes already left out while the command ran)."""
    if len(text) <= MAX_OUTPUT and not dropped:
        return text
    half = MAX_OUTPUT // 2
    cut = max(0, len(text) - MAX_OUTPUT)
    what = f"{cut:,} characters" if not dropped else f"{dropped:,} bytes and {cut:,} characters"
    return f"{text[:half]}\n[... {what} cut ...]\n{text[-half:] if len(text) > half else ''}"


class Output:
    """A command's output as it arrives, kept to its first and last KEEP bytes: `yes`, or a `cat`
    of a large log, must not grow the agent past its memory limit (it would be killed, and so would
    the next attempt) for the 20,000 characters the model is shown."""

    KEEP = MAX_OUTPUT * 4  # bytes: enough for MAX_OUTPUT // 2 characters of UTF-8 at each end

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, data: bytes) -> None:
        room = self.keep - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        self.tail += data
        if len(self.tail) > self.keep:
            excess = len(self.tail) - self.keep
            self.dropped += excess
            del self.tail[:excess]

    def text(self) -> str:
        if not self.dropped:
            return _cap((self.head + self.tail).decode("utf-8", "replace"))
        return _cap(self.head.decode("utf-8", "replace") + self.tail.decode("utf-8", "replace"), self.dropped)


class BackgroundLog:
    """A background command's log file: its output as it comes until there is more than twice `keep`
    bytes of it; from then on the start, a line saying how much was cut, and the latest output."""

    def __init__(self, fd: int, keep: int = BACKGROUND_LOG_KEEP) -> None:
        self.fd = fd
        self.output = Output(keep)
        self.shown = 0  # the bytes cut when the file was last rewritten
        self.stale = False  # a write failed (a full disk): the file is rewritten whole once one succeeds

    def add(self, data: bytes) -> None:
        self.output.add(data)
        if self.output.dropped or self.stale:
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]  # the file is all of the output so far, as it came
        except OSError:
            self.stale = True  # never an end of the watcher: it must still stop the command in time

    def flush(self) -> None:
        """Rewrite what follows the start (all of it after a failed write), if it changed since."""
        dropped = self.output.dropped
        if dropped == self.shown and not self.stale:
            return
        cut = f"\n[... {dropped:,} bytes of output cut; the latest follow ...]\n".encode() if dropped else b""
        rest = cut + self.output.tail
        try:
            if self.stale:
                os.pwrite(self.fd, self.output.head, 0)
            os.pwrite(self.fd, rest, len(self.output.head))
            os.ftruncate(self.fd, len(self.output.head) + len(rest))
        except OSError:
            self.stale = True
            return
        self.shown, self.stale = dropped, False


def _workdir(ctx: ToolContext, workdir: object) -> Any:
    """Where the command runs: the agent's folder, or a folder inside it (Hermes gives absolute paths:
    one inside the folder is taken as relative to it)."""
    from .files import confined, root_of

    if workdir in (None, ""):
        return ctx.scratch
    if isinstance(workdir, str) and os.path.isabs(workdir):
        root, normal = root_of(ctx), Path(os.path.normpath(workdir))
        if normal == root or root in normal.parents:
            workdir = f"./{os.path.relpath(normal, root)}"  # the task's own, even where a grant has its name
    folder = confined(ctx, workdir, allow_root=True)  # or a granted folder
    if not folder.is_dir():
        raise ToolError(f"workdir {workdir} is not a folder in your folder or a granted one")
    return folder


def confined_command(ctx: ToolContext, cwd: Path, env: dict[str, str],
                     argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """(command line, environment) that run `argv` in `cwd` as the agent's `sandbox` allows
    (agents/sandbox.py); ToolError when it cannot be confined and the agent may not run it otherwise."""
    from .files import root_of

    try:
        return command_for(ctx.settings, ctx.grants or (), ctx.workspace, Path(cwd), root_of(ctx), env, argv)
    except sandbox.SandboxRefused as exc:
        raise ToolError(str(exc)) from None


def command_for(settings: Mapping[str, Any], capabilities: Collection[str], workspace: Path | None, cwd: Path,
                own: Path, env: dict[str, str], argv: list[str], shown: Collection[str] = (),
                library: Collection[Path] = (), own_writable: bool = True,
                conceal: Collection[Path] = (), extra: Collection[tuple[Path, bool]] = ()
                ) -> tuple[list[str], dict[str, str]]:
    """`argv` confined to its `own` folder and the folders `settings` grant (a terminal command's, an
    MCP server's, a skill tool's), with the files `shown` readable (and sandbox.plan's `library` and
    `own_writable`), and the `extra` folders (path, writable) as the grants are; SandboxRefused when
    the agent's `sandbox` cannot be had here."""
    from .grants import grants_of

    interpreter = [os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)] + [
        os.path.realpath(p) for p in env.get("PATH", "").split(os.pathsep) if p]
    # A version manager's shims (pyenv, rbenv, asdf: ROOT/shims) run ROOT's own programs.
    interpreter += [os.path.dirname(p) for p in interpreter if os.path.basename(p) == "shims"]
    interpreter += [os.path.realpath(p) for p in shown]
    # Where this Python finds its packages (a .pth may add folders outside its prefix): what a skill's
    # call and a command's own `python` import from, shown read-only (never the workspace: plan()).
    interpreter += [os.path.realpath(p) for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)]
    grants = grants_of(settings)
    # A worktree's files are its tree; git there reads the repository's own .git (read-only: the
    # commit is the agent's, at done, never a command's).
    folders = [(g.root, g.writable) for g in grants] + [(g.path / ".git", False) for g in grants if g.tree]
    folders += [(Path(os.path.realpath(path)), writable) for path, writable in extra]
    # Hidden wherever they are: the team's folders not granted here, and the workspace's runs/ and
    # kanban/ where a link puts them outside it (folders.py allows runs/ on another disk).
    hidden = [*conceal, *(Path(p) for p in settings.get("folders_hidden") or () if isinstance(p, str))]
    if workspace is not None:
        root = Path(workspace).resolve()
        hidden += [real for real in (Path(os.path.realpath(Path(workspace) / name)) for name in ("runs", "kanban"))
                   if not (real == root or root in real.parents)]
    # Where it really is: the sandbox shows folders at their real paths (runs/ may be a link to another
    # disk, and the link itself lies in the hidden workspace).
    cwd, own = Path(os.path.realpath(cwd)), Path(os.path.realpath(own))
    conf = sandbox.plan(cwd, own, folders, workspace=Path(workspace).resolve() if workspace else None,
                        network="network" in capabilities, env=env, home=os.environ.get("HOME"),
                        interpreter=interpreter, private=sandbox.private_here(), library=tuple(library),
                        own_writable=own_writable, conceal=tuple(hidden))
    return sandbox.wrap(str(settings.get("sandbox") or "auto"), conf, argv)


def terminal(ctx: ToolContext, args: dict[str, Any]) -> str:
    settings = ctx.settings.get("terminal") or {}
    command = args["command"]
    rule = denied(command, tuple(settings.get("approve") or ()))
    if rule:
        raise ToolError(f"refused: the command matches the deny rule '{rule}' (destructive); an operator can "
                        f"allow it with terminal: {{approve: [{rule}]}} in hermes.yaml")
    ctx.scratch.mkdir(parents=True, exist_ok=True)
    cwd = _workdir(ctx, args.get("workdir"))
    argv, env = confined_command(ctx, cwd, clean_env(os.environ, withheld(ctx.settings)), ["/bin/sh", "-c", command])
    if args.get("background"):
        return background(ctx, argv, cwd, env, args)
    limit = float(settings.get("timeout", DEFAULT_TIMEOUT))
    if float(args.get("timeout") or 0) > MAX_TIMEOUT:
        raise ToolError(f"timeout {args['timeout']} s is above {MAX_TIMEOUT:g} s, the most a command may hold the "
                        "agent; run a longer one with background: true")
    timeout = min(float(args.get("timeout") or limit), MAX_TIMEOUT)
    proc = subprocess.Popen(argv, cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            process_group=0, close_fds=True)
    output = Output()
    try:
        timed_out = communicate(proc, ctx, timeout, output)
    finally:
        kill_group(proc)  # what the command left running in the background goes with it
        assert proc.stdout is not None
        proc.stdout.close()
        proc.wait()
    if not timed_out and _stopped_by_us(ctx, proc.returncode):
        raise InterruptedError
    text = output.text()
    if timed_out:
        raise ToolError(f"timed out after {timeout:g} s (the command's processes were killed)\n{text}")
    if proc.returncode != 0:
        return f"exit status {proc.returncode}\n{text}"
    return text


def background(ctx: ToolContext, argv: list[str], cwd: Any, env: dict[str, str], args: dict[str, Any]) -> str:
    """Start `command` without waiting for it; a thread kills its group at the deadline or when the
    task is stopped."""
    from .files import root_of

    timeout = min(float(args.get("timeout") or BACKGROUND_TIMEOUT), MAX_BACKGROUND_TIMEOUT)
    logs = root_of(ctx) / BACKGROUND_LOGS
    logs.mkdir(exist_ok=True)
    if logs.is_symlink() or not logs.is_dir():
        raise ToolError(f"refused: {BACKGROUND_LOGS} in your folder is not a real folder")
    log_name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}.log"
    fd = os.open(logs / log_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # Through a pipe the watcher drains into the log, never the file itself: the command could
        # write to that without end.
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, process_group=0, close_fds=True)
    except BaseException:
        os.close(fd)
        raise
    threading.Thread(target=_watch_background, args=(proc, ctx.stop, timeout, BackgroundLog(fd)), daemon=True,
                     name=f"background-{proc.pid}").start()
    unsupported = [name for name in ("notify_on_complete", "watch_patterns", "pty") if args.get(name)]
    note = (f"\n({', '.join(unsupported)}: not available here; read the log to follow it)" if unsupported else "")
    return (f"started in the background: pid {proc.pid}; its output goes to {BACKGROUND_LOGS}/{log_name} (read it "
            f"with read_file); it is stopped after {timeout:g} s, when this task ends, or with the agent"
            f"{note}")


def _watch_background(proc: subprocess.Popen[bytes], stop: threading.Event, timeout: float,
                      log: BackgroundLog) -> None:
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    flushed = time.monotonic()
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            open_ = True
            while time.monotonic() < deadline and not stop.is_set() and proc.poll() is None:
                wait = min(0.5, max(0.0, deadline - time.monotonic()))
                if open_ and selector.select(timeout=wait):
                    data = os.read(fd, 1 << 16)
                    if data:
                        log.add(data)
                    else:
                        open_ = False
                elif not open_:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=wait)
                if time.monotonic() - flushed >= LOG_FLUSH:
                    log.flush()
                    flushed = time.monotonic()
            kill_group(proc)  # what it left running goes with it, as in the foreground
            if open_:
                _drain(selector, fd, log)
            log.flush()
    finally:
        kill_group(proc)  # also when reading failed: a command never outlives its watcher
        proc.stdout.close()
        os.close(log.fd)
        proc.wait()


def communicate(proc: subprocess.Popen[bytes], ctx: ToolContext, timeout: float, output: Output) -> bool:
    """Collect the command's output into `output` until it has ended; whether it ran out of time.
    Waits in short slices so that a stop request (SIGTERM to the agent) ends the command too."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        open_ = True
        while open_ or proc.poll() is None:
            # Looked at before every read: a command that never stops writing (`yes`) is ended by a
            # stop or its timeout all the same.
            if ctx.stop.is_set():
                kill_group(proc)
                raise InterruptedError
            if time.monotonic() >= deadline:  # the command, or something holding its output, still runs
                kill_group(proc)
                if open_:
                    _drain(selector, fd, output)
                return True
            left = max(0.0, deadline - time.monotonic())
            if open_ and selector.select(timeout=min(0.2, left)):
                data = os.read(fd, 1 << 16)
                if data:
                    output.add(data)
                else:
                    open_ = False
                continue
            if not open_:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=min(0.2, left))
    return False


def _drain(selector: selectors.BaseSelector, fd: int, output: Output | BackgroundLog, within: float = 1.0) -> None:
    """What a killed command had written and not yet read, for a second at most (a process it
    moved out of its group may still hold the pipe open)."""
    end = time.monotonic() + within
    while time.monotonic() < end and selector.select(timeout=max(0.0, end - time.monotonic())):
        data = os.read(fd, 1 << 16)
        if not data:
            return
        output.add(data)


def died_of(returncode: int | None) -> int | None:
    """The signal a command died of, from its exit status: negative when the shell itself was
    killed, 128 + N when the shell reports a child killed by N (pure)."""
    if returncode is None or returncode == 0:
        return None
    if returncode < 0:
        return -returncode
    return returncode - 128 if 128 < returncode < 160 else None


def _stopped_by_us(ctx: ToolContext, returncode: int | None) -> bool:
    """Whether a command was ended by our own stop. The supervisor signals the agent's whole session
    at once, so the command may die before the agent has turned the signal into its stop request: a
    command ended by a stop signal waits a moment for that request. One killed by anything else, or
    with no stop following, has its exit status as its result, like any other."""
    return died_of(returncode) in STOP_SIGNALS and ctx.stop.wait(STOP_GRACE)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop the command and its process group. The command's first process is asked first: the
    Landlock launcher then kills what left the group (`setsid`), which becomes its child."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


register(Tool("terminal", "Run a shell command in your folder and get its output (exit status shown when not 0).",
              terminal, {"type": "object", "properties": {
                  "command": {"type": "string", "minLength": 1},
                  "timeout": {"type": "number", "minimum": 1, "description": "seconds (default 60)"},
                  "background": {"type": "boolean", "description": "return at once; output to a log file"}},
                  "required": ["command"], "additionalProperties": False},
              capabilities=("shell",), toolset="terminal", hidden={
                  "workdir": {"type": "string"}, "notify_on_complete": {"type": "boolean"},
                  "watch_patterns": {"type": "array", "items": {"type": "string"}}, "pty": {"type": "boolean"}}))
