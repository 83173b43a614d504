"""`runtime: command`: an agent that works each task it claims by running an agent CLI (`codex exec`,
`claude -p`, `hermes chat -q`, ...) in the task's folder, confined as a `terminal` command is.

The agent process stays hermes-sup's: it claims, heartbeats and is restarted as any agent is; the CLI
is its child for one task. `argv` takes `{prompt}` (the task as a model would first see it),
`{task_id}` and `{workdir}`; each is one argument, never through a shell. Exit 0 is done with the
CLI's output as the result, or the file it wrote at `$HERMES_SUP_RESULT` when there is one; another
exit is a failed attempt whose reason is the output's last lines; a cancel or a stop ends the CLI and
all it started (SIGTERM, then SIGKILL), and `max_runtime` bounds it. The decisions are pure
(fill, judge); run() is the shell around them.
"""

from __future__ import annotations

import os
import stat
import string
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import sandbox
from .terminal import Output, clean_env, command_for, communicate, kill_group, withheld
from .tools import ToolContext

PLACEHOLDERS = ("prompt", "task_id", "workdir")
DEFAULT_MAX_RUNTIME = 3600.0
RESULT_FILE = ".hermes-sup-result"  # in the task's folder; its path is $HERMES_SUP_RESULT
MAX_RESULT_BYTES = 1 << 20
REASON_LINES = 20


def fields(part: str) -> list[str]:
    """The placeholder names in one argument of `argv` (pure); ValueError for a malformed one (a `{`
    not closed). `{{` and `}}` are a literal brace."""
    return [name for _, name, _, _ in string.Formatter().parse(part) if name is not None]


def argv_problem(argv: Any) -> str:
    """Why `argv` cannot be a command runtime's, or "" (pure)."""
    if not isinstance(argv, list) or not argv or not all(isinstance(p, str) and p and "\0" not in p for p in argv):
        return "'argv' must be a non-empty list of non-empty strings (the CLI and its arguments)"
    for part in argv:
        try:
            names = fields(part)
        except ValueError:
            return f"'argv' item {part!r} has a brace that is not closed (write {{{{ and }}}} for literal braces)"
        unknown = [name for name in names if name not in PLACEHOLDERS]
        if unknown:
            return (f"'argv' item {part!r} names {{{unknown[0]}}}; the placeholders are "
                    + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS))
    if fields(argv[0]):
        return "'argv' must start with the program itself, not a placeholder"
    return ""


def fill(argv: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """`argv` with its placeholders replaced by `values` (pure): each argument stays one argument,
    whatever the task's text holds (quotes, `;`, `$(...)`, braces)."""
    filled = []
    for part in argv:
        pieces = []
        for literal, name, _, _ in string.Formatter().parse(part):
            pieces.append(literal)
            if name is not None:
                pieces.append(values[name])
        filled.append("".join(pieces))
    return filled


@dataclass(frozen=True)
class Verdict:
    kind: str                 # done | failed | interrupted
    result: dict[str, Any]
    reason: str = ""


def judge(returncode: int | None, output: str, result_file: str | None, *, stopped: bool, timed_out: bool,
          max_runtime: float, program: str) -> Verdict:
    """What a CLI's run makes of its task (pure)."""
    if stopped:
        return Verdict("interrupted", {})
    tail = "\n".join(output.rstrip().splitlines()[-REASON_LINES:])
    if timed_out:
        return Verdict("failed", {}, f"{program} ran longer than max_runtime ({max_runtime:g} s) and was ended"
                                     + (f"; its last output:\n{tail}" if tail else ""))
    if returncode != 0:
        return Verdict("failed", {}, f"{program} exited with status {returncode}"
                                     + (f"; its last output:\n{tail}" if tail else " and printed nothing"))
    if result_file is not None:
        return Verdict("done", {"answer": result_file, "output": output})
    return Verdict("done", {"answer": output})


def workdir_for(ctx: ToolContext) -> Path:
    """Where the CLI works: the task's worktree of a granted repository (the first, by name) when the
    agent has one, else the task's folder."""
    folders = ctx.settings.get("folders") or {}
    trees = sorted((name, spec["tree"]) for name, spec in folders.items()
                   if isinstance(spec, dict) and isinstance(spec.get("tree"), str))
    return Path(trees[0][1]) if trees else Path(ctx.scratch)


@dataclass(frozen=True)
class Run:
    """How a CLI's run for one task ended: what judge() and hermesrun.judge() decide from."""
    returncode: int | None
    output: str
    stopped: bool
    timed_out: bool
    seconds: float
    problem: str = ""  # it could not be started (or confined): the reason


def run(ctx: ToolContext, argv: list[str], env: dict[str, str], capabilities: Sequence[str], max_runtime: float,
        *, shown: Sequence[str] = (), writable: Sequence[Path] = (), conceal: Sequence[Path] = ()) -> Run:
    """Run `argv` for the task in `ctx`: in its worktree or folder (workdir_for), confined as a
    `terminal` command with the grants, the files `shown` readable, the folders `writable` too and
    `conceal` hidden (inside those); its
    environment the agent's without any credential plus `env`. A cancel or a stop ends it and all it
    started (SIGTERM, then SIGKILL), and so does `max_runtime`."""
    from .files import root_of

    own, workdir = root_of(ctx), workdir_for(ctx)
    env = {**clean_env(os.environ, withheld(ctx.settings)), **env}
    try:
        confined, env = command_for(ctx.settings, capabilities, ctx.workspace, workdir, own, env, argv, shown=shown,
                                    extra=[(path, True) for path in writable], conceal=conceal)
    except sandbox.SandboxRefused as exc:
        return Run(None, "", False, False, 0.0, str(exc))
    started = time.monotonic()
    try:
        proc = subprocess.Popen(confined, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, process_group=0, close_fds=True)
    except OSError as exc:
        return Run(None, "", False, False, 0.0, f"{argv[0]} could not be started: {exc.strerror or exc}")
    output = Output()
    stopped = timed_out = False
    try:
        timed_out = communicate(proc, ctx, max_runtime, output)
    except InterruptedError:  # a cancel, or the agent stopping
        stopped = True
    finally:
        kill_group(proc)  # a grandchild left running goes too (the sandbox's pid namespace or launcher)
        assert proc.stdout is not None
        proc.stdout.close()
        proc.wait()
    return Run(proc.returncode, output.text(), stopped, timed_out, round(time.monotonic() - started, 2))


def work(ctx: ToolContext, prompt: str, capabilities: Sequence[str]) -> Verdict:
    """Run the agent's CLI (`ctx.settings["runtime"]`, kind command) for the task in `ctx` and judge
    it. Its environment holds those `env_from` names, HERMES_SUP_TASK_ID and HERMES_SUP_RESULT."""
    from .files import root_of

    runtime = ctx.settings.get("runtime") or {}
    max_runtime = float(runtime.get("max_runtime") or DEFAULT_MAX_RUNTIME)
    task_id = str((ctx.task or {}).get("id"))
    result_path = root_of(ctx) / RESULT_FILE
    result_path.unlink(missing_ok=True)  # an earlier attempt's is not this one's
    argv = fill(runtime["argv"], {"prompt": prompt, "task_id": task_id, "workdir": str(workdir_for(ctx))})
    env = {**given_env(runtime), "HERMES_SUP_TASK_ID": task_id, "HERMES_SUP_RESULT": str(result_path)}
    ran = run(ctx, argv, env, capabilities, max_runtime)
    if ran.problem:
        return Verdict("failed", {}, ran.problem)
    result = _result(result_path) if ran.returncode == 0 and not ran.stopped else None
    verdict = judge(ran.returncode, ran.output, result, stopped=ran.stopped, timed_out=ran.timed_out,
                    max_runtime=max_runtime, program=os.path.basename(runtime["argv"][0]))
    return Verdict(verdict.kind, {**verdict.result, "seconds": ran.seconds}
                   if verdict.kind == "done" else verdict.result, verdict.reason)


def given_env(runtime: Mapping[str, Any]) -> dict[str, str]:
    """The CLI's own keys, only as hermes.yaml names them (env_from: {ITS_NAME: OUR_VARIABLE})."""
    return {name: os.environ.get(ours, "") for name, ours in (runtime.get("env_from") or {}).items()}


def _result(path: Path) -> str | None:
    """The result file the CLI wrote, as text (at most MAX_RESULT_BYTES), or None. Opened without
    following a link: the CLI may have left one pointing anywhere the agent can read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO would hold the agent
            return None
        data = os.read(fd, MAX_RESULT_BYTES + 1)
    finally:
        os.close(fd)
    text = data[:MAX_RESULT_BYTES].decode("utf-8", "replace")
    return text + ("\n[... cut at 1 MiB]" if len(data) > MAX_RESULT_BYTES else "")
