"""A Python skill's tools as the agent offers them: each call runs the skill in a process of its own
(agents/skillrun.py), confined as a terminal command is, with the rights its declared capabilities
name; no code of a skill ever runs in the agent's process.

The confinement follows the declaration: `fs.write` writes the task's folder and the `rw` grants,
`fs.read` reads every grant; without either a call sees no grant and its task's folder read-only,
without `network` it has none. The code
that runs is the code that was checked (its digest is compared at every call); the process has no
credential in its environment, cannot read the workspace (`.env`, `runs/`, the board), and asks the
agent for a model call over its pipe (`ctx.llm`), so budgets and the log of calls hold. Our own
package is shown to it from a copy of its `.py` files (`runs/.skillrun/<digest>/`): in a checkout
the package's folders are the workspace's, and `kanban/` there is the board too.
"""

from __future__ import annotations

import ast
import compileall
import contextlib
import fcntl
import functools
import hashlib
import json
import os
import selectors
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from . import sandbox
from .terminal import SECRET_NAMES, STOP_SIGNALS, clean_env, command_for, died_of, kill_group, withheld
from .tools import Tool, ToolContext, ToolError

CALL_TIMEOUT = 600.0   # of the call's own work; time spent waiting on the model is not counted
MAX_LINE = 2 << 20     # bytes of one answer line (a result is cut to 20,000 characters anyway)
KEEP_STDERR = 2048     # the end of what the skill printed, shown when it fails
PACKAGES = ("agents", "kanban")  # of hermes_sup: what a skill may import of ours (never supervisor)
# The child's first lines: our package from the copy, never from where this process has it (in a
# checkout that is the hidden workspace: an editable install's finder would look there).
BOOT = ("import importlib, sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if not str(getattr(f, '__module__', '') or '')"
        ".startswith('__editable___hermes_sup')]\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "sys.exit(importlib.import_module(sys.argv[2]).main())\n")
CHECK_TIMEOUT = 10.0
CHECK_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "PYTHONPATH")


def check_env(environ: Mapping[str, str], home: str) -> dict[str, str]:
    """The environment of a skill check (pure): an allow-list of harmless variables, never one
    named like a credential, so neither a provider's key (whatever `api_key_env` calls it) nor any
    other secret of the caller reaches the skill's code."""
    kept = {key: value for key, value in environ.items()
            if (key in CHECK_ENV or key.startswith("LC_")) and not SECRET_NAMES.search(key)}
    return {**kept, "HOME": home, "TMPDIR": home, "PYTHONDONTWRITEBYTECODE": "1"}


def check_in_process_of_its_own(path: Path, runs: Path, data: bytes | None = None) -> dict[str, Any]:
    """The verdict on `path` (its bytes `data`, read once: what is checked is what will run): parsed
    here (no code of the skill runs in this process), imported by agents.skillcheck in a confined
    process of its own with no credential (agents/skillproc.check), bounded in time."""
    try:
        data = path.read_bytes() if data is None else data
        ast.parse(data, filename=str(path))
    except SyntaxError as exc:
        return {"ok": False, "error": f"syntax error at line {exc.lineno}: {exc.msg}"}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": f"cannot be read: {exc}"}
    return check(path, data, runs, check_env(os.environ, ""), CHECK_TIMEOUT)



def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.lru_cache(maxsize=1)
def _package_files() -> tuple[tuple[str, Path], ...]:
    """(where in the copy, the file) of every module of the packages a skill may import: each
    package's `.py` files and those of its subpackages (folders with an `__init__.py`; the board's
    status folders have none)."""
    from .. import kanban

    found = []
    homes = (("agents", Path(__file__).resolve().parent), ("kanban", Path(kanban.__file__).resolve().parent))
    for name, folder in homes:
        packages = [(name, folder)] + [(f"{name}/{sub.name}", sub) for sub in sorted(folder.iterdir())
                                       if sub.is_dir() and (sub / "__init__.py").is_file()]
        for where, package in packages:
            found += [(f"hermes_sup/{where}/{file.name}", file) for file in sorted(package.glob("*.py"))]
    return tuple(found)


@contextlib.contextmanager
def one_at_a_time(path: Path, timeout: float = CHECK_TIMEOUT + 5.0) -> Iterator[None]:
    """Hold the flock on `path` (made if missing) for the block; a holder that keeps it past
    `timeout` (stopped, or hostile: runs/ is the team's) is not waited for any longer. Waiters
    look every 20 ms: what they wait for takes a second, and 255 of them may be waiting."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError:
        yield
        return
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # the lock goes with the descriptor


def library(runs: Path) -> Path:
    """The folder holding the copy of our package: made once per version of the code, by whichever
    process comes first, looked over before every use (intact) and made again when it changed."""
    found = _package_files()
    wheres = [where for where, _ in found]
    key = _known_key(found)
    final = runs / ".skillrun" / key
    if intact(final, wheres):
        return final
    files = [(where, path.read_bytes()) for where, path in found]
    final = runs / ".skillrun" / _key_of(files)
    final.parent.mkdir(parents=True, exist_ok=True)
    # The agents of a team starting together each made and compiled a copy, all but one in vain.
    with one_at_a_time(runs / ".skillrun.lock"):
        if intact(final, wheres):
            return final
        return _make_library(final, final.name, files)


# The key of our code by what stat says of its files: reading and hashing all 124 cost every
# skill call about 15 ms. Any write to a file changes its ctime, so a changed file is read again.
_KNOWN: dict[tuple[Any, ...], str] = {}


def _known_key(found: tuple[tuple[str, Path], ...]) -> str:
    try:
        seen = _stats(found)
    except OSError:
        return _key_of([(where, path.read_bytes()) for where, path in found])
    key = _KNOWN.get(seen)
    if key is None:
        key = _key_of([(where, path.read_bytes()) for where, path in found])
        with contextlib.suppress(OSError):
            # Kept only if nothing changed while it was read: a file rewritten within one tick of
            # a coarse clock would otherwise keep the key of what it held before.
            if _stats(found) == seen:
                _KNOWN.clear()
                _KNOWN[seen] = key
    return key


def _stats(found: tuple[tuple[str, Path], ...]) -> tuple[Any, ...]:
    return tuple((where, s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)
                 for where, s in ((where, os.stat(path)) for where, path in found))


def _key_of(files: list[tuple[str, bytes]]) -> str:
    return digest(b"".join(where.encode() + b"\0" + digest(data).encode() for where, data in files))[:16]


def _make_library(final: Path, key: str, files: list[tuple[str, bytes]]) -> Path:
    """Make the copy at `final` from `files`, compiled, in a temporary folder renamed into place."""
    if os.path.lexists(final):  # changed since it was made (a chmod under Landlock): set aside, made again
        aside = final.parent / f".broken-{key}-{os.urandom(4).hex()}"
        with contextlib.suppress(OSError):
            os.rename(final, aside)
            shutil.rmtree(aside, ignore_errors=True)
    temporary = Path(tempfile.mkdtemp(prefix=".new-", dir=final.parent))
    try:
        (temporary / "hermes_sup").mkdir()
        (temporary / "hermes_sup" / "__init__.py").write_bytes(b"")
        for where, data in files:
            (temporary / where).parent.mkdir(parents=True, exist_ok=True)
            (temporary / where).write_bytes(data)
        # Compiled now: the copy is read-only to the calls, which would otherwise compile every module
        # they import, every time (a third of a call's cost).
        compileall.compile_dir(temporary, quiet=2, workers=1)
        for root, _, names in os.walk(temporary):  # whatever the umask: ours alone, as all of runs/ is
            os.chmod(root, 0o700)
            for name in names:
                os.chmod(os.path.join(root, name), 0o600)
        try:
            os.rename(temporary, final)
        except OSError:
            if not final.is_dir():  # another process's copy won the race: use that one
                raise
    finally:
        shutil.rmtree(temporary, ignore_errors=True)
    return final


def check(path: Path, data: bytes, runs: Path, environ: dict[str, str],
          timeout: float = CHECK_TIMEOUT) -> dict[str, Any]:
    """The verdict on the skill `data` (the bytes of `path` that will run): agents/skillcheck.py
    imports it in a process confined as a call with no capability is (no workspace, no home, no
    network, an empty folder of its own, removed after; what it starts dies with it), with `environ`
    as its environment; bounded in time. What the verdict says is checked here (verdict_problem):
    the skill's code ran where it was written."""
    from .skillcheck import verdict_problem

    with tempfile.TemporaryDirectory(prefix="hermes-skillcheck-") as folder:
        own = Path(folder).resolve()
        lib = library(runs)
        try:
            argv, env = command_for({"sandbox": "auto"}, (), runs.parent, own, own, dict(environ),
                                    [sys.executable, "-P", "-c", BOOT, str(lib), "hermes_sup.agents.skillcheck"],
                                    library=(lib,))
        except sandbox.SandboxRefused as exc:
            return {"ok": False, "error": f"cannot be checked confined here: {exc}"}
        proc = subprocess.Popen(argv, cwd=own, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, process_group=0, close_fds=True)
        request = json.dumps({"source": data.decode("utf-8", "replace"), "file": str(path)}).encode() + b"\n"
        try:
            stdout, stderr = proc.communicate(request, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"ok": False, "error": f"did not finish loading within {timeout:g} s (a loop at import?)"}
        finally:
            _end(proc)
    lines = [line for line in stdout.decode("utf-8", "replace").splitlines() if line.strip()]
    try:
        verdict = json.loads(lines[-1][:MAX_LINE])
    except (IndexError, ValueError, RecursionError):
        tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        return {"ok": False, "error": f"the check process ended with status {proc.returncode} without a verdict "
                                      f"{tail[0][:200]}".strip()}
    problem = verdict_problem(verdict)
    return {"ok": False, "error": f"its check's verdict does not hold: {problem}"} if problem else verdict


def intact(folder: Path, expected: list[str]) -> bool:
    """Whether the copy in `folder` is as it was made: every module there, everything in it ours, a
    real file or folder, readable by us and by nobody else. Confined commands cannot write
    it, but under Landlock they can change modes: a folder made unreadable would break every later
    call, and one made writable to all would let another user of the machine put code in it."""
    uid, regular = os.geteuid(), set()
    try:
        for root, folders, files in os.walk(folder):
            for path in [root, *(os.path.join(root, name) for name in (*folders, *files))]:
                info = os.lstat(path)
                kind_ok = (stat.S_ISDIR(info.st_mode) and info.st_mode & 0o500 == 0o500) \
                    or (stat.S_ISREG(info.st_mode) and info.st_mode & 0o400)
                if not kind_ok or info.st_uid != uid or info.st_mode & 0o077:
                    return False
                if stat.S_ISREG(info.st_mode):
                    regular.add(path)
    except OSError:
        return False
    return all(os.path.join(folder, where) in regular for where in expected)


def proxies(name: str, path: Path, checked: str, declared: list[dict[str, Any]], runs: Path) -> list[Tool]:
    """The tools of the skill `name` (file `path`, checked at digest `checked`) as its verdict
    declared them, each call run confined."""
    tools = []
    for tool in declared:
        capabilities = tuple(str(c) for c in tool.get("capabilities") or ())
        handler = functools.partial(call, Path(path), checked, str(tool["name"]), capabilities, runs)
        tools.append(Tool(str(tool["name"]), str(tool.get("description") or ""), handler,
                          parameters=tool.get("parameters") or {"type": "object", "properties": {}},
                          capabilities=capabilities, idempotent=bool(tool.get("idempotent")), toolset=name,
                          hidden=dict(tool.get("hidden") or {}), opt_in=bool(tool.get("opt_in")),
                          cues=tuple(str(c) for c in tool.get("cues") or ())))
    return tools


def rights(settings: dict[str, Any], capabilities: tuple[str, ...]) -> dict[str, Any]:
    """The agent's settings as a skill's call may use them (pure): the folders its capabilities
    reach (an `rw` grant writable with fs.write, any grant read-only with fs.read, none without
    either) and the sandbox mode; nothing else of the agent's configuration (providers, webhooks)
    goes to the skill."""
    folders = {}
    for key, spec in (settings.get("folders") or {}).items():
        if not isinstance(spec, dict):
            continue
        if spec.get("mode") == "rw" and "fs.write" in capabilities:
            folders[key] = spec
        elif "fs.read" in capabilities:
            folders[key] = {**spec, "mode": "ro"}
    return {"folders": folders, "sandbox": settings.get("sandbox") or "auto"}


def withheld_folders(agents: dict[str, Any], calls: dict[str, Any]) -> list[Path]:
    """The agent's granted folders (and worktrees) a call is not given (pure): hidden from it, since a
    folder outside the machine's private ones would otherwise be readable as the system is."""
    from .grants import grants_of

    given = {g.root for g in grants_of(calls)} | {g.path / ".git" for g in grants_of(calls) if g.tree}
    return sorted({p for g in grants_of(agents) for p in (g.path, g.root) if p not in given})


def call(path: Path, checked: str, tool: str, capabilities: tuple[str, ...], runs: Path,
         ctx: ToolContext, args: dict[str, Any]) -> Any:
    """One call of `tool`, in a confined process of its own; what its handler returned, or the
    ToolError / InterruptedError it ended with."""
    from .files import root_of

    try:
        source = path.read_bytes()
    except OSError as exc:
        raise ToolError(f"the skill of {tool} cannot be read: {exc.strerror}") from None
    if digest(source) != checked:
        raise ToolError(f"the skill of {tool} changed since it was checked; the call was not made (it is offered "
                        "again once its new version is checked)")
    own = root_of(ctx)
    settings = rights(ctx.settings, capabilities)
    lib = library(runs)
    try:
        argv, env = command_for({**ctx.settings, **settings}, capabilities, ctx.workspace, own, own,
                                clean_env(os.environ, withheld(ctx.settings)),
                                [sys.executable, "-P", "-c", BOOT, str(lib), "hermes_sup.agents.skillrun"],
                                library=(lib,), own_writable="fs.write" in capabilities,
                                conceal=withheld_folders(ctx.settings, settings))
    except sandbox.SandboxRefused as exc:
        raise ToolError(str(exc)) from None
    request = {"source": source.decode("utf-8", "replace"), "file": str(path), "tool": tool, "args": args,
               "ctx": {"scratch": str(own), "agent": ctx.agent, "task": ctx.task, "settings": settings,
                       "grants": list(ctx.grants or ()), "llm": ctx.llm is not None,
                       "workspace": str(ctx.workspace) if ctx.workspace else None}}
    proc = subprocess.Popen(argv, cwd=own, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, process_group=0, close_fds=True)
    try:
        answer, stderr = _converse(proc, ctx, json.dumps(request, default=str).encode() + b"\n")
    finally:
        _end(proc)
    if answer is None:
        if died_of(proc.returncode) in STOP_SIGNALS and ctx.stop.is_set():
            raise InterruptedError
        tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise ToolError(f"{tool} ended (exit status {proc.returncode}) without an answer {tail[0][:300]}".strip())
    if "result" in answer:
        return answer["result"]
    if answer.get("kind") == "interrupted":
        if ctx.stop.is_set():
            raise InterruptedError
        raise ToolError(f"{tool} said it was stopped, and no stop was asked")  # not the agent's stop to fake
    if answer.get("kind") == "raised":
        raise ToolError(f"{tool} raised {answer.get('error')}")
    raise ToolError(str(answer.get("error") or f"{tool} failed"))


def _converse(proc: subprocess.Popen[bytes], ctx: ToolContext, request: bytes) -> tuple[dict[str, Any] | None, bytes]:
    """Hand the child its request and answer its model calls until its outcome line; (the outcome or
    None when it ended without one, the end of its stderr). Bounded in time (CALL_TIMEOUT of its own
    work) and size (MAX_LINE); a stop ends it at once. Answers are written without blocking: a child
    that asks again before reading its answer is ended, never waited on."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    with contextlib.suppress(BrokenPipeError):
        proc.stdin.write(request)  # read whole before any code of the skill runs
        proc.stdin.flush()
    os.set_blocking(proc.stdin.fileno(), False)
    deadline = time.monotonic() + CALL_TIMEOUT
    pending, stderr, outbox = b"", b"", b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stderr, selectors.EVENT_READ)
        while any(key.fileobj is not proc.stdin for key in selector.get_map().values()):
            if ctx.stop.is_set():
                raise InterruptedError
            if time.monotonic() > deadline:
                raise ToolError(f"the skill's call took more than {CALL_TIMEOUT:g} s; it was ended")
            for key, _ in selector.select(timeout=0.2):
                if key.fileobj is proc.stdin:
                    outbox = outbox[_write(proc.stdin.fileno(), outbox):]
                    if not outbox:
                        selector.unregister(proc.stdin)
                    continue
                data = os.read(key.fd, 1 << 16)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                if key.fileobj is proc.stderr:
                    stderr = (stderr + data)[-KEEP_STDERR:]
                    continue
                pending += data
                if len(pending) > MAX_LINE and b"\n" not in pending:
                    raise ToolError(f"the skill's answer is larger than {MAX_LINE >> 20} MiB; it was ended")
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    message = _message(line)
                    if "llm" not in message:
                        return message, stderr
                    if outbox:
                        raise ToolError("the skill's process asked the model again before reading its answer; "
                                        "it was ended")
                    started = time.monotonic()
                    reply = json.dumps(_model(ctx, message["llm"])).encode() + b"\n"
                    deadline += time.monotonic() - started
                    outbox = reply[_write(proc.stdin.fileno(), reply):]
                    if outbox:
                        selector.register(proc.stdin, selectors.EVENT_WRITE)
    return None, stderr


def _write(fd: int, data: bytes) -> int:
    """How much of `data` went into the pipe `fd` now (all of it when the child is gone: dropped)."""
    try:
        return os.write(fd, data)
    except BlockingIOError:
        return 0
    except (BrokenPipeError, OSError):
        return len(data)


def _message(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: a line nested 200,000 deep
        return {"error": "the skill's process answered something unreadable", "kind": "tool"}
    if not isinstance(message, dict):
        return {"error": "the skill's process answered something unreadable", "kind": "tool"}
    return message


def _model(ctx: ToolContext, asked: Any) -> dict[str, str]:
    """The agent's answer to a skill's model call (`ctx.llm`): a budget or a provider's failure is
    the skill's to handle, as in the agent's own process."""
    if ctx.llm is None or not (isinstance(asked, list) and len(asked) == 2 and all(isinstance(a, str) for a in asked)):
        return {"error": "no model is available to this call"}
    try:
        return {"answer": str(ctx.llm(asked[0], asked[1]))}
    except (InterruptedError, KeyboardInterrupt):
        raise
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def _end(proc: subprocess.Popen[bytes]) -> None:
    """The call's process and whatever it started are gone, its pipes closed."""
    kill_group(proc)
    proc.wait()
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()

